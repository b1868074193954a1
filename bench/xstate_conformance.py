"""`python -m bench.xstate_conformance` (part of `make conformance`): exported machines run in XState.

Every bundled environment's recorded threads (its open scenarios run once with each stand-in model
and its v0 policy) are folded twice: through the Python interpreter, and through XState v5 with the
host (`improve/machine/xstate_host/host.mjs`) over the machine `improve describe --format xstate`
exports. Actors are answered from the thread (its recorded `xstate.done.actor` / `xstate.error.actor`
entries, as replay answers them); named guards, host code in Python, are answered in XState from the
verdicts Python gave on the same thread, keyed by guard, params, context and event, so XState asking
one anywhere Python did not is reported. A thread differs when the state and status after any event,
the final context or the output differ (numbers compare by value: `90` is `90.0`).

Besides, up to `--explore` paths per environment that the exploration walks (probe inputs, boundary
payloads, refused events, failing actors) are compared the same way.

Prints JSON: per environment and in total, threads replayed, identical and differing (and the same for
the explored paths), with the first few differences. Exits 1 when any differs. Without Node, or when npm cannot install the pinned
packages, prints `{"skipped": reason}` and exits 0. Not a test: the first run downloads from npm.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.xstate_node import NodeUnavailable, install, pins, run_driver
from improve.errors import ImproveError
from improve.evals import run_scenario
from improve.evals.scenarios import load_scenarios
from improve.log import JsonlDirStore, LogEntry, Store
from improve.machine import (
    ExploreOptions,
    GuardFn,
    MachineConfig,
    branches,
    compile_machine,
    initial,
    to_xstate,
    transition,
)
from improve.runtime import Environment, load_environment
from improve.runtime.policy import PolicyDecider, compile_policy, load_policy

ENVIRONMENTS = ("refunds", "refund-approval", "tool-loop", "code-agent", "triage")
SHOWN_DIFFS = 5


def plain(value: Any) -> Any:
    """A JSON value with whole floats as ints, the form both sides compare (and key guards) in."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def canonical(value: Any) -> str:
    """The driver's `canonical`: sorted keys, compact, non-ASCII kept."""
    return json.dumps(plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- threads --------------------------------------------------------------------------------------


def record_threads(env: Environment, store: Store, runs: int = 1, first_run: int = 1) -> list[str]:
    """Run every open scenario `runs` times (numbered from `first_run`) with each stand-in model under the
    v0 policy, seeded by scenario and run; the thread ids."""
    assert env.home is not None, f"{env.name} ships no scenarios"
    scenarios = load_scenarios(env.home / "scenarios.yaml").open_scenarios
    policy = compile_policy(load_policy(env.home / "policies" / "v0.json"))
    ids = []
    for model in sorted(env.models):
        for scenario in scenarios:
            for r in range(first_run, first_run + runs):
                thread_id = f"{scenario.split}:v0:{model}:{scenario.id}:r{r}"
                decider = PolicyDecider(policy, {"decider": env.models[model](f"{scenario.id}:{r}")})
                run_scenario(env, scenario, decider, store, thread_id, stamp={"model": model})
                ids.append(thread_id)
    return ids


@dataclass(frozen=True, slots=True)
class Sequence:
    """A thread as both folds read it: the input, then the events that move the machine."""

    id: str
    input: Any
    events: list[dict[str, Any]]


def sequence(thread_id: str, entries: list[LogEntry]) -> Sequence:
    events = [e.event for e in entries[1:] if not str(e.event.get("type", "")).startswith("@agent.")]
    return Sequence(thread_id, entries[0].event.get("input"), events)


def explored_sequences(env: Environment, limit: int) -> list[Sequence]:
    """Paths the exploration walks (the environment's probe inputs, boundary payloads, every actor
    output and failure), depth-first, at most `limit`: one sequence wherever a path ends (a final state,
    nothing left to try, a snapshot seen before) and one ending in each event no transition takes."""
    machine = env.machine
    opts = env.probe or ExploreOptions()
    inputs: list[Any] = list(env.probe_inputs) or [None]
    out: list[Sequence] = []
    for k, inp in enumerate(inputs):
        budget = len(out) + max(1, limit // len(inputs))
        try:
            start = initial(machine, inp)
        except ImproveError:
            out.append(Sequence(f"explore:{k}:{len(out)}", inp, []))
            continue
        seen = {start.hash()}
        stack: list[tuple[Any, list[dict[str, Any]]]] = [(start, [])]
        while stack and len(out) < budget:
            snap, path = stack.pop()
            events, cut = branches(machine, snap, opts) if snap.status == "active" else ([], None)
            if cut or not events or len(path) >= opts.max_depth:
                out.append(Sequence(f"explore:{k}:{len(out)}", inp, path))
                continue
            for event in events:
                try:
                    nxt = transition(machine, snap, event)
                except ImproveError:
                    nxt = None  # an expression fails on this event: both folds must fail on it
                if nxt is None or nxt is snap or nxt.hash() in seen:
                    out.append(Sequence(f"explore:{k}:{len(out)}", inp, [*path, event]))
                    continue
                seen.add(nxt.hash())
                stack.append((nxt, [*path, event]))
    return out[:limit]


# --- the Python side ------------------------------------------------------------------------------


@dataclass
class Fold:
    steps: list[list[str]] = field(default_factory=list)
    context: Any = None
    output: Any = None
    status: str = ""
    failure: str | None = None
    guards: dict[str, bool] = field(default_factory=dict)


def python_fold(env: Environment, seq: Sequence) -> Fold:
    """The interpreter's fold of `seq` through `env`'s machine."""
    return fold_machine(env.config, env.guards, set(env.actors), seq)


def fold_machine(
    config: MachineConfig, guards: Mapping[str, GuardFn], actors: set[str], seq: Sequence
) -> Fold:
    """The interpreter's fold of `seq`, with every named guard's verdict recorded for the driver."""
    fold = Fold()

    def recording(name: str, fn: GuardFn) -> GuardFn:
        def guard(context: Mapping[str, Any], event: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
            verdict = fn(context, event, params)
            fold.guards[canonical([name, params, context, event])] = verdict
            return verdict

        return guard

    machine = compile_machine(config, guards={k: recording(k, f) for k, f in guards.items()}, actors=actors)
    try:
        snap = initial(machine, seq.input)
        fold.steps.append([snap.value, snap.status])
        for event in seq.events:
            snap = transition(machine, snap, event)
            fold.steps.append([snap.value, snap.status])
    except ImproveError as err:
        fold.failure = str(err).splitlines()[0]
        return fold
    fold.context, fold.output, fold.status = plain(snap.context), plain(snap.output), snap.status
    return fold


# --- comparing ------------------------------------------------------------------------------------


def difference(seq: Sequence, ours: Fold, theirs: dict[str, Any]) -> str | None:
    """How XState's fold of `seq` differs from the interpreter's, in one line; None when it does not."""
    for i, (a, b) in enumerate(zip(ours.steps, theirs["steps"], strict=False)):
        if a != b:
            event = "init" if i == 0 else seq.events[i - 1].get("type")
            return f"after event {i} ({event}): python {a[0]}/{a[1]}, xstate {b[0]}/{b[1]}"
    if ours.failure or theirs.get("failure"):
        # Both folds stop at the event that fails; failing at the same one is agreement.
        if ours.failure and theirs.get("failure") and len(ours.steps) == len(theirs["steps"]):
            return None
        at = len(ours.steps) if ours.failure else len(theirs["steps"])
        return f"at event {at}: python {ours.failure or 'ran'}; xstate {theirs.get('failure') or 'ran'}"
    if ours.context != plain(theirs["context"]):
        keys = sorted(
            k
            for k in set(ours.context) | set(theirs["context"])
            if plain(ours.context.get(k)) != plain(theirs["context"].get(k))
        )
        shown = {k: [ours.context.get(k), theirs["context"].get(k)] for k in keys[:3]}
        return f"final context differs in {keys}: python vs xstate {json.dumps(shown)[:300]}"
    if ours.output != plain(theirs["output"]):
        return f"output: python {json.dumps(ours.output)[:200]}, xstate {json.dumps(theirs['output'])[:200]}"
    return None


@dataclass
class Tally:
    threads: int = 0
    identical: int = 0
    differing: int = 0
    events: int = 0
    diffs: list[str] = field(default_factory=list)


def compare(env: Environment, folder: Path, seqs: list[Sequence]) -> Tally:
    """Fold each sequence both ways and count the differences."""
    folds = [python_fold(env, s) for s in seqs]
    payload = {
        "mode": "conform",
        "machine": to_xstate(env.config),
        "threads": [
            {"id": s.id, "input": s.input, "events": s.events, "guards": f.guards}
            for s, f in zip(seqs, folds, strict=True)
        ],
    }
    answer = run_driver(folder, payload)
    tally = Tally()
    for seq, ours, theirs in zip(seqs, folds, answer["threads"], strict=True):
        tally.threads += 1
        tally.events += 1 + len(seq.events)
        diff = difference(seq, ours, theirs)
        if diff is None:
            tally.identical += 1
        else:
            tally.differing += 1
            tally.diffs.append(f"{env.name} {seq.id}: {diff}")
    return tally


def check_environment(name: str, folder: Path, tmp: Path, runs: int = 1) -> Tally:
    """Record `name`'s threads and compare both folds of each."""
    env = load_environment(name)
    store = JsonlDirStore(tmp / name)
    return compare(env, folder, [sequence(tid, store.read(tid)) for tid in record_threads(env, store, runs)])


def check_explored(name: str, folder: Path, limit: int) -> Tally:
    """Compare both folds of up to `limit` paths the exploration of `name` walks."""
    env = load_environment(name)
    return compare(env, folder, explored_sequences(env, limit))


def _counts(t: Tally) -> dict[str, int]:
    return {"threads": t.threads, "events": t.events, "identical": t.identical, "differing": t.differing}


def _add(total: Tally, t: Tally) -> None:
    total.threads += t.threads
    total.events += t.events
    total.identical += t.identical
    total.differing += t.differing
    total.diffs += t.diffs


def xstate_conformance(
    environments: tuple[str, ...] = ENVIRONMENTS, runs: int = 1, explore: int = 300
) -> dict[str, Any]:
    """The figures `make conformance` prints for XState, or `{"skipped": reason}` without Node.

    Recorded threads are what the check is for; `explore` paths per environment (boundary payloads,
    refused events, failing actors) widen it past what the stand-in models happen to do."""
    try:
        folder = install()
    except NodeUnavailable as err:
        return {"skipped": str(err)}
    per_env: dict[str, Any] = {}
    recorded, explored = Tally(), Tally()
    with tempfile.TemporaryDirectory(prefix="improve-xstate-conf-") as tmp:
        for name in environments:
            print(f"conformance: {name} through XState ...", file=sys.stderr)
            t = check_environment(name, folder, Path(tmp), runs)
            e = check_explored(name, folder, explore) if explore else Tally()
            per_env[name] = {"recorded": _counts(t), "explored": _counts(e)}
            _add(recorded, t)
            _add(explored, e)
    return {
        "peer": ", ".join(f"{k}@{v}" for k, v in sorted(pins().items())),
        "threads_replayed": recorded.threads,
        "events": recorded.events,
        "identical": recorded.identical,
        "differing": recorded.differing,
        "explored_paths": _counts(explored),
        "first_differences": (recorded.diffs + explored.diffs)[:SHOWN_DIFFS],
        "environments": per_env,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.xstate_conformance", description=__doc__)
    parser.add_argument("--env", action="append", choices=ENVIRONMENTS, help="only these environments")
    parser.add_argument("--runs", type=int, default=1, help="runs per scenario and model (default 1)")
    parser.add_argument(
        "--explore",
        type=int,
        default=300,
        help="explored paths per environment besides (default 300; 0: none)",
    )
    args = parser.parse_args()
    report = xstate_conformance(tuple(args.env or ENVIRONMENTS), args.runs, args.explore)
    print(json.dumps(report, indent=2))
    if report.get("differing") or report.get("explored_paths", {}).get("differing"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
