"""Running a policy over a split of scenarios, k runs each, one journaled thread per run.

Thread ids are `split:version:model:scenario:r<k>`: runs of two models coexist. A thread already
recorded with the same stamp (policy hash, model, budget) is reused rather than run again, so an
interrupted job resumes where it stopped; one recorded with a different stamp (the policy changed
under the same version) is refused (bump the policy version, or `fresh=True` to discard it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from improve import clock
from improve.errors import (
    ActorCrash,
    DivergenceError,
    ImproveError,
    LogError,
    MachineError,
    ReplayMissError,
    RunError,
    ScenarioError,
    SpendLimitError,
    WorkspaceError,
)
from improve.evals.fanout import Fanout, ModelGate
from improve.evals.outcome import OutcomeRow, outcome_row
from improve.evals.scenarios import Scenario, ScenarioLines
from improve.evals.workspace import Workspace, policy_hash, policy_label
from improve.files import storage_error
from improve.llm import AskMemory, CacheMode, Meter, ModelSpec, ResponseCache
from improve.log import (
    BulkEntry,
    EntryView,
    JsonlDirStore,
    KeptReads,
    LogEntry,
    MemoryStore,
    RunBuffer,
    Store,
    ThreadId,
    check_chain,
    is_chained,
    model_slug,
    replay,
    to_log_entry,
)
from improve.machine import RESUMABLE_STATUSES, MachineConfig, canonical_hash
from improve.runtime import (
    DEFAULT_MAX_MODEL_CALLS,
    ChatSession,
    Decider,
    Environment,
    EnvironmentRef,
    ModelFactory,
    PolicyDecider,
    RecordedRun,
    Refused,
    RefusedAnswer,
    ReplayFirstDecider,
    RunResult,
    compile_policy,
    refused_at_end,
    run,
    runs_overlap,
)

DIGESTS = "digests"
"""The stamp's digests of the environment's files and of the scenario (`SuiteSpec.stamp`)."""

Progress = Callable[[int, int, OutcomeRow, bool], None]
"""Called after each run: (done, total, row, reused)."""


@dataclass(frozen=True)
class SuiteSpec:
    """What to run: the policy, the model bound to its `decider` ref, k runs per scenario. Picklable,
    so a worker process of an executor can make the same model."""

    policy: MachineConfig
    model: str
    """The model's name: a stand-in of the environment, `openai:MODEL`, or a workspace's `[models.NAME]`."""
    k: int = 1
    max_model_calls: int = DEFAULT_MAX_MODEL_CALLS
    model_spec: ModelSpec | None = None
    """How to reach the model, for one behind an endpoint; None for a stand-in."""
    cache_dir: str | None = None
    """Where its calls are recorded (`.improve/cache` of the workspace)."""
    cache_mode: CacheMode = "live"
    people: bool = True
    """Answer waiting states from the scenarios' people scripts. False (`improve run --suspend`): each run
    stops at its first wait, `waiting`, to be continued by `improve resume`. Not part of the stamp: a
    resumed thread is the same run as one a script answered."""
    asks: AskMemory | None = None
    """The ways of asking the workspace remembers its endpoints to answer (`Workspace.asks`), where a
    model with `ask = "auto"` starts; None: each session finds the way anew. Pickled as its path."""

    def chat_session(self, meter: Meter | None = None, gate: ModelGate | None = None) -> ChatSession | None:
        """The session of a model behind an endpoint (shared by runs); None for a stand-in. `gate`: the
        model's cap shared across the workers of a cluster (default: this process's own)."""
        if self.model_spec is None:
            return None
        return ChatSession(
            self.model,
            self.model_spec,
            ResponseCache(self.cache_dir, self.cache_mode),
            meter,
            gate=gate(self.model, self.model_spec.in_flight()) if gate is not None else None,
            memory=self.asks,
        )

    def model_factory(
        self, env: Environment, meter: Meter | None = None, gate: ModelGate | None = None
    ) -> ModelFactory:
        """Makes the model of each run: a fresh stand-in, or a view of one shared chat session."""
        session = self.chat_session(meter, gate)
        if session is not None:
            return session.model
        if self.model not in env.models:
            raise WorkspaceError(
                f"environment {env.name} has no model {self.model!r}: its stand-ins are "
                f"{', '.join(sorted(env.models))}; a model behind an endpoint is named openai:MODEL, or "
                "defined in improve.toml as [models.NAME]"
            )
        return env.models[self.model]

    @property
    def policy_hash(self) -> str:
        """The policy's hash (`policy_hash`), computed once per spec: every run's stamp carries it. Not a
        functools.cached_property: on Python 3.11 its lock is one for every instance."""
        found: str | None = self.__dict__.get("_policy_hash")
        if found is None:
            found = self.__dict__["_policy_hash"] = policy_hash(self.policy)
        return found

    def thread_id(self, scenario: Scenario, run_number: int) -> str:
        return str(
            ThreadId(
                split=scenario.split,
                policy_version=policy_label(self.policy),
                model=model_slug(self.model),
                scenario=scenario.id,
                run=run_number,
            )
        )

    def stamp(self, env: Environment, scenario: Scenario, run_number: int) -> dict[str, Any]:
        """What a run is a run of, on its entry 0: a thread recorded with the same stamp is reused
        (`write_threads`). `digests`: the environment's files and what the scenario starts from, so
        a run recorded before either changed is run again rather than reused."""
        return {
            **self.live_stamp(env),
            "scenario": scenario.id,
            "split": scenario.split,
            "run": run_number,
            DIGESTS: {"environment": env.files_digest, "scenario": self._scenario_digest(scenario)},
        }

    def live_stamp(self, env: Environment) -> dict[str, Any]:
        """The stamp of a run of no scenario (a deployed agent's, `deploy`): the environment, the policy,
        the model, and the digest of the environment's files."""
        return {
            "environment": env.name,
            "policy": {"id": self.policy.id, "version": self.policy.version, "hash": self.policy_hash},
            "models": {"decider": self.model},
            **({"modelSpec": self.model_spec.public()} if self.model_spec is not None else {}),
            DIGESTS: {"environment": env.files_digest},
        }

    def _scenario_digest(self, scenario: Scenario) -> str:
        """A sha256 of what a run of the scenario starts from (input, world, people; not the label, which
        only scores it), kept per scenario object for the spec's suites (each run's stamp asks)."""
        kept: dict[int, tuple[Scenario, str]] = self.__dict__.setdefault("_scenario_digests", {})
        found = kept.get(id(scenario))
        if found is None or found[0] is not scenario:
            started = scenario.model_dump(mode="json", include={"input", "world", "people"})
            found = kept[id(scenario)] = (scenario, canonical_hash(started))
        return found[1]


def suite_spec(
    space: Workspace,
    env: Environment,
    policy: MachineConfig,
    model: str,
    *,
    k: int | None = None,
    cache: CacheMode = "live",
    people: bool = True,
) -> SuiteSpec:
    """The suite a workspace runs: `policy` with `model` (its `[models.NAME]` when it names one), k runs
    per scenario (default: the objective's), the objective's budget, the workspace's call cache."""
    objective = space.config.objective
    return SuiteSpec(
        policy,
        model,
        k or objective.k,
        objective.max_model_calls,
        space.model_spec(model, env),
        str(space.cache_dir),
        cache,
        people,
        space.asks,
    )


Recordings = Callable[[Scenario, int], RecordedRun | None]
"""The recorded run a (scenario, run number) starts from (replay-first), or None to run it from scratch."""


@dataclass(frozen=True)
class StartFrom:
    """The baseline's runs a candidate's runs start from (replay-first, `improve.runtime.replay_first`):
    the verified baseline thread of each (scenario, run number), read from `store` as its run starts (a
    round's `KeptReads`, which its diagnosis read them through)."""

    store: Store | KeptReads
    threads: Mapping[tuple[str, int], str]

    def recorded(self, scenario: Scenario, run_number: int) -> RecordedRun | None:
        thread_id = self.threads.get((scenario.id, run_number))
        if thread_id is None:
            return None
        entries = self.store.read(thread_id)  # an unknown thread reads as empty
        return RecordedRun.of(thread_id, entries) if entries else None


@dataclass(frozen=True)
class RunBatch:
    """Runs for one task of an executor: picklable, so a process pool or a Dask worker can take it."""

    environment: EnvironmentRef
    spec: SuiteSpec
    runs: tuple[tuple[Scenario, int], ...]
    """(scenario, run number) pairs; each run's model is seeded by the pair, never by the worker."""
    concurrency: int = 1
    """Runs of the batch in flight at once in the worker (they wait on models)."""
    gate: ModelGate | None = None
    recorded: tuple[RecordedRun | None, ...] = ()
    """For replay-first runs: the recorded run each of `runs` starts from (read by the caller)."""


@dataclass(frozen=True)
class WrittenThread:
    thread_id: str
    entries: list[LogEntry]


@dataclass(frozen=True)
class BatchResult:
    """What a batch made: its threads, for the caller's store, and its model calls, for the caller's meter."""

    threads: list[WrittenThread]
    calls: dict[str, Any] | None = None
    """The worker's `Meter.to_json()` for a model behind an endpoint; None for a stand-in."""
    fingerprints: tuple[str, ...] = ()
    """The endpoint's `system_fingerprint`s the batch's calls reported."""


def execute_batch(batch: RunBatch) -> BatchResult:
    """Run a batch in this process (a worker of any `concurrent.futures.Executor`), journaled in memory:
    the threads go back to the caller, which writes them where the command keeps its threads."""
    env = batch.environment.shared()
    spec = batch.spec
    meter = Meter()
    store = MemoryStore()
    recorded = {(sc.id, n): r for (sc, n), r in zip(batch.runs, batch.recorded, strict=False)}
    runner = functools.partial(
        _run_one,
        models=spec.model_factory(env, meter, batch.gate),
        # The worker's meter counts the answers its replay-first runs reused, as the caller's would.
        meter=meter,
        recordings=(lambda sc, n: recorded.get((sc.id, n))) if recorded else None,
    )
    policy = compile_policy(spec.policy, env.judgments, env.policy_guards)
    todo = list(batch.runs)
    asyncio.run(_run_concurrently(runner, env, policy, todo, spec, store, max(1, batch.concurrency), None))
    threads = [WrittenThread(tid, store.read(tid)) for tid in (spec.thread_id(sc, n) for sc, n in todo)]
    if spec.model_spec is None and not meter.reused:
        return BatchResult(threads)
    return BatchResult(threads, meter.to_json(), tuple(sorted(meter.fingerprints)))


def run_scenario(
    env: Environment,
    scenario: Scenario,
    decider: Decider,
    store: Store,
    thread_id: str,
    stamp: dict[str, Any] | None = None,
    max_model_calls: int = DEFAULT_MAX_MODEL_CALLS,
    people: bool = True,
    note: Callable[[], dict[str, Any]] | None = None,
    hashes: bool = True,
    refused: RefusedAnswer = "raise",
) -> RunResult:
    """One run of a scenario: its input, a fresh world from its fixture, its people script (`people`
    False: nobody answers, and the run stops at its first wait); `note`, its end entry's metadata;
    `hashes` False for a run scored in memory and thrown away (see `Journal`); `refused`, what an answer
    of the script the machine refuses where the run waits does (`RefusedAnswer`: a suite's run ends
    there, failed; a check of the script raises)."""
    return run(
        env,
        input=scenario.input,
        world=env.make_world(scenario.world),
        people=scenario.people if people else {},
        decider=decider,
        store=store,
        thread_id=thread_id,
        stamp=stamp,
        max_model_calls=max_model_calls,
        note=note,
        hashes=hashes,
        refused=refused,
    )


def _run_one(
    env: Environment,
    policy: Any,
    scenario: Scenario,
    spec: SuiteSpec,
    run_number: int,
    store: Store,
    models: ModelFactory,
    meter: Meter | None = None,
    recordings: Recordings | None = None,
) -> Refused | None:
    """One run of a suite, written whole to `store` when it ends; the people script's answer the machine
    refused where it ended, if one was."""
    # Checked before anything is written: a run that does not start leaves no thread behind.
    if meter is not None and meter.over_limit():
        raise SpendLimitError(f"the spend limit of ${meter.limit_usd} is reached: {meter.summary()}")
    thread_id = spec.thread_id(scenario, run_number)
    # A fresh model per run, seeded by scenario and run: reproducible, and runs differ.
    model = models(f"{scenario.id}:r{run_number}")
    recorded = recordings(scenario, run_number) if recordings is not None else None
    decider: PolicyDecider
    note: Callable[[], dict[str, Any]] | None = None
    if recorded is not None:
        decider = ReplayFirstDecider(policy, {"decider": model}, env.judgments, recorded)
        note = decider.note
    else:
        decider = PolicyDecider(policy, {"decider": model}, env.judgments)
    stamp = spec.stamp(env, scenario, run_number)
    # Journaled in memory and written whole when it ends: a run that cannot finish (a recorded call
    # missing on replay, a model that fails) leaves no half-written thread, and a later command runs it
    # again from the start, as it would an incomplete one.
    buffer = RunBuffer(thread_id)
    try:
        # A script's answer the machine refuses on this run's path (one the script's author did not
        # foresee) ends this run, failed and said; it used to stop the whole suite, or a round.
        result = run_scenario(
            env,
            scenario,
            decider,
            buffer,
            thread_id,
            stamp,
            spec.max_model_calls,
            spec.people,
            note,
            refused="end",
        )
    except MachineError as err:
        raise machine_stopped(env, scenario, err, f"run {run_number}") from None
    except ActorCrash as err:
        # A tool that crashes on the scenario's world (a value of another type than it reads) stops the
        # suite: the scenario is where to look, and the check finds every other one like it at once.
        said = str(err).removeprefix(f"thread {thread_id}: ")
        raise ActorCrash(
            f"scenario '{scenario.id}' ({scenario.split}, run {run_number}, thread {thread_id}): {said}. "
            "`improve scenarios check` runs every scenario once with careful and names each one whose run "
            "stops, with its line"
        ) from err
    except ReplayMissError as err:
        raise ReplayMissError(
            f"scenario '{scenario.id}' ({scenario.split}, run {run_number}): {err} (a request is asked "
            "otherwise than recorded when the policy, the environment or the scenario changed since)"
        ) from None
    # The thread recorded before (a --fresh run, or one that did not verify) is replaced only now, by a
    # run that finished: a run that stops (a recorded call missing, a spend limit) leaves it as it was.
    if store.exists(thread_id):
        store.delete(thread_id)
    store.append(thread_id, 0, buffer.entries)  # all or nothing (a full disk leaves no thread)
    if meter is not None and isinstance(decider, ReplayFirstDecider):
        meter.reuse(decider.reused)
    return result.refused


def machine_stopped(env: Environment, scenario: Scenario, err: MachineError, run: str) -> ScenarioError:
    """The environment's own machine could not take a step on this scenario's data: a key its input or
    world spells otherwise, a value of another type, or an expression of the machine that fails on any
    data. Either way the scenario says where to start looking. `run`: which run of it (`run 2`)."""
    return ScenarioError(
        f"scenario '{scenario.id}' ({scenario.split}, {run}): environment {env.name}'s machine could not "
        f"take a step: {str(err).rstrip('.')}. Check what the scenario's input and world give the path it names (a key "
        "spelled otherwise, a value of another type), or the machine's expression"
    )


@dataclass(frozen=True)
class PlannedRun:
    """One run of a suite: its scenario and number, its thread, and whether a recorded thread was reused."""

    scenario: Scenario
    run: int
    thread_id: str
    reused: bool
    entries: list[LogEntry] | None = None
    """The reused thread's entries, read once while checking it (None for a run made now)."""
    replaced: str | None = None
    """Why a thread recorded under its id was run again rather than reused (`_reusable`), if one was."""
    restored: str | None = None
    """A recorded thread whose file did not verify, restored from the warehouse's verified copy (not run
    again): what was wrong with the file and where it was kept. Such a run is not `reused`, so the
    commands record its file in the warehouse again (`rewritten`)."""
    refused: Refused | None = None
    """The scenario's people script answered a wait of this run with an event the machine refused there,
    and the run ended there (`refused_scripts` says so)."""


@dataclass(frozen=True)
class Keep:
    """What becomes of a recorded thread whose file does not verify (tampered, diverged, or cut short
    before its end entry) before its scenario is run again: the file is moved into `folder` (never
    deleted: it is evidence, if of something else), and `original(thread_id)` gives the complete copy
    held elsewhere (the warehouse's entries), which is written back and reused when it verifies."""

    folder: Path
    original: Callable[[str], list[LogEntry]] | None = None

    def set_aside(self, store: Store, thread_id: str) -> Path | None:
        """Move the thread's file to `folder/<UTC time>/<thread id>.jsonl` (its name kept: `improve replay
        --verify` of it says what is wrong, as the chain is seeded with the id), and say where; None for a
        store that keeps no file (in memory: nothing outlives the process anyway)."""
        if not isinstance(store, JsonlDirStore):
            return None
        source = store.path(thread_id)
        stamp = clock.now().strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.folder / stamp / source.name
        for n in range(2, 1000):  # one instant, one name: another thread of the same id went there first
            if not target.exists():
                break
            target = self.folder / f"{stamp}-{n}" / source.name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)  # the same file system as a rule: a rename, nothing copied
        except OSError as error:
            raise storage_error(
                error, f"keep the thread file {source} that does not verify in {target}"
            ) from None
        return target


