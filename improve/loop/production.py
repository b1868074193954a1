"""Diagnosing production threads: runs of a deployed agent, with no scenario and no label.

A production thread is ingested and replayed like any other, and gets an `outcomes` row without a
label (`expected_outcome` NULL): its final state, status, the violations the world's audit finds in
its effects, its cost. Clustering them needs no label either: threads are grouped by the decision, the
answer that landed (with its payload, `ANSWER_SQL`), the refusal kind and the guard that refused an earlier answer, and the final state,
with counts, cost and example threads. A cluster that matters becomes labelled scenarios with
`improve scenarios add --from-thread`, and the next round learns from them.

A thread of the sealed test split is never a production thread, even when its scenario has left the
file (and its row has no label): a diagnosis feeds a round, and no round reads the test split.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from improve.evals import SPLITS

if TYPE_CHECKING:  # the connection is the caller's: importing DuckDB here would cost every loop import
    import duckdb

ANSWER_SQL = """CASE
    WHEN d.chosen_event IS NULL THEN '(every answer refused)'
    WHEN len(list_filter(json_keys(d.chosen), lambda k: k != 'type')) = 0 THEN d.chosen_event
    ELSE d.chosen_event || '{' || array_to_string(list_sort(list_transform(
        list_filter(json_keys(d.chosen), lambda k: k != 'type'),
        lambda k: k || '=' || CASE
            WHEN json_type(d.chosen, '$."' || k || '"') = 'VARCHAR'
                 AND length(d.chosen ->> ('$."' || k || '"')) <= 32
            THEN d.chosen ->> ('$."' || k || '"')
            ELSE '#'
        END)), ', ') || '}'
END"""
"""The answer that landed as the round's clusters name it (`diagnose.answer_key`): the event with its
payload, a short text value as itself (`DENY{reason=late}`), a number or anything longer as `#`, which
the round would name by the fact it equals; so two reasons of one event are two clusters."""

PRODUCTION_SQL = """
WITH production AS (
    SELECT o.*,
           (SELECT count(*) FROM entries e
            WHERE e.thread_id = o.thread_id AND e.event_type = '@agent.usage'
              AND (e.event ->> '$.error') IS NOT NULL) AS model_errors
    FROM outcomes o
    WHERE o.environment = $environment AND o.expected_outcome IS NULL AND coalesce(o.split, '') != 'test'
      AND ($policy IS NULL OR o.policy_version = $policy) AND ($model IS NULL OR o.model = $model)
)
SELECT coalesce(p.model, '') AS model,
       coalesce(p.policy_version, '') AS policy_version,
       d.decision,
       {answer} AS answer,
       coalesce(a.kind, '') AS refusal,
       coalesce(a.guard, '') AS guard,
       p.final_state,
       p.status,
       count(DISTINCT p.thread_id) AS threads,
       round(avg(p.cost_usd), 6) AS cost_usd_per_thread,
       round(avg(p.model_calls), 2) AS model_calls_per_thread,
       sum(p.model_errors) AS model_errors,
       sum(p.violations) AS violations,
       list(DISTINCT p.thread_id ORDER BY p.thread_id)[1:3] AS examples
