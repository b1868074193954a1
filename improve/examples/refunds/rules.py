"""The refund desk's rule evals and exploration probe: its guards, without a model.

`RULE_EVALS` drive the interpreter through each guarded state with scripted events; `probe()` is what
the world may do for exploration proofs, and `PROBE_INPUTS` the inputs they start from.
"""

from __future__ import annotations

import itertools
from typing import Any

from improve.machine import ExploreOptions, RuleEval

# --- the world for proofs ------------------------------------------------------------------------------

ACTOR_NAMES = (
    "crm.verifyCustomer",
    "customer.ask",
    "orders.lookup",
    "approvals.request",
    "approvals.record",
    "payments.refund",
    "tickets.escalate",
    "tickets.close",
)


def probe() -> ExploreOptions:
    """The world at the rules' boundaries: amounts around 0 and 100, what is left to refund around the
    amounts, deliveries either side of 30 days, the customer's own order or someone else's, no order."""
    orders: list[Any] = [{"found": False, "order": None}]
    for refundable, days, owner in itertools.product([0, 40, 100, 101, 240], [0, 30, 31], ["C-1", "C-2"]):
        orders.append(
            {
                "found": True,
                "order": {
                    "id": "O-1",
                    "customerId": owner,
                    "total": 240.0,
                    "refunded": 240.0 - refundable,
                    "refundable": float(refundable),
                    "deliveredDaysAgo": days,
                },
            }
        )
    customers = [
        {"verified": True, "customer": {"id": "C-1", "refundsLast90d": n, "accountAgeDays": 400}}
        for n in (0, 3)
    ] + [{"verified": False, "customer": None}]
    return ExploreOptions(
        payloads={
            "REFUND": {"amount": [0, 40, 100, 101, 240]},
            "APPROVE": {"approver": ["dana"]},
            "PROVIDE_ORDER_ID": {"orderId": ["O-1"]},
        },
        outputs={
            "crm.verifyCustomer": customers,
            "orders.lookup": orders,
            "customer.ask": [{"sent": True}],
            "approvals.request": [{"requested": True}],
            "approvals.record": [{"recorded": True}],
            "payments.refund": [{"refunded": 1.0}],
            "tickets.escalate": [{"escalated": True}],
            "tickets.close": [{"closed": True}],
        },
        errors=set(ACTOR_NAMES),
    )


PROBE_INPUTS = [
    {"ticket": "It broke.", "customerId": "C-1", "orderId": "O-1", "amount": 40},
    {"ticket": "It broke.", "customerId": "C-1", "orderId": "O-1", "amount": 240},
    {"ticket": "Which order? I forgot.", "customerId": "C-1", "amount": 101},
]


# --- rule evals: the desk's guards, without a model ------------------------------------------------------

_VERIFIED = {
    "type": "xstate.done.actor",
    "actorId": "verifyingCustomer",
    "output": {"verified": True, "customer": {"id": "C-1", "refundsLast90d": 0, "accountAgeDays": 400}},
}


def _order(refundable: float, days: int = 5, owner: str = "C-1") -> dict[str, Any]:
    return {
        "type": "xstate.done.actor",
        "actorId": "lookingUpOrder",
        "output": {
            "found": True,
            "order": {
                "id": "O-1",
                "customerId": owner,
                "total": 240.0,
                "refunded": 240.0 - refundable,
                "refundable": refundable,
                "deliveredDaysAgo": days,
            },
        },
    }


_TICKET = {"ticket": "It broke.", "customerId": "C-1", "orderId": "O-1", "amount": 240}
_AT_DECISION = [_VERIFIED, _order(100.0)]


def _refund(amount: float) -> dict[str, Any]:
    return {"type": "REFUND", "amount": amount}


RULE_EVALS = [
    RuleEval(
        "a refund is at most what is left to refund",
        ("choosingResolution",),
        _TICKET,
        _AT_DECISION,
        "choosingResolution",
        accepts=[_refund(100.0), _refund(40)],
        refuses=[_refund(100.01), _refund(240)],
    ),
    RuleEval(
        "a refund is positive",
        ("choosingResolution",),
        _TICKET,
        _AT_DECISION,
        "choosingResolution",
        accepts=[_refund(0.01)],
        refuses=[_refund(0), _refund(-5)],
    ),
    RuleEval(
        "no refund more than 30 days after delivery",
        ("choosingResolution",),
        _TICKET,
        [_VERIFIED, _order(100.0, days=31)],
        "choosingResolution",
        accepts=[{"type": "CLOSE"}, {"type": "ESCALATE"}],
        refuses=[_refund(40)],
    ),
    RuleEval(
        "day 30 is still inside the window",
        ("choosingResolution",),
        _TICKET,
        [_VERIFIED, _order(100.0, days=30)],
        "choosingResolution",
        accepts=[_refund(40)],
    ),
    RuleEval(
        "a refund over 100 asks a person first",
        ("checkingApproval", "requestingApproval"),
        _TICKET,
        [_VERIFIED, _order(240.0), _refund(100.5)],
        "requestingApproval",
    ),
    RuleEval(
        "a refund of 100 is paid without approval",
        ("checkingApproval", "checkingPayment"),
        _TICKET,
        [_VERIFIED, _order(240.0), _refund(100)],
        "paying",
    ),
    RuleEval(
        "an approved refund over 100 is paid",
        ("awaitingApproval", "checkingPayment"),
        _TICKET,
        [
            _VERIFIED,
            _order(240.0),
            _refund(150),
            {"type": "xstate.done.actor", "actorId": "requestingApproval", "output": {"requested": True}},
            {"type": "APPROVE", "approver": "dana"},
            {"type": "xstate.done.actor", "actorId": "recordingApproval", "output": {"recorded": True}},
        ],
        "paying",
    ),
    RuleEval(
        "a rejected approval closes the ticket",
        ("awaitingApproval",),
        _TICKET,
        [
            _VERIFIED,
            _order(240.0),
            _refund(150),
            {"type": "xstate.done.actor", "actorId": "requestingApproval", "output": {"requested": True}},
            {"type": "REJECT"},
        ],
        "closing",
    ),
    RuleEval(
        "an unknown customer's ticket is closed",
        ("verifyingCustomer",),
        _TICKET,
        [{"type": "xstate.done.actor", "actorId": "verifyingCustomer", "output": {"verified": False}}],
        "closing",
    ),
    RuleEval(
        "a missing order id is asked for",
        ("checkingOrderId", "askingForOrderId"),
        {"ticket": "Where is my refund?", "customerId": "C-1", "amount": 20},
        [_VERIFIED],
        "askingForOrderId",
    ),
    RuleEval(
        "another customer's order is closed",
        ("lookingUpOrder",),
        _TICKET,
        [_VERIFIED, _order(100.0, owner="C-2")],
        "closing",
    ),
    RuleEval(
        "an order not found is escalated",
        ("lookingUpOrder",),
        _TICKET,
        [_VERIFIED, {"type": "xstate.done.actor", "actorId": "lookingUpOrder", "output": {"found": False}}],
        "escalating",
    ),
]
