"""The refund desk as it was before the state machine: one hand-written loop in plain Python.

This is the code a team replaces with `machine.json` and a policy, and the reason `parity compare`
takes runners: it compares this loop with the machine, scenario by scenario, before the old code is
deleted.

    parity compare improve.examples.refunds.legacy:run v0

It uses the same world, tools and stand-in models as the machine, asks the model with a
`DecisionRequest` built the same way (the options the rules allow, the same facts), and checks the
same rules inline: the model's answer in the order unknown event, invalid payload, refused by the
rules, fed back for up to two retries; approval above 100; and a last check before money moves. The
loop is not a state machine and nothing is journaled: `run` returns what the world recorded.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NoReturn

from improve.errors import ActorFailure, ConfigError, ModelCallError, WorkspaceError
from improve.evals import Scenario
from improve.examples.refunds.env import environment
from improve.examples.refunds.world import (
    APPROVAL_THRESHOLD,
    WINDOW_DAYS,
    RefundWorld,
    ask_customer,
    close,
    escalate,
    lookup_order,
    pay_refund,
    record_approval,
    request_approval,
    verify_customer,
)
from improve.log import Attempt
from improve.parity import ParityRun, new_model
from improve.runtime import DecisionRequest, Environment, Model

MAX_RETRIES = 2
EVENTS = ["REFUND", "ESCALATE", "CLOSE"]
QUESTION = "Which order is this refund for? Please reply with the order id."
PROMPT = (
    "Resolve this refund ticket. Refund the requested amount or the remaining refundable amount, "
    "escalate it to a person, or close it."
)
SENTINEL = (
    "SENTINEL: a refund over 100 without approval, or more than the remaining refundable amount, "
    "reached payment"
)


@cache
def _desk() -> Environment:
    return environment()


class _Ended(Exception):
    """How the ticket ended: a final state, or a wait nobody answered."""

    def __init__(self, state: str, status: str = "done") -> None:
        super().__init__(state)
        self.state = state
        self.status = status


def run(env_name: str, scenario: Scenario, model: str) -> ParityRun:
    """Handle one ticket with a fresh stand-in model, the old way (a `parity` runner)."""
    if env_name != "refunds":
        raise WorkspaceError(f"the legacy refund loop only handles the refunds desk, not {env_name}")
    world = RefundWorld(scenario.world)
    desk = _Desk(world, scenario, new_model(_desk(), model, scenario))
    try:
        desk.handle(dict(scenario.input))
    except _Ended as end:
        state, status = end.state, end.status
    except ActorFailure:  # a tool failed (the payment provider declined): the ticket failed
        state, status = "failed", "done"
    violations = world.audit(world.effects)
    if state == "illegallyIssued":
        violations = [{"rule": "sentinel", "state": state, "description": SENTINEL}, *violations]
    return ParityRun(
        final_state=state,
        effects=[dict(e) for e in world.effects],
        violations=violations,
        guard_refusals=desk.refusals,
        status=status,
    )


class _Desk:
    def __init__(self, world: RefundWorld, scenario: Scenario, model: Model) -> None:
        self.world = world
        self.model = model
        self.people = {state: list(answers) for state, answers in scenario.people.items()}
        self.refusals = 0

    # -- endings --------------------------------------------------------------------------------------

    def close(self, reason: str) -> NoReturn:
        close(self.world, {"reason": reason})
        raise _Ended("closed")

    def escalate(self, reason: str) -> NoReturn:
        escalate(self.world, {"reason": reason})
        raise _Ended("escalated")

    def wait_for(self, waiting: str, accepted: tuple[str, ...]) -> dict[str, Any]:
        """The next answer people give while the ticket waits; nobody answers -> it stays waiting."""
        queue = self.people.get(waiting)
        if not queue:
            raise _Ended(waiting, "waiting")
        answer = dict(queue.pop(0))
        if answer.get("type") not in accepted:
            raise ConfigError(f"the people script answers {answer} in {waiting!r}, which accepts {accepted}")
        return answer

    # -- the ticket -----------------------------------------------------------------------------------

    def handle(self, ticket: dict[str, Any]) -> NoReturn:
        customer_id = ticket["customerId"]
        found = verify_customer(self.world, {"customerId": customer_id})
        if not found["verified"]:
            self.close("unverified-customer")
        customer = found["customer"]

        order_id = ticket.get("orderId", "")
        if order_id == "":
            ask_customer(self.world, {"customerId": customer_id, "question": QUESTION})
            reply = self.wait_for("awaitingOrderId", ("PROVIDE_ORDER_ID", "NO_REPLY"))
            if reply["type"] == "NO_REPLY":
                self.close("no-reply")
            order_id = reply["orderId"]

        looked = lookup_order(self.world, {"orderId": order_id})
        if not looked["found"]:
            self.escalate("order-not-found")
        order = looked["order"]
        if order["customerId"] != customer_id:
            self.close("not-customers-order")

        answer = self.choose(ticket, order, customer)
        if answer is None:
            self.escalate("decision-exhausted")
        if answer["type"] == "ESCALATE":
            self.escalate("agent-escalated")
        if answer["type"] == "CLOSE":
            self.close("agent-closed")

        amount = answer["amount"]
        approved = False
        if amount > APPROVAL_THRESHOLD:
            request_approval(self.world, {"orderId": order_id, "amount": amount})
            decision = self.wait_for("awaitingApproval", ("APPROVE", "REJECT"))
            if decision["type"] == "REJECT":
                self.close("approval-rejected")
            record_approval(
                self.world, {"orderId": order_id, "amount": amount, "approver": decision["approver"]}
            )
            approved = True
        # The last line of defence before money moves, checked again whatever was decided above.
        if (amount > APPROVAL_THRESHOLD and not approved) or amount > order["refundable"] + 1e-9:
            raise _Ended("illegallyIssued")
        pay_refund(self.world, {"orderId": order_id, "amount": amount})
        raise _Ended("issued")

    # -- asking the model -----------------------------------------------------------------------------

    def choose(
        self, ticket: dict[str, Any], order: dict[str, Any], customer: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Ask the model to refund, escalate or close; check its answer; retry twice; None if exhausted."""
        requested = ticket["amount"]
        amounts: list[Any] = []
        for value in (requested, order["refundable"]):
            if value not in amounts:
                amounts.append(value)

        def refund_allowed(amount: Any) -> bool:
            return bool(
                amount > 0 and amount <= order["refundable"] and order["deliveredDaysAgo"] <= WINDOW_DAYS
            )

        options = [{"type": "REFUND", "amount": a} for a in amounts if refund_allowed(a)]
        options += [{"type": "ESCALATE"}, {"type": "CLOSE"}]
        request = DecisionRequest(
            name="chooseResolution",
            options=options,
            facts={
                "ticket": ticket["ticket"],
                "requested": requested,
                "order": {
                    "total": order["total"],
                    "refunded": order["refunded"],
                    "refundable": order["refundable"],
                    "deliveredDaysAgo": order["deliveredDaysAgo"],
                },
                "customer": {
                    "refundsLast90d": customer["refundsLast90d"],
                    "accountAgeDays": customer["accountAgeDays"],
                },
            },
            allowed_events=list(EVENTS),
            payloads={"REFUND": {"amount": amounts}},
            prompt=PROMPT,
        )
        attempts: list[Attempt] = []
        while len(attempts) <= MAX_RETRIES:
            try:
                answer = self.model.answer(request.with_attempts(attempts)).event
            except ModelCallError:
                answer = {"type": "ESCALATE"}  # the model is down: a person takes the ticket
            refusal = self.check(answer, amounts, refund_allowed, options)
            if refusal is None:
                assert isinstance(answer, dict)
                return answer
            if refusal.kind == "rejected-by-guard":
                self.refusals += 1
            attempts.append(refusal)
        return None

    @staticmethod
    def check(
        answer: Any, amounts: list[Any], refund_allowed: Any, options: list[dict[str, Any]]
    ) -> Attempt | None:
        if not isinstance(answer, dict) or not isinstance(answer.get("type"), str):
            return Attempt(
                event=answer if isinstance(answer, dict) else None,
                kind="no-answer",
                reason="no-answer: the decider did not produce an event with a `type`",
            )
        kind = answer["type"]
        if kind not in EVENTS:
            return Attempt(
                event=answer, kind="unknown-event", reason=f"unknown-event: '{kind}' is not one of {EVENTS}"
            )
        fields = {k for k in answer if k != "type"}
        takes = {"amount"} if kind == "REFUND" else set()
        if fields - takes:
            return Attempt(
                event=answer,
                kind="invalid-payload",
                reason=f"invalid-payload: '{kind}' takes no field '{sorted(fields - takes)[0]}'",
            )
        if kind == "REFUND":
            amount = answer.get("amount")
            if not _is_number(amount) or not any(amount == a for a in amounts):
                return Attempt(
                    event=answer,
                    kind="invalid-payload",
                    reason=f"invalid-payload: amount={amount!r} is not one of {amounts}",
                )
            if not refund_allowed(amount):
                return Attempt(
                    event=answer,
                    kind="rejected-by-guard",
                    guard="refund: more than 0, at most what is left, within 30 days",
                    reason=f"rejected-by-guard: the rules do not allow REFUND here; the options now are {options}",
                )
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
