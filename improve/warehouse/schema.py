"""The warehouse schema: named, ordered migrations recorded in the database.

Opening a warehouse applies, in order and each in its own transaction, every migration whose name is
not yet in `schema_migrations`; an old warehouse is upgraded in place. Migrations are never edited
once released: a change is a new migration appended to `MIGRATIONS`.

Views and the column comments are derived objects: `views.py` holds their SQL and documentation, and
they are recreated whenever that definition changes (its hash is recorded as `views:<hash>`).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass

import duckdb

from improve import clock
from improve.errors import LogError
from improve.warehouse.views import view_statements


@dataclass(frozen=True)
class Migration:
    name: str
    statements: tuple[str, ...]


ENTRY_COLUMNS = """
    thread_id       VARCHAR NOT NULL,
    "index"         BIGINT NOT NULL,
    entry_id        VARCHAR NOT NULL,
    recorded_at     VARCHAR NOT NULL,
    machine_id      VARCHAR NOT NULL,
    machine_version VARCHAR NOT NULL,
    event_type      VARCHAR NOT NULL,
    event           JSON NOT NULL,
    causation_id    VARCHAR,
    attempts        JSON,
    metadata        JSON,
    state_hash      VARCHAR,
    schema_version  INTEGER NOT NULL,
    line_thread_id  BOOLEAN NOT NULL DEFAULT false,
    source          VARCHAR,
    batch_id        VARCHAR,
    raw             VARCHAR,
    entry_hash      VARCHAR
