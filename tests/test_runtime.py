"""The runtime: the decision protocol's failure kinds, exhaustion, budgets, people, actors, journaling."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable
from typing import Any

import pytest

from improve.clock import FrozenClock, frozen, now, rfc3339
from improve.errors import ActorFailure, ConfigError, RunError
from improve.log.replay import replay
from improve.log.store import MemoryStore
from improve.machine import parse_machine
from improve.runtime.decision import Decision, DecisionRequest, Usage
from improve.runtime.environment import Environment, World, unknown_actors
from improve.runtime.models import stand_in
from improve.runtime.run import RunResult, run
from tests.helpers import FROZEN_AT


class Scripted:
    """A decider scripted by a plain function of the request (and how many times it was asked)."""

    def __init__(self, answer: Callable[[DecisionRequest, int], dict[str, Any] | None]) -> None:
        self.answer = answer
        self.requests: list[DecisionRequest] = []

    def decide(self, request: DecisionRequest) -> Decision:
        self.requests.append(request)
        event = self.answer(request, len(self.requests) - 1)
        return Decision(event=event, usage=[Usage("decider", "script", 100, 10)], source="script")


def shop(on_error: bool = True) -> Environment:
    """A tiny shop: pick a discount (closed choice, guarded), then a tool charges, a person confirms."""
    invoke: dict[str, Any] = {
        "src": "agent.decide",
        "input": {
            "name": "'discount'",
            "allowedEvents": ["DISCOUNT", "NONE"],
            "payloads": {"DISCOUNT": {"pct": "[5, 10, 50]"}},
            "facts": {"total": "context.total"},
        },
    }
    if on_error:
        invoke["onError"] = {"target": "gaveUp"}
    config = parse_machine(
        {
            "id": "shop",
            "version": "1",
            "initial": "deciding",
            "context": {"total": "input.total", "pct": "0"},
            "states": {
                "deciding": {
                    "invoke": invoke,
                    "on": {
                        "DISCOUNT": {
                            "target": "charging",
                            "guard": "event.pct <= 10",
                            "assign": {"pct": "event.pct"},
                        },
                        "NONE": {"target": "charging"},
                    },
                },
                "charging": {
                    "invoke": {
                        "src": "pay",
                        "input": {"pct": "context.pct"},
                        "onDone": "confirming",
                        "onError": "declined",
                    }
                },
                "confirming": {"on": {"OK": "done"}},
                "done": {"type": "final", "output": {"pct": "context.pct"}},
                "declined": {"type": "final"},
                "gaveUp": {"type": "final"},
            },
        }
    )

    def pay(world: World, inp: dict[str, Any]) -> dict[str, Any]:
        if world.fixture.get("decline"):
            raise ActorFailure("card declined", code="declined")
        if world.fixture.get("crash"):
            raise ZeroDivisionError("bug in the tool")
        return world.record("charge", pct=inp["pct"])

    return Environment(name="shop", config=config, actors={"pay": pay}, make_world=World, models={})


def test_an_invoke_of_no_actor_of_the_environment_is_said_with_what_it_may_be() -> None:
    # Found when a run first reached it, and said differently by each command; `load_environment`
    # refuses it now, with these words (tests/test_init.py runs the commands).
    env = shop()
    assert unknown_actors(env) == []
    doc = env.config.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def said(src: str) -> list[tuple[str, str]]:
        doc["states"]["charging"]["invoke"]["src"] = src
        changed = Environment(
            name="shop",
            config=parse_machine(doc),
            actors=env.actors,
            make_world=World,
            models={},
            judgments={"tone": lambda request, input: "calm"},
        )
        return unknown_actors(changed)

    ((where, typo),) = said("pya")
    assert where == "$.states.charging.invoke.src"
    assert typo == (
        "actor 'pya' is none of environment shop's actors (did you mean 'pay'?); its actors are ['pay'] and "
        "'agent.decide' (a decision request): correct the name, or add the tool to the Environment's `actors`"
    )
    assert said("model.decide")[0][1].startswith(
        "'model.decide' asks a model inside a policy; an environment"
    )
    assert said("tone")[0][1].startswith(
        "'tone' is one of the environment's judgments, which a policy invokes"
    )


def go(
    env: Environment,
    decider: Scripted,
    people: dict[str, list[dict[str, Any]]] | None = None,
    world: dict[str, Any] | None = None,
    store: MemoryStore | None = None,
    **kw: Any,
) -> tuple[RunResult, MemoryStore]:
    store = store or MemoryStore()
    result = run(
        env,
        input={"total": 80},
        world=env.make_world(world or {}),
        people=people if people is not None else {"confirming": [{"type": "OK"}]},
        decider=decider,
        store=store,
        thread_id="t:v0:s:r1",
        **kw,
    )
    return result, store


def test_only_options_the_guards_accept_are_offered() -> None:
    decider = Scripted(lambda r, i: {"type": "NONE"})
    go(shop(), decider)
    assert decider.requests[0].options == [
        {"type": "DISCOUNT", "pct": 5},
        {"type": "DISCOUNT", "pct": 10},
        {"type": "NONE"},
    ]
    assert decider.requests[0].facts == {"total": 80}


@pytest.mark.parametrize(
    ("bad", "kind", "reason"),
    [
        (
            {"type": "REFUND"},
            "unknown-event",
            "unknown-event: 'REFUND' is not one of the allowed events ['DISCOUNT', 'NONE']",
        ),
        (
            {"type": "DISCOUNT", "pct": 7},
            "invalid-payload",
            "invalid-payload: pct=7 is not one of [5, 10, 50]",
        ),
        (
            {"type": "DISCOUNT"},
            "invalid-payload",
            "invalid-payload: 'DISCOUNT' needs 'pct', one of [5, 10, 50]",
        ),
        ({"type": "NONE", "pct": 5}, "invalid-payload", "invalid-payload: 'NONE' takes no field 'pct'"),
        (
            {"type": "DISCOUNT", "pct": 50},
            "rejected-by-guard",
            "rejected-by-guard: the rules do not allow DISCOUNT",
        ),
        (None, "no-answer", "no-answer: the decider did not produce an event"),
    ],
)
def test_each_failure_kind_is_fed_back_then_the_answer_lands(
    bad: dict[str, Any] | None, kind: str, reason: str
) -> None:
    decider = Scripted(lambda r, i: bad if i == 0 else {"type": "DISCOUNT", "pct": 10})
    result, store = go(shop(), decider)
    assert result.status == "done" and result.snapshot.output == {"pct": 10}
    assert decider.requests[1].attempts[0].kind == kind
    assert decider.requests[1].attempts[0].reason.startswith(reason)
    decision = next(e for e in store.read("t:v0:s:r1") if e.type == "DISCOUNT")
    assert decision.attempts is not None and [a.kind for a in decision.attempts] == [kind]
    assert decision.metadata is not None and decision.metadata["decision"]["name"] == "discount"
    assert result.failed_attempts == 1


def test_check_order_is_unknown_then_payload_then_guard() -> None:
    # An unknown event with a bad payload is reported as unknown-event, not invalid-payload.
    decider = Scripted(lambda r, i: {"type": "BOGUS", "pct": 999} if i == 0 else {"type": "NONE"})
    go(shop(), decider)
    assert decider.requests[1].attempts[0].kind == "unknown-event"


def test_exhaustion_takes_on_error_after_default_two_retries() -> None:
    decider = Scripted(lambda r, i: {"type": "DISCOUNT", "pct": 50})
    result, store = go(shop(), decider)
    assert len(decider.requests) == 3  # one answer and two retries
    assert result.final_state == "gaveUp" and result.status == "done"
    last = [e for e in store.read("t:v0:s:r1") if e.type == "xstate.error.actor"][-1]
    assert last.event["error"]["kind"] == "decision-exhausted"
    assert last.attempts is not None and len(last.attempts) == 3


def test_exhaustion_without_on_error_ends_the_run() -> None:
    decider = Scripted(lambda r, i: {"type": "NOPE"})
    result, store = go(shop(on_error=False), decider)
    assert result.status == "decision-exhausted"
    assert replay(shop(on_error=False).machine, store.read("t:v0:s:r1")).status == "decision-exhausted"
    assert_ended(shop(on_error=False), store, "decision-exhausted")


def test_budget_stops_the_run_and_replay_agrees() -> None:
    decider = Scripted(lambda r, i: {"type": "NOPE"})
    result, store = go(shop(), decider, max_model_calls=2)
    assert result.status == "budget"
    assert result.model_calls == 2
    assert replay(shop().machine, store.read("t:v0:s:r1")).status == "budget"
    assert_ended(shop(), store, "budget")


def test_the_entry_cap_ends_the_run_as_budget_and_it_verifies(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cap is the runner's, not the log's: replay derives another status for the active snapshot,
    # and the end entry's `budget` is accepted for it.
    monkeypatch.setattr(sys.modules["improve.runtime.run"], "MAX_ENTRIES", 2)
    result, store = go(shop(), Scripted(lambda r, i: {"type": "NONE"}))
    assert result.status == "budget" and result.snapshot.status == "active"
    replayed = replay(shop().machine, store.read("t:v0:s:r1"), verify=True, thread_id="t:v0:s:r1")
    assert (replayed.verification, replayed.ended) == ("verified", "budget")


def test_a_waiting_state_nobody_answers_ends_the_run_waiting_with_what_it_waits_for() -> None:
    result, store = go(shop(), Scripted(lambda r, i: {"type": "NONE"}), people={})
    assert result.status == "waiting" and result.final_state == "confirming"
    assert replay(shop().machine, store.read("t:v0:s:r1")).status == "waiting"
    waiting_for = [
        {
            "type": "OK",
            "payload": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
        }
    ]
    assert_ended(shop(), store, "waiting", state="confirming", waitingFor=waiting_for)


def test_an_end_entry_written_before_resumes_existed_says_idle_and_still_verifies() -> None:
    # Threads journaled before runs could be resumed end `idle` where they stopped waiting: still verified.
    from improve.log import END_EVENT, seal

    _, store = go(shop(), Scripted(lambda r, i: {"type": "NONE"}), people={})
    entries = store.read("t:v0:s:r1")
    previous = entries[-2].verification.entryHash if entries[-2].verification else None
    assert previous is not None
    old = seal(entries[-1].model_copy(update={"event": {"type": END_EVENT, "status": "idle"}}), previous)
    replayed = replay(shop().machine, [*entries[:-1], old], verify=True, thread_id="t:v0:s:r1")
    assert (replayed.status, replayed.ended, replayed.verification) == ("waiting", "idle", "verified")


def assert_ended(env: Environment, store: MemoryStore, status: str, **more: Any) -> None:
    """The run's last entry says how it ended, and a verified replay derives the same status."""
    entries = store.read("t:v0:s:r1")
    assert entries[-1].event == {"type": "@agent.end", "status": status, **more}
    replayed = replay(env.machine, entries, verify=True, thread_id="t:v0:s:r1")
    assert (replayed.status, replayed.ended, replayed.verification) == (status, status, "verified")


