"""`improve replay`: fold threads against the pinned environment, and verify their chains."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from improve.cli.common import (
    EXIT_FAILED,
    JsonOption,
    WorkspaceOption,
    emit_json,
    err,
    handled,
    out,
    styled,
    workspace,
)
from improve.errors import DivergenceError, LogError, TamperError, WorkspaceError

if TYPE_CHECKING:
    from rich.text import Text

    from improve.evals import Workspace
    from improve.log import EntryView
    from improve.runtime import Environment


Thread = tuple[str, "Sequence[EntryView]", list[bytes]]
"""A thread to replay: its id, its entries, and the lines they were decoded from (`replay(lines=)`)."""


@dataclass(frozen=True)
class _Read:
    """A thread read, and what its file says beyond its entries (`torn`: its last line was cut short),
    with the file it was read from (what a message about the thread names)."""

    thread: Thread
    file: Path
    torn: str = ""


@dataclass(frozen=True)
class _Unreadable:
    """A source (a file, a thread) with a line that is no log entry: named, and the others still replayed."""

    source: str
    why: str


def _threads_from(args: list[str], places: Sequence[Path]) -> Iterator[_Read | _Unreadable]:
    """Files (one thread or many with `threadId`), directories of them (and of their subdirectories:
    traces/ holds a deployed agent's production/), or thread ids in `places` (traces/, then
    traces/production/), checked up front and then read one thread at a time through the bulk decode
    path, so replaying a million entries holds about one thread of them at once."""
    from improve.log import JsonlDirStore

    sources: list[tuple[str, Path]] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            sources += [("dir", d) for d in _folders_of_threads(path)]
        elif path.is_file():
            sources.append(("file", path))
        else:
            held = next((d for d in places if (d / f"{arg}.jsonl").is_file()), None)
            if held is None:
                raise WorkspaceError(
                    f"{arg}: no such file, directory, or thread in {' or '.join(str(d) for d in places)}"
                )
            sources.append(("thread", held / arg))
    found = 0
    for kind, source in sources:
        if kind == "file":
            found += 1
            yield from _file_threads(source)
            continue
        store = JsonlDirStore(source if kind == "dir" else source.parent)
        ids = store.list_threads(limit=1_000_000).thread_ids if kind == "dir" else [source.name]
        for tid in ids:
            found += 1
            try:
                yield _Read((tid, *store.read_bulk_lines(tid)), store.path(tid), _torn(store.path(tid)))
            except LogError as error:
                yield _Unreadable(tid, str(error))
    if not found:  # a directory with no thread in it: nothing replayed must not read as a pass
        raise WorkspaceError(f"no thread found in {', '.join(args)}: nothing to replay")


def _file_threads(source: Path) -> Iterator[_Read | _Unreadable]:
    """The threads of a file given by path (one, or many with `threadId`). A last line cut short (no line
    break, and no whole log entry: a torn write) is left out and said, as it is for a thread of a
    directory (the store reads only whole lines); a whole entry missing only its final line break is
    read (a file written by another tool). The threads are read from a copy of the file without that
    line, in a temporary directory under the same name (a thread without `threadId` is named by it)."""
    from improve.log import read_file_thread_lines

    torn = _torn(source)
    cut = _cut_short_at(source) if torn else None
    with contextlib.ExitStack() as stack:
        read = source
        if cut is not None:
            read = (
                Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="improve-replay-"))) / source.name
            )
            shutil.copyfile(source, read)
            os.truncate(read, cut)
        try:
            for thread in read_file_thread_lines(read):
                yield _Read(thread, source, torn if cut is not None else "")
        except LogError as error:  # the threads after the line in this file are not read
            why = str(error).replace(str(read), str(source))  # the file given, never the copy
            yield _Unreadable(str(source), f"{why} (the file's threads after that line were not replayed)")


def _cut_short_at(path: Path) -> int | None:
    """Where the file's whole lines end (the byte after its last line break) when its last line, which
    has no line break, is not a whole log entry: a torn write. None when that line reads as one."""
    from pydantic import ValidationError

    from improve.log import MAX_LINE_BYTES, decode_entry

    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = max(0, size - MAX_LINE_BYTES - 1)  # a longer line is no entry: the tail is enough
        handle.seek(start)
        tail = handle.read()
        last = tail.rfind(b"\n")
        if last < 0 and start > 0:
            # No line break in the last MAX_LINE_BYTES: the line is too long to be an entry. The whole lines
            # end after the last line break before it, looked for backwards a MiB at a time.
            while start > 0:
                step = min(start, 1 << 20)
                start -= step
                handle.seek(start)
                found = handle.read(step).rfind(b"\n")
                if found >= 0:
                    return start + found + 1
            return 0
    line = tail[last + 1 :].removesuffix(b"\r")
    try:
        decode_entry(line)
    except ValidationError:
        return start + last + 1
    return None


def _torn(path: Path) -> str:
    """Why the thread file's last line was left out, when it was: it has no line break (a run writing
    it, or a file cut short); a store reads only whole lines, as a crash mid-write leaves a torn one."""
    from improve.log import BOM

    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return ""
            start = max(0, size - 4096)
            handle.seek(start)
            tail = handle.read()
    except OSError:
        return ""
    cut = tail.rfind(b"\n")
    last = tail[cut + 1 :]
    if cut < 0 and start == 0:
        last = last.removeprefix(BOM)  # a BOM is no line (a file of only a BOM is empty)
    if not last.strip():
        return ""  # blank after the last line break: no line was cut
    return f"{path} ends with a line cut short (no line break): left out, as a torn write is"


def _folders_of_threads(root: Path) -> list[Path]:
    """`root` and every directory under it that holds a `.jsonl` file, in order: where a directory's
    threads are (hidden directories left out)."""
    found = [root]
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        if Path(directory) != root and any(f.endswith(".jsonl") for f in files):
            found.append(Path(directory))
    return found


def _paused(threads: Iterator[_Read | _Unreadable]) -> Iterator[_Read | _Unreadable]:
    """Each thread read with the cyclic collector paused (see `gc_paused`); replay runs with it on."""
    from improve.log import gc_paused

    while True:
        with gc_paused():
            thread = next(threads, None)
        if thread is None:
            return
        yield thread


def _environment_for(
    space: Workspace, machine_id: str, given: str | None, cache: dict[str, Environment]
) -> Environment:
    if given:
        if given not in cache:
            cache[given] = space.environment(given)
        return cache[given]
    if not cache:
        cache.update(space.environments_by_machine_id())
    if machine_id not in cache:
        raise WorkspaceError(
            f"no registered environment has machine id {machine_id!r} (known: {', '.join(sorted(cache))}); pass --env"
        )
    return cache[machine_id]


def _changed(environment: Environment, entries: Sequence[EntryView]) -> str:
    """Why a thread may no longer replay: the environment's files changed since it was recorded."""
    from improve.evals import recorded_with

    recorded = recorded_with(environment, entries)
    if recorded is None:
        return ""
    return (
        f" (recorded with other files of environment {environment.name!r}: digest {recorded[:12]}, now "
        f"{environment.files_digest[:12]}; a machine that behaves otherwise needs a new `version`, and a "
        "thread replays with the files that recorded it)"
    )


