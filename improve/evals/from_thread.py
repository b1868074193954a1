"""A labelled scenario from a recorded thread: the situation replayable against any policy.

The input is the thread's (entry 0, `@agent.init`); the people script is the answers people sent to
waiting states; the world is rebuilt by the environment's own `world_from_thread` hook from the tools'
recorded answers, then checked: each recorded tool call is made again, in order, against a fresh world
built from that fixture, and must answer as the thread says (same output, or a failure with the same
code, and the same effects). The label (expected outcome and effects) is a person's; nothing of it is
taken from the thread.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from improve.errors import (
    ActorFailure,
    LogError,
    ScenarioError,
    WorkspaceError,
    WorldFromThreadError,
    did_you_mean,
)
from improve.evals.scenarios import SPLITS, Expected, Scenario
from improve.evals.workspace import Workspace
from improve.log import LogEntry
from improve.runtime import ActorCall, Environment, RecordedThread, recorded_thread

HOOK_HELP = (
    "give its Environment a `world_from_thread=` function: from the thread's input and its tools' "
    "recorded outputs (a `RecordedThread`), the `world` fixture its tools answer the same way from "
    "(docs/extending.md, 'A world from a thread')"
)


def find_thread(source: str, space: Workspace) -> tuple[str, list[LogEntry]]:
    """The thread `source` names: a path to a `.jsonl` file holding one thread, or a thread id of the
    workspace (traces/, or a deployed agent's traces/production/). Errors name the file and line."""
    path = Path(source)
    if path.is_file():
        return _read_file(path)
    try:
        store = space.thread_store(source)
        found = store.exists(source)
    except LogError:
        found = False  # not a valid thread id either: reported below with every place looked at
    if not found:
        places = " or ".join(str(d) for d in space.thread_dirs)
        raise WorkspaceError(
            f"{source}: no such file, and no thread {source!r} in {places}; pass a thread id (a file name "
            "there, without .jsonl) or a path to a .jsonl thread"
        )
    return source, store.read(source)


def _read_file(path: Path) -> tuple[str, list[LogEntry]]:
    threads: dict[str, list[LogEntry]] = {}
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                entry = LogEntry.model_validate_json(line)
            except ValueError as error:
                first = " ".join(str(error).splitlines()[:3])
                raise LogError(f"{path}:{number}: not a log entry: {first}") from None
            threads.setdefault(entry.threadId or path.stem, []).append(entry)
    if len(threads) != 1:
        listed = ", ".join(sorted(threads)[:5]) + (", ..." if len(threads) > 5 else "")
        raise WorkspaceError(
            f"{path}: holds {len(threads)} threads ({listed or 'no entries'}); a scenario comes from one "
            "thread: write its lines to a file of their own, or pass its id in traces/"
        )
    ((thread_id, entries),) = threads.items()
    return thread_id, sorted(entries, key=lambda e: e.index)


def scenario_from_thread(
    env: Environment,
    entries: Sequence[LogEntry],
    *,
    expect: str,
    effects: list[dict[str, Any]] | None,
    split: str,
    category: str | None = None,
    id: str | None = None,
    thread_id: str | None = None,
) -> Scenario:
    """The scenario of a thread: its input, its people's answers and the world `env` rebuilds from it,
    labelled `expect` (a final state) and `effects` (None: the outcome alone is compared).

    `category` defaults to the expected state; `id` to `<category>-<the thread's scenario>`, or
    `<category>-<8 hex digits of the thread's hash>` for a thread that came from no scenario.
    """
    check_label(env, expect, split)
    if env.world_from_thread is None:
        raise WorkspaceError(
            f"environment {env.name} cannot rebuild a world from a thread, and a world is never guessed: "
            + HOOK_HELP
        )
    if not entries:
        raise LogError(f"thread {thread_id or '?'} is empty: a thread starts with an @agent.init entry")
    thread_id = thread_id or entries[0].threadId or "thread"
    check_machine(env, entries, thread_id)
    thread = recorded_thread(env.machine, entries, thread_id)
    if not isinstance(thread.input, dict):
        raise ScenarioError(
            f"thread {thread_id}, entry 0: the input is {type(thread.input).__name__}, but a scenario's "
            "input is a mapping"
        )
    world = rebuild_world(env, thread)
    category = category or expect
    scenario_id = id or default_id(category, thread, entries)
    try:
        return Scenario(
            id=scenario_id,
            category=category,
            split=split,  # checked above: one of SPLITS (pydantic validates it again)
            input=thread.input,
            world=world,
            people=thread.people(),
            expected=Expected(outcome=expect, effects=effects),
        )
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in problem['loc']) or 'scenario'}: {problem['msg']}"
            for problem in error.errors()
        )
        raise ScenarioError(f"the scenario from thread {thread_id} is not valid: {problems}") from None


