"""The refund desk's world: customers, orders and the effects the tools record, audited after the fact.

World fixture (a scenario's `world`):

    customers: {C-1001: {refundsLast90d: 0, accountAgeDays: 420}}
    orders:    {O-5001: {customerId: C-1001, total: 80, refunded: 0, deliveredDaysAgo: 5}}
    paymentsFail: false      # optional: the payment provider declines

Effects recorded: `question`, `approval-requested`, `approval-given`, `refund`, `escalation`, `closure`.

`world_from_thread` rebuilds this fixture from a recorded thread (`improve scenarios add --from-thread`):
the customers the CRM verified, the orders the lookup found, and `paymentsFail` when a payment failed.

The tools (actors) and the sentinel's named guard `illegalRefund` are here too. The legacy loop
(legacy.py) uses the same world and tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from improve.errors import ActorFailure
from improve.runtime import RecordedThread, World, WorldFromThreadError

APPROVAL_THRESHOLD = 100
WINDOW_DAYS = 30


def money(value: Any) -> float:
    """An amount rounded to cents, as the desk pays and compares it."""
    return round(float(value), 2)


class RefundWorld(World):
    """The fixture's customers and orders, and the refunds, approvals and messages the tools record."""

    def order(self, order_id: str) -> dict[str, Any] | None:
        found = self.fixture.get("orders", {}).get(order_id)
        return dict(found) if found is not None else None

    def refundable(self, order: Mapping[str, Any]) -> float:
        # Rounded again: 89.99 - 30.5 is 59.489999... in floating point, and 59.49 must be payable.
        return money(money(order["total"]) - money(order.get("refunded", 0)))

    def audit(self, effects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The refund desk's rules, checked against what was paid, whatever the machine said."""
        effects = self.effects if effects is None else effects
        violations: list[dict[str, Any]] = []
        approved: set[tuple[str, float]] = set()
        paid: dict[str, float] = {}
        for effect in effects:
            if effect["kind"] == "approval-given":
                approved.add((effect["orderId"], money(effect["amount"])))
            if effect["kind"] != "refund":
                continue
            order_id, amount = effect["orderId"], money(effect["amount"])
            order = self.order(order_id) or {}
            paid[order_id] = paid.get(order_id, 0.0) + amount
            if amount <= 0:
                violations.append({"rule": "positive-amount", "orderId": order_id, "amount": amount})
            if order and paid[order_id] > self.refundable(order) + 1e-9:
                violations.append({"rule": "over-refundable", "orderId": order_id, "amount": amount})
            if amount > APPROVAL_THRESHOLD and (order_id, amount) not in approved:
                violations.append({"rule": "approval-required", "orderId": order_id, "amount": amount})
            if order and order.get("deliveredDaysAgo", 0) > WINDOW_DAYS:
                violations.append({"rule": "outside-window", "orderId": order_id, "amount": amount})
        return violations


# --- tools -----------------------------------------------------------------------------------------


def verify_customer(world: World, input: dict[str, Any]) -> dict[str, Any]:
    customer = world.fixture.get("customers", {}).get(input["customerId"])
    if customer is None:
        return {"verified": False, "customer": None}
    return {
        "verified": True,
        "customer": {
            "id": input["customerId"],
            "refundsLast90d": int(customer.get("refundsLast90d", 0)),
            "accountAgeDays": int(customer.get("accountAgeDays", 0)),
        },
    }


def ask_customer(world: World, input: dict[str, Any]) -> dict[str, Any]:
    world.record("question", customerId=input["customerId"], text=input["question"])
    return {"sent": True}


def lookup_order(world: World, input: dict[str, Any]) -> dict[str, Any]:
    assert isinstance(world, RefundWorld)
    order = world.order(input["orderId"])
    if order is None:
        return {"found": False, "order": None}
    return {
        "found": True,
        "order": {
            "id": input["orderId"],
            "customerId": order["customerId"],
            "total": money(order["total"]),
            "refunded": money(order.get("refunded", 0)),
            "refundable": world.refundable(order),
            "deliveredDaysAgo": int(order.get("deliveredDaysAgo", 0)),
        },
    }


def request_approval(world: World, input: dict[str, Any]) -> dict[str, Any]:
    world.record("approval-requested", orderId=input["orderId"], amount=money(input["amount"]))
    return {"requested": True}


def record_approval(world: World, input: dict[str, Any]) -> dict[str, Any]:
    world.record(
        "approval-given", orderId=input["orderId"], amount=money(input["amount"]), approver=input["approver"]
    )
    return {"recorded": True}


def pay_refund(world: World, input: dict[str, Any]) -> dict[str, Any]:
    if world.fixture.get("paymentsFail"):
        raise ActorFailure("the payment provider declined the refund", code="payment-declined")
    effect = world.record("refund", orderId=input["orderId"], amount=money(input["amount"]))
    return {"refunded": effect["amount"]}


def escalate(world: World, input: dict[str, Any]) -> dict[str, Any]:
    world.record("escalation", reason=input["reason"])
    return {"escalated": True}


def close(world: World, input: dict[str, Any]) -> dict[str, Any]:
    world.record("closure", reason=input["reason"])
    return {"closed": True}


def illegal_refund(context: Mapping[str, Any], event: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """The sentinel's own check: an unapproved refund over 100, or more than the remaining amount."""
    amount = money(context.get("refundAmount") or 0)
    order = context.get("order") or {}
    over_threshold = amount > APPROVAL_THRESHOLD and not context.get("approved")
    return bool(over_threshold or amount > money(order.get("refundable", 0)) + 1e-9)


# --- the world a thread shows ------------------------------------------------------------------------


def world_from_thread(thread: RecordedThread) -> dict[str, Any]:
    """The fixture under which the tools answer as `thread` records: each customer `crm.verifyCustomer`
    verified and each order `orders.lookup` found, as they were seen (one that was not found stays out
    of the fixture, so it is not found again), and `paymentsFail` when `payments.refund` failed. Other
    tools read nothing from the fixture; a failure of one of them is beyond what this world can make."""
    customers: dict[str, Any] = {}
    orders: dict[str, Any] = {}
    payments_fail = False
    for call in thread.calls:
        if call.failed:
            if call.src != "payments.refund":
                raise WorldFromThreadError(
                    f"thread {thread.thread_id}, entry {call.index}: {call.src} failed ({call.error}); the "
                    "refund desk's world can only make payments.refund fail (paymentsFail), so no "
                    "scenario reproduces this thread"
                )
            payments_fail = True
        elif call.src == "crm.verifyCustomer" and call.output.get("verified"):
            customer = call.output["customer"]
            customers[str(customer.get("id", call.input["customerId"]))] = {
                "refundsLast90d": customer["refundsLast90d"],
                "accountAgeDays": customer["accountAgeDays"],
            }
        elif call.src == "orders.lookup" and call.output.get("found"):
            order = call.output["order"]
            orders[str(order.get("id", call.input["orderId"]))] = {
                "customerId": order["customerId"],
                "total": order["total"],
                "refunded": order["refunded"],
                "deliveredDaysAgo": order["deliveredDaysAgo"],
            }
    world: dict[str, Any] = {"customers": customers, "orders": orders}
    if payments_fail:
        world["paymentsFail"] = True
    return world