def kept_aside(plan: Sequence[PlannedRun]) -> list[str]:
    """What to say of the recorded threads whose files did not verify (`Keep`): those restored from the
    warehouse's copy, and those run again, each with what was wrong and where its file was kept."""
    said = []
    for what, notes in (
        ("restored from the warehouse's verified copy, not run again", [p for p in plan if p.restored]),
        ("run again", [p for p in plan if p.replaced and "its file was kept as" in p.replaced]),
    ):
        if notes:
            said.append(
                f"{len(notes)} recorded thread(s) whose file did not verify were {what}: "
                + "; ".join(f"{p.thread_id}: {p.restored or p.replaced}" for p in notes[:3])
                + (f"; and {len(notes) - 3} more" if len(notes) > 3 else "")
            )
    return said


def refused_scripts(plan: Sequence[PlannedRun], source: Path | None = None) -> list[str]:
    """What to say of the runs that ended where their scenario's people script answered a wait with an
    event the machine refused there (`PlannedRun.refused`): one warning per scenario and answer, naming
    the answer, the rule that refused it, the runs, and where to fix the script (its line in `source`,
    the scenario file, when given). Each such run is a failure of its scenario; the others went on."""
    grouped: dict[tuple[str, str, int, str], list[PlannedRun]] = {}
    for planned in plan:
        if planned.refused is not None:
            said = planned.refused.sentence()
            key = (planned.scenario.id, planned.refused.state, planned.refused.index, said)
            grouped.setdefault(key, []).append(planned)
    lines = ScenarioLines.read(source) if grouped and source is not None else None
    notes = []
    for (scenario, state, index, said), runs in grouped.items():
        field = ("people", state, index)
        where = (
            lines.where(scenario, field) if lines is not None else f"people.{state}[{index}] of the scenario"
        )
        more = f" and {len(runs) - 1} more" if len(runs) > 1 else ""
        notes.append(
            f"warning: scenario '{scenario}': {said}; {len(runs)} run(s) ended waiting there, each failed "
            f"({runs[0].thread_id}{more}), and the other runs went on. Fix the script at {where} with an "
            "answer the state's rules take on the path those runs took"
        )
    return notes


