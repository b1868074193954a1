"""Suspend and resume: a run that stops waiting ends its process with the thread as its only state, and
`improve resume` (or `improve.runtime.resume`) continues it, in the same thread, in another process.

A small machine exercises the engine (the three resumable statuses, budgets, refusals, idempotency,
the resume bound); the refund desk exercises it end to end through the CLI, across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from improve.cli.main import app
from improve.errors import ResumeRefusedError
from improve.log import END_EVENT, RESUME_KEY, MemoryStore, replay
from improve.loop.gates.explore import ExploreGate
from improve.loop.gates.gate import GateContext
from improve.machine import ExploreOptions, explore_paths, parse_machine
from improve.runtime import Environment, World, prove_resumes, resume, run
from improve.runtime.decision import Decision, DecisionRequest, Usage
from tests.helpers import copy_workspace

REPO = Path(__file__).resolve().parents[1]
THREAD = "t:v0:m:s:r1"


class Scripted:
    """A decider answering from a list of event types, one per request (the last one repeats)."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked = 0

    def decide(self, request: DecisionRequest) -> Decision:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return Decision({"type": answer}, [Usage("decider", "script", 10, 1)], "script")


def worker(bounded: bool = True, resume_budget: int | None = None, version: str = "1") -> Environment:
    """Works by decisions; may checkpoint (waits `checkpointed` for RESUME) or ask (waits `blocked_ask`
    for ANSWER{text}); `bounded` counts the resumes in its context and allows two."""
    back: dict[str, Any] = {"target": "working", "assign": {"resumes": "context.resumes + 1"}}
    answer: dict[str, Any] = {
        "target": "working",
        "assign": {"answer": "event.text", "resumes": "context.resumes + 1"},
    }
    if bounded:
        back["guard"] = answer["guard"] = "context.resumes < 2"
    else:
        back, answer = {"target": "working"}, {"target": "working", "assign": {"answer": "event.text"}}
    config = parse_machine(
        {
            "id": "worker",
            "version": version,
            "initial": "working",
            "context": {"resumes": "0", "answer": "''"},
            "states": {
                "working": {
                    "invoke": {
                        "src": "agent.decide",
                        "input": {"name": "'next'", "allowedEvents": ["CHECKPOINT", "ASK", "FINISH"]},
                        "onError": "gaveUp",
                    },
                    "on": {"CHECKPOINT": "checkpointed", "ASK": "asking", "FINISH": "finished"},
                },
                "checkpointed": {"meta": {"status": "checkpointed"}, "on": {"RESUME": back}},
                "asking": {
                    "meta": {"status": "blocked_ask", "payloads": {"ANSWER": {"text": "string"}}},
                    "on": {"ANSWER": answer},
                },
                "finished": {"type": "final", "output": {"answer": "context.answer"}},
                "gaveUp": {"type": "final"},
            },
        }
    )
    probe = ExploreOptions(payloads={"ANSWER": {"text": ["yes"]}}, decide_errors=False)
    return Environment(
        name="worker",
        config=config,
        actors={},
        make_world=World,
        models={},
        resume_budget=resume_budget,
        probe=probe,
        probe_inputs=[{}],
    )


def start(env: Environment, decider: Scripted, store: MemoryStore | None = None, **kw: Any) -> MemoryStore:
    store = store or MemoryStore()
    run(env, input={}, world=World(), people={}, decider=decider, store=store, thread_id=THREAD, **kw)
    return store


def go_on(
    env: Environment, store: MemoryStore, event: Any, decider: Scripted | None = None, **kw: Any
) -> Any:
    return resume(
        env,
        store=store,
        thread_id=THREAD,
        event=event,
        decider=decider or Scripted("FINISH"),
        world=World(),
        **kw,
    )


def verified(env: Environment, store: MemoryStore) -> Any:
    result = replay(env.machine, store.read(THREAD), verify=True, thread_id=THREAD)
    assert result.verification == "verified"
    return result


# --- the engine, on a small machine ----------------------------------------------------------------


def test_a_checkpointed_run_resumes_in_the_same_thread_with_a_fresh_budget() -> None:
    env = worker(resume_budget=3)
    store = start(env, Scripted("CHECKPOINT"))
    entries = store.read(THREAD)
    end = entries[-1].event
    assert end["status"] == "checkpointed" and end["state"] == "checkpointed"
    assert [w["type"] for w in end["waitingFor"]] == ["RESUME"]
    assert verified(env, store).status == "checkpointed"

    result = go_on(env, store, {"type": "RESUME"})
    assert (result.run.status, result.run.final_state, result.duplicate) == ("done", "finished", False)
    entries = store.read(THREAD)
    resumed = entries[result.entry]
    # The event is journaled right after the wait's end entry, before anything acts on it.
    assert entries[result.entry - 1].type == END_EVENT
    assert resumed.event == {"type": "RESUME"}
    assert resumed.metadata == {
        "source": "resume",
        RESUME_KEY: {"eventId": result.event_id, "maxModelCalls": 3},
    }
    assert entries[-1].event == {"type": END_EVENT, "status": "done"}
    replayed = verified(env, store)
    assert (replayed.status, replayed.model_calls, result.run.model_calls) == ("done", 2, 2)


