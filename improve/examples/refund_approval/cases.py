"""Plausible refund requests, drawn at random: refund-approval's generator of cases (`Environment.cases`),
for checking a policy out of sample. The draws carry no label: the `careful` stand-in's run of `v0`
labels them (`improve.evals.out_of_sample`).

Most requests give an everyday reason (a damaged, late, wrong or unwanted order); about one in eight
reports a stolen card, a duplicate charge or fraud. Amounts run from a few to a thousand; above 100 a
person answers, approving more often than not.
"""

from __future__ import annotations

import random
from typing import Any

EVERYDAY = (
    "The {item} arrived damaged and I would like my money back.",
    "My order of a {item} arrived two weeks late, I no longer need it.",
    "The {item} in my order is the wrong colour.",
    "I changed my mind about the {item}, it is still unopened.",
    "Half of my order was missing: no {item} in the box.",
    "The {item} stopped working after three days.",
    "The {item} is much smaller than described on the order page.",
    "The venue cancelled the event and the {item} tickets were never reissued.",
)
SUSPICIOUS = (
    "My card was stolen and someone ordered a {item} with it.",
    "There is a duplicate charge for the {item} on my statement.",
    "I think the {item} order is fraud, I never placed it.",
    "Someone used my stolen account details to buy a {item}.",
    "I was charged twice, a duplicate payment for one {item}.",
)
ITEMS = ("mug", "jacket", "monitor", "blender", "standing desk", "concert", "phone", "rug", "kettle", "lamp")


def draw(rng: random.Random) -> dict[str, Any]:
    suspicious = rng.random() < 0.12
    reason = rng.choice(SUSPICIOUS if suspicious else EVERYDAY).format(item=rng.choice(ITEMS))
    amount = round(rng.choice((rng.uniform(5, 100), rng.uniform(100.01, 1000))), 2)
    answer = (
        {"type": "APPROVE", "approver": "dana"} if rng.random() < 0.7 else {"type": "REJECT", "reason": "no"}
    )
    return {
        "category": "suspicious" if suspicious else "large" if amount > 100 else "small",
        "input": {"amount": amount, "reason": reason},
        "people": {"approving": [answer]},
    }
