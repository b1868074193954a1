"""`improve resume` and `improve waiting`: runs that stopped waiting for the outside world, continued later."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

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
    workspace,
)
from improve.errors import ResumeRefusedError, WorkspaceError

RESUME_EVENT = {"type": "RESUME"}
"""The event of a resume given no --event and no --answer: a checkpointed run goes on."""


def resume_command(
    thread_id: Annotated[
        str, typer.Argument(help="The waiting thread, by its id in the workspace's traces/.")
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
    environment or policy changed. The thread is then recorded in the warehouse and scored.

    Example:

        improve resume train:v0:naive:large-approved-01:r1 \\
            --event '{"type": "APPROVE", "approver": "dana"}'
    """
    from improve.evals import Ledger, ResumeRequest, resume_thread, thread_environment
    from improve.llm import Meter

    with handled():
        space = workspace(ws)
        if event is not None and answer is not None:
            raise WorkspaceError("give --event or --answer, not both")
        chosen: Any = dict(RESUME_EVENT)
        if answer is not None:
            chosen = {"type": "ANSWER", "text": answer}
        elif event is not None:
            try:
                chosen = json.loads(event)
            except json.JSONDecodeError as error:
                raise WorkspaceError(
                    f"--event is not JSON (column {error.colno}): {error.msg}; e.g. "
                    '--event \'{"type": "APPROVE", "approver": "dana"}\''
                ) from None
        environment = thread_environment(space, thread_id, env)
        meter = Meter(say=lambda m: err.print(m, markup=False))
        try:
            result = resume_thread(
                space, environment, ResumeRequest(thread_id, chosen, event_id, cache.value), meter
            )
        except ResumeRefusedError as refused:
            if as_json:
                emit_json({"thread": thread_id, "refused": refused.kind, "reason": str(refused)})
            raise
        with Ledger(space, environment) as ledger:
            recorded = ledger.record([thread_id], say=lambda m: err.print(m, markup=False))
        row = recorded.rows[0] if recorded.rows else None
        waits = _waiting_for(space, thread_id) if result.run.status != "done" else None
        document = {
            **result.to_json(),
            "waiting_for": waits,
            "passed": row.passed if row is not None else None,
            "reason": row.reason if row is not None else None,
            "quarantined": [q.reason for q in recorded.quarantined],
        }
        if as_json:
            emit_json(document)
            return
        said = (
            "already resumed with this event: nothing written"
            if result.duplicate
            else f"journaled at entry {result.entry}"
        )
        err.print(f"event {result.event_id}: {said}", markup=False)
        out.print(
            f"{thread_id}: {result.run.status} in state '{result.run.final_state}' after {result.run.entries} entries",
            markup=False,
        )
        if waits:
            out.print(f"  waits for: {', '.join(w['type'] for w in waits)}", markup=False)
        if row is not None and row.expected_outcome is not None:
            out.print(f"  {'pass' if row.passed else 'FAIL'}: {row.reason}", markup=False)


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
    """
    from improve.warehouse import open_database

    with handled():
        space = workspace(ws)
        target = db or space.warehouse
        if not Path(target).exists():
            raise WorkspaceError(
                f"no warehouse at {target}; `improve run` or `improve ingest traces/` creates it"
            )
        con = open_database(target)
        try:
            query = (
                "SELECT thread_id, environment, scenario, status, state, events, waiting_for, since, resumes "
                "FROM waiting WHERE $env IS NULL OR environment = $env ORDER BY since, thread_id"
            )
            rows = con.execute(query, {"env": env}).fetchall()
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
        if as_json:
            emit_json({"waiting": threads})
            return
        table = Table(title=f"{len(threads)} thread(s) waiting (improve resume THREAD --event ...)")
        for column in ("thread", "status", "state", "waits for", "since"):
            table.add_column(column, overflow="fold")
        for t in threads:
            table.add_row(t["thread"], t["status"], t["state"] or "", _events(t), (t["since"] or "")[:19])
        out.print(table)


def _events(thread: dict[str, Any]) -> str:
    """Each accepted event with its payload fields (a trailing ? for an optional one)."""
    shown = []
    for wait in thread["waiting_for"] or [{"type": e, "payload": {}} for e in thread["events"]]:
        payload = wait.get("payload") or {}
        required = set(payload.get("required") or ())
        fields = [f if f in required else f"{f}?" for f in payload.get("properties") or {}]
        shown.append(wait["type"] + (f"{{{', '.join(fields)}}}" if fields else ""))
    return ", ".join(shown)