def test_a_run_blocked_on_a_question_resumes_with_a_typed_answer() -> None:
    env = worker()
    store = start(env, Scripted("ASK"))
    end = store.read(THREAD)[-1].event
    assert end["status"] == "blocked_ask"
    assert end["waitingFor"] == [
        {
            "type": "ANSWER",
            "payload": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": False,
            },
        }
    ]
    length = len(store.read(THREAD))
    for bad, why in [
        ({"type": "ANSWER", "text": 5}, "'ANSWER'.text must be a string, not integer"),
        ({"type": "ANSWER"}, "'ANSWER' needs the field 'text'"),
        (
            {"type": "ANSWER", "text": "x", "extra": 1},
            "'ANSWER' takes no field 'extra'; its fields are: text",
        ),
    ]:
        with pytest.raises(ResumeRefusedError, match=why) as refused:
            go_on(env, store, bad)
        assert refused.value.kind == "invalid-payload"
    with pytest.raises(ResumeRefusedError, match="accepts ANSWER, not 'RESUME'") as refused:
        go_on(env, store, {"type": "RESUME"})
    assert refused.value.kind == "unknown-event"
    assert len(store.read(THREAD)) == length  # a refusal journals nothing
    result = go_on(env, store, {"type": "ANSWER", "text": "use the staging branch"})
    assert result.run.snapshot.output == {"answer": "use the staging branch"}
    verified(env, store)


def test_without_a_resume_budget_the_run_budget_is_counted_across_resumes() -> None:
    env = worker()
    store = start(env, Scripted("CHECKPOINT"), max_model_calls=2)
    first = go_on(env, store, {"type": "RESUME"}, Scripted("CHECKPOINT"))
    assert first.run.status == "checkpointed" and first.run.model_calls == 2
    assert store.read(THREAD)[first.entry].metadata[RESUME_KEY]["maxModelCalls"] == 1  # type: ignore[index]
    second = go_on(env, store, {"type": "RESUME"}, Scripted("CHECKPOINT"))
    # Nothing left: the run stops at its next decision, and replay derives the same.
    assert (second.run.status, second.run.model_calls) == ("budget", 2)
    assert verified(env, store).status == "budget"


def test_a_guard_refuses_a_resume_past_the_machines_own_bound() -> None:
    env = worker(resume_budget=5)
    store = start(env, Scripted("CHECKPOINT"))
    go_on(env, store, {"type": "RESUME"}, Scripted("CHECKPOINT"))
    go_on(env, store, {"type": "RESUME"}, Scripted("CHECKPOINT"))
    with pytest.raises(ResumeRefusedError, match=r"rejected-by-guard: .*context.resumes < 2") as refused:
        go_on(env, store, {"type": "RESUME"})
    assert refused.value.kind == "rejected-by-guard"
    replayed = verified(env, store)
    assert (replayed.status, replayed.snapshot.context["resumes"]) == ("checkpointed", 2)


def test_the_same_event_id_twice_is_idempotent() -> None:
    env = worker()
    store = start(env, Scripted("CHECKPOINT"))
    first = go_on(env, store, {"type": "RESUME"}, event_id="hook-1")
    length = len(store.read(THREAD))
    again = go_on(env, store, {"type": "RESUME"}, event_id="hook-1")
    assert again.duplicate and not first.duplicate
    assert (again.run.status, again.run.final_state, again.entry, again.event_id) == (
        first.run.status,
        first.run.final_state,
        first.entry,
        "hook-1",
    )
    assert again.run.model_calls == first.run.model_calls
    assert len(store.read(THREAD)) == length
    with pytest.raises(ResumeRefusedError, match="event id 'hook-1' resumed thread at entry") as refused:
        go_on(env, store, {"type": "RESUME", "note": "other"}, event_id="hook-1")
    assert refused.value.kind == "event-id-reused"
    # A new id for a thread that is done: not waiting.
    with pytest.raises(
        ResumeRefusedError, match="is not waiting: it ended done in state 'finished'"
    ) as refused:
        go_on(env, store, {"type": "RESUME"}, event_id="hook-2")
    assert refused.value.kind == "not-waiting"


def test_without_an_event_id_repeating_the_same_resume_is_idempotent_too() -> None:
    env = worker()
    store = start(env, Scripted("ASK"))
    first = go_on(env, store, {"type": "ANSWER", "text": "yes"})
    again = go_on(env, store, {"type": "ANSWER", "text": "yes"})
    assert again.duplicate and again.event_id == first.event_id and again.entry == first.entry
    with pytest.raises(ResumeRefusedError) as refused:
        go_on(env, store, {"type": "ANSWER", "text": "no"})  # another event: the thread no longer waits
    assert refused.value.kind == "not-waiting"


class Crashing(MemoryStore):
    """A store whose process dies right after the append that journals a resume's event: the worst
    moment, the event taken and nothing acted on it yet."""

    def append(self, thread_id: str, expected_index: int, entries: Any) -> int:
        length = super().append(thread_id, expected_index, entries)
        if any(RESUME_KEY in (e.metadata or {}) for e in entries):
            raise SystemExit("killed")
        return length


