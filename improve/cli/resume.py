"""`improve resume` and `improve waiting`: runs that stopped waiting for the outside world, continued later."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from improve.cli.common import (
    CacheMode,
    CacheOption,
    EnvOption,
    JsonOption,
    WorkspaceOption,
    emit_json,
    err,
    handled,
    out,
    say,
    strict_json,
    workspace,
)
from improve.errors import ResumeRefusedError, WorkspaceError

RESUME_EVENT = {"type": "RESUME"}
"""The event of a resume given no --event and no --answer: a checkpointed run goes on."""


def resume_command(
    thread_id: Annotated[
        str,
        typer.Argument(help="The waiting thread, by its id in the workspace's traces/ (or its file's path)."),
    ],
    event: Annotated[
        str | None,
        typer.Option(
            "--event",
            help='The external event as JSON, e.g. \'{"type": "APPROVE", "approver": "dana"}\' (default: '
            '{"type": "RESUME"}, which a checkpointed run takes).',
        ),
    ] = None,
    answer: Annotated[
        str | None,
        typer.Option(
            "--answer",
            help='Shorthand for --event \'{"type": "ANSWER", "text": TEXT}\' (a run blocked on a question).',
        ),
    ] = None,
    event_id: Annotated[
        str | None,
        typer.Option(
            "--event-id",
            help="The event's id (a webhook delivery id): resuming again with it changes nothing. Default: "
            "derived from the wait and the event, so repeating the command is a no-op.",
        ),
    ] = None,
    finish: Annotated[
        bool,
        typer.Option(
            "--finish",
            help="Finish a resume that was interrupted (killed, a full disk) after its event was journaled: "
            "the run goes on from where the thread stops, with that event; nothing is journaled twice.",
        ),
    ] = False,
    env: Annotated[str | None, EnvOption] = None,
    cache: Annotated[CacheMode, CacheOption] = CacheMode.record,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Resume a run that stopped waiting (for an approval, an answer, the next day) with an external event.

    The thread is folded with every hash verified; the event is checked against what the waiting state
    accepts (unknown-event, invalid-payload, rejected-by-guard), journaled with its id, and the run goes
    on in the same thread to its next wait or its end, under the policy, model and world it started
    with. Refused (exit 1, nothing written): a thread that is not waiting, does not verify, or whose
    environment, policy or scenario input changed. The thread is then recorded in the warehouse and
    scored; when the warehouse cannot be written, the resume still stands (exit 0, with a warning) and
    `improve ingest traces/` records it later.

    A resume interrupted after its event was journaled (the process killed, the disk full) is finished
    by the same command again, or by --finish; until then any other event is refused.

    Example:

        improve resume train:v0:naive:large-approved-01:r1 \\
            --event '{"type": "APPROVE", "approver": "dana"}'
        improve resume train:v0:naive:large-approved-01:r1 --finish
    """
    from improve.evals import ResumeRequest, resume_thread, thread_environment
    from improve.llm import Meter
    from improve.runtime import MAX_EVENT_BYTES, MAX_EVENT_DEPTH

    with handled():
        space = workspace(ws)
        thread_id = _thread_id_of(space, thread_id)
        if event is not None and answer is not None:
            raise WorkspaceError("give --event or --answer, not both")
        chosen: Any = dict(RESUME_EVENT)
        if answer is not None:
            chosen = {"type": "ANSWER", "text": answer}
        elif event is not None:
            chosen = strict_json(
                event,
                "--event",
                f"--event '{_example_event(_waiting_for(space, thread_id))}'",
                max_bytes=MAX_EVENT_BYTES,
                max_depth=MAX_EVENT_DEPTH,
            )
        environment = thread_environment(space, thread_id, env)
        meter = Meter(say=say)
        # One writer of the workspace's threads at a time: a second resume (or run) waits for this one.
        with space.writing(say):
            try:
                result = resume_thread(
                    space,
                    environment,
                    ResumeRequest(thread_id, chosen, event_id, cache.value, finish=finish),
                    meter,
                )
            except ResumeRefusedError as refused:
                if as_json:
                    emit_json({"thread": thread_id, "refused": refused.kind, "reason": str(refused)})
                raise
            recorded, unrecorded = _record(space, environment, thread_id)
        row = recorded.rows[0] if recorded is not None and recorded.rows else None
        # A production thread has no labelled scenario: not scored, as the warehouse has it (not "FAIL").
        labelled = row is not None and bool(row.expected_outcome)
        waits = _waiting_for(space, thread_id) if result.run.status != "done" else None
        document = {
            **result.to_json(),
            "waiting_for": waits,
            "passed": row.passed if row is not None and labelled else None,
            "reason": (row.reason if labelled else UNLABELLED) if row is not None else None,
            "quarantined": [q.reason for q in recorded.quarantined] if recorded is not None else [],
            "recorded": unrecorded is None,
        }
        if unrecorded is not None:
            err.print(
                f"warning: the resume took effect (journaled at entry {result.entry}, the run {result.run.status}), "
                f"but the warehouse could not record it: {unrecorded}. Run `improve ingest traces/` once the "
                "warehouse can be written; the thread is complete in traces/",
                markup=False,
            )
        if as_json:
            emit_json(document)
            return
        said = (
            "already resumed with this event: nothing written"
            if result.duplicate
            else f"interrupted resume finished from entry {result.entry}"
            if result.finished
            else f"journaled at entry {result.entry}"
        )
        err.print(f"event {result.event_id}: {said}", markup=False)
        out.print(
            f"{thread_id}: {result.run.status} in state '{result.run.final_state}' after {result.run.entries} entries",
            markup=False,
        )
        if waits:
            out.print(f"  waits for: {', '.join(w['type'] for w in waits)}", markup=False)
        if row is not None and labelled:
            out.print(f"  {'pass' if row.passed else 'FAIL'}: {row.reason}", markup=False)
        elif row is not None:
            out.print(f"  not scored: {UNLABELLED}", markup=False)


