"""Replay: a pure fold that reaches the live run's final snapshot, and refuses logs it cannot trust."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from improve.errors import DivergenceError, LogError, VersionMismatchError
from improve.log.entry import LogEntry
from improve.log.replay import replay
from improve.log.store import MemoryStore
from improve.machine import compile_machine
from improve.runtime import load_environment
from improve.runtime.policy import PolicyDecider, compile_policy, load_policy
from improve.runtime.run import run
from tests.conftest import REPO

REFUNDS = load_environment("refunds")
APPROVAL = load_environment("refund-approval")
V0 = compile_policy(load_policy(REPO / "policies" / "refunds" / "v0.json"))
V0_APPROVAL = compile_policy(load_policy(REPO / "policies" / "refund-approval" / "v0.json"))

amounts = st.one_of(
    st.sampled_from([0, 40, 99.99, 100, 100.01, 101, 240]), st.floats(1, 500).map(lambda x: round(x, 2))
)


@st.composite
def refund_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Random tickets over the whole input space: amounts at the rule boundaries, missing and foreign
    orders, old deliveries, fraud signals, people who answer or not, declined payments."""
    total = draw(amounts)
    refunded = draw(st.sampled_from([0, 0, round(total / 2, 2), total]))
    owner = draw(st.sampled_from(["C-1", "C-1", "C-2"]))
    order_known = draw(st.booleans()) or draw(st.booleans())
    give_order = draw(st.booleans())
    world = {
        "customers": {
            "C-1": {"refundsLast90d": draw(st.integers(0, 6)), "accountAgeDays": draw(st.integers(0, 900))}
        },
        "orders": {
            "O-1": {
                "customerId": owner,
                "total": total,
                "refunded": refunded,
                "deliveredDaysAgo": draw(st.integers(0, 60)),
            }
        }
        if order_known
        else {},
        "paymentsFail": draw(st.booleans()) and draw(st.booleans()),
    }
    people: dict[str, list[dict[str, Any]]] = {}
    if draw(st.booleans()):
        people["awaitingOrderId"] = [
            draw(st.sampled_from([{"type": "PROVIDE_ORDER_ID", "orderId": "O-1"}, {"type": "NO_REPLY"}]))
        ]
    if draw(st.booleans()):
        people["awaitingApproval"] = [
            draw(st.sampled_from([{"type": "APPROVE", "approver": "dana"}, {"type": "REJECT"}]))
        ]
    inp = {
        "ticket": draw(st.sampled_from(["it broke", "unacceptable!! refund now", "wrong size"])),
        "customerId": draw(st.sampled_from(["C-1", "C-9"])),
        "amount": draw(amounts),
    }
    if give_order:
        inp["orderId"] = "O-1"
    return {
        "input": inp,
        "world": world,
        "people": people,
        "model": draw(st.sampled_from(["careful", "naive", "sloppy"])),
        "seed": draw(st.text("abc123", min_size=1, max_size=6)),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(refund_scenarios())
def test_replay_equals_the_live_final_snapshot(case: dict[str, Any]) -> None:
    store = MemoryStore()
    live = run(
        REFUNDS,
        input=case["input"],
        world=REFUNDS.make_world(case["world"]),
        people=case["people"],
        decider=PolicyDecider(V0, {"decider": REFUNDS.models[case["model"]](case["seed"])}),
        store=store,
        thread_id="t:v0:x:r1",
        stamp={},
    )
    entries = store.read("t:v0:x:r1")
    replayed = replay(REFUNDS.machine, entries, verify=True)
    assert replayed.snapshot == live.snapshot
    assert replayed.status == live.status
    assert replayed.model_calls == live.model_calls
    assert replayed.tokens == live.input_tokens + live.output_tokens
    # The sentinel stays unreachable whatever the model does: the guards hold.
    assert live.final_state != "illegallyIssued"
    # Every prefix replays too, and the prefix's state is the journaled one at that point.
    for cut in range(1, len(entries) + 1):
        partial = replay(REFUNDS.machine, entries, upto=cut, verify=True)
        assert partial.entries == cut


@settings(max_examples=60, deadline=None)
@given(
    amount=amounts,
    reason=st.sampled_from(["broken", "fraud suspected", "late"]),
    model=st.sampled_from(["careful", "naive", "sloppy"]),
    answer=st.sampled_from(
        [None, {"type": "APPROVE", "approver": "kim"}, {"type": "REJECT", "reason": "no"}]
    ),
)
def test_replay_property_on_refund_approval(amount: float, reason: str, model: str, answer: Any) -> None:
    store = MemoryStore()
    people = {"approving": [answer]} if answer else {}
    live = run(
        APPROVAL,
        input={"amount": amount, "reason": reason},
        world=APPROVAL.make_world({}),
        people=people,
        decider=PolicyDecider(V0_APPROVAL, {"decider": APPROVAL.models[model](reason)}),
        store=store,
        thread_id="t:v0:y:r1",
        stamp={},
    )
    assert replay(APPROVAL.machine, store.read("t:v0:y:r1"), verify=True).snapshot == live.snapshot
    assert live.final_state != "illegallyIssued"


def _recorded() -> list[LogEntry]:
    store = MemoryStore()
    run(
        REFUNDS,
        input={"ticket": "broke", "customerId": "C-1", "orderId": "O-1", "amount": 40},
        world=REFUNDS.make_world(
            {
                "customers": {"C-1": {}},
                "orders": {"O-1": {"customerId": "C-1", "total": 90, "deliveredDaysAgo": 2}},
            }
        ),
        people={},
        decider=PolicyDecider(V0, {"decider": REFUNDS.models["careful"]("s")}),
        store=store,
        thread_id="t:v0:z:r1",
        stamp={},
    )
    return store.read("t:v0:z:r1")


def test_version_mismatch_names_entry_expected_and_found() -> None:
    entries = _recorded()
    newer = REFUNDS.config.model_copy(update={"version": "2"})
    with pytest.raises(
        VersionMismatchError, match=r"entry 0: version mismatch, expected refunds@2, found refunds@1"
    ):
        replay(compile_machine(newer, guards=REFUNDS.guards), entries)


def test_hash_mismatch_names_the_first_diverging_entry() -> None:
    entries = _recorded()
    tampered = [e.model_copy(deep=True) for e in entries]
    lookup = next(e for e in tampered if e.event.get("actorId") == "lookingUpOrder")
    lookup.event["output"]["order"]["refundable"] = 10.0
    with pytest.raises(DivergenceError, match=rf"entry {lookup.index} \(xstate.done.actor\) diverges"):
        replay(REFUNDS.machine, tampered, verify=True)
    # Without hashes, the refused decision still gives it away: the machine does not accept it.
    with pytest.raises(LogError, match=r"entry \d+ \(REFUND\) is not accepted in state 'choosingResolution'"):
        replay(REFUNDS.machine, tampered)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda es: es[1:], "entry 0 is 'xstate.done.actor'"),
        (lambda es: [es[0], *es[2:]], "has index 2; indices must be contiguous"),
        (lambda es: [], "the thread is empty"),
        (
            lambda es: [es[0], es[1].model_copy(update={"machineId": "other"}), *es[2:]],
            "entry 1 was recorded by machine other@1, expected refunds@1",
        ),
    ],
)
def test_invalid_logs_are_refused(mutate: Any, message: str) -> None:
    with pytest.raises(LogError, match=message):
        replay(REFUNDS.machine, mutate(_recorded()))