def crashed_mid_resume(env: Environment) -> MemoryStore:
    store = start(env, Scripted("ASK"), Crashing())
    with pytest.raises(SystemExit):
        go_on(env, store, {"type": "ANSWER", "text": "yes"})
    entries = store.read(THREAD)
    assert entries[-1].type != END_EVENT and RESUME_KEY in (entries[-1].metadata or {})
    return store


def test_a_resume_interrupted_after_its_event_is_finished_by_the_same_resume() -> None:
    env = worker()
    store = crashed_mid_resume(env)
    finished = go_on(env, store, {"type": "ANSWER", "text": "yes"})
    assert finished.finished and not finished.duplicate
    assert (finished.run.status, finished.run.final_state) == ("done", "finished")
    entries = store.read(THREAD)
    assert sum(RESUME_KEY in (e.metadata or {}) for e in entries) == 1  # the event is not journaled twice
    assert verified(env, store).status == "done"
    assert go_on(env, store, {"type": "ANSWER", "text": "yes"}).duplicate  # and now it is a repeat


def test_an_interrupted_resume_refuses_other_events_and_finish_finishes_it() -> None:
    env = worker()
    store = crashed_mid_resume(env)
    length = len(store.read(THREAD))
    with pytest.raises(ResumeRefusedError, match="was interrupted while being resumed") as refused:
        go_on(env, store, {"type": "ANSWER", "text": "no"})
    assert refused.value.kind == "interrupted" and "--finish" in str(refused.value)
    assert len(store.read(THREAD)) == length
    finished = go_on(env, store, {"type": "RESUME"}, finish=True)  # the event given is not used
    assert finished.finished and finished.run.status == "done"
    assert verified(env, store).snapshot.context["answer"] == "yes"
    again = go_on(env, store, None, finish=True)  # finishing again answers as the resume that ended
    assert again.duplicate and again.run.status == "done"
    with pytest.raises(ResumeRefusedError) as refused:
        go_on(env, start(env, Scripted("ASK")), None, finish=True)
    assert refused.value.kind == "not-interrupted"


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ({"type": "ANSWER", "text": float("nan")}, "must be finite"),
        ({"type": "ANSWER", "text": "\ud800"}, "not Unicode text"),
        ({"type": "ANSWER", "text": "x" * 70_000}, "at most 65,536 bytes"),
        (
            {"type": "ANSWER", "text": "yes", "deep": json.loads('{"a":' * 40 + "1" + "}" * 40)},
            "deeper than 32",
        ),
        ({"type": "ANSWER", "text": None}, r"needs the field 'text' \(it is null\)"),
    ],
)
def test_an_event_past_the_bounds_is_refused_before_anything_is_written(event: Any, problem: str) -> None:
    env = worker()
    store = start(env, Scripted("ASK"))
    length = len(store.read(THREAD))
    with pytest.raises(ResumeRefusedError, match=problem) as refused:
        go_on(env, store, event)
    assert refused.value.kind == "invalid-payload"
    assert len(store.read(THREAD)) == length


def test_a_tampered_thread_or_a_changed_environment_is_refused() -> None:
    env = worker()
    store = start(env, Scripted("ASK"))
    with pytest.raises(ResumeRefusedError, match="the environment changed since the run stopped") as refused:
        go_on(worker(version="2"), store, {"type": "ANSWER", "text": "yes"})
    assert refused.value.kind == "version-changed"

    entries = store.read(THREAD)
    forged = MemoryStore()
    edited = entries[1].model_copy(update={"event": {"type": "FINISH"}})  # what the decider said, changed
    forged.append(THREAD, 0, [entries[0], edited, *entries[2:]])
    with pytest.raises(ResumeRefusedError, match="does not verify, so it is not resumed") as refused:
        go_on(env, forged, {"type": "ANSWER", "text": "yes"})
    assert refused.value.kind == "does-not-verify"
    with pytest.raises(ResumeRefusedError) as refused:
        go_on(env, MemoryStore(), {"type": "ANSWER", "text": "yes"})
    assert refused.value.kind == "not-found"


def test_a_resumed_threads_end_entries_are_checked_on_replay() -> None:
    # A waiting end entry in the middle is evidence too: rewriting its status is caught.
    from improve.errors import DivergenceError
    from improve.log import seal

    env = worker()
    store = start(env, Scripted("ASK"))
    go_on(env, store, {"type": "ANSWER", "text": "yes"})
    entries = store.read(THREAD)
    middle = next(i for i, e in enumerate(entries) if e.type == END_EVENT)
    changed = entries[middle].model_copy(
        update={"event": {**entries[middle].event, "status": "checkpointed"}}
    )
    # Chained again after the change, as a forger would: only the status check can see it.
    forged, previous = [], THREAD
    for entry in [*entries[:middle], changed, *entries[middle + 1 :]]:
        forged.append(seal(entry, previous))
        previous = forged[-1].verification.entryHash  # type: ignore[union-attr]
    with pytest.raises(
        DivergenceError, match="recorded status 'checkpointed' as it ended, replay derives 'blocked_ask'"
    ):
        replay(env.machine, forged, verify=True, thread_id=THREAD)


