"""Probe requests for the explore gate: the decision requests training scenarios actually made.

From recorded threads when the store has one for the scenario (replayed to each decision, so the facts
and options are exactly what the decider saw); otherwise by running the scenario offline with the
`careful` stand-in model (deterministic; no model is called) and recording the requests it was asked.
Held-out scenarios are never used: nothing about them may shape a candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from improve.errors import MachineError
from improve.evals import Scenario, machine_stopped, run_scenario
from improve.log import END_EVENT, INIT_EVENT, USAGE_EVENT, LogEntry, MemoryStore, ThreadId, ThreadPage
from improve.machine import DECIDE_SRC, Snapshot, canonical_json, initial, transition
from improve.runtime import (
    Decision,
    DecisionRequest,
    Environment,
    PolicyDecider,
    build_request,
    compile_policy,
)

PROBE_MODEL = "careful"


class Reads(Protocol):
    """What reading recorded threads needs of a store (`improve.log.Store`, or a round's own reads)."""

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]: ...

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage: ...


def requests_in(env: Environment, entries: Sequence[LogEntry]) -> list[DecisionRequest]:
    """Replay a thread and collect the request of every decision it made."""
    found: list[DecisionRequest] = []
    snapshot: Snapshot | None = None
    for entry in entries:
        if entry.type in (USAGE_EVENT, END_EVENT):  # journal records, not events the machine takes
            continue
        if entry.type == INIT_EVENT:
            snapshot = initial(env.machine, entry.event.get("input"))
            continue
        assert snapshot is not None
        if snapshot.invoke is not None and snapshot.invoke.src == DECIDE_SRC:
            found.append(build_request(env.machine, snapshot))
        snapshot = transition(env.machine, snapshot, entry.event)
    return found


class _Recorder:
    def __init__(self, inner: PolicyDecider) -> None:
        self.inner = inner
        self.requests: list[DecisionRequest] = []

    def decide(self, request: DecisionRequest) -> Decision:
        if not request.attempts:
            self.requests.append(request)
        return self.inner.decide(request)


def first_train_threads(store: Reads) -> dict[str, str]:
    """The first recorded training thread of each scenario in the store, by scenario id."""
    recorded: dict[str, str] = {}
    for thread_id in store.list_threads(prefix="train:", limit=100_000).thread_ids:
        parsed = ThreadId.parse(thread_id)
        if parsed is not None:
            recorded.setdefault(parsed.scenario, thread_id)
    return recorded


def probe_requests(
    env: Environment,
    scenarios: Sequence[Scenario],
    store: Reads | None = None,
    requests: Mapping[str, list[DecisionRequest]] | None = None,
) -> list[DecisionRequest]:
    """One request per distinct (decision, facts, options) among the training scenarios' decisions:
    from the scenario's recorded thread in `store` (or its requests already read, `requests` by
    scenario id), else from an offline run with the careful stand-in."""
    given = dict(requests or {})
    recorded = first_train_threads(store) if store is not None else {}
    from improve.machine import parse_machine

    v0 = parse_machine(
        {
            "id": "probe",
            "version": "0",
            "initial": "ask",
            "states": {
                "ask": {"invoke": {"src": "model.decide", "onDone": "answer", "onError": "answer"}},
                "answer": {"type": "final", "output": "event.output"},
            },
        }
    )
    seen: dict[str, DecisionRequest] = {}
    for scenario in scenarios:
        if scenario.split != "train":
            continue
        try:
            if scenario.id in given:
                found = given[scenario.id]
            elif store is not None and scenario.id in recorded:
                found = requests_in(env, store.read(recorded[scenario.id]))
            else:
                decider = _Recorder(
                    PolicyDecider(compile_policy(v0), {"decider": env.models[PROBE_MODEL](scenario.id)})
                )
                # Only its requests are read: a script's answer refused on its path ends it, no more.
                run_scenario(
                    env, scenario, decider, MemoryStore(), f"probe:v0:{scenario.id}:r1", refused="end"
                )
                found = decider.requests
        except MachineError as err:
            # The machine cannot step through the scenario's decisions (an expression that fails on its
            # data): said with the scenario, as a run says it, not as a bare expression error (exit 3).
            raise machine_stopped(env, scenario, err, "its decisions, read for the probes") from None
        for request in found:
            key = canonical_json([request.name, request.facts, request.options])
            seen.setdefault(key, request)
    return list(seen.values())
