"""What test files share, as plain functions: the example workspace copied or committed, a bundled desk's
workspace, log entries and thread files, and a DuckDB scalar. Fixtures are in conftest.py."""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import git

from improve.demo import commit_workspace
from improve.log import LogEntry
from improve.machine import Machine, Snapshot, fold_of, initial, transition
from improve.machine.snapshot import shallow_json, sorted_text

REPO = Path(__file__).resolve().parents[1]

FROZEN_AT = "2026-01-15T12:00:00Z"
"""The instant the `clock` fixture freezes the product's clock at: expected stamps come from here."""


def copy_workspace(target: Path, *, traces: Path | None = None) -> Path:
    """A scratch copy of the example workspace: improve.toml, scenarios/ and policies/ (and `traces`, a
    directory of threads, as its traces/)."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "improve.toml", target / "improve.toml")
    shutil.copytree(REPO / "scenarios", target / "scenarios")
    shutil.copytree(REPO / "policies", target / "policies")
    if traces is not None:
        shutil.copytree(traces, target / "traces")
    return target


def committed_workspace(target: Path, *, remote: Path | None = None) -> Path:
    """The example workspace in a git repository of its own (a round leaves its review branch there);
    with `remote`, a bare repository standing in for GitHub as `origin`."""
    repo = commit_workspace(copy_workspace(target), user="t", message="workspace")
    if remote is not None:
        git.Repo.init(remote, bare=True)
        repo.create_remote("origin", "https://github.com/acme/desk.git")
        with repo.config_writer() as config:
            config.set_value(f'url "{remote}"', "insteadOf", "https://github.com/acme/desk.git")
    return target


def desk_workspace(
    target: Path,
    desk: str,
    scenarios: dict[str, Any] | Path,
    *,
    objective: str = "k = 3\n",
    commit: bool = True,
) -> Path:
    """A workspace for one bundled desk alone: its scenarios (a file, or a document to write), its
    policies, an `[objective]` section, committed unless `commit` is False."""
    (target / "scenarios").mkdir(parents=True)
    file = target / "scenarios" / f"{desk}.yaml"
    if isinstance(scenarios, Path):
        shutil.copy(scenarios, file)
    else:
        import yaml

        file.write_text(yaml.safe_dump(scenarios, sort_keys=False))
    shutil.copytree(REPO / "policies" / desk, target / "policies" / desk)
    (target / "improve.toml").write_text(
        f'[workspace]\nenvironment = "{desk}"\n\n[environments."{desk}"]\n'
        f'scenarios = "scenarios/{desk}.yaml"\npolicies = "policies/{desk}"\n\n[objective]\n{objective}'
    )
    if commit:
        commit_workspace(target, user="t", message="workspace")
    return target


def entry(i: int, thread: str = "train:v0:s:r1", **changes: Any) -> dict[str, Any]:
    """Line `i` of a thread file, as a dict: entry 0 is `@agent.init`, the rest `STEP`s."""
    data: dict[str, Any] = {
        "schemaVersion": 1,
        "id": f"{thread}#{i}",
        "index": i,
        "recordedAt": "2026-11-30T00:00:00Z",
        "machineId": "refunds",
        "machineVersion": "1",
        "event": {"type": "@agent.init" if i == 0 else "STEP", "n": i},
        "threadId": thread,
    }
    data.update(changes)
    return data


def log_entry(index: int, type_: str = "STEP", **fields: Any) -> LogEntry:
    """A `LogEntry` of refund-approval; `payload` goes into the event, other fields onto the entry."""
    return LogEntry(
        id=fields.pop("id", f"e{index}"),
        index=index,
        recordedAt=fields.pop("recordedAt", "2026-11-30T00:00:00Z"),
        machineId=fields.pop("machineId", "refund-approval"),
        machineVersion="1",
        event={"type": type_, **fields.pop("payload", {})},
        **fields,
    )


def write_lines(path: Path, lines: list[Any]) -> Path:
    """A JSONL file of `lines` (dicts are dumped, strings written as they are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> Any:
    """The one value a query returns."""
    row = con.execute(sql, params or []).fetchone()
    assert row is not None, sql
    return row[0]


def fold_against_interpreter(
    machine: Machine, input: Any, events: list[dict[str, Any]]
) -> list[tuple[Any, Any]]:
    """Each step of a run as the interpreter takes it (`initial`, then `transition` event by event) and
    as the fold does (`fold_of(machine)`), side by side: the snapshot reached (its JSON, and its owed actor's
    input or the error evaluating it), `not taken`, or the error raised (type and message). Both stop at
    their first error; a step that is not taken leaves the run where it was, and the next event goes on.
    Each side is given its own copy of an event, emptied once the step is taken: what a snapshot keeps of
    it must be its own."""

    def attempt(compute: Callable[[], Any]) -> Any:
        try:
            return compute()
        except Exception as error:
            return ("error", type(error).__name__, str(error))

    def outcome_of(digest: Any, snapshot: Snapshot) -> Any:
        owed = attempt(lambda: snapshot.invoke.input if snapshot.invoke is not None else None)
        return snapshot.to_json_shallow(), owed, digest

    def _fold_hash(run: Any, journaled: Any) -> Any:
        """The fold's hash, asked three ways: alone, told the reference's (the journaled one, which
        msgspec's text is hashed against first), and told another: all three must agree."""
        digest = attempt(functools.partial(fold.hash, run))
        told = [digest]
        if isinstance(journaled, str):
            told = [attempt(functools.partial(fold.hash, run, j)) for j in (journaled, "0" * 64)]
        # Then (building the owed actor): the text the hash is tried on first, made of pieces written
        # once, is msgspec's text of the snapshot.
        snapshot = fold.snapshot(run)
        invoke = (snapshot.invoke.id, snapshot.invoke.src) if snapshot.invoke is not None else None
        whole = shallow_json(
            snapshot.value,
            snapshot.context,
            snapshot.status,
            snapshot.input,
            snapshot.output,
            snapshot.error,
            invoke,
        )
        if fold.text(run) != sorted_text(whole):
            return ("the text is not msgspec's", fold.text(run), sorted_text(whole))
        return digest if all(t == digest for t in told) else ("the hash told another", digest, told)

    pairs: list[tuple[Any, Any]] = []
    fold = fold_of(machine)
    reference: Snapshot | None = None
    run = None
    for position in range(len(events) + 1):
        try:
            if position == 0:
                reference = initial(machine, input)
                expected: Any = outcome_of(attempt(reference.hash), reference)
            else:
                assert reference is not None
                event = copy.deepcopy(events[position - 1])
                after = transition(machine, reference, event)
                event.clear()
                expected = "not taken" if after is reference else outcome_of(attempt(after.hash), after)
                reference = after
        except Exception as error:
            expected = ("error", type(error).__name__, str(error))
        try:
            if position == 0:
                run = fold.start(input)
                # The hash first: the fold hashes a run whose owed actor is not built yet.
                found: Any = outcome_of(_fold_hash(run, expected[2]), fold.snapshot(run))
            else:
                assert run is not None
                event = copy.deepcopy(events[position - 1])
                taken = fold.step(run, event)
                event.clear()
                digest = _fold_hash(run, expected[2] if isinstance(expected, tuple) else None)
                found = outcome_of(digest, fold.snapshot(run)) if taken else "not taken"
        except Exception as error:
            found = ("error", type(error).__name__, str(error))
        pairs.append((expected, found))
        if expected[0] == "error" or found[0] == "error":
            break
    return pairs


FUZZ = float(os.environ.get("IMPROVE_FUZZ", "1"))
"""How much deeper than the suite's own the fuzz tests search: `make fuzz` sets IMPROVE_FUZZ=10."""


def examples(suite: int) -> int:
    """A fuzz test's `max_examples`: `suite` in `make test` (sized so the whole suite stays within its
    time), IMPROVE_FUZZ times as many in `make fuzz`."""
    return max(1, round(suite * FUZZ))