def replay_command(
    targets: Annotated[
        list[str],
        typer.Argument(
            help="JSONL files, directories (with their subdirectories), or thread ids in traces/."
        ),
    ],
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Check each thread's hash chain, its state hashes and its end entry."),
    ] = False,
    require_chain: Annotated[
        bool,
        typer.Option(
            "--require-chain", help="With --verify: fail on unchained (schemaVersion 1) threads too."
        ),
    ] = False,
    env: Annotated[
        str | None, typer.Option("--env", "-e", help="Environment (default: by machine id).")
    ] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Replay threads against the pinned environment: no model, tool or person is called.

    Prints each thread's final state and output. With --verify, checks each chained thread's hash
    chain (every entry's entryHash: an edited, removed, inserted or reordered entry is named), every
    journaled snapshot hash, and that the thread ends with its run's @agent.end entry; exits 1 when a
    thread is tampered, diverged or incomplete. A thread that does not fold (the machine refuses an
    entry), or has a line that is no log entry (a file of many threads: those after that line are not
    read), or is empty, is named as invalid, the others still replayed, and the exit is 1 (3 when every
    thread is empty: nothing was replayed). A thread file whose last
    line is cut short (a torn write) has it left out, and says so. Threads of the older, unchained form (schemaVersion 1)
    are checked as far as their state hashes go and reported as unchained, not as a failure (unless
    --require-chain).

    Example:

        improve replay train:v0:naive:small-refund-01:r1 --verify
    """
    from improve.log import head
    from improve.log import replay as replay_thread

    with handled():
        space = workspace(ws)
        threads = _paused(_threads_from(targets, space.thread_dirs))
        cache: dict[str, Environment] = {}
        results: list[dict[str, Any]] = []
        failed: dict[str, int] = {"tampered": 0, "diverged": 0, "invalid": 0, "incomplete": 0, "unchained": 0}
        empty: list[str] = []  # why each empty thread is: when every thread is, nothing was replayed
        for item in threads:
            if isinstance(item, _Unreadable):
                failed["invalid"] += 1
                results.append({"thread": item.source, "invalid": item.why})
                err.print(styled(("INVALID", "red"), f" {item.why}"))
                continue
            (thread_id, entries, lines), torn = item.thread, item.torn
            if torn:
                err.print(styled(("warning", "yellow"), f": {torn}"))
            if not entries:
                # Nothing to replay is no pass, but one empty file (a run that never wrote, a copy that
                # failed) says nothing about the others: named as invalid, the rest replayed.
                failed["invalid"] += 1
                why = f"{item.file}: thread {thread_id} is empty (no log entry in it): nothing to replay"
                empty.append(why)
                results.append({"thread": thread_id, "invalid": why, "empty": True, "file": str(item.file)})
                if len(empty) < len(results):  # else said once below: with the others, or as the error
                    err.print(styled(("INVALID", "red"), f" {why}"))
                continue
            if len(empty) == len(results):  # the empty threads before the first with entries
                for why in empty:
                    err.print(styled(("INVALID", "red"), f" {why}"))
            environment = _environment_for(space, entries[0].machineId, env, cache)
            try:
                result = replay_thread(
                    environment.machine, entries, verify=verify, thread_id=thread_id, lines=lines
                )
            except TamperError as error:
                failed["tampered"] += 1
                results.append(
                    {"thread": thread_id, "tampered": str(error), "entry": error.index, "kind": error.kind}
                )
                err.print(styled(("TAMPERED", "red"), f" {error}"))
                continue
            except LogError as error:
                # Diverged, or it does not fold at all (an entry the machine refuses, another machine
                # version): named, and the other threads still replayed.
                kind = "diverged" if isinstance(error, DivergenceError) else "invalid"
                failed[kind] += 1
                why = f"{error}{_changed(environment, entries)}"
                results.append({"thread": thread_id, kind: why})
                err.print(styled((kind.upper(), "red"), f" {thread_id}: {why}"))
                continue
            if result.verification == "incomplete":
                failed["incomplete"] += 1
                err.print(
                    styled(
                        ("INCOMPLETE", "red"),
                        f" {thread_id}: its {len(entries)} entries chain, but it has "
                        f"no @agent.end entry after entry {len(entries) - 1}: the run stopped before it ended, "
                        "or its last entries were removed"
                        + (" (its file's last line was cut short)" if torn else ""),
                    )
                )
            elif result.verification == "unchained":
                failed["unchained"] += 1
            results.append(
                {
                    "thread": thread_id,
                    "final_state": result.final_state,
                    "status": result.status,
                    "output": result.snapshot.output,
                    "entries": result.entries,
                    "model_calls": result.model_calls,
                    "verified": verify,
                    "verification": result.verification,
                    "head": head(entries),
                    **({"torn": torn} if torn else {}),
                }
            )
        if empty and len(empty) == len(results):
            # Not one thread with an entry: the data is missing, not a check that failed (exit 3).
            raise LogError(
                empty[0] if len(empty) == 1 else f"{len(empty)} threads are empty, e.g. {empty[0]}"
            )
        if failed["unchained"]:
            note = "fail: --require-chain" if require_chain else "not an error"
            err.print(
                f"{failed['unchained']} thread(s) are unchained (schemaVersion 1): their state hashes were "
                f"checked, the rest of their content cannot be ({note})"
            )
        if as_json:
            emit_json({"threads": results, **failed})
        else:
            bad = sum(failed[k] for k in ("tampered", "diverged", "invalid", "incomplete"))
            checked = f" ({bad} did not verify)" if bad else " (chain and hashes verified)"
            title = f"replayed {len(results)} thread(s)" + (checked if verify else "")
            from rich.table import Table

            table = Table(title=title)
            for column in ("thread", "final state", "status", "output"):
                table.add_column(column, overflow="fold")
            if verify:
                table.add_column("verification", overflow="fold")
            for shown in results:
                wrong = next((key for key in ("tampered", "diverged", "invalid") if key in shown), None)
                if wrong:
                    # Under --verify the verdict is the verification column's (a user found it empty
                    # beside "tampered" as a final state); the replay stopped, so no state is shown.
                    verdict = styled((wrong, "red"))
                    table.add_row(
                        shown["thread"],
                        "-" if verify else verdict,
                        "",
                        shown[wrong],
                        *([verdict] if verify else []),
                    )
                    continue
                row: list[str | Text] = [
                    shown["thread"],
                    shown["final_state"],
                    shown["status"],
                    # As JSON, as every other output of a run is shown (a Python repr read `None`, `True`).
                    json.dumps(shown["output"], ensure_ascii=False, default=str),
                ]
                if verify:
                    style = {"verified": "green", "unchained": "yellow"}.get(shown["verification"], "red")
                    row.append(styled((shown["verification"], style)))
                table.add_row(*row)
            out.print(table)
        if failed["tampered"] or failed["diverged"] or failed["invalid"] or failed["incomplete"]:
            raise typer.Exit(EXIT_FAILED)
        if require_chain and failed["unchained"]:
            raise typer.Exit(EXIT_FAILED)
