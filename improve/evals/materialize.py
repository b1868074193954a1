"""Materializing the warehouse's `outcomes` table: replay each thread, score it against its labels.

A thread gets a row when its machine is a known environment and its replay verifies (every journaled
hash checks); a thread that does not verify goes to `quarantine` with the reason instead, and nothing
scores it. When its id names a scenario of that environment's scenario file
(`split:version:model:scenario:rK`), the row is scored (`passed`, `reason`), and `current` says
whether the run was recorded from what a run of the scenario starts from now (`suite.stale_stamp`, the
test `improve score` makes); otherwise (a production thread) those stay NULL. Rows are refreshed when
the thread has grown since it was checked, or when what scores it (`scored_by`) has changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb

from improve.errors import ImproveError, LogError
from improve.evals.outcome import OutcomeRow, outcome_row
from improve.evals.scenarios import Scenario, label_digest, load_scenarios
from improve.evals.suite import inputs_digests, stale_stamp
from improve.evals.workspace import Workspace
from improve.log import EntryView, LogEntry, ThreadId, gc_paused
from improve.machine import canonical_hash
from improve.runtime import Environment
from improve.warehouse import COLUMNS, insert_rows, row_view


@dataclass
class MaterializeReport:
    replayed: int = 0
    scored: int = 0
    skipped_unknown_machine: int = 0
    """Threads of improve's own format whose machine no registered environment has: not replayed."""
    unknown_machines: dict[str, int] = field(default_factory=dict)
    """Those threads, counted by machine id."""
    failed: int = 0
    quarantined: int = 0
    errors: list[str] | None = None
    set_aside: list[str] = field(default_factory=list)
    """The first threads set aside (quarantined), each as `thread: why`."""


def scenarios_by_id(workspace: Workspace, env: Environment) -> dict[str, Scenario]:
    """The environment's labelled scenarios by id (none when the workspace has no scenario file)."""
    path = workspace.scenarios_path(env.name)
    if not path.exists():
        return {}
    return load_scenarios(path, env.name).by_id()


def scored_by(env: Environment, scenario: Scenario) -> str:
    """The `outcomes.label` digest: what scores a run of the scenario (`label_digest`) and what a run of
    it starts from now (the environment's files, its input, world and people). A row scored against
    another is scored again, so both `passed` and `current` follow an edit of the scenario file or of
    the environment (an input edited under the same id leaves the label's digest as it was)."""
    return canonical_hash({"label": label_digest(scenario), "inputs": inputs_digests(env, scenario)})[:16]


def _pending(
    con: duckdb.DuckDBPyConnection,
    machine_ids: list[str],
    only: list[str] | None,
    labels: list[dict[str, str]] | None = None,
) -> list[str]:
    """The threads to replay: without an outcomes row, or one of fewer entries than the thread has now,
    or scored against another label than their scenario's now (`labels`: each scenario's digest)."""
    # Only the threads asked for, when a command records its own: the warehouse may hold many more.
    restrict = "WHERE list_contains($only, thread_id)" if only is not None else ""
    rows = con.execute(
        f"""
        WITH labels AS (
            SELECT l.environment, l.scenario, l.label FROM (SELECT unnest($labels) AS l)
        )
        SELECT t.thread_id FROM (
            SELECT thread_id, count(*) AS n, min(machine_id) AS machine_id FROM entries {restrict}
            GROUP BY thread_id
        ) t LEFT JOIN outcomes o USING (thread_id) LEFT JOIN quarantine q USING (thread_id)
        LEFT JOIN labels l ON l.environment = o.environment AND l.scenario = o.scenario
        WHERE list_contains($machines, t.machine_id)
          AND (o.thread_id IS NULL OR o.entries != t.n OR (l.label IS NOT NULL AND o.label IS DISTINCT FROM l.label))
          AND (q.thread_id IS NULL OR q.entries != t.n)
        ORDER BY t.thread_id
        """,
        {
            "machines": machine_ids,
            "labels": labels or [],
            **({"only": only} if only is not None else {}),
        },
    ).fetchall()
    return [r[0] for r in rows]


def _unknown_machines(con: duckdb.DuckDBPyConnection, machine_ids: list[str]) -> dict[str, int]:
    """Threads journaled by improve (no `raw` line of another agent's format) whose machine is none of
    `machine_ids`, counted by machine: nothing replays them here, which an ingest must say rather than
    count them as nothing."""
    rows = con.execute(
        """
        SELECT machine_id, count(*) FROM (
            SELECT min(machine_id) AS machine_id, bool_and(raw IS NULL) AS native FROM entries GROUP BY thread_id
        )
        WHERE native AND NOT list_contains($machines, machine_id)
        GROUP BY machine_id ORDER BY machine_id
        """,
        {"machines": machine_ids},
    ).fetchall()
    return {str(machine): int(n) for machine, n in rows}


