"""Threads chosen for export as OpenTelemetry traces, each with its outcome: from JSONL files (replayed
and scored here, nothing written) or from the warehouse (its outcome rows), and the OTLP requests that
carry them. `improve export --format otlp` prints what this returns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from improve.errors import ConfigError, WorkspaceError
from improve.evals.outcome import OutcomeRow

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from improve.evals.workspace import Workspace
    from improve.warehouse import RunOutcome, ThreadRun


@dataclass(frozen=True)
class ExportSelection:
    """The threads to export, with their outcomes, and why some have none."""

    runs: list[ThreadRun]
    unscored: dict[str, str]
    """Thread id -> why it has no outcome (not in the warehouse's outcomes, an unknown environment)."""
    origin: str
    """Where they were read: the file or directory given, or the warehouse's path."""
    withheld: dict[str, str] = dataclasses.field(default_factory=dict)
    """Thread id -> why it is not exported: it does not verify (an entry edited, removed or moved, or it
    has no end entry yet; the warehouse's `quarantine`), so its content is not what was recorded, and a
    trace would show it as a run."""


@dataclass(frozen=True)
class OtlpExport:
    """The OTLP requests for a selection, and what they hold."""

    selection: ExportSelection
    requests: list[ExportTraceServiceRequest]
    spans: int
    projects: list[str]
    """The Phoenix projects the requests name (the resource attribute Phoenix files traces under)."""


def run_outcome(row: OutcomeRow | None) -> RunOutcome | None:
    """A scored run's outcome as a trace carries it (None: the run was not scored)."""
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


def _looks_like_path(source: str) -> bool:
    return "/" in source or source.endswith((".jsonl", ".json"))


def _named_tools(space: Workspace, runs: list[ThreadRun]) -> list[ThreadRun]:
    """The runs, each with the tools its machine's invokes run (`tools_of`), when the workspace knows
    that machine: its tool spans are named for the tool, not the state."""
    from improve.warehouse import tools_of

    machines = {run.entries[0].machineId for run in runs if run.entries}
    if not machines:
        return runs
    known = space.environments_by_machine_id()
    tools = {m: tools_of(known[m].machine) for m in machines if m in known}
    return [
        dataclasses.replace(run, tools=tools.get(run.entries[0].machineId, {})) if run.entries else run
        for run in runs
    ]


def select_for_export(space: Workspace, source: str | None, db: Path | None = None) -> ExportSelection:
    """The threads `source` names: a JSONL file or directory (each thread replayed and scored against
    the workspace's environments), else a thread id prefix or a query over the warehouse at `db`
    (default: the workspace's), whose outcome rows come with them."""
    from improve.evals.materialize import score_threads
    from improve.warehouse import (
        ThreadRun,
        file_threads,
        open_database,
        selected_thread_ids,
        warehouse_threads,
    )

    if source is not None and Path(source).exists():
        threads = file_threads([source])
        if not threads:
            raise WorkspaceError(f"{source}: no thread found (no *.jsonl file with a log entry)")
        scored = score_threads(space, threads)
        runs = [
            ThreadRun(tid, entries, run_outcome(scored.rows.get(tid)))
            for tid, entries in threads
            if tid not in scored.unverified
        ]
        withheld = {tid: why for tid, why in scored.unscored.items() if tid in scored.unverified}
        unscored = {tid: why for tid, why in scored.unscored.items() if tid not in scored.unverified}
        return ExportSelection(_named_tools(space, runs), unscored, source, withheld)
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
        selected = selected_thread_ids(con, source)
        withheld = dict(
            con.execute(
                "SELECT thread_id, reason FROM quarantine WHERE list_contains(?, thread_id)", [selected]
            ).fetchall()
        )
        runs = warehouse_threads(con, [tid for tid in selected if tid not in withheld])
    finally:
        con.close()
    return ExportSelection(
        _named_tools(space, runs),
        {r.thread_id: "no outcomes row" for r in runs if r.outcome is None},
        str(target),
        withheld,
    )


def otlp_export(
    space: Workspace,
    source: str | None,
    *,
    db: Path | None = None,
    batch: int,
    version: str,
    content: bool,
    project: str | None = None,
) -> OtlpExport:
    """The threads `source` names (`select_for_export`) as OTLP requests of at most `batch` threads each
    (`content`: with what runs were told and answered), filed under the Phoenix `project` (default: the
    workspace's). The options are checked before any thread is read."""
    from improve.warehouse import OTLP_PROJECT, export_requests

    if batch < 1:
        raise ConfigError(f"--batch must be at least 1 thread per request, got {batch}")
    if project is not None and not project.strip():
        raise ConfigError("--project is empty; give the Phoenix project's name, e.g. --project refunds")
    selection = select_for_export(space, source, db)
    requests = list(
        export_requests(
            selection.runs,
            batch=batch,
            version=version,
            content=content,
            project=project or space.config.otlp.project,
        )
    )
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
    return OtlpExport(selection, requests, spans, projects)