def test_what_a_waiting_state_declares_is_checked_when_the_machine_compiles() -> None:
    from improve.errors import MachineConfigError
    from improve.machine import compile_machine

    def compiled(meta: dict[str, Any], on: dict[str, Any] | None = None, invoke: bool = False) -> None:
        state: dict[str, Any] = {"meta": meta, "on": on or {"GO": "end"}}
        if invoke:
            state["invoke"] = {"src": "tool", "onDone": "end"}
        config = {
            "id": "m",
            "version": "1",
            "initial": "wait",
            "states": {"wait": state, "end": {"type": "final"}},
        }
        compile_machine(parse_machine(config))

    compiled({"status": "blocked_ask", "payloads": {"GO": {"text": "string", "n": "integer?"}}})
    with pytest.raises(MachineConfigError, match="'done' is not a status a run can wait in"):
        compiled({"status": "done"})
    with pytest.raises(MachineConfigError, match="only a waiting state"):
        compiled({"status": "checkpointed"}, invoke=True)
    with pytest.raises(MachineConfigError, match="accepts no event 'STOP'"):
        compiled({"payloads": {"STOP": {"why": "string"}}})
    with pytest.raises(MachineConfigError, match="'text' is not a type"):
        compiled({"payloads": {"GO": {"why": "text"}}})


# --- the resume bound ------------------------------------------------------------------------------


def test_exploration_bounds_the_resumes_of_a_machine_that_counts_them() -> None:
    env = worker(resume_budget=10)
    assert env.probe is not None
    bound = explore_paths(env.machine, {}, env.probe).resumes
    assert bound is not None and bound.max_resumes == 2
    assert bound.waiting_states == ["asking", "checkpointed"]
    proof = prove_resumes(env)
    assert proof.holds and proof.most_calls(100) == 120
    assert "at most 2 resume(s) on any path" in proof.summary(100)


def test_an_unbounded_resume_loop_is_reported_with_its_witness() -> None:
    env = worker(bounded=False, resume_budget=10)
    assert env.probe is not None
    bound = explore_paths(env.machine, {}, env.probe).resumes
    assert bound is not None and bound.max_resumes is None
    assert bound.loop is not None and bound.loop_state in ("asking", "checkpointed")
    # The witness reaches the waiting state, then goes round back to it: resumed, then waiting again.
    types = [e["type"] for e in bound.loop]
    assert types[0] in ("CHECKPOINT", "ASK") and types[-2] in ("RESUME", "ANSWER") and types[-1] == types[0]
    proof = prove_resumes(env)
    assert not proof.holds and proof.most_calls(100) is None
    assert "unbounded resume loop" in proof.summary(100)
    gate = ExploreGate().run(GateContext(env=env))
    assert not gate.ok and "unbounded resume loop" in gate.detail
    assert ExploreGate().run(GateContext(env=worker(bounded=True, resume_budget=10))).ok
    # Sharing the run's budget, the same loop cannot outspend it.
    assert prove_resumes(worker(bounded=False)).holds


# --- the refund desk, across processes -------------------------------------------------------------


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real CLI in a new process, as a person (or a webhook handler) would run it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "improve.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def desk(root: Path) -> Path:
    result = CliRunner().invoke(app, ["init", str(root), "--from", "refund-approval"])
    assert result.exit_code == 0, result.output
    return root