def every(runs: int, say: Callable[[str], None], what: str) -> Callable[[int, int], None]:
    """A `ran` callback for `write_threads` that says `  what: done/total runs` every `runs` runs and
    at the end."""

    def ran(done: int, total: int) -> None:
        if done == total or done % runs == 0:
            say(f"  {what}: {done}/{total} runs")

    return ran


def write_threads(
    env: Environment,
    scenarios: Sequence[Scenario],
    spec: SuiteSpec,
    store: Store,
    *,
    fresh: bool = False,
    concurrency: int = 1,
    executor: Executor | Fanout | None = None,
    ran: Callable[[int, int], None] | None = None,
    meter: Meter | None = None,
    models: ModelFactory | None = None,
    runs: Sequence[int] | None = None,
    compiled: Any = None,
    start_from: StartFrom | None = None,
    slots: Slots | None = None,
    keep: Keep | None = None,
) -> list[PlannedRun]:
    """Run every scenario k times (reusing threads recorded with this stamp), journaling one thread
    per run; the runs in planned order. `runs` are other run numbers to make instead of 1..k (the
    sequential reruns of a round: k+1.. of the scenarios whose result changed). Scoring is the caller's: `run_suite` replays them here, a
    ledger ingests and verifies them in the warehouse.

    Runs wait on models, so they overlap: up to `concurrency` at a time (asyncio, each run in a worker
    thread), but runs of a stand-in that answers at once go one at a time (`runs_overlap`); `ran(done, total)` reports each finished run. For CPU-bound runs pass an `executor` (a
    `ProcessPoolExecutor`, or a `Fanout` onto a Dask cluster): it takes the runs in batches and sends
    back their threads, which are written to `store` here, so the workers need no access to it.
    `meter` counts the model calls (a worker's are added as its batch comes back), and its spend limit
    is checked before each run (each batch, on an executor) starts; runs under way finish.
    `models` makes each run's model (default: `spec.model_factory`); a round passes one factory to
    all its suites, so they share one chat session: its fallback, its meter, its fingerprints.
    `compiled`: the policy already compiled with the environment's judgments and guards (a round's
    gates compiled the candidate), so it is not compiled again. `start_from`: the recorded runs these
    runs start from, replay-first (a round's candidate starts from the baseline's runs). `slots`: runs
    in flight across suites that run at once (a round's), each run taking one while it runs here.
    `keep`: where a recorded thread whose file does not verify goes before it is run again, and the
    verified copy it is restored from instead when there is one (`Keep`; the commands pass the
    workspace's, `Ledger.keep`); without it such a thread is run again in place.
    """
    models = models or spec.model_factory(env, meter)
    policy = (
        compiled if compiled is not None else compile_policy(spec.policy, env.judgments, env.policy_guards)
    )
    numbers = list(runs) if runs is not None else range(1, spec.k + 1)
    planned = [(scenario, n) for scenario in scenarios for n in numbers]
    # Threads already recorded with this stamp, read once: checked here, handed on with the plan.
    recorded: dict[str, list[LogEntry]] = {}
    replaced: dict[str, str] = {}
    restored: dict[str, str] = {}
    if not fresh:
        for sc, n in planned:
            thread_id = spec.thread_id(sc, n)
            stamp = spec.stamp(env, sc, n)
            check = _reuse(env, store, thread_id, stamp, spec.people, sc)
            if check.entries is not None:
                recorded[thread_id] = check.entries
            elif check.why is not None and check.damaged and keep is not None:
                entries, note = _set_aside(keep, env, store, thread_id, stamp, spec.people, sc, check.why)
                if entries is not None:
                    recorded[thread_id], restored[thread_id] = entries, note
                else:
                    replaced[thread_id] = note
            elif check.why is not None:
                replaced[thread_id] = check.why
    todo = [(sc, n) for sc, n in planned if spec.thread_id(sc, n) not in recorded]
    # Thread id -> the script's answer refused where the run ended: of the runs reused, read off their
    # end entries; of those made now, as each ends.
    refusals = {tid: found for tid, entries in recorded.items() if (found := refused_at_end(entries))}
    if executor is not None and todo:
        _fan_out(
            Fanout.of(executor), env, spec, store, todo, max(1, concurrency), ran, meter, start_from, refusals
        )
    elif todo:
        recordings = start_from.recorded if start_from is not None else None
        runner = functools.partial(_run_one, models=models, meter=meter, recordings=recordings)
        cap = max(1, concurrency) if spec.model_spec is not None or runs_overlap(models) else 1
        if cap == 1:  # in this thread: no event loop, no hand-over of the GIL to a worker per run
            for done, (scenario, n) in enumerate(todo, start=1):
                found = runner(env, policy, scenario, spec, n, store)
                if found is not None:
                    refusals[spec.thread_id(scenario, n)] = found
                if ran:
                    ran(done, len(todo))
        else:
            pool = None
            if slots is not None:
                runner = functools.partial(_in_slot, slots.permits, runner)
                pool = slots.pool
            asyncio.run(_run_concurrently(runner, env, policy, todo, spec, store, cap, ran, pool, refusals))
    plan = []
    for scenario, n in planned:
        thread_id = spec.thread_id(scenario, n)
        plan.append(
            PlannedRun(
                scenario,
                n,
                thread_id,
                thread_id in recorded and thread_id not in restored,
                recorded.get(thread_id),
                replaced.get(thread_id),
                restored.get(thread_id),
                refusals.get(thread_id),
            )
        )
    return plan