def _threads(
    con: duckdb.DuckDBPyConnection, thread_ids: list[str], chunk: int = 2000
) -> Iterator[tuple[str, list[EntryView]]]:
    """Each thread's entries as the warehouse holds them, for the replay that verifies and scores them
    (`row_view`: the bulk path's structs)."""
    for start in range(0, len(thread_ids), chunk):
        ids = thread_ids[start : start + chunk]
        rows = con.execute(
            f'SELECT {COLUMNS} FROM entries WHERE list_contains(?, thread_id) ORDER BY thread_id, "index"',
            [ids],
        ).fetchall()
        current: str | None = None
        batch: list[EntryView] = []
        for row in rows:
            if row[0] != current:
                if current is not None:
                    yield current, batch
                current, batch = row[0], []
            batch.append(row_view(row))
        if current is not None:
            yield current, batch


def refresh_outcomes(
    con: duckdb.DuckDBPyConnection,
    workspace: Workspace,
    progress: Callable[[int, int], None] | None = None,
    *,
    only: list[str] | None = None,
    envs: dict[str, Environment] | None = None,
    scenarios: dict[str, dict[str, Scenario]] | None = None,
) -> MaterializeReport:
    """Replay every thread of a known environment that has no (or a stale) outcomes row; `only` those
    threads, `envs` (by machine id) instead of every registered environment, `scenarios` (by machine
    id, then scenario id) already read instead of reading each environment's scenario file."""
    envs = envs if envs is not None else workspace.environments_by_machine_id()
    report = MaterializeReport(errors=[])
    given = scenarios or {}
    scenario_sets = {
        machine_id: given[machine_id] if machine_id in given else scenarios_by_id(workspace, env)
        for machine_id, env in envs.items()
    }
    digests = {
        (machine_id, sid): scored_by(envs[machine_id], scenario)
        for machine_id, by_id in scenario_sets.items()
        for sid, scenario in by_id.items()
    }
    labels = [
        {"environment": envs[machine_id].name, "scenario": sid, "label": digest}
        for (machine_id, sid), digest in digests.items()
    ]
    if only is None:
        report.unknown_machines = _unknown_machines(con, list(envs))
        report.skipped_unknown_machine = sum(report.unknown_machines.values())
    pending = _pending(con, list(envs), only, labels)
    if not pending:
        return report
    rows: list[tuple[Any, ...]] = []
    quarantined: list[tuple[Any, ...]] = []
    with gc_paused():
        _replay_pending(con, envs, scenario_sets, digests, pending, report, rows, quarantined, progress)
    if rows or quarantined:
        checked = [r[0] for r in rows] + [q[0] for q in quarantined]
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM outcomes WHERE list_contains(?, thread_id)", [checked])
            con.execute("DELETE FROM quarantine WHERE list_contains(?, thread_id)", [checked])
            if rows:
                insert_rows(con, "outcomes", OUTCOME_COLUMNS, rows, now="replayed_at")
            if quarantined:
                insert_rows(con, "quarantine", QUARANTINE_COLUMNS, quarantined, now="quarantined_at")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return report


def _replay_pending(
    con: duckdb.DuckDBPyConnection,
    envs: dict[str, Environment],
    scenario_sets: dict[str, dict[str, Scenario]],
    digests: dict[tuple[str, str], str],
    pending: list[str],
    report: MaterializeReport,
    rows: list[tuple[Any, ...]],
    quarantined: list[tuple[Any, ...]],
    progress: Callable[[int, int], None] | None,
) -> None:
    for done, (thread_id, entries) in enumerate(_threads(con, pending), start=1):
        env = envs[entries[0].machineId]
        parsed = ThreadId.parse(thread_id)
        scenario = scenario_sets[env.config.id].get(parsed.scenario) if parsed else None
        try:
            scored = outcome_row(env, scenario, thread_id, entries, verify=True)
        except LogError as err:
            # It does not verify: set aside with the reason, never scored.
            quarantined.append((thread_id, env.name, str(err), len(entries)))
            report.quarantined += 1
            if len(report.set_aside) < 20:
                report.set_aside.append(f"{thread_id}: {err}")
            continue
        except ImproveError as err:
            report.failed += 1
            assert report.errors is not None
            if len(report.errors) < 20:
                report.errors.append(f"{thread_id}: {err}")
            continue
        if scored.verification == "incomplete":
            # A chained thread without its end entry: cut short, or a run still going. Not scored until
            # it ends (it is checked again when it grows).
            reason = f"incomplete: thread {thread_id} has no @agent.end entry after entry {len(entries) - 1}"
            quarantined.append((thread_id, env.name, reason, len(entries)))
            report.quarantined += 1
            if len(report.set_aside) < 20:
                report.set_aside.append(f"{thread_id}: {reason}")
            continue
        if scenario is None:
            rows.append(_row(env, scored, len(entries), None, None))
        else:
            current = not stale_stamp(env, entries[0].metadata, scenario)
            rows.append(_row(env, scored, len(entries), digests[env.config.id, scenario.id], current))
        report.replayed += 1
        report.scored += scenario is not None  # counted once its row is kept: a set-aside thread is not
        if progress and done % 500 == 0:
            progress(done, len(pending))


