"""What the rules are, tested without a model, and what the world may do, for exploration proofs.

`RULE_EVALS` drive the machine straight through the interpreter (tool answers included) and check
which answers the guards accept or refuse; each names the states it covers, and `improve rules` fails
when a guarded state is not covered. `probe()` and `PROBE_INPUTS` describe the world at the rule's
boundaries (credits around 0 and the fee, tools that fail), so that `improve explore` searching the
whole state space and finding no path to the sentinel is a proof, relative to that world.
"""

from __future__ import annotations

from typing import Any

from improve.machine import ExploreOptions, RuleEval
from improve.runtime import FactType

from .world import ACTORS

FACT_TYPES: dict[str, dict[str, FactType]] = {
    "resolve": {
        "ticket": "text",  # free text, meant for word tests; a name or an id would be "string"
        "requested": "number",
        "account.plan": ("basic", "pro", "team"),  # an enumeration: the tuple of its values
        "account.monthlyFee": "number",  # a number may carry its unit, "number:usd": two of one unit are comparable
        "account.creditsThisYear": "int",
    }
}
"""The type of each fact a policy may read, per decision: the rules proposer learns conditions over these
(docs/extending.md, What the rule miner can learn from)."""


def probe() -> ExploreOptions:
    accounts: list[Any] = [{"found": False, "account": None}]
    for fee, credits in ((0, 0), (30, 0), (30, 3)):
        accounts.append(
            {"found": True, "account": {"plan": "pro", "monthlyFee": fee, "creditsThisYear": credits}}
        )
    return ExploreOptions(
        payloads={"CREDIT": {"amount": [-1, 0, 0.01, 30, 30.01, 500]}},
        outputs={"accounts.lookup": accounts, "credits.issue": [{"credited": 1.0}]},
        errors=set(ACTORS),
    )


PROBE_INPUTS = [
    {"ticket": "The app was down all day.", "accountId": "A-1", "amount": amount} for amount in (0, 30, 500)
]

_TICKET = {"ticket": "The app was down all day.", "accountId": "A-1", "amount": 45}
_FOUND = {
    "type": "xstate.done.actor",
    "actorId": "lookingUpAccount",
    "output": {"found": True, "account": {"plan": "pro", "monthlyFee": 30, "creditsThisYear": 0}},
}


def _credit(amount: float) -> dict[str, Any]:
    return {"type": "CREDIT", "amount": amount}


RULE_EVALS = [
    RuleEval(
        "a credit is at most one month's fee",
        ("resolving",),
        _TICKET,
        [_FOUND],
        "resolving",
        accepts=[_credit(30), _credit(0.01), {"type": "ESCALATE"}, {"type": "DECLINE"}],
        refuses=[_credit(30.01), _credit(45), _credit(0), _credit(-5)],
    ),
    RuleEval(
        "a credit within the fee is paid",
        ("resolving", "checkingCredit"),
        _TICKET,
        [_FOUND, _credit(30)],
        "crediting",
    ),
    RuleEval(
        "a ticket for an unknown account is declined",
        ("lookingUpAccount",),
        _TICKET,
        [{"type": "xstate.done.actor", "actorId": "lookingUpAccount", "output": {"found": False}}],
        "declined",
    ),
]