FROM production p
JOIN decisions d USING (thread_id)
LEFT JOIN attempts a ON a.thread_id = d.thread_id AND a."index" = d."index"
GROUP BY ALL
ORDER BY threads DESC, d.decision, answer, refusal, guard, p.final_state, model, policy_version
""".replace("{answer}", ANSWER_SQL.replace("\n", "\n       "))
"""Production threads of one environment (of one policy version, one model, when given), clustered by
model and policy version (their failures are theirs), decision, answer, refusal, guard and end."""


@dataclass(frozen=True)
class ProductionCluster:
    model: str
    """The model that decided (from the threads' stamps), or empty."""
    policy_version: str
    decision: str
    answer: str
    refusal: str
    """The kind of an answer refused before this one landed (`rejected-by-guard`, ...), or empty."""
    guard: str
    """The guard that refused it, as `'state'.on.EVENT[i]: <expression>`, or empty."""
    final_state: str
    status: str
    threads: int
    cost_usd_per_thread: float
    model_calls_per_thread: float
    model_errors: int
    violations: int
    examples: list[str]


@dataclass(frozen=True)
class ProductionDiagnosis:
    environment: str
    threads: int
    clusters: list[ProductionCluster]
    sql: str
    policy: str | None = None
    """The policy version the threads were restricted to (None: every version)."""
    model: str | None = None
    """The model they were restricted to (None: every model)."""
    present: list[ProductionSlice] = field(default_factory=list)
    """Every production thread of the environment, by model and policy version, whatever the
    restriction: when it leaves none, what there is to give `--model` or `--policy` instead."""
    set_aside: int = 0
    """The environment's threads of no scenario run in `quarantine` (they do not verify, or have no end
    entry yet): in none of the clusters, and said, since a count that leaves them out silently reads
    as every thread."""

    def to_json(self) -> dict[str, Any]:
        return {
            "source": "production",
            "environment": self.environment,
            "policy": self.policy,
            "model": self.model,
            "threads": self.threads,
            "clusters": [asdict(c) for c in self.clusters],
            "sql": self.sql,
            "present": [asdict(p) for p in self.present],
            "set_aside": self.set_aside,
        }

    def present_text(self) -> str:
        """`careful on v0 (12 threads), naive on v0 (4)`: the production threads there are."""
        return ", ".join(
            f"{p.model or '(no model)'} on {p.policy_version or '(no version)'} ({p.threads}"
            f"{' threads' if i == 0 else ''})"
            for i, p in enumerate(self.present)
        )


@dataclass(frozen=True)
class ProductionSlice:
    """How many production threads one model ran under one policy version."""

    model: str | None
    policy_version: str | None
    threads: int


def diagnose_production(
    con: duckdb.DuckDBPyConnection, environment: str, policy: str | None = None, model: str | None = None
) -> ProductionDiagnosis:
    """The clusters of an environment's production threads (of `policy`, a version label, and `model`,
    when given), largest first, with the SQL that made them."""
    params = {"environment": environment, "policy": policy, "model": model}
    rows = con.execute(PRODUCTION_SQL, params).fetchall()
    names = [f.name for f in fields(ProductionCluster)]
    clusters = [
        ProductionCluster(**dict(zip(names, [*row[:-1], list(row[-1])], strict=True))) for row in rows
    ]
    threads = con.execute(
        "SELECT count(*) FROM outcomes WHERE environment = $environment AND expected_outcome IS NULL "
        "AND coalesce(split, '') != 'test' AND ($policy IS NULL OR policy_version = $policy) "
        "AND ($model IS NULL OR model = $model)",
        params,
    ).fetchone()
    present = [
        ProductionSlice(model, version, int(n))
        for model, version, n in con.execute(
            "SELECT model, policy_version, count(*) FROM outcomes WHERE environment = $environment "
            "AND expected_outcome IS NULL AND coalesce(split, '') != 'test' GROUP BY ALL "
            "ORDER BY count(*) DESC, model, policy_version",
            {"environment": environment},
        ).fetchall()
    ]
    aside = con.execute(  # of no scenario run: a thread id that does not start with a split
        "SELECT count(*) FROM quarantine WHERE environment = $environment "
        "AND NOT list_contains($splits, split_part(thread_id, ':', 1))",
        {"environment": environment, "splits": list(SPLITS)},
    ).fetchone()
    sql = PRODUCTION_SQL
    for name, value in params.items():  # written in, so `improve sql` runs it as it is
        sql = sql.replace(f"${name}", "NULL" if value is None else "'" + value.replace("'", "''") + "'")
    return ProductionDiagnosis(
        environment,
        int(threads[0]) if threads else 0,
        clusters,
        sql.strip(),
        policy,
        model,
        present,
        int(aside[0]) if aside else 0,
    )