def test_people_answer_not_accepted_is_a_scenario_error() -> None:
    with pytest.raises(ConfigError, match=r"does not accept it; it accepts \['OK'\]"):
        go(shop(), Scripted(lambda r, i: {"type": "NONE"}), people={"confirming": [{"type": "NOPE"}]})


def test_a_people_answer_refused_ends_a_suites_run_there_saying_which_and_it_still_verifies() -> None:
    # A suite's run (`refused="end"`) ends where its script's answer is refused, as a run nobody answered
    # does, its end entry saying which answer; the refused event is never journaled as an entry, so the
    # thread replays as a pure fold to the wait. A second answer for the state is never reached.
    from improve.runtime import PEOPLE_REFUSED_KEY, Refused, refused_at_end

    people = {"confirming": [{"type": "NOPE", "why": "late"}, {"type": "OK"}]}
    result, store = go(shop(), Scripted(lambda r, i: {"type": "NONE"}), people=people, refused="end")
    assert (result.status, result.final_state) == ("waiting", "confirming")
    wanted = Refused("confirming", 0, {"type": "NOPE", "why": "late"}, None, ("OK",))
    assert result.refused == wanted
    entries = store.read("t:v0:s:r1")
    assert not any(e.event.get("type") == "NOPE" for e in entries)
    assert entries[-1].metadata == {
        PEOPLE_REFUSED_KEY: {
            "state": "confirming",
            "index": 0,
            "event": {"type": "NOPE", "why": "late"},
            "accepts": ["OK"],
        }
    }
    assert refused_at_end(entries) == wanted
    assert wanted.sentence() == (
        'the people script answers {"type": "NOPE", "why": "late"} in state \'confirming\', which does not '
        "accept it; it accepts ['OK']"
    )
    assert_ended(shop(), store, "waiting", state="confirming", waitingFor=entries[-1].event["waitingFor"])
    # A run nobody answered says no refusal.
    _, unanswered = go(shop(), Scripted(lambda r, i: {"type": "NONE"}), people={}, refused="end")
    assert refused_at_end(unanswered.read("t:v0:s:r1")) is None