def run_suite(
    env: Environment,
    scenarios: Sequence[Scenario],
    spec: SuiteSpec,
    store: Store,
    *,
    fresh: bool = False,
    progress: Progress | None = None,
    concurrency: int = 1,
    executor: Executor | None = None,
    ran: Callable[[int, int], None] | None = None,
    meter: Meter | None = None,
    models: ModelFactory | None = None,
) -> list[OutcomeRow]:
    """Run (or reuse) every scenario k times (`write_threads`) and score each thread by replaying it."""
    plan = write_threads(
        env,
        scenarios,
        spec,
        store,
        fresh=fresh,
        concurrency=concurrency,
        executor=executor,
        ran=ran,
        meter=meter,
        models=models,
    )
    rows: list[OutcomeRow] = []
    for planned in plan:
        entries = planned.entries if planned.entries is not None else store.read(planned.thread_id)
        row = outcome_row(env, planned.scenario, planned.thread_id, entries)
        rows.append(row)
        if progress:
            progress(len(rows), len(plan), row, planned.reused)
    return rows


def _fan_out(
    fanout: Fanout,
    env: Environment,
    spec: SuiteSpec,
    store: Store,
    todo: list[tuple[Scenario, int]],
    concurrency: int,
    ran: Callable[[int, int], None] | None,
    meter: Meter | None,
    start_from: StartFrom | None = None,
    refusals: dict[str, Refused] | None = None,
) -> None:
    """Send the runs to the executor in batches and write each batch's threads as it comes back; the
    runs that ended where their script's answer was refused go into `refusals`, by thread id."""
    # A worker loads the environment again by its registered name (an environment made in code without
    # the registry is looked up by its name there).
    ref = env.ref or EnvironmentRef(env.name)
    size = fanout.batch_size(len(todo))
    batches = []
    for i in range(0, len(todo), size):
        runs = tuple(todo[i : i + size])
        # Read here: the workers have no access to the store.
        recorded = tuple(start_from.recorded(sc, n) for sc, n in runs) if start_from is not None else ()
        batches.append(RunBatch(ref, spec, runs, concurrency, fanout.gate, recorded))
    pending: deque[Future[BatchResult]] = deque()
    queued = deque(batches)
    done = 0
    while queued or pending:
        while queued and len(pending) < fanout.in_flight:
            # Checked before each batch is sent: the batches under way finish, none starts past the limit.
            if meter is not None and meter.over_limit():
                queued.clear()
                break
            pending.append(fanout.executor.submit(execute_batch, queued.popleft()))
        if not pending:
            break
        result = _batch_result(pending.popleft(), fanout)
        for thread in result.threads:
            # The same file a run in this process writes: any earlier copy goes, the thread lands whole.
            if store.exists(thread.thread_id):
                store.delete(thread.thread_id)
            store.append(thread.thread_id, 0, thread.entries)
            found = refused_at_end(thread.entries)
            if found is not None and refusals is not None:
                refusals[thread.thread_id] = found
        if meter is not None and result.calls is not None:
            meter.absorb(result.calls, result.fingerprints)
        done += len(result.threads)
        if ran:
            ran(done, len(todo))
    if done < len(todo) and meter is not None and meter.over_limit():
        raise SpendLimitError(f"the spend limit of ${meter.limit_usd} is reached: {meter.summary()}")


