"""The warehouse as the ledger of runs: what a command writes, it records there, and reads back from there.

Every thread `improve run`, `score`, `diagnose` and `round` write (or reuse) is ingested into the
workspace's warehouse (incrementally: unchanged files are skipped; one transaction per batch, as
`improve ingest`), then replayed with every journaled hash verified into `outcomes`, or set aside in
`quarantine` with the reason. The rows a scorecard, a diagnosis or a promotion decision uses are read
back from `outcomes` with SQL (`OUTCOMES_SQL`), so an analyst querying `traces.duckdb` sees exactly
what the round decided on, and a thread that does not verify is never scored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from improve import clock
from improve.errors import RunError
from improve.evals.outcome import OutcomeRow, Quarantined
from improve.evals.scenarios import Scenario
from improve.evals.suite import Keep
from improve.evals.workspace import Workspace
from improve.log import JsonlDirStore, LogEntry
from improve.runtime import Environment
from improve.warehouse import COLUMNS, ingest, open_database, row_entry

OUTCOMES_SQL = """
SELECT thread_id, scenario, category, split, policy_version, run, status, final_state, output,
       expected_outcome, passed, reason, effects, violation_details, steps, model_calls, input_tokens,
       output_tokens, failed_attempts, cost_usd, model, decisions, fallbacks, fallback_reason
FROM outcomes
WHERE list_contains($threads, thread_id)
ORDER BY thread_id
"""
"""The rows a score, a diagnosis or a round reads: one per verified thread of the ones it ran."""

PRODUCTION_THREADS_SQL = """
SELECT o.thread_id, max(e.recorded_at) AS last
FROM outcomes o JOIN entries e USING (thread_id)
WHERE o.environment = $environment AND o.expected_outcome IS NULL AND coalesce(o.split, '') != 'test'
GROUP BY o.thread_id
ORDER BY last DESC, o.thread_id
"""
"""An environment's production threads (verified, unlabelled, never the sealed test split), newest first."""

QUARANTINE_SQL = (
    "SELECT thread_id, reason FROM quarantine WHERE list_contains($threads, thread_id) ORDER BY thread_id"
)


@dataclass
class Recorded:
    """The verified rows of the threads asked for, in the order asked, and those set aside."""

    rows: list[OutcomeRow] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    thread_ids: list[str] = field(default_factory=list)

    @property
    def sql(self) -> str:
        """The query that read the rows, with its threads written in: `improve sql` runs it as it is."""
        quoted = ", ".join("'" + t.replace("'", "''") + "'" for t in self.thread_ids)
        return OUTCOMES_SQL.replace("list_contains($threads, thread_id)", f"thread_id IN ({quoted})").strip()

    def set_aside(self) -> str:
        """One line for a progress message: how many threads were set aside, and the first reason."""
        if not self.quarantined:
            return ""
        first = self.quarantined[0]
        return (
            f"set aside {len(self.quarantined)} thread(s) whose replay does not verify (see the quarantine "
            f"table), e.g. {first.thread_id}: {first.reason}"
        )


@dataclass(frozen=True)
class Production:
    """Production threads read from the warehouse: how many it holds, and the newest, with their entries."""

    available: int
    threads: list[tuple[str, list[LogEntry]]]


