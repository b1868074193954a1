"""refund-approval's stand-in models: plain functions of the decision request (`classify`).

`careful` refuses a suspicious reason and escalates above the threshold; `naive` issues whatever it is
asked for; `sloppy` breaks the rules the guards must catch (an invented event, a bad payload).
"""

from __future__ import annotations

import random
from typing import Any

from improve.runtime import DecisionRequest, first_option, option

THRESHOLD = 100
SUSPICIOUS = ("fraud", "stolen", "duplicate")


def _suspicious(request: DecisionRequest) -> bool:
    reason = str(request.facts.get("reason", "")).lower()
    return any(word in reason for word in SUSPICIOUS)


def careful(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Refuses a suspicious reason, escalates an amount over the threshold, issues the rest."""
    if _suspicious(request):
        return {"type": "REFUSE", "reasoning": "the reason given suggests fraud"}
    if float(request.facts["amount"]) > THRESHOLD:
        return option(request, "ESCALATE") or first_option(request)
    return option(request, "ISSUE") or option(request, "ESCALATE") or first_option(request)


def naive(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Issues whatever it is asked for; refused, it escalates. It never spots a suspicious reason."""
    if request.attempts:
        return {"type": "ESCALATE"}
    return {"type": "ISSUE"}


def sloppy(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Breaks rules the guards must catch: issues regardless, invents an event, sends a bad payload."""
    roll = rng.random()
    if request.attempts and roll < 0.5:
        return rng.choice(request.options) if request.options else None
    if roll < 0.6:
        return {"type": "ISSUE"}
    if roll < 0.8:
        return {"type": "PAY", "amount": request.facts.get("amount")}
    return {"type": "REFUSE", "reasoning": 42}