def test_actor_failure_is_journaled_and_routed() -> None:
    result, store = go(shop(), Scripted(lambda r, i: {"type": "NONE"}), world={"decline": True})
    assert result.final_state == "declined"
    error = next(e for e in store.read("t:v0:s:r1") if e.type == "xstate.error.actor")
    assert error.event["error"] == {"code": "declined", "message": "card declined"}


def test_actor_crash_keeps_everything_journaled_before_it() -> None:
    store = MemoryStore()
    with pytest.raises(RunError, match="actor 'pay' crashed"):
        go(shop(), Scripted(lambda r, i: {"type": "NONE"}), world={"crash": True}, store=store)
    types = [e.type for e in store.read("t:v0:s:r1")]
    assert types == ["@agent.init", "@agent.usage", "NONE"]  # no @agent.end: the run never ended
    assert replay(shop().machine, store.read("t:v0:s:r1")).status == "incomplete"
    checked = replay(shop().machine, store.read("t:v0:s:r1"), verify=True, thread_id="t:v0:s:r1")
    assert checked.verification == "incomplete"


def test_journal_shape_effects_usage_and_hashes() -> None:
    result, store = go(shop(), Scripted(lambda r, i: {"type": "DISCOUNT", "pct": 5}))
    entries = store.read("t:v0:s:r1")
    assert [e.index for e in entries] == list(range(len(entries)))
    assert [e.type for e in entries] == [
        "@agent.init",
        "@agent.usage",
        "DISCOUNT",
        "xstate.done.actor",
        "OK",
        "@agent.end",
    ]
    assert entries[-1].event == {"type": "@agent.end", "status": result.status}
    assert entries[3].event["effects"] == [{"kind": "charge", "pct": 5}]
    assert entries[1].event["inputTokens"] == 100
    assert all(e.verification for e in entries if e.type != "@agent.usage")
    assert entries[0].metadata == {"maxModelCalls": 100}
    assert result.effects == [{"kind": "charge", "pct": 5}]
    replayed = replay(shop().machine, entries, verify=True, thread_id="t:v0:s:r1")
    assert replayed.snapshot == result.snapshot
    assert (replayed.verification, replayed.ended) == ("verified", result.status)