def _batch_result(future: Future[BatchResult], fanout: Fanout) -> BatchResult:
    try:
        return future.result()
    except ImproveError:
        raise  # a run's own failure (a recorded call missing on replay, ...), as it would be locally
    except Exception as error:
        # The executor's failure, not a run's: a worker killed, the scheduler gone.
        raise RunError(
            f"a batch of runs failed on {fanout.where}: {type(error).__name__}: {error}; the runs already "
            "written are kept, and running the command again resumes with the rest (or use --executor local)"
        ) from error


class Slots:
    """What the suites that run at once (a round's) share: `concurrency` permits for runs in flight, and
    one pool of worker threads they run on. One pool, not one a suite: starting a thread waits for the
    new thread to take the GIL (about 3 ms each with 32 runs waiting, and a round's suites started about
    50), and the threads a suite started are idle when the next one starts. `close` when done: runs
    queued are cancelled, runs under way finish on their threads."""

    def __init__(self, concurrency: int) -> None:
        self.permits = threading.Semaphore(max(1, concurrency))
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="improve-run")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _in_slot(
    permits: threading.Semaphore, runner: Callable[..., Refused | None], *args: Any
) -> Refused | None:
    with permits:
        return runner(*args)


async def _run_concurrently(
    runner: Callable[..., Refused | None],
    env: Environment,
    policy: Any,
    todo: list[tuple[Scenario, int]],
    spec: SuiteSpec,
    store: Store,
    cap: int,
    ran: Callable[[int, int], None] | None,
    shared: ThreadPoolExecutor | None = None,
    refusals: dict[str, Refused] | None = None,
) -> None:
    """The runs, up to `cap` at a time, on `shared` (the suites' `Slots.pool`) or a pool of their own;
    those that ended where their script's answer was refused go into `refusals`, by thread id."""
    gate = asyncio.Semaphore(cap)
    finished = 0
    loop = asyncio.get_running_loop()
    # Our own pool: asyncio's default one has min(32, cores + 4) threads, which would cap the overlap.
    with (
        contextlib.nullcontext(shared)
        if shared is not None
        else ThreadPoolExecutor(max_workers=cap, thread_name_prefix="improve-run") as pool
    ):

        async def one(scenario: Scenario, n: int) -> None:
            nonlocal finished
            async with gate:
                found = await loop.run_in_executor(pool, runner, env, policy, scenario, spec, n, store)
            if found is not None and refusals is not None:
                refusals[spec.thread_id(scenario, n)] = found
            finished += 1
            if ran:
                ran(finished, len(todo))

        await asyncio.gather(*(one(sc, n) for sc, n in todo))


