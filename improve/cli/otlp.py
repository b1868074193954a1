"""`improve export --format otlp`: threads as OpenTelemetry traces, to files or to a collector."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from improve import DISTRIBUTION
from improve.cli.common import EXIT_FAILED, emit_json, err, out, workspace

if TYPE_CHECKING:
    from improve.warehouse import SendReport

FILE_NAME = "traces.jsonl"


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return ""


def export_otlp(
    source: str | None,
    *,
    endpoint: str | None,
    out_dir: Path | None,
    batch: int,
    content: bool,
    project: str | None,
    db: Path | None,
    as_json: bool,
    ws: Path | None,
) -> None:
    from improve.evals import otlp_export
    from improve.warehouse import headers_from_env, request_json, send_requests, traces_url, write_json_lines

    headers: dict[str, str] = {}
    if endpoint is not None:
        # Before any work: a wrong URL or a malformed header variable fails now, not after the replay.
        traces_url(endpoint)
        headers = headers_from_env(os.environ)
    space = workspace(ws)
    export = otlp_export(
        space, source, db=db, batch=batch, version=_version(), content=content, project=project
    )
    runs, unscored = export.selection.runs, export.selection.unscored
    summary: dict[str, object] = {
        "source": export.selection.origin,
        "threads": len(runs),
        "spans": export.spans,
        "requests": len(export.requests),
        "unscored": len(unscored),
        "withheld": dict(sorted(export.selection.withheld.items())),
        "projects": export.projects,
    }
    done: list[str] = []
    if endpoint is None or out_dir is not None:
        path = (out_dir or space.reports / "otlp") / FILE_NAME
        write_json_lines((request_json(r) for r in export.requests), path)
        summary["file"] = str(path)
        done.append(f"wrote {path}")
    sent: SendReport | None = None
    if endpoint is not None:
        sent = send_requests(
            export.requests, endpoint, headers=headers, progress=lambda m: err.print(m, markup=False)
        )
        summary |= sent.to_json()
        done.append(f"sent to {sent.endpoint} ({sent.retries} retries)")
    where = ", ".join(done)
    withheld = export.selection.withheld
    if as_json:
        emit_json(summary)
        if withheld:
            raise typer.Exit(EXIT_FAILED)
        return
    from rich.table import Table

    table = Table(title=f"OTLP export: {where}; Phoenix project {', '.join(export.projects)}")
    for column in ("threads", "traces", "spans", "requests", "without an outcome"):
        table.add_column(column)
    table.add_row(
        str(len(runs)), str(len(runs)), str(export.spans), str(len(export.requests)), str(len(unscored))
    )
    out.print(table)
    for thread_id, why in sorted(unscored.items())[:5]:
        err.print(f"no outcome for {thread_id}: {why}", markup=False)
    if sent is not None:
        for message in sent.messages:
            err.print(f"collector: {message}", markup=False)
    if withheld:
        # A thread that does not verify is not what was recorded: exported, it would read as a run.
        for thread_id, why in sorted(withheld.items())[:5]:
            err.print(f"not exported: {thread_id}: it does not verify: {why}", markup=False)
        err.print(
            f"{len(withheld)} thread(s) not exported: they do not verify (`improve replay THREAD --verify` "
            "says where; the warehouse's `quarantine` table holds them)",
            markup=False,
        )
        raise typer.Exit(EXIT_FAILED)