"""
"""`entries` as migrations 001 to 005 left it, without its primary key (006 rebuilds it so)."""
ENTRY_NAMES = ", ".join(line.split()[0] for line in ENTRY_COLUMNS.strip().splitlines())

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "001_entries",
        (
            """
            CREATE TABLE entries (
                thread_id       VARCHAR NOT NULL,
                "index"         BIGINT NOT NULL,
                entry_id        VARCHAR NOT NULL,
                recorded_at     VARCHAR NOT NULL,
                machine_id      VARCHAR NOT NULL,
                machine_version VARCHAR NOT NULL,
                event_type      VARCHAR NOT NULL,
                event           JSON NOT NULL,
                causation_id    VARCHAR,
                attempts        JSON,
                metadata        JSON,
                state_hash      VARCHAR,
                schema_version  INTEGER NOT NULL,
                line_thread_id  BOOLEAN NOT NULL DEFAULT false,
                PRIMARY KEY (thread_id, "index")
            )
            """,
            """
            CREATE TABLE rejected_lines (
                file  VARCHAR NOT NULL,
                line  BIGINT,
                error VARCHAR NOT NULL,
                raw   VARCHAR
            )
            """,
        ),
    ),
    Migration(
        "002_ingest_batches",
        (
            """
            CREATE TABLE ingest_batches (
                batch_id        VARCHAR PRIMARY KEY,
                format          VARCHAR NOT NULL,
                started_at      TIMESTAMPTZ NOT NULL,
                finished_at     TIMESTAMPTZ,
                files           INTEGER NOT NULL,
                lines_read      BIGINT NOT NULL,
                ingested        BIGINT NOT NULL,
                already_present BIGINT NOT NULL,
                rejected        BIGINT NOT NULL
            )
            """,
            "ALTER TABLE entries ADD COLUMN source VARCHAR",
            "ALTER TABLE entries ADD COLUMN batch_id VARCHAR",
            "ALTER TABLE entries ADD COLUMN raw VARCHAR",
            "ALTER TABLE rejected_lines ADD COLUMN batch_id VARCHAR",
            "ALTER TABLE rejected_lines ADD COLUMN rejected_at TIMESTAMPTZ",
            """
            CREATE TABLE ingested_files (
                path     VARCHAR PRIMARY KEY,
                size     BIGINT NOT NULL,
                mtime_ns BIGINT NOT NULL,
                sha256   VARCHAR NOT NULL,
                lines    BIGINT NOT NULL,
                rejected BIGINT NOT NULL,
                batch_id VARCHAR NOT NULL
            )
            """,
        ),
    ),
    Migration(
        "003_outcomes",
        (
            """
            CREATE TABLE outcomes (
                thread_id        VARCHAR PRIMARY KEY,
                environment      VARCHAR,
                scenario         VARCHAR,
                category         VARCHAR,
                split            VARCHAR,
                policy_version   VARCHAR,
                run              INTEGER,
                final_state      VARCHAR NOT NULL,
                status           VARCHAR NOT NULL,
                output           JSON,
                steps            INTEGER NOT NULL,
                model_calls      INTEGER NOT NULL,
                input_tokens     BIGINT NOT NULL,
                output_tokens    BIGINT NOT NULL,
                failed_attempts  INTEGER NOT NULL,
                violations       INTEGER NOT NULL,
                violation_rules  VARCHAR[],
                expected_outcome VARCHAR,
                passed           BOOLEAN,
                reason           VARCHAR,
                entries          INTEGER NOT NULL,
                replayed_at      TIMESTAMPTZ NOT NULL
            )
            """,
        ),
    ),
    Migration(
        "004_entry_hash",
        # schemaVersion 2 entries carry verification.entryHash, the thread's hash chain; entries of
        # version 1 and of other formats have none (NULL).
        ("ALTER TABLE entries ADD COLUMN entry_hash VARCHAR",),
    ),
    Migration(
        "005_outcome_details_and_quarantine",
        (
            "ALTER TABLE outcomes ADD COLUMN model VARCHAR",
            "ALTER TABLE outcomes ADD COLUMN effects JSON",
            "ALTER TABLE outcomes ADD COLUMN violation_details JSON",
            "ALTER TABLE outcomes ADD COLUMN cost_usd DOUBLE",
            # Rows written before these columns existed are replayed again to fill them.
            "DELETE FROM outcomes",
            """
            CREATE TABLE quarantine (
                thread_id      VARCHAR PRIMARY KEY,
                environment    VARCHAR,
                reason         VARCHAR NOT NULL,
                entries        INTEGER NOT NULL,
                quarantined_at TIMESTAMPTZ NOT NULL
            )
            """,
        ),
    ),
    Migration(
        "006_otel_spans",
        # OpenTelemetry spans from OTLP/JSON exports (`improve ingest --format otlp`): any agent's traces
        # next to our threads. Ids are hex; times are kept in nanoseconds as written and as timestamps.
        (
            """
            CREATE TABLE otel_spans (
                trace_id                 VARCHAR NOT NULL,
                span_id                  VARCHAR NOT NULL,
                parent_span_id           VARCHAR,
                trace_state              VARCHAR,
                flags                    UBIGINT,
                name                     VARCHAR NOT NULL,
                kind                     VARCHAR NOT NULL,
                start_time               TIMESTAMPTZ NOT NULL,
                end_time                 TIMESTAMPTZ NOT NULL,
                start_unix_nano          UBIGINT NOT NULL,
                end_unix_nano            UBIGINT NOT NULL,
                duration_ms              DOUBLE NOT NULL,
                status_code              VARCHAR NOT NULL,
                status_message           VARCHAR,
                attributes               JSON NOT NULL,
                events                   JSON NOT NULL,
                links                    JSON NOT NULL,
                dropped_attributes_count BIGINT NOT NULL,
                dropped_events_count     BIGINT NOT NULL,
                dropped_links_count      BIGINT NOT NULL,
                service_name             VARCHAR,
                resource_attributes      JSON NOT NULL,
                resource_schema_url      VARCHAR,
                scope_name               VARCHAR,
                scope_version            VARCHAR,
                scope_attributes         JSON NOT NULL,
                scope_schema_url         VARCHAR,
                raw                      JSON NOT NULL,
                content_hash             VARCHAR NOT NULL,
                source                   VARCHAR,
                line                     BIGINT,
                batch_id                 VARCHAR,
                ingested_at              TIMESTAMPTZ NOT NULL,
                PRIMARY KEY (trace_id, span_id)
            )
            """,
        ),
    ),
    Migration(
        "007_thread_lengths",
        # Uniqueness of (thread_id, index) moves from a primary key on entries (an ART index updated row
        # by row: most of a large ingest's time) to the writers, who check each batch as a set against
        # `thread_lengths` and advance a thread's row in the same transaction: two writers to one thread
        # conflict on that row. DuckDB cannot drop a primary key, so entries is rebuilt without it.
        (
            "CREATE TABLE thread_lengths (thread_id VARCHAR PRIMARY KEY, entries BIGINT NOT NULL)",
            "INSERT INTO thread_lengths SELECT thread_id, count(*) FROM entries GROUP BY thread_id",
            f"CREATE TABLE entries_unkeyed ({ENTRY_COLUMNS})",
            f"INSERT INTO entries_unkeyed SELECT {ENTRY_NAMES} FROM entries",
            "DROP TABLE entries",
            "ALTER TABLE entries_unkeyed RENAME TO entries",
            # The column comments went with the old table: the views and comments are made again.
            "DELETE FROM schema_migrations WHERE name LIKE 'views:%'",
        ),
    ),
    Migration(
        "008_outcome_fallbacks",
        # How many decisions the model was asked and how many the policy's onError answered because the
        # endpoint failed: a failing endpoint must never read as a weak or a strong policy.
        (
            "ALTER TABLE outcomes ADD COLUMN decisions INTEGER",
            "ALTER TABLE outcomes ADD COLUMN fallbacks INTEGER",
            "ALTER TABLE outcomes ADD COLUMN fallback_reason VARCHAR",
            # Rows written before these columns existed are replayed again to fill them.
            "DELETE FROM outcomes",
        ),
    ),
    Migration(
        "009_outcome_label",
        # What scored a row (the scenario's label, category and world, as a digest): a row scored
        # against a label that has changed since is scored again. Rows without one (written before it
        # existed) are scored again when a command reads them. Production rows (no label) were audited
        # in an empty world before the environment's world_from_thread rebuilt theirs: replayed again.
        (
            "ALTER TABLE outcomes ADD COLUMN label VARCHAR",
            "DELETE FROM outcomes WHERE expected_outcome IS NULL",
        ),
    ),
    Migration(
        "010_outcome_current",
        # Whether a scored run was recorded from what a run of its scenario starts from now (the
        # environment's files, the scenario's input, world and people): `improve score` leaves the
        # others out, and `scenario_passes` must too. The label digest now covers those inputs as well,
        # so every scored row is scored again; rows written before the column existed are replayed
        # again to fill it, as 005 and 008 did, so no scored row has an unknown `current`.
        (
            "ALTER TABLE outcomes ADD COLUMN current BOOLEAN",
            "DELETE FROM outcomes WHERE expected_outcome IS NOT NULL",
        ),
    ),
)


def ensure_views(con: duckdb.DuckDBPyConnection) -> bool:
    """Recreate the views and comments when their definition changed; True when it did."""
    statements = view_statements()
    marker = "views:" + hashlib.sha256("\n".join(statements).encode()).hexdigest()[:16]
    # fetchall, not fetchone: a result left unfinished makes DuckDB refuse the connection's next arrow
    # fetch (polars reads through one).
    present = con.execute("SELECT 1 FROM schema_migrations WHERE name = ?", [marker]).fetchall()
    if present:
        return False
    con.execute("BEGIN TRANSACTION")
    try:
        for statement in statements:
            con.execute(statement)
        con.execute("DELETE FROM schema_migrations WHERE name LIKE 'views:%'")
        con.execute("INSERT INTO schema_migrations VALUES (?, ?)", [marker, clock.now()])
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):  # a failed COMMIT (a full disk) has ended the transaction
            con.execute("ROLLBACK")
        raise
    return True


def applied(con: duckdb.DuckDBPyConnection) -> list[str]:
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)"
    )
    return [row[0] for row in con.execute("SELECT name FROM schema_migrations ORDER BY name").fetchall()]


def migrate(con: duckdb.DuckDBPyConnection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[str]:
    """Apply pending migrations in order; returns the names applied now."""
    done = applied(con)
    known = [m.name for m in migrations]
    unknown = [name for name in done if name not in known and not name.startswith("views:")]
    if unknown:
        raise LogError(
            f"this warehouse was written by a newer version of improve (migrations {unknown} are unknown "
            "here); upgrade improve to open it"
        )
    now: list[str] = []
    for migration in migrations:
        if migration.name in done:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            for statement in migration.statements:
                con.execute(statement)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?)", [migration.name, clock.now()])
            con.execute("COMMIT")
        except Exception:
            with contextlib.suppress(duckdb.Error):  # a failed COMMIT (a full disk) has ended the transaction
                con.execute("ROLLBACK")
            raise
        now.append(migration.name)
    return now
