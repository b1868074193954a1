"""`improve export --format otlp`: threads as OpenTelemetry traces, to files or to a collector."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from improve import DISTRIBUTION
from improve.cli.common import emit_json, err, out, workspace
from improve.errors import ConfigError, WorkspaceError

if TYPE_CHECKING:
    from improve.evals import OutcomeRow
    from improve.warehouse import RunOutcome, SendReport

FILE_NAME = "traces.jsonl"


def _outcome(row: OutcomeRow | None) -> RunOutcome | None:
    from improve.warehouse import RunOutcome

    if row is None:
        return None
    return RunOutcome(
        final_state=row.final_state,
        status=row.status,
        passed=row.passed if row.expected_outcome else None,  # unscored: no labelled scenario
        expected_outcome=row.expected_outcome or None,
        violation_rules=tuple(str(v.get("rule")) for v in row.violations),
        reason=row.reason,
    )


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return ""


def _looks_like_path(source: str) -> bool:
    return "/" in source or source.endswith((".jsonl", ".json"))


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
    from improve.warehouse import (
        OTLP_PROJECT,
        ThreadRun,
        export_requests,
        file_threads,
        headers_from_env,
        open_database,
        request_json,
        selected_thread_ids,
        send_requests,
        traces_url,
        warehouse_threads,
        write_json_lines,
    )

    if batch < 1:
        raise ConfigError(f"--batch must be at least 1 thread per request, got {batch}")
    headers: dict[str, str] = {}
    if endpoint is not None:
        # Before any work: a wrong URL or a malformed header variable fails now, not after the replay.
        traces_url(endpoint)
        headers = headers_from_env(os.environ)
    space = workspace(ws)
    if project is not None and not project.strip():
        raise ConfigError("--project is empty; give the Phoenix project's name, e.g. --project refunds")
    project = project or space.config.otlp.project
    unscored: dict[str, str] = {}
    if source is not None and Path(source).exists():
        threads = file_threads([source])
        if not threads:
            raise WorkspaceError(f"{source}: no thread found (no *.jsonl file with a log entry)")
        from improve.evals import score_threads

        rows, unscored = score_threads(space, threads)
        runs = [ThreadRun(tid, entries, _outcome(rows.get(tid))) for tid, entries in threads]
        origin = source
    else:
        if source is not None and _looks_like_path(source):
            raise WorkspaceError(
                f"{source}: no such file or directory; pass a JSONL thread file or directory, a thread id "
                "prefix, or a query"
            )
        target = db or space.warehouse
        if not Path(target).exists():
            raise WorkspaceError(
                f"no warehouse at {target}; pass a JSONL file or directory of threads, or create the "
                "warehouse with `improve ingest traces/`"
            )
        con = open_database(target, sandboxed=True)
        try:
            runs = warehouse_threads(con, selected_thread_ids(con, source))
        finally:
            con.close()
        unscored = {r.thread_id: "no outcomes row" for r in runs if r.outcome is None}
        origin = str(target)
    requests = list(export_requests(runs, batch=batch, version=_version(), content=content, project=project))
    spans = sum(len(s.spans) for r in requests for rs in r.resource_spans for s in rs.scope_spans)
    projects = sorted(
        {
            kv.value.string_value
            for r in requests
            for rs in r.resource_spans
            for kv in rs.resource.attributes
            if kv.key == OTLP_PROJECT
        }
    )
    summary: dict[str, object] = {
        "source": origin,
        "threads": len(runs),
        "spans": spans,
        "requests": len(requests),
        "unscored": len(unscored),
        "projects": projects,
    }
    done: list[str] = []
    if endpoint is None or out_dir is not None:
        path = (out_dir or space.reports / "otlp") / FILE_NAME
        write_json_lines((request_json(r) for r in requests), path)
        summary["file"] = str(path)
        done.append(f"wrote {path}")
    sent: SendReport | None = None
    if endpoint is not None:
        sent = send_requests(
            requests, endpoint, headers=headers, progress=lambda m: err.print(m, markup=False)
        )
        summary |= sent.to_json()
        done.append(f"sent to {sent.endpoint} ({sent.retries} retries)")
    where = ", ".join(done)
    if as_json:
        emit_json(summary)
        return
    table = Table(title=f"OTLP export: {where}; Phoenix project {', '.join(projects)}")
    for column in ("threads", "traces", "spans", "requests", "without an outcome"):
        table.add_column(column)
    table.add_row(str(len(runs)), str(len(runs)), str(spans), str(len(requests)), str(len(unscored)))
    out.print(table)
    for thread_id, why in sorted(unscored.items())[:5]:
        err.print(f"no outcome for {thread_id}: {why}", markup=False)
    if sent is not None:
        for message in sent.messages:
            err.print(f"collector: {message}", markup=False)
