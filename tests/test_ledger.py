"""The warehouse as the round's ledger: what a round decides on is what `improve sql` shows, and a
thread that does not verify is set aside, named, and kept out of every score."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from improve.cli.main import app
from improve.demo import commit_workspace

from .conftest import copy_workspace

runner = CliRunner()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = copy_workspace(tmp_path / "ws")
    commit_workspace(root, user="t", message="workspace")
    return root


def cli(ws: Path, *args: str) -> Any:
    result = runner.invoke(
        app, [*args, "-w", str(ws)], env={"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    )
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def sql(ws: Path, query: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = cli(ws, "sql", query, "--format", "json")
    return rows


def tamper_order_total(path: Path, total: float) -> int:
    """Edit the order total an `orders.lookup` answered; the index of the entry changed."""
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        entry = json.loads(line)
        output = entry["event"].get("output") or {}
        if entry["event"]["type"] == "xstate.done.actor" and "order" in output and output["order"]:
            output["order"]["total"] = total
            lines[index] = json.dumps(entry)
            path.write_text("\n".join(lines) + "\n")
            return index
    raise AssertionError(f"{path.name} has no order lookup")


def test_a_tampered_baseline_thread_is_set_aside_by_the_round(ws: Path) -> None:
    cli(ws, "run", "--split", "train", "--k", "1", "--json")
    path = ws / "traces" / "train:v0:naive:partial-refund-01:r1.jsonl"
    index = tamper_order_total(path, 4730)
    outcome = cli(ws, "round", "--policy", "v0", "--k", "1", "--json")["rounds"][0]
    (aside,) = outcome["quarantined"]
    assert (
        aside["thread_id"] == path.stem
        and f"index {index} already holds a different entry" in aside["reason"]
    )
    # It is in quarantine with its reason, and in no outcome row, so in no score.
    assert sql(ws, f"SELECT thread_id FROM quarantine WHERE thread_id = '{path.stem}'") == [
        {"thread_id": path.stem}
    ]
    assert sql(ws, f"SELECT count(*) AS n FROM outcomes WHERE thread_id = '{path.stem}'") == [{"n": 0}]
    # The mined rule never sees the edited total.
    assert "accountAgeDays" not in (outcome["rationale"] or "")


def test_sql_shows_the_rows_the_round_scored(ws: Path) -> None:
    outcome = cli(ws, "round", "--policy", "v0", "--k", "2", "--json")["rounds"][0]
    assert outcome["status"] == "recommended"
    for split, side, version in (
        ("train", "before", "v0"),
        ("held-out", "after", outcome["candidate_version"]),
    ):
        rows = sql(
            ws,
            f"""
            SELECT avg(fraction) AS pass_rate, sum(violations) AS violations FROM (
                SELECT scenario, avg(passed::INTEGER) AS fraction, sum(violations) AS violations
                FROM outcomes
                WHERE environment = 'refunds' AND policy_version = '{version}' AND model = 'naive'
                  AND split = '{split}' AND run <= 2 AND expected_outcome IS NOT NULL
                GROUP BY scenario)
            """,
        )
        assert rows[0]["pass_rate"] == pytest.approx(outcome["scores"][split][side], abs=1e-12), (split, side)
    after = outcome["scores"]["held-out"]["violations_after"]
    assert rows[0]["violations"] == after


def test_diagnose_json_carries_the_sql_it_ran(ws: Path) -> None:
    doc = cli(ws, "diagnose", "--policy", "v0", "--k", "1", "--json")
    rows = sql(ws, doc["sql"])
    assert len(rows) == doc["train_runs"] and {r["split"] for r in rows} == {"train"}
    failed = {r["thread_id"] for r in rows if not r["passed"]}
    assert set(doc["chosen"]["threads"]) <= failed