SCENARIO = "large-approved-01"
APPROVAL = "train:v0:careful:large-approved-01:r1"


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def here(*args: str, space: Path) -> Any:
    """A read of what the processes left (or a run to compare with), in this process: what crosses
    processes is the suspend and the resumes, and a new interpreter costs a second of CPU each."""
    result = CliRunner().invoke(app, [*args, "-w", str(space)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow
def test_the_refund_desk_waits_for_approval_then_resumes_in_a_new_process_and_scores_as_uninterrupted(
    tmp_path: Path,
) -> None:
    space = desk(tmp_path / "suspended")
    # Process 1: the run reaches the approval wait, nobody answers, the process ends.
    ran = as_json(
        cli("run", "--scenario", SCENARIO, "--model", "careful", "--k", "1", "--suspend", "--json", cwd=space)
    )
    assert [(t["final_state"], t["status"]) for t in ran["threads"]] == [("approving", "waiting")]
    end = json.loads((space / "traces" / f"{APPROVAL}.jsonl").read_text().splitlines()[-1])["event"]
    assert end["status"] == "waiting" and end["state"] == "approving"
    assert [w["type"] for w in end["waitingFor"]] == ["APPROVE", "REJECT"]
    waiting = here("waiting", "--json", space=space)["waiting"]
    assert [(w["thread"], w["state"], w["events"]) for w in waiting] == [
        (APPROVAL, "approving", ["APPROVE", "REJECT"])
    ]

    # Process 2: a person approves.
    event = json.dumps({"type": "APPROVE", "approver": "dana"})
    resumed = as_json(
        cli("resume", APPROVAL, "--event", event, "--event-id", "approval-7", "--json", cwd=space)
    )
    assert (resumed["status"], resumed["final_state"], resumed["duplicate"], resumed["passed"]) == (
        "done",
        "issued",
        False,
        True,
    )
    lines = [json.loads(line) for line in (space / "traces" / f"{APPROVAL}.jsonl").read_text().splitlines()]
    approve = lines[resumed["entry"]]
    assert approve["event"] == {"type": "APPROVE", "approver": "dana"}
    assert approve["metadata"]["resume"]["eventId"] == "approval-7"
    assert here("waiting", "--json", space=space)["waiting"] == []

    # Process 3: the same delivery again changes nothing.
    again = as_json(
        cli("resume", APPROVAL, "--event", event, "--event-id", "approval-7", "--json", cwd=space)
    )
    assert again["duplicate"] and again["entry"] == resumed["entry"] and again["status"] == "done"
    assert len((space / "traces" / f"{APPROVAL}.jsonl").read_text().splitlines()) == len(lines)

    # The thread verifies end to end.
    verify = here("replay", APPROVAL, "--verify", "--json", space=space)
    assert [(t["verification"], t["status"], t["final_state"]) for t in verify["threads"]] == [
        ("verified", "done", "issued")
    ]
    # The approver's name edited in the entry that resumed it: its content changed (it stands after the
    # waiting run's end entry by right, so it is not called inserted).
    edited = space / "edited"
    edited.mkdir()
    copy = [dict(line) for line in lines]
    copy[resumed["entry"]] = {**copy[resumed["entry"]], "event": {"type": "APPROVE", "approver": "mallory"}}
    (edited / f"{APPROVAL}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in copy))
    tampered = CliRunner().invoke(app, ["replay", str(edited), "--verify", "--json", "-w", str(space)])
    assert tampered.exit_code == 1, tampered.output
    (found,) = json.loads(tampered.stdout)["threads"]
    assert (found["entry"], found["kind"]) == (resumed["entry"], "changed"), found

    # It scores like an uninterrupted run of the same scenario, policy and model.
    whole = desk(tmp_path / "uninterrupted")
    straight = here("run", "--scenario", SCENARIO, "--model", "careful", "--k", "1", "--json", space=whole)
    rescored = here("run", "--scenario", SCENARIO, "--model", "careful", "--k", "1", "--json", space=space)
    keys = (
        "thread",
        "final_state",
        "status",
        "passed",
        "reason",
        "output",
        "effects",
        "violations",
        "model_calls",
    )

    def row(doc: dict[str, Any]) -> dict[str, Any]:
        (thread,) = doc["threads"]
        return {k: thread.get(k) for k in keys}

    assert row(rescored) == row(straight)
    assert row(rescored)["passed"] is True
    assert rescored["summary"] == straight["summary"]


def test_resume_refuses_what_the_wait_does_not_accept_with_exit_1_and_the_reason(tmp_path: Path) -> None:
    space = desk(tmp_path / "ws")
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        return runner.invoke(app, list(args))

    ran = runner.invoke(
        app, ["run", "-w", str(space), "--scenario", SCENARIO, "--model", "careful", "--suspend"]
    )
    assert ran.exit_code == 0, ran.output
    refused = invoke("resume", APPROVAL, "-w", str(space), "--answer", "yes", "--json")
    assert refused.exit_code == 1
    document = json.loads(refused.stdout)
    assert document["refused"] == "unknown-event"
    assert "accepts APPROVE, REJECT, not 'ANSWER'" in document["reason"]
    # Its file's path names it too, as `replay` takes one; a path elsewhere is a usage error, said so.
    by_path = str(space / "traces" / f"{APPROVAL}.jsonl")
    refused = invoke("resume", by_path, "-w", str(space), "--answer", "yes", "--json")
    assert refused.exit_code == 1 and json.loads(refused.stdout)["refused"] == "unknown-event"
    elsewhere = invoke("resume", str(tmp_path / "x.jsonl"), "-w", str(space), "--answer", "yes")
    assert elsewhere.exit_code == 2 and "not a thread file of this workspace" in elsewhere.output
    untyped = invoke("resume", APPROVAL, "-w", str(space), "--event", '{"approver": "dana"}')
    assert untyped.exit_code == 1 and 'the event {"approver": "dana"} is not an object with a' in " ".join(
        untyped.output.split()
    )  # as JSON, as it was typed (a Python repr read {'approver': 'dana'})
    bad = invoke("resume", APPROVAL, "-w", str(space), "--event", "{not json")
    assert bad.exit_code == 2 and "--event is not JSON" in bad.output
    # Its example is an event this thread waits for (a fixed one named another desk's fields).
    assert """e.g. --event '{"type": "APPROVE", "approver": "..."}'""" in " ".join(bad.output.split())
    rejected = invoke(
        "resume", APPROVAL, "-w", str(space), "--event", '{"type": "REJECT", "reason": "no receipt"}'
    )
    assert rejected.exit_code == 0, rejected.output
    assert "done in state 'rejected'" in rejected.stdout and "FAIL" in rejected.stdout
    late = invoke("resume", APPROVAL, "-w", str(space), "--event", '{"type": "APPROVE"}')
    assert late.exit_code == 1 and "is not waiting: it ended done in state 'rejected'" in late.output
    # A thread that never waited has nothing to finish, and no --event to give either (it said to).
    small = runner.invoke(app, ["run", "-w", str(space), "--scenario", "small-01", "--model", "careful"])
    assert small.exit_code == 0, small.output
    never = invoke("resume", "train:v0:careful:small-01:r1", "-w", str(space), "--finish")
    said = " ".join(never.output.split())
    assert never.exit_code == 1 and "there is nothing to resume" in said and "--event" not in said, said


def test_ingest_carries_what_a_thread_waits_for_into_any_warehouse(tmp_path: Path) -> None:
    space = desk(tmp_path / "ws")
    runner = CliRunner()
    ran = runner.invoke(app, ["run", "-w", str(space), "--split", "train", "--model", "careful", "--suspend"])
    assert ran.exit_code == 0, ran.output
    other = tmp_path / "other.duckdb"
    ingested = runner.invoke(app, ["ingest", "-w", str(space), str(space / "traces"), "--db", str(other)])
    assert ingested.exit_code == 0, ingested.output
    listed = runner.invoke(app, ["waiting", "-w", str(space), "--db", str(other), "--json"])
    assert listed.exit_code == 0, listed.output
    waiting = json.loads(listed.stdout)["waiting"]
    # Every train scenario the careful model escalates waits for its approval; the others ended.
    threads = sorted(p.stem for p in (space / "traces").glob("*.jsonl"))
    ends = {
        t: json.loads((space / "traces" / f"{t}.jsonl").read_text().splitlines()[-1])["event"]
        for t in threads
    }
    expected = sorted(t for t, e in ends.items() if e["status"] == "waiting")
    assert expected and sorted(w["thread"] for w in waiting) == expected
    for w in waiting:
        assert w["waiting_for"] == ends[w["thread"]]["waitingFor"] and w["resumes"] == 0
    table = runner.invoke(app, ["waiting", "-w", str(space), "--db", str(other)])
    assert "APPROVE{approver?}, REJECT{reason?}" in table.stdout


def test_a_resume_killed_after_its_event_is_listed_interrupted_and_finished_by_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from improve.log import store as store_module

    space = desk(tmp_path / "ws")
    runner = CliRunner()
    ran = runner.invoke(
        app, ["run", "-w", str(space), "--scenario", SCENARIO, "--model", "careful", "--k", "1", "--suspend"]
    )
    assert ran.exit_code == 0, ran.output
    append = store_module.JsonlDirStore.append

    def killed(self: Any, thread_id: str, expected_index: int, entries: Any) -> int:
        length = append(self, thread_id, expected_index, entries)
        if any(RESUME_KEY in (e.metadata or {}) for e in entries):
            raise SystemExit(137)  # the process dies: nothing after the event is written
        return length

    monkeypatch.setattr(store_module.JsonlDirStore, "append", killed)
    approve = ["resume", APPROVAL, "-w", str(space), "--event", '{"type": "APPROVE", "approver": "dana"}']
    assert runner.invoke(app, approve).exit_code == 137
    monkeypatch.undo()
    assert runner.invoke(app, ["ingest", "-w", str(space), str(space / "traces")]).exit_code == 0
    listed = json.loads(runner.invoke(app, ["waiting", "-w", str(space), "--json"]).stdout)["waiting"]
    assert [(w["thread"], w["status"], w["state"], w["events"]) for w in listed] == [
        (APPROVAL, "interrupted", "approving", [])
    ]
    other = runner.invoke(app, ["resume", APPROVAL, "-w", str(space), "--event", '{"type": "REJECT"}'])
    assert other.exit_code == 1 and f"improve resume {APPROVAL} --finish" in " ".join(other.output.split())
    finished = runner.invoke(app, ["resume", APPROVAL, "-w", str(space), "--finish", "--json"])
    assert finished.exit_code == 0, finished.output
    doc = json.loads(finished.stdout)
    assert (doc["finished"], doc["status"], doc["final_state"], doc["passed"]) == (
        True,
        "done",
        "issued",
        True,
    )
    assert json.loads(runner.invoke(app, ["waiting", "-w", str(space), "--json"]).stdout)["waiting"] == []


def test_a_desk_with_tools_resumes_on_its_world_rebuilt_from_the_fixture_and_the_thread(
    tmp_path: Path,
) -> None:
    # The refund desk's tools act on its world before the approval wait (lookups, the approval request):
    # the resumed run acts on the fixture brought to where the run stopped, and its effects are whole.
    runner = CliRunner()
    space = tmp_path / "refunds"
    assert runner.invoke(app, ["init", str(space), "--from", "refunds"]).exit_code == 0
    thread = "train:v0:careful:large-refund-approved-01:r1"
    scenario = ["--scenario", "large-refund-approved-01", "--model", "careful", "--k", "1", "-w", str(space)]
    ran = runner.invoke(app, ["run", *scenario, "--suspend", "--json"])
    assert ran.exit_code == 0, ran.output
    assert [t["status"] for t in json.loads(ran.stdout)["threads"]] == ["waiting"]
    before = (space / "scenarios" / "refunds.yaml").read_text()

    # A fixture that no longer answers the recorded lookup as the thread says is refused.
    (space / "scenarios" / "refunds.yaml").write_text(
        before.replace("total: 140, refunded: 0", "total: 90, refunded: 0")
    )
    changed = runner.invoke(
        app, ["resume", thread, "-w", str(space), "--event", '{"type": "APPROVE", "approver": "dana"}']
    )
    assert changed.exit_code == 1 and "the fixture changed since the run stopped" in changed.output
    (space / "scenarios" / "refunds.yaml").write_text(before)

    resumed = runner.invoke(
        app,
        ["resume", thread, "-w", str(space), "--event", '{"type": "APPROVE", "approver": "dana"}', "--json"],
    )
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["passed"] is True
    scored = runner.invoke(app, ["run", *scenario, "--json"])
    (row,) = json.loads(scored.stdout)["threads"]
    assert [e["kind"] for e in row["effects"]] == ["approval-requested", "approval-given", "refund"]
    assert (row["final_state"], row["passed"]) == ("issued", True)


def test_a_run_its_people_script_answered_is_run_again_to_wait_under_suspend(tmp_path: Path) -> None:
    """`improve run --suspend` asks for runs that stop at their first wait: a recorded run of the same
    stamp that the scenario's people script answered is not reused (nothing would wait), it runs again
    and waits; one already waiting is reused as it is."""
    space = desk(tmp_path / "desk")
    args = ["run", "--scenario", SCENARIO, "--model", "careful", "--k", "1", "--json", "-w", str(space)]
    answered = json.loads(CliRunner().invoke(app, args).stdout)["threads"]
    assert [(t["final_state"], t["status"]) for t in answered] == [("issued", "done")]
    for _ in range(2):
        suspended = CliRunner().invoke(app, [*args, "--suspend"])
        waits = json.loads(suspended.stdout)["threads"]
        assert [(t["final_state"], t["status"]) for t in waits] == [("approving", "waiting")]
        # A run only waiting for a person is no failure of the policy: its summary said pass rate 0.000.
        summary = json.loads(suspended.stdout)["summary"]
        assert (summary["runs"], summary["waiting"]) == (0, 1), summary
        assert "1 of 1 run(s) wait for a person (--suspend), not scored" in suspended.stderr
    # An event without a type is refused with an example the state waits for (not another desk's).
    typeless = CliRunner().invoke(
        app, ["resume", answered[0]["thread_id"], "--event", '{"x": 1}', "-w", str(space)]
    )
    assert typeless.exit_code == 1 and "accepts APPROVE, REJECT" in typeless.output, typeless.output
    # Nor is it scored as a failure: it has no outcome yet.
    split = answered[0]["thread_id"].split(":")[0]
    score = CliRunner().invoke(app, ["score", "-w", str(space), "-p", "v0", "-m", "careful", "-s", split])
    assert "1 run(s) of v0 with model careful still wait for a person" in score.stderr, score.output
    # The other way round: a run that reads the people scripts runs a thread nobody resumed again, its
    # script answering the wait. Reused, a waiting run was scored as a failure of the policy.
    again = json.loads(CliRunner().invoke(app, args).stdout)["threads"]
    assert [(t["final_state"], t["status"], t["passed"]) for t in again] == [("issued", "done", True)]


def test_a_wait_no_person_of_the_scenario_answers_is_scored_as_run_scores_it(tmp_path: Path) -> None:
    """A scenario whose people script does not answer the wait: its run ends there for good, a failure
    for `run` and a round. `score` left it out as waiting for a person (a desk's referrals no pharmacist
    answered: 0.800 where run said 0.500); it scores it as they do."""
    space = desk(tmp_path / "desk")
    path = space / "scenarios" / "refund-approval.yaml"
    text = path.read_text()
    script = "    people:\n      approving: [{type: APPROVE, approver: dana}]\n"
    assert script in text
    path.write_text(text.replace(script, "", 1))
    args = ["-w", str(space), "--model", "careful", "--split", "train"]
    ran = CliRunner().invoke(app, ["run", *args, "--k", "1", "--json"])
    threads = json.loads(ran.stdout)["threads"]
    (waiting,) = [t for t in threads if t["status"] == "waiting"]
    assert waiting["scenario"] == SCENARIO and not waiting["passed"]
    score = CliRunner().invoke(app, ["score", *args, "-p", "v0", "--json"])
    assert score.exit_code == 0, score.output
    assert "wait for a person" not in score.stderr
    (card,) = json.loads(score.stdout)["scorecards"]
    assert card["runs"] == len(threads), card
    (scored,) = [c for c in card["scenarios"] if c["scenario"] == SCENARIO]
    assert (scored["runs"], scored["passed"], scored["outcomes"]) == (1, 0, {"approving": 1}), scored
    # Run again, it is reused: it would only wait there again (each time at a model's cost).
    thread = space / "traces" / f"{waiting['thread_id']}.jsonl"
    before = thread.read_bytes()
    again = CliRunner().invoke(app, ["run", *args, "--k", "1"])
    assert again.exit_code == 0 and "left waiting" not in again.stderr, again.output
    assert thread.read_bytes() == before


def test_a_deployed_agents_run_that_waits_is_resumed_by_the_agent(tmp_path: Path) -> None:
    """`improve.evals.deploy`: a live run that reaches the approval ends waiting in traces/production/;
    the agent resumes it with the approver's event, in the same thread, once (the same event id twice
    changes nothing), and a thread that is not waiting is refused."""
    from improve.evals import Workspace, deploy

    ws = tmp_path / "desk"
    assert CliRunner().invoke(app, ["init", str(ws), "--from", "refund-approval"]).exit_code == 0
    agent = deploy(Workspace.load(ws / "improve.toml"), "v0", model="careful")
    ticket = {"amount": 250, "reason": "The monitor arm arrived bent in transit."}
    waited = agent.run(ticket, agent.env.make_world({}), thread_id="prod-1")
    assert waited.status == "waiting" and (ws / "traces" / "production" / "prod-1.jsonl").is_file()
    approve = {"type": "APPROVE", "approver": "dana"}
    done = agent.resume("prod-1", approve, agent.env.make_world({}), event_id="e-1")
    assert done.run.status == "done" and done.run.final_state == "issued" and not done.duplicate
    again = agent.resume("prod-1", approve, agent.env.make_world({}), event_id="e-1")
    assert again.duplicate and again.entry == done.entry
    with pytest.raises(ResumeRefusedError):
        agent.resume("prod-1", approve, agent.env.make_world({}), event_id="e-2")
    # From the command line its world would have to be rebuilt from the thread, and this desk has no
    # world_from_thread: refused, saying so and what to do (not "no thread", not a guessed world).
    waits = agent.run(ticket, agent.env.make_world({}), thread_id="prod-2")
    assert waits.status == "waiting"
    refused = CliRunner().invoke(app, ["resume", "prod-2", "--event", json.dumps(approve), "-w", str(ws)])
    assert (
        refused.exit_code == 1 and "world_from_thread" in refused.stderr and "Agent.resume" in refused.stderr
    )


def test_a_deployed_agents_waiting_run_is_found_resumed_and_recorded_from_the_command_line(
    tmp_path: Path,
) -> None:
    """`improve waiting` lists a deployed agent's run waiting for approval in traces/production/;
    `improve resume ID` finds it there, rebuilds its world with the desk's world_from_thread (checked
    against every recorded tool call), goes on, and records it: it no longer waits. `improve replay ID`
    finds it too."""
    from improve.evals import Workspace, deploy

    ws = copy_workspace(tmp_path / "ws")
    agent = deploy(Workspace.load(ws / "improve.toml"), "v0", model="careful")
    world = {
        "customers": {"C-9": {"refundsLast90d": 0, "accountAgeDays": 400}},
        "orders": {"O-9": {"customerId": "C-9", "total": 240, "refunded": 0, "deliveredDaysAgo": 4}},
    }
    ticket = {"ticket": "The lamp arrived broken.", "customerId": "C-9", "orderId": "O-9", "amount": 240}
    assert agent.run(ticket, agent.env.make_world(world), thread_id="prod-9").status == "waiting"
    production = ws / "traces" / "production"
    assert CliRunner().invoke(app, ["ingest", str(production), "-w", str(ws)]).exit_code == 0
    listed = json.loads(CliRunner().invoke(app, ["waiting", "--json", "-w", str(ws)]).stdout)["waiting"]
    assert [w["thread"] for w in listed] == ["prod-9"]
    # An evaluation run left waiting is listed too, unless only a deployed agent's are asked for.
    args = ["--scenario", "large-refund-approved-01", "--model", "careful", "--k", "1", "-w", str(ws)]
    assert CliRunner().invoke(app, ["run", *args, "--suspend"]).exit_code == 0
    every = json.loads(CliRunner().invoke(app, ["waiting", "--json", "-w", str(ws)]).stdout)["waiting"]
    only = CliRunner().invoke(app, ["waiting", "--json", "--production", "-w", str(ws)]).stdout
    assert len(every) == 2 and [w["thread"] for w in json.loads(only)["waiting"]] == ["prod-9"]
    event = json.dumps({"type": "APPROVE", "approver": "dana"})
    resumed = CliRunner().invoke(app, ["resume", "prod-9", "--event", event, "--json", "-w", str(ws)])
    assert resumed.exit_code == 0, resumed.output
    assert (json.loads(resumed.stdout)["status"], json.loads(resumed.stdout)["final_state"]) == (
        "done",
        "issued",
    )
    # No labelled scenario: not scored, as the warehouse has it (it said "FAIL:" with no reason).
    assert json.loads(resumed.stdout)["passed"] is None
    assert "no labelled scenario" in json.loads(resumed.stdout)["reason"]
    waiting = CliRunner().invoke(app, ["waiting", "--json", "--production", "-w", str(ws)]).stdout
    assert json.loads(waiting)["waiting"] == []
    replayed = CliRunner().invoke(app, ["replay", "prod-9", "--verify", "-w", str(ws)])
    assert replayed.exit_code == 0 and "issued" in replayed.stdout, replayed.output
    # The whole of traces/ replays its production/ too, as ingest reads it.
    every = CliRunner().invoke(app, ["replay", str(ws / "traces"), "--json", "-w", str(ws)])
    assert every.exit_code == 0 and "prod-9" in {t["thread"] for t in json.loads(every.stdout)["threads"]}
