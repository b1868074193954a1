"""Resuming a workspace's waiting thread: what `improve resume` does, over `improve.runtime.resume`.

Everything the run needs to go on is read off the thread and the workspace, never from the process
that started it: the environment (by the stamp's name), the policy (the stamp's version, which must
still hash as recorded), the model bound to its `decider` ref (a stand-in seeded for this stretch of
the run, or the same endpoint with its recorded calls), and the world (the scenario's fixture, brought
to where the run stopped by making the recorded tool calls again). The thread is then recorded in the
warehouse like any run, so `improve waiting` and the outcomes see where it went.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from improve.errors import ResumeRefusedError
from improve.evals.scenarios import Scenario
from improve.evals.suite import SuiteSpec
from improve.evals.workspace import Workspace, policy_hash
from improve.llm import CacheMode, Meter
from improve.log import JsonlDirStore, LogEntry
from improve.machine import canonical_json
from improve.runtime import (
    MAX_ENTRIES,
    Environment,
    PolicyDecider,
    ResumeResult,
    compile_policy,
    fold_thread,
    recorded_thread,
    resume,
    world_at,
)

MAX_THREAD_ENTRIES = 2 * MAX_ENTRIES
"""More entries than a run's thread holds: a run stops journaling steps at `MAX_ENTRIES` (its last
step and end entry past it), and each later resume adds only its event and an end entry."""


@dataclass(frozen=True)
class ResumeRequest:
    """A resume as a person asks for it: which thread, with which event (and its id)."""

    thread_id: str
    event: Any
    event_id: str | None = None
    cache_mode: CacheMode = "record"
    finish: bool = False
    """Finish a resume that was interrupted before its run ended (the event is the one it journaled)."""


def thread_environment(space: Workspace, thread_id: str, given: str | None = None) -> Environment:
    """The environment a thread of the workspace's traces ran in: `given`, else its stamp's."""
    if given is not None:
        return space.environment(given)
    store = space.thread_store(thread_id)
    if not store.exists(thread_id):
        places = " or ".join(str(d) for d in space.thread_dirs)
        raise ResumeRefusedError(f"no thread {thread_id!r} in {places} to resume", kind="not-found")
    _check_length(store, thread_id)
    first = store.read(thread_id, 0)[:1]
    name = (first[0].metadata or {}).get("environment") if first else None
    return space.environment(str(name) if name else None)


def resume_thread(
    space: Workspace, env: Environment, request: ResumeRequest, meter: Meter | None = None
) -> ResumeResult:
    """Resume the waiting thread of the workspace's traces with the request's event; see the module."""
    thread_id = request.thread_id
    store = space.thread_store(thread_id)
    _check_length(store, thread_id)
    # Verified first: nothing (policy, model, world) is read off a thread that does not check.
    folded = fold_thread(env, store, thread_id)
    entries = folded.entries
    stamp = dict(entries[0].metadata or {})
    scenario = _scenario(space, env, stamp, thread_id)
    if scenario is not None:
        _check_input(scenario, entries, thread_id)
    policy_stamp = stamp.get("policy") or {}
    version = str(policy_stamp.get("version", ""))
    ref = version if version.startswith("v") else f"v{version}"
    policy = space.load_policy(env.name, ref)
    if policy_hash(policy) != policy_stamp.get("hash"):
        raise ResumeRefusedError(
            f"thread {thread_id} ran under policy {ref} with hash {policy_stamp.get('hash')}, but "
            f"{space.policy_path(env.name, ref)} now hashes {policy_hash(policy)}; a run goes on only under the "
            "policy it started with (bump the version for a changed policy)",
            kind="version-changed",
        )
    model_name = str((stamp.get("models") or {}).get("decider", ""))
    spec = SuiteSpec(
        policy=policy,
        model=model_name,
        model_spec=space.model_spec(model_name, env),
        cache_dir=str(space.cache_dir),
        cache_mode=request.cache_mode,
        asks=space.asks,
    )
    # Each stretch of the run draws its own seed: a stand-in resumed does not repeat its first answers.
    # Finishing an interrupted resume goes on with that stretch's seed.
    stretch = folded.resumes if folded.interrupted is not None else 1 + folded.resumes
    seed = f"{stamp.get('scenario', thread_id)}:r{stamp.get('run', 1)}:resume{stretch}"
    model = spec.model_factory(env, meter)(seed)
    decider = PolicyDecider(
        compile_policy(policy, env.judgments, env.policy_guards), {"decider": model}, env.judgments
    )
    fixture = scenario.world if scenario is not None else _deployed_world(env, entries, thread_id)
    world = world_at(env, fixture, entries, thread_id)
    return resume(
        env,
        store=store,
        thread_id=thread_id,
        event=request.event,
        decider=decider,
        world=world,
        event_id=request.event_id,
        finish=request.finish,
    )


def _deployed_world(env: Environment, entries: list[LogEntry], thread_id: str) -> dict[str, Any]:
    """The fixture of a thread that ran no scenario (a deployed agent's): the environment's own
    `world_from_thread` rebuilds it from what the tools answered (`world_at` then checks every call);
    without that hook nothing is guessed and the thread is refused."""
    if env.world_from_thread is None:
        raise ResumeRefusedError(
            f"thread {thread_id} ran no scenario (a deployed agent's run), so its world is rebuilt from what "
            f"its tools answered, by the environment's world_from_thread, which {env.name} lacks: add it "
            "(docs/extending.md, 'A world from a thread'), or resume the run through the deployed agent "
            "(Agent.resume), which holds its world",
            kind="world-changed",
        )
    world = env.world_from_thread(recorded_thread(env.machine, entries, thread_id))
    if not isinstance(world, dict):
        raise ResumeRefusedError(
            f"environment {env.name}'s world_from_thread returned {type(world).__name__} for thread {thread_id}, "
            "not a fixture (a mapping)",
            kind="world-changed",
        )
    return world


def _check_length(store: JsonlDirStore, thread_id: str) -> None:
    """A thread longer than any run journals was not written by a run: refused before it is read (a
    crafted million-entry file would otherwise be folded whole, in time and memory)."""
    length = store.length(thread_id)
    if length > MAX_THREAD_ENTRIES:
        raise ResumeRefusedError(
            f"thread {thread_id} has {length:,} entries; a run journals at most {MAX_ENTRIES:,} (its budget of "
            "entries), so this thread was not written by one and is not resumed; nothing was read past its length",
            kind="does-not-verify",
        )


def _check_input(scenario: Scenario, entries: list[LogEntry], thread_id: str) -> None:
    """The scenario's input must still be the one the run started with: its label, its world and its
    people's answers are about that input."""
    started = entries[0].event.get("input")
    if canonical_json(started) != canonical_json(scenario.input):
        raise ResumeRefusedError(
            f"thread {thread_id} started from the input {canonical_json(started)[:300]}, but scenario "
            f"{scenario.id!r} now has the input {canonical_json(scenario.input)[:300]}; the run goes on only "
            "against the scenario it started from (restore the input, or run the scenario again)",
            kind="world-changed",
        )


def _scenario(space: Workspace, env: Environment, stamp: dict[str, Any], thread_id: str) -> Scenario | None:
    """The scenario the thread ran (its world's fixture); None for a thread that names none."""
    scenario_id = stamp.get("scenario")
    if scenario_id is None:
        return None
    known = space.scenarios(env.name).by_id()
    if scenario_id not in known:
        raise ResumeRefusedError(
            f"thread {thread_id} ran scenario {scenario_id!r}, which {space.scenarios_path(env.name)} no longer "
            "has: its world cannot be rebuilt",
            kind="world-changed",
        )
    return known[scenario_id]