UNLABELLED = "no labelled scenario for this thread (a production run): nothing to score it against"


def _thread_id_of(space: Any, given: str) -> str:
    """The thread id `given` names: itself, or the id of a thread file of the workspace given by its path
    (as `replay` and `scenarios add --from-thread` take one). A path elsewhere is a usage error, said so:
    it was refused as a malformed id, exit 3."""
    if not (given.endswith(".jsonl") or "/" in given):
        return given
    path = Path(given).resolve()
    if (
        path.suffix == ".jsonl"
        and path.is_file()
        and any(path.parent == d.resolve() for d in space.thread_dirs)
    ):
        return path.stem
    places = " or ".join(str(d) for d in space.thread_dirs)
    raise WorkspaceError(
        f"{given}: not a thread file of this workspace ({places}); give the thread's id, its file name "
        "without .jsonl"
    )


def _record(space: Any, environment: Any, thread_id: str) -> tuple[Any, str | None]:
    """Record the resumed thread in the warehouse: (what was recorded, None), or (None, why not) when
    the warehouse cannot be written (read-only, locked, a full disk): the resume itself stands."""
    import duckdb

    from improve.errors import ImproveError
    from improve.evals import Ledger
    from improve.files import storage_error

    try:
        with Ledger(space, environment) as ledger:
            return ledger.record([thread_id], say=say), None
    except OSError as error:
        return None, str(storage_error(error))
    except (ImproveError, duckdb.Error) as error:
        return None, str(error).splitlines()[0]


_PLACEHOLDERS = {"string": "...", "integer": 1, "number": 1.0, "boolean": True}


def _example_event(waits: list[dict[str, Any]] | None) -> str:
    """An event the thread's wait accepts, as JSON (its first, each field a value of its type), for an
    error's example: a fixed one named another desk's event and fields."""
    if not waits:
        return json.dumps({"type": "EVENT"}) + " (`improve waiting` says what each thread waits for)"
    first = waits[0]
    payload = first.get("payload") or {}
    properties = payload.get("properties") or {}
    fields = {
        name: _PLACEHOLDERS.get(str((schema or {}).get("type")), "...") for name, schema in properties.items()
    }
    return json.dumps({"type": first.get("type"), **fields})


def _waiting_for(space: Any, thread_id: str) -> list[dict[str, Any]] | None:
    """What the thread's end entry says it waits for (None when it is not waiting)."""
    from improve.log import END_EVENT, JsonlDirStore

    entries = JsonlDirStore(space.traces).read(thread_id)
    last = entries[-1] if entries else None
    if last is None or last.type != END_EVENT or "waitingFor" not in last.event:
        return None
    waits: list[dict[str, Any]] = last.event["waitingFor"]
    return waits