def check_label(env: Environment, expect: str, split: str) -> None:
    """The label names a final state of `env` that is no sentinel (`scenarios check` refuses the scenario
    otherwise: `workspace.label_problem`), and a split."""
    finals = set(env.config.final_states()) - set(env.config.sentinels())
    if expect in env.config.sentinels():
        raise ScenarioError(
            f"--expect {expect!r} is a sentinel state of {env.name}, which a run must never reach (it counts "
            f"a violation), so the scenario could never pass; label what the desk should have done: one of "
            f"{', '.join(sorted(finals))}"
        )
    if expect not in finals:
        raise ScenarioError(
            f"--expect {expect!r} is not a final state of {env.name}{did_you_mean(expect, finals)}; a "
            "scenario's expected outcome is "
            f"where the run must end: one of {', '.join(sorted(finals))}"
        )
    if split not in SPLITS:
        raise ScenarioError(f"--split {split!r}: use one of {', '.join(SPLITS)}")


def check_machine(env: Environment, entries: Sequence[LogEntry], thread_id: str) -> None:
    machine_id = entries[0].machineId
    if machine_id != env.machine.id:
        raise WorkspaceError(
            f"thread {thread_id} was recorded by machine {machine_id!r}, but environment {env.name}'s machine "
            f"is {env.machine.id!r}; pass --env with the environment whose machine id is {machine_id!r}"
        )


def rebuild_world(env: Environment, thread: RecordedThread) -> dict[str, Any]:
    """`env`'s world for `thread`, checked to be plain data and to make every tool answer as recorded."""
    assert env.world_from_thread is not None
    world = env.world_from_thread(thread)
    if not isinstance(world, dict):
        raise WorldFromThreadError(
            f"environment {env.name}'s world_from_thread returned {type(world).__name__} for thread "
            f"{thread.thread_id}; it must return the world fixture, a mapping"
        )
    try:
        plain: dict[str, Any] = json.loads(json.dumps(world, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise WorldFromThreadError(
            f"environment {env.name}'s world_from_thread returned a world that is not plain JSON data "
            f"({error}); a scenario file holds it as YAML"
        ) from None
    check_world(env, thread, plain)
    return plain


def check_world(env: Environment, thread: RecordedThread, world: dict[str, Any]) -> None:
    """Make each recorded tool call again, in order, on a fresh world from `world`; raise
    `WorldFromThreadError` at the first that answers otherwise than the thread records."""
    fresh = env.make_world(world)
    for call in thread.calls:
        actor = env.actors.get(call.src)
        where = f"thread {thread.thread_id}, entry {call.index} ({call.src} in state '{call.state}')"
        if actor is None:
            raise WorldFromThreadError(f"{where}: environment {env.name} has no tool {call.src!r}")
        before = len(fresh.effects)
        answer: dict[str, Any]
        try:
            answer = {"output": _plain(actor(fresh, dict(call.input or {})))}
        except ActorFailure as failure:
            answer = {"error": failure.to_error()}
        except Exception as error:  # a tool that crashes on the rebuilt world: the hook left something out
            raise WorldFromThreadError(
                f"{where}: the tool crashed on the rebuilt world ({error!r}); environment {env.name}'s "
                "world_from_thread leaves out something it reads"
            ) from error
        effects = _plain(fresh.effects[before:])
        problem = _difference(call, answer, effects)
        if problem:
            raise WorldFromThreadError(
                f"{where}: {problem}, so a scenario would not replay this thread; environment {env.name}'s "
                "world_from_thread must rebuild what this tool reads (or the tool does not depend on its "
                "world alone)"
            )


def _difference(call: ActorCall, answer: dict[str, Any], effects: list[dict[str, Any]]) -> str:
    if call.failed:
        if "error" not in answer:
            return (
                f"the thread records a failure ({call.error}), the rebuilt world answers {answer['output']}"
            )
        recorded_code = (call.error or {}).get("code")
        if recorded_code is not None and answer["error"].get("code") != recorded_code:
            return f"the thread records failure code {recorded_code!r}, the rebuilt world {answer['error']}"
    elif "error" in answer:
        return f"the thread records {call.output}, the rebuilt world fails ({answer['error']})"
    elif answer["output"] != call.output:
        return f"the thread records {call.output}, the rebuilt world answers {answer['output']}"
    if effects != list(call.effects):
        return f"the thread records effects {list(call.effects)}, the rebuilt world records {effects}"
    return ""


def _plain(value: Any) -> Any:
    """As the journal holds it: JSON, so tuples are lists and 100.0 stays a float."""
    return json.loads(json.dumps(value, default=str))


def default_id(category: str, thread: RecordedThread, entries: Sequence[LogEntry]) -> str:
    """`<category>-<the thread's scenario>`, or `<category>-<8 hex digits>` of the thread's id and first
    entry, so the same thread gets the same id (adding it twice is refused as a duplicate)."""
    origin = thread.stamp.get("scenario")
    if not isinstance(origin, str) or not origin:
        origin = hashlib.sha256(f"{thread.thread_id}\n{entries[0].id}".encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{category}-{origin}").strip("-._") or origin
