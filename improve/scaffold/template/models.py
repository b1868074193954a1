"""Stand-in models: deterministic deciders, so every run reproduces offline.

`careful` follows the rules as the team would, `sloppy` breaks rules the guards must catch, and
`naive` makes the systematic mistakes a better policy can fix: it credits whatever was asked for
(escalating when the guard refuses) and never notices a customer who claims credits again and again.
Run your agent on a real model by binding it to the policy's `decider` ref instead.
"""

from __future__ import annotations

import random
from typing import Any

from improve.runtime import DecisionRequest, first_option, option, stand_in

from .world import money

REPEAT_CLAIMS = 3
"""A customer with this many credits this year is escalated to a person (the team's judgment)."""


def careful(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    requested = money(request.facts["requested"])
    account = request.facts["account"]
    if int(account["creditsThisYear"]) >= REPEAT_CLAIMS:
        return option(request, "ESCALATE") or first_option(request)
    amount = min(requested, money(account["monthlyFee"]))
    return option(request, "CREDIT", amount=amount) or option(request, "ESCALATE") or first_option(request)


def naive(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    if request.attempts:
        return {"type": "ESCALATE"}
    return {"type": "CREDIT", "amount": money(request.facts["requested"])}


def sloppy(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    requested = money(request.facts["requested"])
    roll = rng.random()
    if request.attempts and roll < 0.5:
        return rng.choice(request.options) if request.options else None
    if roll < 0.5:
        return {"type": "CREDIT", "amount": money(requested * 2)}
    if roll < 0.7:
        return {"type": "REFUND", "amount": requested}
    if roll < 0.85:
        return {"type": "CREDIT", "amount": -requested}
    return {"type": "ESCALATE"}


MODELS = {
    "careful": stand_in("careful", careful),
    "naive": stand_in("naive", naive),
    "sloppy": stand_in("sloppy", sloppy),
}
