"""Plausible cases nobody labelled, for checking a policy out of sample (`improve out-of-sample`).

A round judges a candidate on the labelled scenarios; a learned branch also meets tickets unlike any of
them. `draw` makes one plausible ticket at random, as a scenario has it: its `input` and `world` (and
`people`, when the machine asks a person). Without `expected`, each case is labelled by the `careful`
stand-in's run of the first policy given; when your rules can label a case themselves (a handbook in
code), also return `expected` (`outcome`, `effects`) and a `category`. Draw the facts your rules turn
on across their boundaries (fees, amounts around them, customers with many credits), in proportions
like your traffic's.
"""

from __future__ import annotations

import random
from typing import Any

PLANS = {"basic": 12.0, "pro": 30.0, "team": 90.0}
"""Each plan's monthly fee."""

TICKETS = (
    "The service was down for most of the afternoon. Please credit {amount}.",
    "I was charged twice this month. Credit the extra {amount}, please.",
    "Sync lost my changes again. I'd like {amount} back for the trouble.",
    "Nobody on our team could log in this morning. We expect {amount} credited.",
    "Your support took a week to answer. Credit {amount}.",
    "The export failed right before a deadline. I want {amount} refunded.",
)


def draw(rng: random.Random) -> dict[str, Any]:
    """One ticket: an account of some plan (now and then one the desk does not know), a customer with
    a few credits this year or many, and an amount within one month's fee or above it."""
    plan = rng.choice(tuple(PLANS))
    fee = PLANS[plan]
    credits = rng.choices(range(0, 7), weights=(30, 25, 15, 12, 8, 6, 4))[0]
    amount = (
        round(rng.uniform(1, fee), 2) if rng.random() < 0.5 else round(rng.uniform(fee + 0.01, fee * 4), 2)
    )
    account_id = f"A-{rng.randint(1000, 9999)}"
    accounts = (
        {}
        if rng.random() < 0.05
        else {account_id: {"plan": plan, "monthlyFee": fee, "creditsThisYear": credits}}
    )
    return {
        "input": {
            "ticket": rng.choice(TICKETS).format(amount=amount),
            "accountId": account_id,
            "amount": amount,
        },
        "world": {"accounts": accounts},
    }
