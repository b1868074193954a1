"""`improve ingest`, `improve sql` and `improve export`: the trace warehouse from the command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from improve.cli.common import (
    EXIT_FAILED,
    JsonOption,
    WorkspaceOption,
    emit_json,
    err,
    handled,
    out,
    say,
    styled,
    workspace,
)
from improve.errors import WorkspaceError

if TYPE_CHECKING:
    import duckdb

# The log's line limit, written out so that `--help` imports neither the log nor the warehouse (DuckDB alone
# takes longer to import than the whole help); tests/test_cli.py holds it equal to the library's.
MAX_LINE_BYTES = 8 << 20

DbOption = typer.Option("--db", help="Warehouse file (default: the workspace's traces/traces.duckdb).")


def ingest_command(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="JSONL files, directories (every *.jsonl below; with --format otlp every .json, .jsonl and "
            ".ndjson) or globs."
        ),
    ],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="The importer: native, normalize, opencli, otlp (OpenTelemetry OTLP/JSON trace exports, into "
            "otel_spans), or one a package or improve.toml ([importers.NAME] module = ...) registers.",
        ),
    ] = "native",
    db: Annotated[Path | None, DbOption] = None,
    allow_rejects: Annotated[
        bool, typer.Option("--allow-rejects", help="Exit 0 even when lines were rejected.")
    ] = False,
    outcomes: Annotated[
        bool, typer.Option("--outcomes/--no-outcomes", help="Replay new threads into `outcomes`.")
    ] = True,
    lock_timeout: Annotated[
        float | None,
        typer.Option(
            "--lock-timeout",
            help="Seconds to wait for another writer (default: $IMPROVE_LOCK_TIMEOUT, else 30).",
            min=0,
        ),
    ] = None,
    max_line_bytes: Annotated[
        int,
        typer.Option("--max-line-bytes", help="Reject a line longer than this many bytes (default 8 MiB)."),
    ] = MAX_LINE_BYTES,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Ingest JSONL threads into the DuckDB warehouse: one batch, one transaction, nothing lost.

    Every line lands, is recognised as already present, or goes to `rejected_lines` with its file, line
    number and reason (not UTF-8, longer than --max-line-bytes, nested too deep, not an entry, a
    conflict, a gap); the command prints, per file, lines read = ingested + already present + rejected.
    A file that cannot be read (a directory, a FIFO, a dangling link, a binary file) is skipped with the
    reason and the rest goes on. It exits 1 when anything was rejected or skipped (unless
    --allow-rejects), 3 when the warehouse file is damaged. Ingesting the same files again adds
    nothing. Then every new thread of a known environment is replayed into `outcomes`; the threads of
    an environment the workspace does not register are counted by machine and said not replayed.

    --format otlp reads OpenTelemetry trace exports (OTLP/JSON, as the Collector's file exporter, an
    SDK's request as JSON or `improve export --format otlp` write them) into `otel_spans` and the
    `otel_sessions` view; the unit counted is the span: spans read = ingested + already present +
    rejected, each malformed span rejected with where it is and why.

    Example:

        improve ingest traces/
        improve ingest --format normalize ~/normalize-agent/logs
        improve ingest --format otlp phoenix-export.jsonl
    """
    import duckdb

    from improve.evals import refresh_outcomes
    from improve.warehouse import OTLP_FORMAT, damaged, expand_paths, ingest, ingest_otlp, open_database

    with handled("interrupted: a batch is committed whole or not at all; run the command again to finish"):
        space = workspace(ws)
        target = db or space.warehouse
        # Before the warehouse is opened (and created): a wrong path must leave no empty warehouse behind.
        if not expand_paths(paths) and fmt != OTLP_FORMAT:  # (OTLP's .json files are found otherwise)
            where = ", ".join(str(p) for p in paths)
            err.print(f"no thread file in {where}: nothing to ingest", markup=False)
            if not Path(target).exists():  # nor a warehouse to create for it
                if as_json:
                    emit_json({"files": [], "lines_read": 0, "ingested": 0, "warehouse": None})
                return
        con = open_database(target, lock_timeout=lock_timeout, say=say)
        spans = fmt == OTLP_FORMAT
        try:
            if spans:
                report = ingest_otlp(
                    con, paths, progress=lambda m: err.print(f"ingest: {m}"), max_line_bytes=max_line_bytes
                )
            else:
                report = ingest(
                    con,
                    paths,
                    fmt=fmt,
                    local=space.specs("importers"),
                    root=space.root,
                    progress=lambda m: err.print(f"ingest: {m}"),
                    max_line_bytes=max_line_bytes,
                )
            materialized = None
            if outcomes and not spans:
                materialized = refresh_outcomes(
                    con, space, progress=lambda d, t: err.print(f"outcomes: {d}/{t}")
                )
        except duckdb.Error as failure:
            raise damaged(target, failure) or failure from None
        finally:
            con.close()
        if as_json:
            doc = report.to_json() | {"warehouse": str(target)}
            if spans:
                doc["unit"] = "span"  # lines_read counts spans (and lines that held none)
                doc["requests_unread"] = report.unread
            if materialized:
                doc["outcomes"] = materialized.__dict__
            emit_json(doc)
        else:
            from rich.table import Table

            table = Table(title=f"ingest into {target} ({report.seconds:.2f}s)")
            unit = "spans read" if spans else "lines read"
            # `read`: how the file was read (bulk, careful line by line, unchanged and not read again);
            # the report's field is `path`, the code path (a user read it as a file's).
            for column in ("file", unit, "ingested", "already present", "rejected", "read"):
                table.add_column(column, overflow="fold")
            shown = report.files if len(report.files) <= 20 else [f for f in report.files if f.rejected]
            if len(shown) < len(report.files):
                table.caption = f"{len(report.files) - len(shown)} clean file(s) not listed (all in --json)"
            for f in shown:
                style = "red" if f.rejected else ""
                table.add_row(
                    f.file,
                    str(f.lines_read),
                    str(f.ingested),
                    str(f.already_present),
                    styled((str(f.rejected), style)) if style else "0",
                    f.path,
                )
            table.add_row(
                styled(("total", "bold")),
                str(report.lines_read),
                str(report.ingested),
                str(report.already_present),
                str(report.rejected),
                "",
            )
            out.print(table)
            for skip in report.skipped:
                err.print(f"skipped {skip.file}: {skip.reason}", markup=False)
            for file, line, error in report.rejections:
                err.print(f"rejected {file}:{line}: {error}", markup=False)
            if fmt == "native":
                # Every line of a file refused as no log entry: most likely another tool's log.
                for f in report.files:
                    if f.lines_read and f.rejected == f.lines_read:
                        err.print(
                            f"{f.file}: none of its lines is an improve log entry: another tool's log? "
                            "`--format normalize`, `opencli` or `otlp` reads those, or an importer of "
                            "your own (docs/interop.md)",
                            markup=False,
                        )
            if report.rejected > len(report.rejections):
                more = report.rejected - len(report.rejections)
                err.print(
                    f"... {more} more in the rejected_lines table"
                    if report.rejections
                    else f"{more} rejected in the rejected_lines table"
                )
            if materialized:
                err.print(
                    f"outcomes: {materialized.replayed} thread(s) replayed ({materialized.scored} scored, "
                    f"{materialized.failed} failed)"
                )
                for problem in materialized.errors or []:
                    err.print(f"  {problem}", markup=False)
                for machine, count in materialized.unknown_machines.items():
                    err.print(
                        f"{count} thread(s) of unknown environment {machine} not replayed: no environment "
                        f"this workspace registers has machine {machine!r}; add it to improve.toml "
                        f'([environments.NAME] module = "..."), or ingest them from its own workspace',
                        markup=False,
                    )
                if materialized.quarantined:
                    err.print(
                        f"set aside {materialized.quarantined} thread(s) whose replay does not verify, never "
                        'scored (`improve sql "SELECT * FROM quarantine"`):',
                        markup=False,
                    )
                    for problem in materialized.set_aside:
                        err.print(f"  {problem}", markup=False)
        if (report.rejected or report.skipped) and not allow_rejects:
            if report.rejected:
                unread = (
                    f" ({report.unread} of them whole requests that could not be read at all, each counted as "
                    "one: the spans in them are not counted)"
                    if report.unread
                    else ""
                )
                err.print(
                    f"{report.rejected} {'span' if spans else 'line'}(s) rejected{unread}: see "
                    f'`improve sql "SELECT * FROM rejected_lines"`; {_rest(report.ingested, spans)} (use '
                    "--allow-rejects to accept a partial ingest)"
                )
            if report.skipped:
                err.print(
                    f"{len(report.skipped)} file(s) skipped (listed above, and under skipped in --json); "
                    f"{_rest(report.ingested, spans)} (use --allow-rejects to accept a partial ingest)"
                )
            raise typer.Exit(EXIT_FAILED)


