"""Plausible refund tickets, drawn at random: the refund desk's generator of cases (`Environment.cases`),
for checking a policy out of sample. The draws carry no label: the `careful` stand-in's run of `v0`
labels them (`improve.evals.out_of_sample`).

A ticket asks for the order's refundable amount, a part of it, or more than is left; customers refund
rarely or often, orders are fresh or past the 30-day window, some tickets shout; a few name no order
(and the customer replies with one, or never), name someone else's order or one that does not exist.
Above 100 an approver answers, approving more often than not.
"""

from __future__ import annotations

import random
from typing import Any

from improve.examples.refunds.world import money

ITEMS = (
    "phone case",
    "bedside lamp",
    "pair of running shoes",
    "coffee grinder",
    "rain jacket",
    "set of kitchen knives",
    "desk chair",
    "wireless headset",
    "board game",
    "winter duvet",
    "blender",
    "backpack",
)
PROBLEMS = (
    "arrived broken",
    "stopped working after a week",
    "is not what the photos showed",
    "came in the wrong size",
    "was missing parts",
    "arrived scratched",
)
CALM = (
    "The {item} I ordered {problem}. Could I get {amount} back?",
    "Hello, my {item} {problem}. Please refund {amount}.",
    "Sadly the {item} {problem}, so I would like a refund of {amount}.",
)
ANGRY = (
    "This is unacceptable!! The {item} {problem}. Refund {amount} now.",
    "I am furious: the {item} {problem}. I want my {amount} back or I file a chargeback.",
    "Third time this happens, the {item} {problem}!! Refund {amount} or my lawyer hears about it.",
)
TOTALS = (9.99, 12.75, 23.5, 34.2, 42.0, 55.0, 64.0, 89.99, 100.0, 129.0, 175.0, 249.0, 420.0, 899.0)
APPROVERS = ("dana", "marcus", "priya", "tomasz", "aisha")


def draw(rng: random.Random) -> dict[str, Any]:
    customer, order_id = f"C-{rng.randint(2000, 9999)}", f"O-{rng.randint(6000, 9999)}"
    total = rng.choice(TOTALS)
    refunded = money(total * rng.choice((0.25, 0.5))) if rng.random() < 0.2 else 0.0
    left = money(total - refunded)
    roll = rng.random()
    requested = left if roll < 0.6 else money(left * rng.choice((0.3, 0.5))) if roll < 0.8 else total
    days = rng.randint(0, 30) if rng.random() < 0.7 else rng.randint(31, 90)
    angry = rng.random() < 0.15
    ticket = rng.choice(ANGRY if angry else CALM).format(
        item=rng.choice(ITEMS), problem=rng.choice(PROBLEMS), amount=f"{requested:g}"
    )
    order = {"customerId": customer, "total": total, "refunded": refunded, "deliveredDaysAgo": days}
    history = {"refundsLast90d": rng.choices((0, 1, 2, 3, 4), weights=(55, 25, 10, 7, 3))[0]}
    history["accountAgeDays"] = rng.randint(10, 2000)
    world: dict[str, Any] = {"customers": {customer: history}, "orders": {order_id: order}}
    people: dict[str, list[dict[str, Any]]] = {
        "awaitingApproval": [
            {"type": "APPROVE", "approver": rng.choice(APPROVERS)}
            if rng.random() < 0.7
            else {"type": "REJECT"}
        ]
    }
    ticket_input: dict[str, Any] = {
        "ticket": ticket,
        "customerId": customer,
        "orderId": order_id,
        "amount": requested,
    }
    category = (
        "repeat-refunder"
        if history["refundsLast90d"] >= 3
        else "past-window"
        if days > 30
        else "more-than-left"
        if requested > left
        else "angry"
        if angry
        else "refund"
    )
    kind = rng.random()
    if kind < 0.05:  # no order named: the customer is asked, and replies with it or never does
        del ticket_input["orderId"]
        reply = (
            {"type": "PROVIDE_ORDER_ID", "orderId": order_id} if rng.random() < 0.6 else {"type": "NO_REPLY"}
        )
        people["awaitingOrderId"] = [reply]
        category = "no-order-id"
    elif kind < 0.09:  # someone else's order
        other = f"C-{rng.randint(10000, 19999)}"
        world["customers"][other] = {"refundsLast90d": 0, "accountAgeDays": 300}
        world["orders"][order_id] = {**order, "customerId": other}
        category = "not-customers-order"
    elif kind < 0.13:  # an order the system does not know
        world["orders"] = {}
        category = "order-not-found"
    return {"category": category, "input": ticket_input, "world": world, "people": people}