QUARANTINE_COLUMNS = ("thread_id", "environment", "reason", "entries")

OUTCOME_COLUMNS = (
    "thread_id",
    "environment",
    "scenario",
    "category",
    "split",
    "policy_version",
    "run",
    "final_state",
    "status",
    "output",
    "steps",
    "model_calls",
    "input_tokens",
    "output_tokens",
    "failed_attempts",
    "violations",
    "violation_rules",
    "expected_outcome",
    "passed",
    "reason",
    "entries",
    "model",
    "effects",
    "violation_details",
    "cost_usd",
    "decisions",
    "fallbacks",
    "fallback_reason",
    "label",
    "current",
)


def _row(
    env: Environment, r: OutcomeRow, entries: int, label: str | None, current: bool | None
) -> tuple[Any, ...]:
    """The outcomes row of a replayed thread; `label`: the digest of what scored it (`scored_by`; None:
    unscored); `current`: recorded from what a run of its scenario starts from now (None: unscored)."""
    scored = label is not None
    return (
        r.thread_id,
        env.name,
        r.scenario or None,
        r.category or None,
        r.split or None,
        r.policy_version or None,
        r.run or None,
        r.final_state,
        r.status,
        json.dumps(r.output),
        r.steps,
        r.model_calls,
        r.input_tokens,
        r.output_tokens,
        r.failed_attempts,
        len(r.violations),
        [v.get("rule", "") for v in r.violations],
        r.expected_outcome if scored else None,
        r.passed if scored else None,
        r.reason if scored else None,
        entries,
        r.model,
        json.dumps(r.effects),
        json.dumps(r.violations, default=str),
        r.cost_usd,
        r.decisions,
        r.fallbacks,
        r.fallback_reason,
        label,
        current,
    )


@dataclass(frozen=True)
class ScoredThreads:
    """`score_threads`: the outcome rows of the threads that verify, and why the others have none."""

    rows: dict[str, OutcomeRow]
    unscored: dict[str, str]
    """Thread id -> why it has no row: an unknown environment, the environment's code failing to score
    it, or one of `unverified`."""
    unverified: frozenset[str]
    """The threads whose replay does not verify (an entry edited, removed or moved; cut short): their
    content is not what was recorded, so nothing may present it as a run."""


def score_threads(workspace: Workspace, threads: list[tuple[str, list[LogEntry]]]) -> ScoredThreads:
    """Replay and score threads that are not in the warehouse (files), as `refresh_outcomes` would:
    the outcome rows of those that verify, and for the others why not (an unknown environment, a
    thread that does not verify). Nothing is written."""
    envs = workspace.environments_by_machine_id()
    scenario_sets: dict[str, dict[str, Scenario]] = {}
    rows: dict[str, OutcomeRow] = {}
    problems: dict[str, str] = {}
    unverified: set[str] = set()
    with gc_paused():
        for thread_id, entries in threads:
            env = envs.get(entries[0].machineId) if entries else None
            if env is None:
                problems[thread_id] = f"no environment of this workspace has machine {entries[0].machineId!r}"
                continue
            if env.config.id not in scenario_sets:
                scenario_sets[env.config.id] = scenarios_by_id(workspace, env)
            parsed = ThreadId.parse(thread_id)
            scenario = scenario_sets[env.config.id].get(parsed.scenario) if parsed else None
            # As the warehouse sets a thread aside (`_replay_pending`): one that does not verify, or
            # that has no end entry yet.
            try:
                row = outcome_row(env, scenario, thread_id, entries, verify=True)
            except LogError as err:
                problems[thread_id] = str(err)
                unverified.add(thread_id)
                continue
            except ImproveError as err:
                problems[thread_id] = str(err)
                continue
            if row.verification == "incomplete":
                problems[thread_id] = f"incomplete: it has no @agent.end entry after entry {len(entries) - 1}"
                unverified.add(thread_id)
                continue
            rows[thread_id] = row
    return ScoredThreads(rows, problems, frozenset(unverified))
