"""The triage desk's fact types, rule evals and exploration probe: its guards, without a model.

`FACT_TYPES` is what a policy may read in the `triage` decision. `RULE_EVALS` drive the interpreter
through each guarded state with scripted events; `probe()` is what the world may do for exploration
proofs, and `PROBE_INPUTS` the inputs they start from.
"""

from __future__ import annotations

from typing import Any

from improve.examples.triage.world import ACTORS, CLOSE_REASONS, PLANS, QUEUES
from improve.machine import ExploreOptions, RuleEval
from improve.runtime import FactType

FACT_TYPES: dict[str, dict[str, FactType]] = {
    "triage": {
        "ticket.subject": "string",
        "ticket.body": "string",
        "ticket.spamScore": "number",
        "ticket.autoReply": "bool",
        "customer.plan": PLANS,
        "customer.locked": "bool",
        "customer.seats": "int",
        "openTicket.found": "bool",
        "openTicket.hoursAgo": "int",
    }
}
"""What a policy's guards may read in the one decision, `triage`: its facts and their types."""


# --- the world for proofs ------------------------------------------------------------------------------


def probe() -> ExploreOptions:
    """The world at the rules' boundaries: no account, an open and a locked account on each paying
    plan, an open ticket or none; every offered queue and reason plus ones the desk does not have."""
    accounts: list[Any] = [{"found": False, "account": None}]
    for plan in ("free", "enterprise"):
        for locked in (False, True):
            accounts.append(
                {"found": True, "account": {"id": "A-1", "plan": plan, "locked": locked, "seats": 5}}
            )
    return ExploreOptions(
        payloads={
            "ROUTE": {"queue": [*QUEUES, "sales"]},
            "CLOSE": {"reason": [*CLOSE_REASONS, "resolved"]},
        },
        outputs={
            "accounts.lookup": accounts,
            "tickets.findOpen": [
                {"found": False, "ticketId": "", "hoursAgo": 0},
                {"found": True, "ticketId": "T-1", "hoursAgo": 5},
            ],
            "tickets.route": [{"routed": True}],
            "tickets.escalate": [{"escalated": True}],
            "tickets.close": [{"closed": True}],
        },
        errors=set(ACTORS),
    )


PROBE_INPUTS = [
    {
        "ticketId": "T-9",
        "from": "a@example.com",
        "subject": "Help",
        "body": "My account is locked.",
        "spamScore": 0.5,
    },
    {
        "ticketId": "T-9",
        "from": "a@example.com",
        "subject": "Re: Help",
        "body": "WIN NOW",
        "spamScore": 9.0,
        "autoSubmitted": True,
    },
]


# --- rule evals: the desk's guards, without a model ------------------------------------------------------

_TICKET = {
    "ticketId": "T-9",
    "from": "a@example.com",
    "subject": "Cheap watches",
    "body": "Buy now.",
    "spamScore": 8.0,
}


def _account(locked: bool, plan: str = "free") -> dict[str, Any]:
    return {
        "type": "xstate.done.actor",
        "actorId": "lookingUpSender",
        "output": {"found": True, "account": {"id": "A-1", "plan": plan, "locked": locked, "seats": 1}},
    }


def _open_ticket(found: bool) -> dict[str, Any]:
    output = (
        {"found": True, "ticketId": "T-1", "hoursAgo": 5}
        if found
        else {"found": False, "ticketId": "", "hoursAgo": 0}
    )
    return {"type": "xstate.done.actor", "actorId": "findingOpenTicket", "output": output}


def _close(reason: str) -> dict[str, Any]:
    return {"type": "CLOSE", "reason": reason}


def _route(queue: str) -> dict[str, Any]:
    return {"type": "ROUTE", "queue": queue}


RULE_EVALS = [
    RuleEval(
        "a locked account's ticket is never closed",
        ("triaging",),
        _TICKET,
        [_account(locked=True), _open_ticket(found=True)],
        "triaging",
        accepts=[_route("accounts"), _route("security"), {"type": "ESCALATE"}],
        refuses=[_close("spam"), _close("duplicate"), _close("auto-reply")],
    ),
    RuleEval(
        "an unlocked account's ticket may be closed as spam or an automatic reply",
        ("triaging",),
        _TICKET,
        [_account(locked=False), _open_ticket(found=False)],
        "triaging",
        accepts=[_close("spam"), _close("auto-reply"), _route("billing")],
        refuses=[_close("duplicate")],
    ),
    RuleEval(
        "a duplicate is closed only into an open ticket",
        ("triaging",),
        _TICKET,
        [_account(locked=False), _open_ticket(found=True)],
        "triaging",
        accepts=[_close("duplicate")],
    ),
    RuleEval(
        "a closure of an unlocked account's ticket goes to the tool",
        ("triaging", "checkingClosure"),
        _TICKET,
        [_account(locked=False), _open_ticket(found=False), _close("spam")],
        "closing",
    ),
    RuleEval(
        "a sender without an account is triaged as a visitor, and a visitor's spam may be closed",
        ("lookingUpSender",),
        _TICKET,
        [
            {
                "type": "xstate.done.actor",
                "actorId": "lookingUpSender",
                "output": {"found": False, "account": None},
            },
            _open_ticket(found=False),
        ],
        "triaging",
        accepts=[_close("spam")],
    ),
    RuleEval(
        "a found account is read from the lookup",
        ("lookingUpSender",),
        _TICKET,
        [_account(locked=True, plan="enterprise"), _open_ticket(found=False)],
        "triaging",
        refuses=[_close("spam")],
    ),
]