def waiting_command(
    env: Annotated[str | None, typer.Option("--env", "-e", help="Only threads of this environment.")] = None,
    production: Annotated[
        bool,
        typer.Option(
            "--production",
            help="Only a deployed agent's threads (of no scenario), not the evaluation runs left waiting.",
        ),
    ] = False,
    db: Annotated[
        Path | None,
        typer.Option("--db", help="Warehouse file (default: the workspace's traces/traces.duckdb)."),
    ] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """List the threads waiting to be resumed, from the warehouse: where each waits, and for what.

    A run that stops in a waiting state with nobody to answer ends `waiting` (or `checkpointed`,
    `blocked_ask`) and records the events it accepts with their payload schema; `improve run`,
    `improve resume` and `improve ingest` bring threads into the warehouse (the `waiting` view).

    Example:

        improve waiting --json
        improve waiting --production
    """
    from improve.evals import PRODUCTION_DIR

    with handled():
        space = workspace(ws)
        target = db or space.warehouse
        deployed = space.traces / PRODUCTION_DIR
        if not Path(target).exists():
            creates = (
                f"`improve ingest {deployed}` creates it"
                if production
                else "`improve run` or `improve ingest traces/` creates it"
            )
            raise WorkspaceError(f"no warehouse at {target}; {creates}")
        con = _open_for_reading(target)
        try:
            query = (
                "SELECT thread_id, environment, scenario, status, state, events, waiting_for, since, resumes "
                "FROM waiting WHERE ($env IS NULL OR environment = $env) AND (NOT $production OR scenario IS NULL) "
                "ORDER BY since, thread_id"
            )
            rows = con.execute(query, {"env": env, "production": production}).fetchall()
            unread = _not_ingested(con, deployed) if production else 0
        finally:
            con.close()
        threads = [
            {
                "thread": r[0],
                "environment": r[1],
                "scenario": r[2],
                "status": r[3],
                "state": r[4],
                "events": list(r[5] or []),
                "waiting_for": json.loads(r[6]) if r[6] else None,
                "since": r[7].isoformat() if r[7] is not None else None,
                "resumes": int(r[8]),
            }
            for r in rows
        ]
        if unread:
            # A deployed agent's threads reach the warehouse only by `improve ingest`: "0 waiting" alone
            # would read as nobody waiting while its threads on disk wait.
            err.print(
                f"{unread} thread file(s) in {deployed} are not in the warehouse as they are on disk, so "
                f"this list may miss their waits: `improve ingest {deployed}` brings them in",
                markup=False,
            )
        if as_json:
            emit_json({"waiting": threads, **({"not_ingested": unread} if production else {})})
            return
        from rich.table import Table

        table = Table(
            title=f"{len(threads)} thread(s) waiting (improve resume THREAD --event ...; an interrupted "
            "resume: improve resume THREAD --finish)"
        )
        for column in ("thread", "status", "state", "waits for", "since"):
            table.add_column(column, overflow="fold")
        for t in threads:
            table.add_row(t["thread"], t["status"], t["state"] or "", _events(t), (t["since"] or "")[:19])
        out.print(table)


def _not_ingested(con: Any, directory: Path) -> int:
    """How many of the thread files in `directory` the warehouse has not read as they are now (never
    ingested, or grown since: their size differs from what `ingested_files` recorded)."""
    files = {str(p.resolve()): p.stat().st_size for p in directory.glob("*.jsonl") if p.is_file()}
    if not files:
        return 0
    read = dict(
        con.execute(
            "SELECT path, size FROM ingested_files WHERE list_contains($paths, path)", {"paths": list(files)}
        ).fetchall()
    )
    return sum(1 for path, size in files.items() if read.get(path) != size)


def _open_for_reading(target: Path) -> Any:
    """The warehouse, opened to be brought up to date (migrated, its views recreated) when it can be
    written, else read-only as it stands: listing what waits needs no write (`improve sql` reads a
    read-only warehouse too)."""
    from improve.errors import (
        ImproveError,
        WarehouseDamagedError,
        WarehouseLockedError,
        WarehouseVersionError,
    )
    from improve.warehouse import open_database

    try:
        return open_database(target)
    except (WarehouseDamagedError, WarehouseLockedError, WarehouseVersionError):
        raise
    except (ImproveError, OSError) as error:
        try:
            return open_database(target, read_only=True)
        except ImproveError:
            raise error from None


def _events(thread: dict[str, Any]) -> str:
    """Each accepted event with its payload fields (a trailing ? for an optional one)."""
    if thread["status"] == "interrupted":
        return f"nothing: a resume was interrupted (improve resume {thread['thread']} --finish)"
    shown = []
    for wait in thread["waiting_for"] or [{"type": e, "payload": {}} for e in thread["events"]]:
        payload = wait.get("payload") or {}
        required = set(payload.get("required") or ())
        fields = [f if f in required else f"{f}?" for f in payload.get("properties") or {}]
        shown.append(wait["type"] + (f"{{{', '.join(fields)}}}" if fields else ""))
    return ", ".join(shown)