def test_no_options_goes_straight_to_on_error_without_asking() -> None:
    env = shop()
    config = env.config.model_copy(deep=True)
    config.states["deciding"].on["NONE"].guard = "false"  # type: ignore[union-attr]
    config.states["deciding"].invoke.input["payloads"]["DISCOUNT"]["pct"] = "[50]"  # type: ignore[union-attr,index]
    env2 = Environment(name="shop", config=config, actors=env.actors, make_world=World, models={})
    decider = Scripted(lambda r, i: {"type": "NONE"})
    result, _ = go(env2, decider)
    assert decider.requests == []
    assert result.final_state == "gaveUp"


# --- refusal paths: each check the answer goes through can refuse --------------------------------------


def note_request(**payloads: Any) -> tuple[Any, Any, DecisionRequest]:
    """A decision whose NOTE event takes free text and whose PICK event takes one of [1, 2]."""
    from improve.machine import FREE_TEXT, compile_machine, initial

    config = parse_machine(
        {
            "id": "notes",
            "version": "1",
            "initial": "asking",
            "states": {
                "asking": {"on": {"NOTE": "done", "PICK": "done"}},
                "done": {"type": "final"},
            },
        }
    )
    machine = compile_machine(config)
    snapshot = initial(machine, {})
    request = DecisionRequest(
        name="notes",
        options=[{"type": "PICK", "n": 1}, {"type": "PICK", "n": 2}],
        facts={},
        allowed_events=["NOTE", "PICK"],
        payloads={"NOTE": {"text": FREE_TEXT}, "PICK": {"n": [1, 2]}, **payloads},
    )
    return machine, snapshot, request


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"type": "NOTE", "text": "x" * 100_001}, "'text' must be text of at most 100000 characters"),
        ({"type": "NOTE", "text": 42}, "'text' must be text of at most 100000 characters"),
        ({"type": "NOTE", "text": ["a"]}, "'text' must be text of at most 100000 characters"),
        ({"type": "PICK", "n": True}, "n=True is not one of [1, 2]"),
        ({"type": "PICK", "n": "1"}, "n='1' is not one of [1, 2]"),
        ({"type": "PICK"}, "'PICK' needs 'n', one of [1, 2]"),
        ({"type": 7}, "the decider did not produce an event with a `type`"),
        ("PICK", "the decider did not produce an event with a `type`"),
    ],
)
def test_free_text_limits_and_payload_types_are_refused(event: Any, reason: str) -> None:
    from improve.runtime.decision import check_answer

    machine, snapshot, request = note_request()
    refused = check_answer(machine, snapshot, request, event)
    assert refused is not None and reason in refused.reason, refused


