"""The refund desk: the embedded default environment.

A ticket names a customer, maybe an order, and an amount. The machine (machine.json) verifies the
customer, asks for a missing order id, looks the order up, then asks the agent to `chooseResolution`.
The rules are guards; the world (world.py) holds customers, orders and the effects the tools record,
and audits them after the fact.

The hard rules (positive amount, at most what is left to refund, 30-day window, approval above 100) are
guards and are audited after the fact. Escalating repeat refunders (3 or more in 90 days) is the desk's
judgment, not a hard rule: a policy learns it from the labels, and the audit does not flag it.

This module assembles the environment from its parts: the world and its tools (world.py), the stand-in
models and the sentiment judgment (models.py), and the rule evals and exploration probe (rules.py).
"""

from __future__ import annotations

from pathlib import Path

from improve.examples.refunds.cases import draw
from improve.examples.refunds.models import careful, naive, sentiment, sloppy
from improve.examples.refunds.rules import PROBE_INPUTS, RULE_EVALS, probe
from improve.examples.refunds.world import (
    RefundWorld,
    ask_customer,
    close,
    escalate,
    illegal_refund,
    lookup_order,
    pay_refund,
    record_approval,
    request_approval,
    verify_customer,
    world_from_thread,
)
from improve.machine import parse_machine
from improve.runtime import Environment, ModelJudgment, load_json, stand_in

HERE = Path(__file__).parent

FACT_TYPES = {
    "chooseResolution": {
        "ticket": "string",
        "requested": "number",
        "order.total": "number",
        "order.refunded": "number",
        "order.refundable": "number",
        "order.deliveredDaysAgo": "int",
        "customer.refundsLast90d": "int",
        "customer.accountAgeDays": "int",
    }
}
"""What a policy's guards may read in the one decision, `chooseResolution`: its facts and their types."""


def environment() -> Environment:
    config = parse_machine(load_json(HERE / "machine.json"), source=str(HERE / "machine.json"))
    return Environment(
        home=HERE,
        name="refunds",
        config=config,
        actors={
            "crm.verifyCustomer": verify_customer,
            "customer.ask": ask_customer,
            "orders.lookup": lookup_order,
            "approvals.request": request_approval,
            "approvals.record": record_approval,
            "payments.refund": pay_refund,
            "tickets.escalate": escalate,
            "tickets.close": close,
        },
        guards={"illegalRefund": illegal_refund},
        make_world=RefundWorld,
        world_from_thread=world_from_thread,
        models={
            "careful": stand_in("careful", careful),
            "naive": stand_in("naive", naive),
            "sloppy": stand_in("sloppy", sloppy),
        },
        files=[
            HERE / "machine.json",
            Path(__file__),
            HERE / "world.py",
            HERE / "models.py",
            HERE / "rules.py",
            HERE / "cases.py",
        ],
        # A person holding the ticket (escalated, or waiting for approval) is the safest outcome.
        safety_order={
            "illegallyIssued": 0,
            "issued": 1,
            "failed": 2,
            "closed": 3,
            "escalated": 4,
            "awaitingApproval": 4,
        },
        fact_types=FACT_TYPES,
        # A model behind an endpoint answers the question itself; stand-in deciders get the keywords.
        judgments={
            "judge.sentiment": ModelJudgment(
                question="Is the customer angry (threatening, shouting, furious), judging by the ticket?",
                output={"angry": "bool"},
                stand_in=sentiment,
            )
        },
        probe=probe(),
        probe_inputs=PROBE_INPUTS,
        rule_evals=RULE_EVALS,
        cases=draw,
    )