def _reusable(
    env: Environment, store: Store, thread_id: str, stamp: dict[str, Any], people: bool = True
) -> list[LogEntry] | None:
    """The thread's entries when it was recorded with this stamp and finished; None to run it. Without
    `people` (`improve run --suspend`: each run stops at its first wait), a run the people script
    answered is not what was asked for: it runs again, to wait there. With them (`improve run`, a
    round), a run `--suspend` left waiting, which nobody resumed, is no outcome of the policy: it runs
    again, its scenario's people script answering the wait (a waiting run scored as a failure gave a
    round's baseline failures its candidate then seemed to fix)."""
    return _reuse(env, store, thread_id, stamp, people).entries


@dataclass(frozen=True)
class _Check:
    """What `_reuse` found of a recorded thread: its entries to reuse, or why it is run again (`why`), and
    whether that is because its file does not verify (`damaged`: tampered, diverged or cut short)."""

    entries: list[LogEntry] | None = None
    why: str | None = None
    damaged: bool = False


def _read(store: Store, thread_id: str) -> tuple[Sequence[BulkEntry | LogEntry], Sequence[bytes] | None]:
    """The thread's entries, and the lines they were decoded from when the store keeps lines: the chain is
    checked over the lines as written (`replay(lines=)`), not over each entry written out again, which
    costs twice the read (measured in the commit that made reuse verify)."""
    if isinstance(store, JsonlDirStore):
        return store.read_bulk_lines(thread_id)
    return store.read(thread_id), None