def test_text_at_the_limit_and_numbers_of_either_kind_land() -> None:
    from improve.runtime.decision import check_answer

    machine, snapshot, request = note_request()
    for event in (
        {"type": "NOTE", "text": "x" * 100_000},
        {"type": "PICK", "n": 1.0},
        {"type": "PICK", "n": 2},
    ):
        assert check_answer(machine, snapshot, request, event) is None, event


def test_a_guard_refusal_lists_the_options_as_written() -> None:
    """The options in a rejected-by-guard reason are JSON as the decider saw them, not ASCII-escaped."""
    from improve.machine import compile_machine, initial
    from improve.runtime.decision import check_answer

    config = parse_machine(
        {
            "id": "cafe",
            "version": "1",
            "initial": "asking",
            "states": {
                "asking": {"on": {"ORDER": {"target": "done", "guard": "event.item == 'thé'"}}},
                "done": {"type": "final"},
            },
        }
    )
    machine = compile_machine(config)
    request = DecisionRequest(
        name="cafe",
        options=[{"type": "ORDER", "item": "thé"}],
        facts={},
        allowed_events=["ORDER"],
        payloads={"ORDER": {"item": ["thé", "café"]}},
    )
    refused = check_answer(machine, initial(machine, {}), request, {"type": "ORDER", "item": "café"})
    assert refused is not None and refused.kind == "rejected-by-guard"
    assert refused.reason.endswith('the options now are [{"type": "ORDER", "item": "thé"}]'), refused.reason


def test_a_usage_entry_carries_optional_fields_only_when_known() -> None:
    plain = Usage(ref="r", model="m", input_tokens=3, output_tokens=4)
    assert plain.to_event("pick") == {
        "type": "@agent.usage",
        "ref": "r",
        "model": "m",
        "decision": "pick",
        "calls": 1,
        "inputTokens": 3,
        "outputTokens": 4,
    }
    full = Usage("r", "m", 3, 4, cost_usd=0.0000000064, recorded=True, fingerprint="fp", error="timeout")
    event = full.to_event("pick")
    assert (event["costUsd"], event["recorded"], event["fingerprint"], event["error"]) == (
        6e-9,  # to the nano-dollar
        True,
        "fp",
        "timeout",
    )
    assert Usage("r", "m", 0, 0, cost_usd=0.0).to_event("x")["costUsd"] == 0.0


def test_a_free_text_field_does_not_end_the_payload_check() -> None:
    from improve.machine import FREE_TEXT
    from improve.runtime.decision import check_answer

    machine, snapshot, request = note_request(NOTE={"text": FREE_TEXT, "tag": ["a", "b"]})
    refused = check_answer(machine, snapshot, request, {"type": "NOTE", "text": "hi"})
    assert refused is not None and "'NOTE' needs 'tag', one of ['a', 'b']" in refused.reason
    assert check_answer(machine, snapshot, request, {"type": "NOTE", "text": "hi", "tag": "b"}) is None


def test_a_decision_request_is_frozen() -> None:
    import dataclasses

    _, _, request = note_request()
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.name = "other"  # type: ignore[misc]


# --- the clock -------------------------------------------------------------------------------------------


def test_every_journal_stamp_comes_from_the_clock(clock: FrozenClock) -> None:
    """Frozen, the clock gives each entry of a run its own instant, in order, from the frozen one on."""
    start = clock.peek()
    _, store = go(shop(), Scripted(lambda r, i: {"type": "DISCOUNT", "pct": 5}))
    stamps = [e.recordedAt for e in store.read("t:v0:s:r1")]
    assert stamps[0] == rfc3339(start)
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert all(s.startswith(FROZEN_AT[:10]) for s in stamps)


