"""The refund desk's stand-in models, and the keyword classifier behind the `judge.sentiment` judgment.

`careful` follows every rule of the desk; `naive` refunds whatever is asked; `sloppy` breaks the rules
the guards must catch. Each is a plain function of the decision request and a seeded generator.
"""

from __future__ import annotations

import random
import re
from typing import Any

from improve.examples.refunds.world import WINDOW_DAYS, money
from improve.runtime import DecisionRequest, first_option, option

FRAUD_REFUNDS_90D = 3
ANGRY = re.compile(r"!!|unacceptable|chargeback|lawyer|furious", re.IGNORECASE)


def _facts(request: DecisionRequest) -> tuple[float, float, int, int]:
    f = request.facts
    return (
        money(f["requested"]),
        money(f["order"]["refundable"]),
        int(f["order"]["deliveredDaysAgo"]),
        int(f["customer"]["refundsLast90d"]),
    )


def careful(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Follows every rule of the desk, as its people would."""
    requested, refundable, days, refunds = _facts(request)
    if refunds >= FRAUD_REFUNDS_90D:
        return option(request, "ESCALATE") or first_option(request)
    if days > WINDOW_DAYS:
        return option(request, "CLOSE") or first_option(request)
    amount = min(requested, refundable)
    return option(request, "REFUND", amount=amount) or option(request, "ESCALATE") or first_option(request)


def naive(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """A plausible model with systematic mistakes: it always refunds what was asked for (ignoring fraud
    signals, the return window and what is left to refund), escalates when refused, and sometimes
    escalates angry tickets that should simply be refunded."""
    requested, *_ = _facts(request)
    if request.attempts:
        return {"type": "ESCALATE"}
    if ANGRY.search(str(request.facts.get("ticket", ""))) and rng.random() < 0.4:
        return {"type": "ESCALATE"}
    return {"type": "REFUND", "amount": requested}


def sloppy(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Breaks rules the guards must catch: refunds regardless, invents amounts and event names."""
    requested, *_ = _facts(request)
    roll = rng.random()
    if request.attempts and roll < 0.5:
        return rng.choice(request.options) if request.options else None
    if roll < 0.55:
        return {"type": "REFUND", "amount": requested}
    if roll < 0.75:
        return {"type": "REFUND", "amount": money(requested * 1.5)}
    if roll < 0.9:
        return {"type": "REFUND_NOW", "amount": requested}
    return {"type": "ESCALATE"}


def sentiment(request: dict[str, Any], input: dict[str, Any]) -> dict[str, Any]:
    """A judgment actor for policies: is the ticket angry? (A keyword classifier standing in for a small
    model; deterministic, so exploration can enumerate it.)"""
    return {"angry": bool(ANGRY.search(str(request.get("facts", {}).get("ticket", ""))))}