def _reuse(
    env: Environment,
    store: Store,
    thread_id: str,
    stamp: dict[str, Any],
    people: bool = True,
    scenario: Scenario | None = None,
) -> _Check:
    """`_reusable`, and why a thread recorded under the id is run again (None when none was, or it is
    reused). `scenario`, when known: a run waiting where its people script has no answer, or one whose
    answer there the machine refused (`refused_at_end`), ended there for good, and is reused (run again,
    it waits there again, at a model's cost each time).
    The thread is verified as `improve replay --verify` does (chain, state hashes, end entry): one that
    does not verify is never reused as a result (its file is `damaged`)."""
    read, lines = _read(store, thread_id)
    if not read:
        return _Check()
    if not people and any((e.metadata or {}).get("source") == "person" for e in read):
        return _Check(None, "its people's script answered it, and --suspend waits instead")
    entries = [to_log_entry(e) for e in read]
    metadata = entries[0].metadata or {}
    recorded = {k: v for k, v in metadata.items() if k not in ("maxModelCalls", DIGESTS)}
    wanted = {k: v for k, v in stamp.items() if k != DIGESTS}
    if recorded != wanted:
        tampered = _tampered(env, entries, thread_id, lines)
        if tampered is not None:  # the stamp was edited, not recorded otherwise: damaged, not refused
            return _Check(None, tampered, damaged=True)
        # A policy edited under its version is the policy's to fix (its threads are evidence of the old
        # content); a model set up otherwise (another endpoint, temperature, seed) is the run's.
        fix = (
            "bump the policy version (a policy you try by hand: give it a version no round takes, such as "
            '"version": "hand-1"), or run with --fresh to replace the recorded threads'
            if recorded.get("policy") != wanted.get("policy")
            else "run with --fresh to replace the recorded threads, or give the new setup its own name in "
            "[models.NAME] so both are kept"
        )
        raise WorkspaceError(
            f"thread {thread_id} was recorded with a different stamp ({_stamp_diff(recorded, wanted)}); {fix}"
        )
    if metadata.get(DIGESTS) != stamp[DIGESTS]:
        # Recorded before the environment's files or the scenario changed (or by a version of improve
        # that did not stamp them): evidence of other inputs, so it is run again, and replaced.
        return _Check(None, "recorded before the environment's files or the scenario changed")
    try:
        result = replay(env.machine, read, verify=True, thread_id=thread_id, lines=lines)
    except DivergenceError as error:
        # Tampered (an entry edited, removed, inserted or reordered) or diverged: what `improve replay
        # --verify` fails, never a result (the warehouse may hold it whole: `Keep`).
        return _Check(None, f"does not verify: {error}", damaged=True)
    except LogError:
        # It does not fold (an entry the machine refuses): reused as it is, so the ledger's
        # verification sets it aside with the reason instead of a new run silently replacing it.
        return _Check(entries)
    # An interrupted run (the thread stops while an actor is owed, or before its end entry) is run
    # again from the start.
    if result.status == "incomplete" or (is_chained(entries) and result.ended is None):
        return _Check(None, f"cut short after entry {len(entries) - 1} (no end entry)", damaged=True)
    if (
        people
        and result.status in RESUMABLE_STATUSES
        and not any((e.metadata or {}).get("source") == "resume" for e in entries)
        and (scenario is None or scenario.answers(str(result.snapshot.value)))
        # Its script answered the wait, and the machine refused the answer: it ended there for good (run
        # again, the same path meets the same refusal, at a model's cost), until the script changes.
        and refused_at_end(entries) is None
    ):
        return _Check(None, "left waiting by --suspend, and never resumed")
    return _Check(entries)