def test_a_frozen_clock_steps_nests_and_refuses_naive_times() -> None:
    with frozen("2030-02-03T04:05:06Z", step=dt.timedelta(seconds=1)) as outer:
        assert now() == dt.datetime(2030, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
        assert rfc3339() == "2030-02-03T04:05:07.000000Z"
        with frozen(dt.datetime(1999, 12, 31, 23, 59, tzinfo=dt.UTC), step=dt.timedelta(0)):
            assert now() == now() == dt.datetime(1999, 12, 31, 23, 59, tzinfo=dt.UTC)
        outer.advance(dt.timedelta(days=1))
        assert now() == dt.datetime(2030, 2, 4, 4, 5, 8, tzinfo=dt.UTC)
    # Unfrozen again: the wall clock, whatever day this runs on.
    assert abs(now() - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=5)
    with pytest.raises(ValueError, match="aware datetime"), frozen(dt.datetime(2030, 1, 1)):
        pass


# --- replay-first runs --------------------------------------------------------------------------------


def twice() -> Environment:
    """A machine asking the same decision twice (the same facts, the same options), then a third one
    whose facts say what the first two answered."""

    def decide(name: str, facts: dict[str, str]) -> dict[str, Any]:
        return {
            "src": "agent.decide",
            "input": {"name": f"'{name}'", "allowedEvents": ["A", "B"], "facts": facts},
        }

    config = parse_machine(
        {
            "id": "twice",
            "version": "1",
            "initial": "first",
            "context": {"picked": "''"},
            "states": {
                "first": {
                    "invoke": decide("pick", {"n": "1"}),
                    "on": {e: {"target": "second", "assign": {"picked": f"'{e}'"}} for e in ("A", "B")},
                },
                "second": {
                    "invoke": decide("pick", {"n": "1"}),
                    "on": {
                        e: {"target": "third", "assign": {"picked": f"context.picked + '{e}'"}}
                        for e in ("A", "B")
                    },
                },
                "third": {
                    "invoke": decide("last", {"picked": "context.picked"}),
                    "on": {e: f"done{e}" for e in ("A", "B")},
                },
                "doneA": {"type": "final"},
                "doneB": {"type": "final"},
            },
        }
    )
    coin = stand_in("coin", lambda request, rng: dict(rng.choice(request.options)))
    return Environment(name="twice", config=config, actors={}, make_world=World, models={"coin": coin})


ASK = {"invoke": {"src": "model.decide", "input": {"model": "'decider'"}, "onDone": "answer"}}
ANSWER = {"type": "final", "output": "event.output"}
MODEL_DECIDES = {"id": "p", "version": "0", "initial": "ask", "states": {"ask": ASK, "answer": ANSWER}}
B_FIRST = {  # answers the third decision itself when the first two were both A, else asks the model
    "id": "p",
    "version": "1",
    "initial": "route",
    "states": {
        "route": {
            "type": "choice",
            "choice": [
                {"guard": "input.name == 'last' && facts.picked == 'AA'", "target": "b"},
                {"target": "ask"},
            ],
        },
        "b": {"type": "final", "output": {"type": "'B'"}},
        "ask": ASK,
        "answer": ANSWER,
    },
}


class Counting:
    """A stand-in, counting the calls it answers."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.answered = inner, inner.name, 0

    def answer(self, request: DecisionRequest) -> Any:
        self.answered += 1
        return self.inner.answer(request)

    def advance(self, request: DecisionRequest, number: int) -> None:
        self.inner.advance(request, number)


def replay_first_run(
    policy: dict[str, Any], seed: str, baseline: list[Any] | None
) -> tuple[list[Any], Counting, Any]:
    """A run of `twice` with `policy` and the coin seeded by `seed`, replay-first from `baseline`'s
    entries when given: its entries, its model, and its decider."""
    from improve.runtime import PolicyDecider, RecordedRun, ReplayFirstDecider, compile_policy

    env = twice()
    compiled = compile_policy(parse_machine(policy))
    model = Counting(env.models["coin"](seed))
    decider = (
        ReplayFirstDecider(compiled, {"decider": model}, {}, RecordedRun.of("t:v0:s:r1", baseline))
        if baseline is not None
        else PolicyDecider(compiled, {"decider": model}, {})
    )
    store = MemoryStore()
    note = decider.note if isinstance(decider, ReplayFirstDecider) else None
    run(
        env,
        input={},
        world=World(),
        people={},
        decider=decider,
        store=store,
        thread_id="t:v1:s:r1",
        note=note,
    )
    entries = store.read("t:v1:s:r1")
    assert replay(env.machine, entries, verify=True, thread_id="t:v1:s:r1").verification == "verified"
    return entries, model, decider


def test_a_replay_first_run_of_the_same_policy_asks_nothing_and_is_the_same_run() -> None:
    for seed in ("s:r1", "s:r2", "s:r3", "s:r4"):
        baseline, _, _ = replay_first_run(MODEL_DECIDES, seed, None)
        entries, model, decider = replay_first_run(MODEL_DECIDES, seed, baseline)
        assert model.answered == 0 and decider.reused == 3 and decider.parted is None
        # The same events, the same draws: the usage entries say what was asked, answered and reused.
        assert [e.event for e in entries if e.type != "@agent.usage"][:-1] == [
            e.event for e in baseline if e.type != "@agent.usage"
        ][:-1]
        usage = [e.event for e in entries if e.type == "@agent.usage"]
        recorded = [e.event for e in baseline if e.type == "@agent.usage"]
        assert [u["asked"] for u in usage] == [r["asked"] for r in recorded] and usage[0]["asked"] == usage[
            1
        ]["asked"]
        assert [u["answer"] for u in usage] == [r["answer"] for r in recorded]
        assert all(u["reused"] for u in usage) and not any(r.get("reused") for r in recorded)
        assert entries[-1].metadata == {
            "replayFirst": {"from": "t:v0:s:r1", "reused": 3, "asked": 0, "parted": None}
        }


def test_a_replay_first_run_asks_the_model_only_where_its_path_departs() -> None:
    seen = set()
    for n in range(1, 13):
        seed = f"s:r{n}"
        baseline, _, _ = replay_first_run(MODEL_DECIDES, seed, None)
        full, _, _ = replay_first_run(B_FIRST, seed, None)
        entries, model, decider = replay_first_run(B_FIRST, seed, baseline)
        picked = "".join(e.type for e in baseline[1:] if e.type in "AB")[:2]
        last = next(e.type for e in reversed(baseline) if e.type in "AB")
        # The same run a full re-run makes (the stand-in draws what it would have), asking nothing: the
        # candidate either asks what the baseline asked, or answers by its rule.
        unflagged = [{k: v for k, v in e.event.items() if k != "reused"} for e in entries]
        assert unflagged[:-1] == [e.event for e in full][:-1] or picked == "AA"
        assert model.answered == 0
        if picked == "AA" and last == "A":
            seen.add("parted")
            assert decider.parted is not None and (decider.parted.decision, decider.parted.name) == (
                3,
                "last",
            )
            assert "answered B where the recorded run answered A" in decider.parted.why
        else:
            seen.add("same" if picked != "AA" else "same answer by rule")
            assert decider.parted is None
    assert seen == {"parted", "same", "same answer by rule"}, seen


def test_a_stand_in_that_raises_is_named_with_its_file_and_line_not_a_traceback() -> None:
    """A stand-in model is the environment's own Python: `LIMITS[facts['memberType']]` on a misspelt
    value raised a KeyError through every command as a traceback. It is a crash of the environment's
    code, as a tool's is (exit 3, the scenario named by the suite); a model's own failure still goes to
    the policy's onError."""
    from improve.errors import ActorCrash, ModelCallError
    from improve.runtime.models import StandInModel

    limits = {"student": 5}

    def handbook(request: DecisionRequest, rng: Any) -> dict[str, Any]:
        return {"type": "PLACE"} if limits[request.facts["memberType"]] > 0 else {"type": "REFUSE"}

    def down(request: DecisionRequest, rng: Any) -> dict[str, Any]:
        raise ModelCallError("the model is down")

    request = DecisionRequest("hold", [{"type": "PLACE"}], {"memberType": "stduent"}, ["PLACE"], {})
    with pytest.raises(ActorCrash) as crashed:
        StandInModel("careful", handbook, "s").answer(request)
    said = str(crashed.value)
    assert said.startswith("stand-in model 'careful' crashed on decision 'hold': KeyError: 'stduent' (")
    assert f"{__file__}:" in said, said
    with pytest.raises(ModelCallError):
        StandInModel("careful", down, "s").answer(request)
