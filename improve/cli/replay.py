"""`improve replay`: fold threads against the pinned environment, and verify their chains."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from improve.cli.common import (
    EXIT_FAILED,
    JsonOption,
    WorkspaceOption,
    emit_json,
    err,
    handled,
    out,
    workspace,
)
from improve.errors import DivergenceError, LogError, TamperError, WorkspaceError
from improve.evals import Workspace
from improve.log import JsonlDirStore, LogEntry, entry_problems, gc_paused, head, line_problem, split_lines
from improve.log import replay as replay_thread
from improve.runtime import Environment


def _threads_from(args: list[str], traces: Path) -> list[tuple[str, list[LogEntry]]]:
    """Files (one thread or many with `threadId`), directories of them, or thread ids in traces/."""
    found: list[tuple[str, list[LogEntry]]] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            store = JsonlDirStore(path)
            page = store.list_threads(limit=1_000_000)
            found += [(tid, store.read(tid)) for tid in page.thread_ids]
        elif path.is_file():
            found += _read_file(path)
        elif (traces / f"{arg}.jsonl").is_file():
            found.append((arg, JsonlDirStore(traces).read(arg)))
        else:
            raise WorkspaceError(f"{arg}: no such file, directory, or thread in {traces}")
    if not found:  # a directory with no thread in it: nothing replayed must not read as a pass
        raise WorkspaceError(f"no thread found in {', '.join(args)}: nothing to replay")
    return found


def _read_file(path: Path) -> list[tuple[str, list[LogEntry]]]:
    """Read as bytes and decode line by line: a binary or invalid-UTF-8 file is refused with the line
    it goes wrong on, not with a decoder's traceback. A leading byte-order mark is dropped, as ingest does."""
    threads: dict[str, list[LogEntry]] = defaultdict(list)
    # The reader ingest uses too (improve.log.lines): a BOM and CRLF line ends read the same everywhere.
    try:
        data = path.read_bytes()
    except OSError as error:
        raise LogError(f"{path}: cannot be read ({error.strerror})") from None
    for number, line in split_lines(data):
        problem = line_problem(line)
        if problem is not None:
            raise LogError(f"{path}:{number}: not a log entry: {problem}")
        try:
            entry = LogEntry.model_validate_json(line)
        except ValidationError as error:
            raise LogError(f"{path}:{number}: not a log entry: {entry_problems(error)}") from None
        threads[entry.threadId or path.stem].append(entry)
    # An empty (or blank) file is an empty thread, refused by the caller, not zero threads that pass.
    return list(threads.items()) or [(path.stem, [])]


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


def replay_command(
    targets: Annotated[list[str], typer.Argument(help="JSONL files, directories, or thread ids in traces/.")],
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
    thread is tampered, diverged or incomplete. Threads of the older, unchained form (schemaVersion 1)
    are checked as far as their state hashes go and reported as unchained, not as a failure (unless
    --require-chain).

    Example:

        improve replay train:v0:naive:small-refund-01:r1 --verify
    """
    with handled():
        space = workspace(ws)
        with gc_paused():
            threads = _threads_from(targets, space.traces)
        cache: dict[str, Environment] = {}
        results: list[dict[str, Any]] = []
        failed: dict[str, int] = {"tampered": 0, "diverged": 0, "incomplete": 0, "unchained": 0}
        for thread_id, entries in threads:
            if not entries:
                raise LogError(f"thread {thread_id} is empty")
            environment = _environment_for(space, entries[0].machineId, env, cache)
            try:
                result = replay_thread(environment.machine, entries, verify=verify, thread_id=thread_id)
            except TamperError as error:
                failed["tampered"] += 1
                results.append(
                    {"thread": thread_id, "tampered": str(error), "entry": error.index, "kind": error.kind}
                )
                err.print(f"[red]TAMPERED[/] {escape(str(error))}", markup=True)
                continue
            except DivergenceError as error:
                failed["diverged"] += 1
                results.append({"thread": thread_id, "diverged": str(error)})
                err.print(f"[red]DIVERGED[/] {escape(thread_id)}: {escape(str(error))}", markup=True)
                continue
            if result.verification == "incomplete":
                failed["incomplete"] += 1
                err.print(
                    f"[red]INCOMPLETE[/] {escape(thread_id)}: its {len(entries)} entries chain, but it has "
                    f"no @agent.end entry after entry {len(entries) - 1}: the run stopped before it ended, "
                    "or its last entries were removed",
                    markup=True,
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
                }
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
            title = f"replayed {len(results)} thread(s)" + (" (chain and hashes verified)" if verify else "")
            table = Table(title=title)
            for column in ("thread", "final state", "status", "output"):
                table.add_column(column, overflow="fold")
            if verify:
                table.add_column("verification", overflow="fold")
            for item in results:
                bad = next((key for key in ("tampered", "diverged") if key in item), None)
                if bad:
                    table.add_row(
                        item["thread"], f"[red]{bad}[/]", "", escape(item[bad]), *([""] if verify else [])
                    )
                    continue
                row = [item["thread"], item["final_state"], item["status"], escape(str(item["output"]))]
                if verify:
                    style = {"verified": "green", "unchained": "yellow"}.get(item["verification"], "red")
                    row.append(f"[{style}]{item['verification']}[/]")
                table.add_row(*row)
            out.print(table)
        if failed["tampered"] or failed["diverged"] or failed["incomplete"]:
            raise typer.Exit(EXIT_FAILED)
        if require_chain and failed["unchained"]:
            raise typer.Exit(EXIT_FAILED)