def sql_command(
    statement: Annotated[str | None, typer.Argument(help="One SQL statement (DuckDB dialect).")] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="table, csv, json (one strict JSON array of row objects) or markdown. Values are shown as "
            "stored, each type rendered one way in all four (INTERVAL as an ISO 8601 duration, BLOB as base64, "
            "NaN as null in json; README, The trace warehouse).",
        ),
    ] = "table",
    db: Annotated[Path | None, DbOption] = None,
    lake: Annotated[
        Path | None,
        typer.Option(
            "--lake", help="Query a Parquet lake written by `improve export` instead of the warehouse."
        ),
    ] = None,
    schema: Annotated[
        bool,
        typer.Option(
            "--schema",
            help="Print tables, views and every column's description (a new warehouse's when there is none yet).",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="The same as --format json: one JSON document on stdout.")
    ] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Query the trace warehouse with SQL (read-only).

    The warehouse is a plain DuckDB file: the same SQL works from the `duckdb` CLI or Python. Views:
    threads, decisions, attempts, usage, outcomes, otel_sessions (see --schema). DuckDB's errors are shown
    as they are.
    With --lake DIR, the same views run over the Parquet files of a lake instead.

    Read-only, enforced: exactly one statement, and only SELECT (WITH, DESCRIBE, SHOW, SUMMARIZE),
    EXPLAIN of a query or PRAGMA table_info; anything else is refused, naming the rule, with exit 2
    before it runs. The connection is read-only with DuckDB's hardening settings: no files or network
    beyond the warehouse (or the lake), no extensions, configuration locked.

    Example:

        improve sql "SELECT guard, count(*) AS n FROM attempts GROUP BY guard"
        improve sql --json "SELECT thread_id FROM outcomes WHERE NOT passed"
        improve sql --lake lake/ \\
            "SELECT policy_version, avg(passed::INT) FROM outcomes GROUP BY ALL"
    """
    from improve.warehouse import FORMATS, open_database, open_lake

    with handled():
        if fmt not in FORMATS:
            raise WorkspaceError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
        if as_json:
            # --json, as every command that prints a result takes it; a table is only the default.
            if fmt not in ("table", "json"):
                raise WorkspaceError(f"give --json or --format {fmt}, not both: --json is --format json")
            fmt = "json"
        if lake is not None:
            if db is not None:
                raise WorkspaceError(
                    "give --db or --lake, not both: --lake queries a lake instead of a warehouse"
                )
            con = open_lake(lake, sandboxed=True)
        else:
            space = workspace(ws)
            target = db or space.warehouse
            if Path(target).exists():
                con = open_database(target, sandboxed=True, say=say)
            elif schema:
                # The schema is the code's (the migrations and views.py), so an analyst can read it before
                # the first run: a new warehouse's, made in memory.
                say(f"no warehouse at {target} yet: the schema `improve ingest traces/` creates there")
                con = open_database(":memory:")
            else:
                raise WorkspaceError(f"no warehouse at {target}; create it with `improve ingest traces/`")
        try:
            _sql(con, statement, fmt, schema, target if lake is None else lake)
        finally:
            con.close()


def _sql(con: duckdb.DuckDBPyConnection, statement: str | None, fmt: str, schema: bool, source: Path) -> None:
    import duckdb

    from improve.warehouse import (
        cell_text,
        damaged,
        query_readonly,
        render_csv,
        render_json,
        render_markdown,
        schema_doc,
    )

    if schema:
        doc = schema_doc(con)
        if fmt == "json":
            emit_json(doc)
            return
        for rel in doc:
            out.print(styled((rel["name"], "bold"), f" ({rel['kind']}): {rel['description']}"))
            for c in rel["columns"]:
                out.print(f"    {c['name']:<18} {c['type']:<14} {c['description']}", markup=False)
        return
    if not statement:
        raise WorkspaceError("give a SQL statement, or --schema")
    # A refused statement (SqlRefusedError, exit 2) never reaches DuckDB; a DuckDB error is shown as it is.
    try:
        result = query_readonly(con, statement)
    except duckdb.Error as error:
        if (problem := damaged(source, error)) is not None:
            raise problem from None  # a damaged file is a data error (exit 3), not a bad statement
        err.print(str(error), markup=False)
        if isinstance(error, duckdb.CatalogException) and "does not exist" in str(error):
            # DuckDB suggests the nearest name in its own catalog (`duckdb_constraints` for `runs`).
            relations = schema_doc(con)
            views = ", ".join(r["name"] for r in relations if r["kind"] == "view")
            tables = ", ".join(r["name"] for r in relations if r["kind"] == "table")
            err.print(
                f"the warehouse's views: {views}; its tables: {tables} (`improve sql --schema` describes "
                "every column; a run's result is a row of outcomes, its entries are rows of entries)",
                markup=False,
            )
        if isinstance(error, duckdb.PermissionException):
            err.print(
                "improve sql reads the warehouse (or the lake) only: files elsewhere and the network are "
                "closed to it; query them with the duckdb CLI or Python yourself"
            )
        raise typer.Exit(2) from None
    if fmt == "csv":
        sys.stdout.write(render_csv(result))
    elif fmt == "json":
        sys.stdout.write(render_json(result) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(render_markdown(result))
    else:
        from rich.table import Table

        table = Table(show_lines=False)
        for column in result.columns:
            table.add_column(column, overflow="fold")
        for row in result.rows:
            table.add_row(*(cell_text(v) for v in row))
        out.print(table)
        err.print(f"{len(result.rows)} row(s)")


def export_command(
    source: Annotated[
        str | None,
        typer.Argument(
            metavar="[DIR | PATH_OR_QUERY]",
            help="parquet: the lake, a new or empty directory or a lake to replace. otlp: the threads, a JSONL "
            "file or directory, a thread id prefix (train:v2:) or a query selecting thread_id from the "
            "warehouse (default: every thread in the warehouse).",
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="parquet (a lake) or otlp (OpenTelemetry traces).")
    ] = ("parquet"),
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint",
            help="otlp: send to this OTLP/HTTP collector (e.g. http://localhost:4318; spans go to its "
            "/v1/traces) instead of writing files. Headers from OTEL_EXPORTER_OTLP_HEADERS.",
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="otlp: the directory to write traces.jsonl into (default: reports/otlp; with --endpoint, "
            "written only when given).",
        ),
    ] = None,
    batch: Annotated[int, typer.Option("--batch", help="otlp: threads per export request.")] = 100,
    content: Annotated[
        bool,
        typer.Option(
            "--content/--no-content",
            help="otlp: include what runs were told and answered (inputs, tool outputs, decision payloads, the "
            "messages of model calls); "
            "--no-content keeps names, types, counts, tokens and outcomes only.",
        ),
    ] = True,
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            help="otlp: the Arize Phoenix project to file the traces under (the resource attribute "
            "openinference.project.name; default: [otlp] project in improve.toml, else each environment's name).",
        ),
    ] = None,
    db: Annotated[Path | None, DbOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Export the warehouse as a Parquet lake, or threads as OpenTelemetry traces.

    --format parquet: the warehouse's entries, outcomes and quarantine as Hive-partitioned Parquet in
    DIR, each partitioned by environment, policy version and day (the thread's
    first day, UTC), so Spark, polars (`scan_parquet(..., hive_partitioning=True)`), DuckDB or Athena
    read only the partitions a query needs; DIR/_lake.json lists the tables, columns and row counts.
    Exporting again replaces the lake (written beside it, swapped in when complete): rows are never
    duplicated. `improve sql --lake DIR` runs the warehouse's views over it.

    --format otlp: one trace per thread, in the OpenTelemetry GenAI semantic conventions and
    OpenInference's (Arize Phoenix, MLflow): an `invoke_agent` span per run, named by its scenario and
    outcome (failed runs have status ERROR), a `chat` span per model call (model, tokens, what it was
    asked and answered), an `execute_tool` span per tool call, events for guard refusals and retries;
    each thread is a session (docs/interop.md). Ids derive from the thread ids,
    so exporting again gives the same traces. Without --endpoint it writes OTLP/JSON (one export
    request per line) to --out/traces.jsonl; with one it POSTs protobuf to the collector, in batches,
    retrying 429 and 5xx with backoff (exit 3 after the last try). Threads from files are replayed and
    scored against the workspace's scenarios; threads from the warehouse take their `outcomes` row. A
    thread that does not verify (edited, cut short: the warehouse's quarantine) is not exported: each is
    named, and the command exits 1.

    Example:

        improve export --format parquet lake/
        improve sql --lake lake/ "SELECT count(*) FROM threads"
        improve export --format otlp --endpoint http://localhost:4318 \\
            "SELECT thread_id FROM outcomes WHERE NOT passed"
        improve export --format otlp --endpoint http://localhost:6006 \\
            --project refunds-v3 train:v3:
    """
    from improve.warehouse import OTLP_FORMAT, PARTITION_KEYS, export_lake, open_database

    with handled():
        if fmt == OTLP_FORMAT:
            from improve.cli.otlp import export_otlp

            export_otlp(
                source,
                endpoint=endpoint,
                out_dir=out_dir,
                batch=batch,
                content=content,
                project=project,
                db=db,
                as_json=as_json,
                ws=ws,
            )
            return
        if fmt != "parquet":
            raise WorkspaceError(f"unknown export format {fmt!r}; use --format parquet or --format otlp")
        if endpoint is not None or out_dir is not None or project is not None:
            raise WorkspaceError(
                "--endpoint, --out and --project are for --format otlp; a lake is written to DIR"
            )
        if source is None:
            raise WorkspaceError("give the lake's directory: improve export --format parquet DIR")
        directory = Path(source)
        space = workspace(ws)
        target = db or space.warehouse
        if not Path(target).exists():
            raise WorkspaceError(f"no warehouse at {target}; create it with `improve ingest traces/`")
        con = open_database(target, read_only=True, say=say)
        try:
            report = export_lake(con, directory)
        finally:
            con.close()
        if as_json:
            emit_json(report.to_json() | {"warehouse": str(target)})
            return
        verb = "replaced" if report.replaced else "wrote"
        from rich.table import Table

        table = Table(
            title=f"{verb} lake {report.directory} from {target} ({report.seconds:.2f}s), "
            f"partitioned by {', '.join(PARTITION_KEYS)}"
        )
        for column in ("table", "rows", "files", "partitions"):
            table.add_column(column)
        for t in report.tables:
            table.add_row(t.table, str(t.rows), str(t.files), str(t.partitions))
        out.print(table)
        err.print(
            f'query it with: improve sql --lake {report.directory} "SELECT * FROM threads"', markup=False
        )


def _rest(ingested: int, spans: bool) -> str:
    """What became of the rest of an ingest that rejected or skipped some: said as a count, since "the
    rest was ingested" read as news where nothing was new."""
    kind = "span" if spans else "line"
    return f"{ingested} other {kind}(s) ingested" if ingested else f"no other {kind} was new"