def _tampered(
    env: Environment, entries: Sequence[EntryView], thread_id: str, lines: Sequence[bytes] | None
) -> str | None:
    """Why the thread does not verify, when its chain says it was edited; else None."""
    if not is_chained(entries):
        return None
    try:
        check_chain(entries, thread_id, lines)
    except DivergenceError as error:
        return f"does not verify: {error}"
    return None


def _set_aside(
    keep: Keep,
    env: Environment,
    store: Store,
    thread_id: str,
    stamp: dict[str, Any],
    people: bool,
    scenario: Scenario,
    why: str,
) -> tuple[list[LogEntry] | None, str]:
    """A recorded thread whose file does not verify, before its scenario runs again: its file kept aside
    (`Keep.set_aside`), and the complete copy held elsewhere (the warehouse) written in its place and
    reused when it verifies with this stamp. The entries reused (None: run it again) and what to say."""
    kept = keep.set_aside(store, thread_id)
    where = f"; its file was kept as {kept}" if kept is not None else ""
    original = keep.original(thread_id) if keep.original is not None else []
    if original:
        store.append(thread_id, 0, original)
        check = _reuse(env, store, thread_id, stamp, people, scenario)
        if check.entries is not None and not check.damaged and check.why is None:
            return check.entries, f"{why}{where}; restored from the warehouse's verified copy"
        store.delete(thread_id)  # the warehouse's copy does not verify either: the scenario runs again
        return None, f"{why}{where} (the warehouse's copy does not verify either)"
    return None, f"{why}{where}"


def inputs_digests(env: Environment, scenario: Scenario) -> dict[str, str]:
    """What a run of `scenario` starts from, as its stamp's `digests` hold it: the environment's files
    and the scenario's input, world and people."""
    started = scenario.model_dump(mode="json", include={"input", "world", "people"})
    return {"environment": env.files_digest, "scenario": canonical_hash(started)}


def stale(env: Environment, store: Store, thread_id: str, scenario: Scenario) -> bool:
    """Whether the thread was recorded from other inputs than a run of `scenario` would start from now
    (the environment's files or the scenario changed since): the evidence `write_threads` would not
    reuse. A thread whose stamp holds no digests (an older improve, another agent's log) cannot say,
    and is not called stale."""
    entries = store.read(thread_id)
    return stale_stamp(env, entries[0].metadata if entries else None, scenario)


def stale_stamp(env: Environment, stamp: Mapping[str, Any] | None, scenario: Scenario) -> bool:
    """`stale`, of a thread whose entry 0 carries `stamp`: the one test `improve score` and the
    warehouse's `outcomes.current` both make, so they leave out the same runs."""
    recorded = (stamp or {}).get(DIGESTS)
    return isinstance(recorded, dict) and recorded != inputs_digests(env, scenario)


def recorded_with(env: Environment, entries: Sequence[EntryView]) -> str | None:
    """The digest of the environment's files the thread was recorded with, when it is not theirs now (its
    machine or tools changed since, under the same version): why a thread may no longer fold. None when
    they are the same, or its stamp holds no digest."""
    recorded = (entries[0].metadata or {}).get(DIGESTS) if entries else None
    found = recorded.get("environment") if isinstance(recorded, dict) else None
    return found if isinstance(found, str) and found != env.files_digest else None


def _stamp_diff(recorded: dict[str, Any], wanted: dict[str, Any]) -> str:
    keys = sorted(set(recorded) | set(wanted))
    diffs = [
        f"{k}: {recorded.get(k)!r} != {wanted.get(k)!r}" for k in keys if recorded.get(k) != wanted.get(k)
    ]
    return "; ".join(diffs)