class Ledger:
    """The workspace's warehouse, open for one command."""

    def __init__(self, space: Workspace, env: Environment, say: Callable[[str], None] | None = None) -> None:
        self.space = space
        self.env = env
        self.say = say
        """Told when the warehouse is held by another process (an `improve ingest`) and the command waits."""
        self.store = JsonlDirStore(space.traces)
        self._con: duckdb.DuckDBPyConnection | None = None
        self._scenarios: dict[str, Scenario] | None = None

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            self.space.warehouse.parent.mkdir(parents=True, exist_ok=True)
            self._con = open_database(self.space.warehouse, say=self.say)
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(
        self,
        thread_ids: Sequence[str],
        say: Callable[[str], None] | None = None,
        rewritten: Sequence[str] = (),
    ) -> Recorded:
        """Ingest the threads' files, verify and score what is new, and read their rows back.

        `rewritten` are threads this command ran again (`--fresh`, an interrupted run started over):
        their earlier copies leave the warehouse first. Any other thread whose file no longer matches
        what the warehouse holds was changed after it was written: it is set aside with the reason.
        """

        # A thread of traces/, or a deployed agent's of traces/production/ (a resumed one, say).
        paths = [self.space.thread_store(tid).path(tid) for tid in thread_ids]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"threads not written: {', '.join(str(p) for p in missing[:5])}")
        if rewritten:
            self.forget(rewritten)
        report = ingest(self.con, [str(p) for p in paths])
        self._quarantine_rejected([f.file for f in report.files if f.rejected], report.batch_id)
        self.refresh(only=list(thread_ids))
        recorded = self.read(thread_ids)
        if say and recorded.quarantined:
            say(recorded.set_aside())
        return recorded

    def forget(self, thread_ids: Sequence[str]) -> None:
        """Remove threads from the warehouse (entries and their thread_lengths rows, outcomes, quarantine,
        file bookkeeping) in one transaction: they are about to be written again."""
        ids = list(thread_ids)
        files = [str(self.space.thread_store(tid).path(tid)) for tid in ids]
        con = self.con
        held = con.execute(
            """
            SELECT EXISTS (SELECT 1 FROM thread_lengths WHERE list_contains($ids, thread_id))
                OR EXISTS (SELECT 1 FROM outcomes WHERE list_contains($ids, thread_id))
                OR EXISTS (SELECT 1 FROM quarantine WHERE list_contains($ids, thread_id))
                OR EXISTS (SELECT 1 FROM ingested_files WHERE list_contains($files, path))
                OR EXISTS (SELECT 1 FROM rejected_lines WHERE list_contains($files, file))
            """,
            {"ids": ids, "files": files},
        ).fetchone()
        if held is not None and not held[0]:
            return  # threads run for the first time (most of a round's): nothing to delete
        con.execute("BEGIN TRANSACTION")
        try:
            for table in ("entries", "thread_lengths", "outcomes", "quarantine"):
                con.execute(f"DELETE FROM {table} WHERE list_contains($ids, thread_id)", {"ids": ids})
            con.execute("DELETE FROM ingested_files WHERE list_contains($files, path)", {"files": files})
            con.execute("DELETE FROM rejected_lines WHERE list_contains($files, file)", {"files": files})
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def _quarantine_rejected(self, files: Sequence[str], batch_id: str) -> None:
        """Threads whose files have a line ingest rejects (it conflicts with what the warehouse holds,
        leaves a gap, or does not parse: the file was changed after it was written) go to quarantine,
        with the first rejection as the reason."""
        if not files:
            return
        con = self.con
        rows = con.execute(
            """
            SELECT file, first(line ORDER BY line), first(error ORDER BY line) FROM rejected_lines
            WHERE batch_id = $batch AND list_contains($files, file) GROUP BY file
            """,
            {"batch": batch_id, "files": list(files)},
        ).fetchall()
        con.execute("BEGIN TRANSACTION")
        try:
            for file, line, error in rows:
                thread = Path(file).stem
                entries = con.execute("SELECT count(*) FROM entries WHERE thread_id = ?", [thread]).fetchone()
                reason = f"{file}:{line}: a line of the thread was rejected on ingest: {error}"
                con.execute("DELETE FROM outcomes WHERE thread_id = ?", [thread])
                con.execute("DELETE FROM quarantine WHERE thread_id = ?", [thread])
                con.execute(
                    "INSERT INTO quarantine VALUES (?, ?, ?, ?, ?)",
                    [thread, self.env.name, reason, int(entries[0]) if entries else 0, clock.now()],
                )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def not_current(self, thread_ids: Sequence[str]) -> None:
        """Mark the rows of threads recorded from other inputs than their scenario's now (`improve
        score` leaves them out) as not `current`, without replaying them: `scenario_passes` then agrees
        with the scorecard at once, not only after the next `improve ingest` scores them again. Their
        `label` is cleared too: it names what they were scored against, and an edit undone later would
        leave it equal to the scenario's again, the row never scored again, and `current` false for good."""
        self.con.execute(
            "UPDATE outcomes SET current = false, label = NULL WHERE list_contains($ids, thread_id) AND current",
            {"ids": list(thread_ids)},
        )

    def read(self, thread_ids: Sequence[str]) -> Recorded:
        """The verified rows of `thread_ids` (in that order) and those in quarantine."""
        params = {"threads": list(thread_ids)}
        found = {row.thread_id: row for row in map(_row, self.con.execute(OUTCOMES_SQL, params).fetchall())}
        quarantined = [Quarantined(*r) for r in self.con.execute(QUARANTINE_SQL, params).fetchall()]
        return Recorded([found[t] for t in thread_ids if t in found], quarantined, list(thread_ids))

    def refresh(self, only: list[str] | None = None) -> None:
        """Replay and score the environment's threads (`only` these) the warehouse holds without a
        current outcomes row (ingested but not replayed, relabelled since, or written by an older improve)."""
        from improve.evals.materialize import refresh_outcomes, scenarios_by_id

        if self._scenarios is None:  # read once per command: a round records three times
            self._scenarios = scenarios_by_id(self.space, self.env)
        machine = self.env.config.id
        report = refresh_outcomes(
            self.con, self.space, only=only, envs={machine: self.env}, scenarios={machine: self._scenarios}
        )
        if report.failed and only is not None:
            # A thread the command asked for that could not be scored (the environment's audit crashed, say) is no result: a
            # command that counts runs must not count it out silently ("0/0 runs", exit 0).
            first = (report.errors or ["?"])[0]
            tid, _, why = first.partition(": ")
            said = why if why.startswith(f"thread {tid}") else first  # the thread named once
            raise RunError(f"{report.failed} thread(s) could not be scored, e.g. {said}")

    def production(self, limit: int) -> Production:
        """The `limit` most recent production threads of the environment (by their last entry), with
        their entries, and how many the warehouse holds (their rows brought up to date first)."""
        self.refresh()
        found = self.con.execute(PRODUCTION_THREADS_SQL, {"environment": self.env.name}).fetchall()
        newest = [str(r[0]) for r in found[:limit]]
        threads: dict[str, list[LogEntry]] = {t: [] for t in newest}
        if newest:
            rows = self.con.execute(
                f'SELECT {COLUMNS} FROM entries WHERE list_contains($ids, thread_id) ORDER BY thread_id, "index"',
                {"ids": newest},
            ).fetchall()
            for row in rows:
                threads[str(row[0])].append(row_entry(row))
        return Production(len(found), [(t, threads[t]) for t in newest])

    def entries(self, thread_id: str) -> list[LogEntry]:
        """The thread's entries as the warehouse holds them (empty when it holds none): the copy a
        thread whose file no longer verifies is restored from (`keep`)."""
        rows = self.con.execute(
            f'SELECT {COLUMNS} FROM entries WHERE thread_id = ? ORDER BY "index"', [thread_id]
        ).fetchall()
        return [row_entry(row) for row in rows]

    def keep(self) -> Keep:
        """What a suite does with a recorded thread whose file does not verify (`write_threads`): the file
        is kept in the workspace's `.improve/damaged/`, and the warehouse's copy restored when it verifies."""
        return Keep(self.space.damaged, self.entries)

    def recorded(self, prefix: str) -> list[str]:
        """Thread ids in the workspace's traces starting with `prefix` (`train:v3:naive:`)."""
        return self.store.list_threads(prefix=prefix, limit=1_000_000).thread_ids


def _row(r: tuple[Any, ...]) -> OutcomeRow:
    (thread_id, scenario, category, split, version, run, status, final, output, expected, passed, reason,
     effects, violations, steps, calls, tokens_in, tokens_out, failed, cost, model, decisions, fallbacks,
     fallback_reason) = r  # fmt: skip
    return OutcomeRow(
        thread_id=str(thread_id),
        scenario=str(scenario or ""),
        category=str(category or ""),
        split=str(split or ""),
        policy_version=str(version or ""),
        run=int(run or 0),
        status=str(status),
        final_state=str(final),
        output=_json(output),
        expected_outcome=str(expected or ""),
        passed=bool(passed),
        reason=str(reason or ""),
        effects=_json(effects) or [],
        violations=_json(violations) or [],
        steps=int(steps),
        model_calls=int(calls),
        input_tokens=int(tokens_in),
        output_tokens=int(tokens_out),
        failed_attempts=int(failed),
        cost_usd=float(cost or 0.0),
        model=str(model) if model is not None else None,
        decisions=int(decisions or 0),
        fallbacks=int(fallbacks or 0),
        fallback_reason=str(fallback_reason) if fallback_reason is not None else None,
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
