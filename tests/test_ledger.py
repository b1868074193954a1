"""The warehouse as the round's ledger: what a round decides on is what `improve sql` shows, and a
thread that does not verify is set aside, named, and kept out of every score."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import git
import pytest
import yaml
from typer.testing import CliRunner

from improve.cli.main import app
from improve.demo import commit_workspace
from improve.evals import PRODUCTION_DIR, Workspace, deploy
from improve.log import JsonlDirStore
from improve.runtime import recorded_thread
from improve.warehouse import connect
from tests.helpers import copy_workspace

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


@pytest.mark.slow
def test_a_tampered_baseline_thread_is_never_used_by_the_round(ws: Path) -> None:
    """A baseline thread edited in traces/ is not reused as it stands: its file is kept in
    .improve/damaged/, and the warehouse's verified copy is written back and used (docs/contracts.md)."""
    cli(ws, "run", "--split", "train", "--k", "1", "--json")
    path = ws / "traces" / "train:v0:naive:partial-refund-01:r1.jsonl"
    original = path.read_bytes()
    tamper_order_total(path, 4730)
    tampered = path.read_bytes()
    outcome = cli(ws, "round", "--policy", "v0", "--k", "1", "--json")["rounds"][0]
    assert outcome["quarantined"] == []
    assert path.read_bytes() == original
    (kept,) = (ws / ".improve" / "damaged").glob("*/*.jsonl")
    assert kept.name == path.name and kept.read_bytes() == tampered
    assert sql(ws, f"SELECT count(*) AS n FROM outcomes WHERE thread_id = '{path.stem}'") == [{"n": 1}]
    # The mined rule never sees the edited total.
    assert "4730" not in json.dumps(outcome)


@pytest.mark.slow
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
                  AND split = '{split}' AND expected_outcome IS NOT NULL
                GROUP BY scenario)
            """,
        )
        assert rows[0]["pass_rate"] == pytest.approx(outcome["scores"][split][side], abs=1e-12), (split, side)
        # The polars API reads the same rows.
        with connect(ws / "traces" / "traces.duckdb") as warehouse:
            frame = warehouse.sql(
                "SELECT scenario, avg(passed::INTEGER) AS fraction FROM outcomes WHERE environment = 'refunds' "
                f"AND policy_version = '{version}' AND model = 'naive' AND split = '{split}' "
                "AND expected_outcome IS NOT NULL GROUP BY scenario"
            )
        assert frame["fraction"].mean() == pytest.approx(outcome["scores"][split][side], abs=1e-12)
    after = outcome["scores"]["held-out"]["violations_after"]
    assert rows[0]["violations"] == after


def test_diagnose_json_carries_the_sql_it_ran(ws: Path) -> None:
    # The runs it makes (a real model is asked for them) are said, with the model and k; none the second time.
    made = runner.invoke(app, ["diagnose", "--policy", "v0", "--k", "1", "--json", "-w", str(ws)])
    assert (
        "recorded " in made.stderr
        and " new train runs of v0 with model naive (k = 1); 0 reused" in made.stderr
    )
    doc = cli(ws, "diagnose", "--policy", "v0", "--k", "1", "--json")
    rows = sql(ws, doc["sql"])
    assert len(rows) == doc["train_runs"] and {r["split"] for r in rows} == {"train"}
    failed = {r["thread_id"] for r in rows if not r["passed"]}
    assert set(doc["chosen"]["threads"]) <= failed
    # Said in words, the pass rate names the model it is of (not only the policy).
    said = runner.invoke(app, ["diagnose", "--policy", "v0", "--k", "1", "-w", str(ws)])
    assert "new train runs" not in said.stderr
    assert said.exit_code == 0 and said.stdout.startswith(
        f"v0 with naive on train: pass rate {doc['train_pass_rate']:.3f}"
    ), said.stdout


def test_ingest_names_the_threads_it_sets_aside(ws: Path) -> None:
    """A thread edited after it was written is never scored: `improve ingest` says so by name, not
    only in its --json."""
    cli(ws, "run", "--model", "careful", "--k", "1", "--scenario", "small-refund-01", "--json")
    (path,) = (ws / "traces").glob("*small-refund-01*.jsonl")
    tamper_order_total(path, 9999.0)
    fresh = ws / "fresh"
    fresh.mkdir()
    path.rename(fresh / path.name)
    (ws / "traces" / "traces.duckdb").unlink()
    said = runner.invoke(app, ["ingest", str(fresh), "-w", str(ws)])
    assert said.exit_code == 0, said.output
    assert "set aside 1 thread(s) whose replay does not verify" in said.stderr, said.stderr
    assert f"  {path.stem}: " in said.stderr


def test_threads_set_aside_feed_no_analyst_view(ws: Path) -> None:
    """A thread edited after it was written, and one cut short, are in `quarantine`: `threads` says so,
    and `decisions`, `attempts`, `usage` and `outcomes` leave them out (the README's queries over them
    count only threads that verify)."""
    cli(ws, "run", "--model", "sloppy", "--k", "1", "--split", "train", "--json")
    # Threads whose decisions had answers refused by a guard, so `attempts` has rows of each.
    refused = sorted({r["thread_id"] for r in sql(ws, "SELECT thread_id FROM attempts")})
    assert len(refused) >= 3, refused
    copies = ws / "copies"
    copies.mkdir()
    for thread in refused[:3]:
        (copies / f"{thread}.jsonl").write_bytes((ws / "traces" / f"{thread}.jsonl").read_bytes())
    edited, cut, kept = (copies / f"{t}.jsonl" for t in refused[:3])
    lines = edited.read_text().splitlines()
    init = json.loads(lines[0])
    init["event"]["input"]["customerId"] = "C-0000"
    edited.write_text("\n".join([json.dumps(init), *lines[1:]]) + "\n")
    cut.write_text("\n".join(cut.read_text().splitlines()[:-1]) + "\n")
    db = str(ws / "copies.duckdb")
    said = runner.invoke(app, ["ingest", str(copies), "--db", db, "-w", str(ws)])
    assert said.exit_code == 0 and "set aside 2 thread(s)" in said.stderr, said.output

    def rows(query: str) -> set[tuple[Any, ...]]:
        got = runner.invoke(app, ["sql", "--db", db, "--format", "json", query, "-w", str(ws)])
        assert got.exit_code == 0, got.output
        return {tuple(r.values()) for r in json.loads(got.stdout)}

    assert rows("SELECT thread_id, quarantined FROM threads") == {
        (edited.stem, True),
        (cut.stem, True),
        (kept.stem, False),
    }
    for view in ("decisions", "attempts", "usage", "outcomes"):
        assert rows(f"SELECT DISTINCT thread_id FROM {view}") == {(kept.stem,)}, view
    assert rows("SELECT thread_id FROM quarantine") == {(edited.stem,), (cut.stem,)}


def test_a_relabelled_scenario_is_scored_against_its_label_now(ws: Path) -> None:
    """A run is reused after its scenario's label changed (the label only scores it), but its row is
    scored again against the new label: not the old verdict, in the run's table, the warehouse or
    `improve score`."""
    path = ws / "scenarios" / "refunds.yaml"
    doc = yaml.safe_load(path.read_text())
    scenario = next(s for s in doc["scenarios"] if s["split"] == "train")
    args = ("run", "--model", "careful", "--k", "1", "--scenario", scenario["id"], "--json")
    first = cli(ws, *args)
    assert [t["passed"] for t in first["threads"]] == [True], first
    right = scenario["expected"]["outcome"]
    scenario["expected"]["outcome"] = "escalated" if right != "escalated" else "closed"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    again = cli(ws, *args)
    assert [t["thread_id"] for t in again["threads"]] == [t["thread_id"] for t in first["threads"]]
    assert [t["passed"] for t in again["threads"]] == [False], again
    (row,) = sql(ws, f"SELECT expected_outcome, passed FROM outcomes WHERE scenario = '{scenario['id']}'")
    assert row == {"expected_outcome": scenario["expected"]["outcome"], "passed": False}
    scenario["expected"]["outcome"] = right
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert [t["passed"] for t in cli(ws, *args)["threads"]] == [True]


def test_a_run_of_a_changed_scenario_is_not_current_and_no_pass_rate_counts_it(ws: Path) -> None:
    """A run recorded before its scenario's input changed (same id) is left out by `improve score`; the
    warehouse marks it not `current`, so `scenario_passes` (and the README's pass rate over `outcomes`)
    say what the scorecard says, before and after `improve ingest` scores it against the new label."""
    cli(ws, "run", "--model", "careful", "--k", "1", "--split", "train", "--json")
    path = ws / "scenarios" / "refunds.yaml"
    doc = yaml.safe_load(path.read_text())
    (edited,) = [s for s in doc["scenarios"] if s["id"] == "small-refund-01"]
    edited["input"]["amount"] = 20.5  # was 23.5; the label follows
    edited["expected"]["effects"][0]["amount"] = 20.5
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    scored = runner.invoke(
        app, ["score", "--policy", "v0", "--model", "careful", "--split", "train", "--json", "-w", str(ws)]
    )
    assert scored.exit_code == 0, scored.output
    assert "1 recorded run(s) of v0 with model careful are not scored" in scored.stderr
    (card,) = json.loads(scored.stdout)["scorecards"]
    stale = "train:v0:careful:small-refund-01:r1"
    passes = """
        SELECT round(avg(pass_fraction), 6) AS pass_rate, sum(runs) AS runs FROM scenario_passes
        WHERE model = 'careful' AND split = 'train' AND policy_version = 'v0'
    """
    readme = """
        SELECT round(avg(fraction), 6) AS pass_rate FROM (
            SELECT scenario, avg(passed::INT) AS fraction FROM outcomes
            WHERE model = 'careful' AND split = 'train' AND policy_version = 'v0' AND current GROUP BY ALL)
    """
    for moment in ("after score", "after ingest"):
        assert sql(ws, passes) == [{"pass_rate": card["pass_rate"], "runs": card["runs"]}], moment
        assert sql(ws, readme) == [{"pass_rate": card["pass_rate"]}], moment
        assert sql(ws, f"SELECT current FROM outcomes WHERE thread_id = '{stale}'") == [{"current": False}]
        ingested = runner.invoke(app, ["ingest", str(ws / "traces"), "-w", str(ws)])
        assert ingested.exit_code == 0, ingested.output
    # Scored again against the new label, it fails: not current, so no pass rate counts it.
    assert sql(ws, f"SELECT passed, current FROM outcomes WHERE thread_id = '{stale}'") == [
        {"passed": False, "current": False}
    ]
    # Run again, the scenario's run is current again.
    cli(ws, "run", "--model", "careful", "--k", "1", "--scenario", "small-refund-01", "--json")
    assert sql(ws, f"SELECT passed, current FROM outcomes WHERE thread_id = '{stale}'") == [
        {"passed": True, "current": True}
    ]
    # An edit scored, then undone: the run is current again as soon as `improve score` says so, not left
    # out of every pass rate the warehouse gives for good.
    kept = path.read_text()
    path.write_text(kept.replace("amount: 20.5", "amount: 21.5"))
    score = ["score", "--policy", "v0", "--model", "careful", "--split", "train", "--json", "-w", str(ws)]
    assert "1 recorded run(s) of v0 with model careful are not scored" in runner.invoke(app, score).stderr
    assert sql(ws, f"SELECT current FROM outcomes WHERE thread_id = '{stale}'") == [{"current": False}]
    path.write_text(kept)
    rescored = runner.invoke(app, score)
    assert rescored.exit_code == 0 and "not scored" not in rescored.stderr, rescored.output
    assert sql(ws, f"SELECT passed, current FROM outcomes WHERE thread_id = '{stale}'") == [
        {"passed": True, "current": True}
    ]


def test_a_warehouse_from_before_current_is_scored_again_on_ingest(ws: Path) -> None:
    """A warehouse an older improve wrote (no `current`) keeps working: opened for writing it gains the
    column, its scored rows are replayed again, and every scored row says whether it is current."""
    import duckdb

    cli(ws, "run", "--model", "careful", "--k", "1", "--scenario", "small-refund-01", "--json")
    con = duckdb.connect(str(ws / "traces" / "traces.duckdb"))
    con.execute("DROP VIEW scenario_passes")
    con.execute("ALTER TABLE outcomes DROP COLUMN current")
    con.execute("DELETE FROM schema_migrations WHERE name = '010_outcome_current' OR name LIKE 'views:%'")
    con.close()
    said = runner.invoke(app, ["ingest", str(ws / "traces"), "-w", str(ws)])
    assert said.exit_code == 0 and "1 thread(s) replayed (1 scored" in said.stderr, said.output
    assert sql(ws, "SELECT thread_id, passed, current FROM outcomes") == [
        {"thread_id": "train:v0:careful:small-refund-01:r1", "passed": True, "current": True}
    ]
    assert sql(ws, "SELECT runs FROM scenario_passes") == [{"runs": 1}]


# --- production threads, from diagnosis to a fix ------------------------------------------------------

PARTIAL = [  # (customer, order, total, refunded, asked): more asked than is left to refund
    ("C-1", "O-1", 100, 40, 90),
    ("C-2", "O-2", 80, 30, 70),
    ("C-3", "O-3", 60, 25, 50),
    ("C-4", "O-4", 90, 50, 60),
]
SMALL = [("C-5", "O-5", 30, 0, 30), ("C-6", "O-6", 45, 0, 20)]


def production_thread(agent: Any, thread_id: str, case: tuple[str, str, int, int, int]) -> None:
    """A deployed agent's run (`improve.evals.deploy`): the refund desk on v0, no scenario, no label."""
    customer, order, total, refunded, asked = case
    agent.run(
        {"ticket": "The parcel arrived damaged.", "customerId": customer, "orderId": order, "amount": asked},
        agent.env.make_world(
            {
                "customers": {customer: {"refundsLast90d": 0, "accountAgeDays": 300}},
                "orders": {
                    order: {
                        "customerId": customer,
                        "total": total,
                        "refunded": refunded,
                        "deliveredDaysAgo": 3,
                    }
                },
            }
        ),
        thread_id=thread_id,
    )


def test_a_production_thread_is_audited_in_the_world_its_tools_answered_from(ws: Path) -> None:
    """A thread of no scenario has no fixture: its audit reads the world `world_from_thread` rebuilds
    from what its tools answered (the order's total and window, the customer), not an empty one, where
    a rule that reads the world would see nothing (or, for another desk's audit, false violations)."""
    import dataclasses

    from improve.evals import outcome_row

    agent = deploy(Workspace.load(ws / "improve.toml"), "v0", model="careful")
    production_thread(agent, "prod-audit", SMALL[0])
    entries = JsonlDirStore(ws / "traces" / PRODUCTION_DIR).read("prod-audit")
    seen: list[dict[str, Any]] = []

    def make_world(fixture: Any) -> Any:
        seen.append(fixture)
        return agent.env.make_world(fixture)

    env = dataclasses.replace(agent.env, make_world=make_world)
    row = outcome_row(env, None, "prod-audit", entries)
    assert row.violations == [] and seen[-1]["orders"]["O-5"]["total"] == 30, seen
    assert row.policy_version == "v0" and row.model == "careful"  # from its stamp: the id says neither
    assert runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces" / PRODUCTION_DIR)]).exit_code == 0
    for relation in ("outcomes", "threads"):
        (found,) = sql(ws, f"SELECT policy_version, model FROM {relation} WHERE thread_id = 'prod-audit'")
        assert found == {"policy_version": "v0", "model": "careful"}, relation
    assert seen[-1] == agent.env.world_from_thread(recorded_thread(agent.env.machine, entries, "prod-audit"))
    # Without the hook (or when it cannot read the thread) nothing is guessed: the empty world.
    outcome_row(dataclasses.replace(env, world_from_thread=None), None, "prod-audit", entries)
    assert seen[-1] == {}


@pytest.mark.slow
def test_diagnosing_production_for_a_model_with_no_threads_names_the_models_there_are(ws: Path) -> None:
    agent = deploy(Workspace.load(ws / "improve.toml"), "v0", model="careful")
    production_thread(agent, "prod-1", SMALL[0])
    ingested = runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces" / PRODUCTION_DIR)])
    assert ingested.exit_code == 0, ingested.output
    said = runner.invoke(app, ["diagnose", "--source", "production", "--model", "nope", "-w", str(ws)])
    assert said.exit_code == 0, said.output
    assert "no production threads of refunds decided by nope" in said.stdout
    assert "its production threads are of careful on v0 (1 threads)" in said.stdout
    assert "ingest a deployed agent's threads first" not in said.stdout  # they are ingested
    found = cli(ws, "diagnose", "--source", "production", "--model", "nope", "--json")
    assert found["clusters"] == [] and found["present"] == [
        {"model": "careful", "policy_version": "v0", "threads": 1}
    ]


def test_diagnosing_production_without_a_warehouse_creates_none(ws: Path) -> None:
    """A read makes no warehouse: it says there is none and how to make one, as `improve sql` does."""
    said = runner.invoke(app, ["diagnose", "--source", "production", "-w", str(ws)])
    assert said.exit_code == 2, said.output
    assert f"no warehouse at {ws / 'traces' / 'traces.duckdb'}" in said.stderr
    assert f"improve ingest {ws / 'traces' / PRODUCTION_DIR}" in said.stderr
    assert not (ws / "traces" / "traces.duckdb").exists()


def test_waiting_production_says_when_threads_on_disk_are_not_ingested(ws: Path) -> None:
    agent = deploy(Workspace.load(ws / "improve.toml"), "v0", model="careful")
    production_thread(agent, "prod-1", SMALL[0])
    deployed = ws / "traces" / PRODUCTION_DIR
    # No warehouse yet: the command that makes one for a deployed agent's threads is named.
    none = runner.invoke(app, ["waiting", "--production", "-w", str(ws)])
    assert none.exit_code == 2 and f"`improve ingest {deployed}` creates it" in none.stderr, none.output
    assert runner.invoke(app, ["ingest", "-w", str(ws), str(deployed)]).exit_code == 0
    assert cli(ws, "waiting", "--production", "--json") == {"waiting": [], "not_ingested": 0}
    # Above 100 the refund waits for a person's approval: a wait on disk, not yet in the warehouse.
    production_thread(agent, "prod-2", ("C-7", "O-7", 150, 0, 150))
    listed = runner.invoke(app, ["waiting", "--production", "-w", str(ws)])
    assert listed.exit_code == 0 and "0 thread(s) waiting" in listed.stdout, listed.output
    assert f"1 thread file(s) in {deployed} are not in the warehouse" in listed.stderr
    assert f"`improve ingest {deployed}` brings them in" in listed.stderr
    assert runner.invoke(app, ["ingest", "-w", str(ws), str(deployed)]).exit_code == 0
    found = cli(ws, "waiting", "--production", "--json")
    assert [t["thread"] for t in found["waiting"]] == ["prod-2"] and found["not_ingested"] == 0


def test_ingest_says_which_threads_no_environment_replays(ws: Path) -> None:
    """Threads of an environment the workspace does not register are ingested, and said not replayed."""
    other = ws / "other"
    other.mkdir()
    for number in range(3):
        stamp = {"schemaVersion": 1, "recordedAt": "2026-11-28T10:00:00Z", "machineId": "support-desk"}
        lines = [
            json.dumps(
                stamp | {"machineVersion": "1", "id": f"x{number}-{i}", "index": i, "event": {"type": t}}
            )
            for i, t in enumerate(("@agent.init", "STEP"))
        ]
        (other / f"train:v0:careful:ticket-{number}:r1.jsonl").write_text("\n".join(lines) + "\n")
    said = runner.invoke(app, ["ingest", str(other), "-w", str(ws)])
    assert said.exit_code == 0, said.output
    assert "outcomes: 0 thread(s) replayed" in said.stderr
    assert "3 thread(s) of unknown environment support-desk not replayed" in said.stderr
    doc = json.loads(runner.invoke(app, ["ingest", str(other), "-w", str(ws), "--json"]).stdout)
    assert doc["outcomes"]["unknown_machines"] == {"support-desk": 3}


def test_production_threads_become_scenarios_and_a_round_fixes_them(tmp_path: Path) -> None:

    ws = copy_workspace(tmp_path / "ws")
    # A workspace whose only labelled scenarios will come from production.
    (ws / "scenarios" / "refunds.yaml").write_text("environment: refunds\nscenarios: []\n")
    # Three labelled scenarios bound no rule's reach: the check on generated cases (on by default) refuses
    # the rule they support, which also refunds orders the desk escalates or closes. This test is about
    # what production threads give a round, so it goes without that check.
    config = ws / "improve.toml"
    config.write_text(
        config.read_text().replace("[objective]\n", "[objective]\nout_of_sample_cases = 0\n", 1)
    )
    commit_workspace(ws, user="t", message="workspace")
    # The deployed agent journals into the workspace's traces/production/ by default.
    agent = deploy(Workspace.load(ws / "improve.toml"), "v0", model="naive")
    for number, case in enumerate(PARTIAL + SMALL, start=1):
        production_thread(agent, f"prod-{number:04d}", case)
    prod = ws / "traces" / PRODUCTION_DIR
    stamp = json.loads((prod / "prod-0001.jsonl").read_text().splitlines()[0])["metadata"]
    assert stamp["environment"] == "refunds" and stamp["policy"]["version"] == "0"
    assert stamp["models"] == {"decider": "naive"} and "scenario" not in stamp
    ingested = runner.invoke(app, ["ingest", "-w", str(ws), str(prod)])
    assert ingested.exit_code == 0, ingested.output

    found = cli(ws, "diagnose", "--source", "production", "--json")
    assert found["threads"] == 6
    top = found["clusters"][0]
    # The systematic mistake: the whole amount asked, refused by the guard, then escalated.
    assert (top["decision"], top["answer"], top["refusal"], top["final_state"], top["threads"]) == (
        "chooseResolution", "ESCALATE", "rejected-by-guard", "escalated", 4
    )  # fmt: skip
    assert "refundable" in top["guard"]
    # The table cuts a long guard (whole in --json and in the SQL): at 80 columns it wrapped a row into twenty.
    table = runner.invoke(app, ["diagnose", "--source", "production", "-w", str(ws)])
    assert len(top["guard"]) > 72 and "…" in table.stdout and top["guard"][-12:] not in table.stdout
    assert sql(ws, found["sql"])[0]["threads"] == 4  # the SQL it shows runs as it is
    assert (top["model"], top["policy_version"]) == ("naive", "v0")
    # One model's and one version's threads: the stamps say which; another model has none here, and a
    # version the workspace does not have is refused.
    assert (
        cli(ws, "diagnose", "--source", "production", "--model", "naive", "--policy", "v0", "--json")[
            "clusters"
        ]
        == found["clusters"]
    )
    assert cli(ws, "diagnose", "--source", "production", "--model", "careful", "--json")["clusters"] == []
    unknown = runner.invoke(app, ["diagnose", "--source", "production", "--policy", "v9", "-w", str(ws)])
    assert unknown.exit_code == 2 and "v9" in unknown.stderr
    assert found["set_aside"] == 0
    # A production thread edited after it was written is set aside: in no cluster, and said so.
    edited = prod / "prod-0007.jsonl"
    production_thread(agent, "prod-0007", SMALL[0])
    lines = edited.read_text().splitlines()
    lines[1] = lines[1].replace('"verified":true', '"verified":false', 1)
    assert lines[1] != edited.read_text().splitlines()[1]
    edited.write_text("\n".join(lines) + "\n")
    assert runner.invoke(app, ["ingest", "-w", str(ws), str(prod)]).exit_code == 0
    assert cli(ws, "diagnose", "--source", "production", "--json")["set_aside"] == 1
    said = runner.invoke(app, ["diagnose", "--source", "production", "-w", str(ws)])
    assert "1 production thread(s) of refunds set aside, in no cluster" in " ".join(said.stderr.split())
    # Rows an older improve wrote (audited in an empty world) are gone after the migration: the threads
    # are replayed again when production is read, not missing from it.
    with connect(ws / "traces" / "traces.duckdb", read_only=False) as warehouse:
        warehouse.con.execute("DELETE FROM outcomes WHERE expected_outcome IS NULL")
    assert cli(ws, "diagnose", "--source", "production", "--json")["clusters"] == found["clusters"]
    # An answer is named with its payload, as a round's clusters name it (a number as `#`).
    assert [c["answer"] for c in found["clusters"][1:]] == ["REFUND{amount=#}"], found["clusters"]

    # Two labelled for training (a rule's evidence never rests on one scenario), one held out.
    for thread, split in zip(top["examples"][:3], ("train", "train", "held-out"), strict=True):
        case = PARTIAL[int(thread.split("-")[1]) - 1]
        left = case[2] - case[3]
        effect = json.dumps({"kind": "refund", "orderId": case[1], "amount": left})
        added = runner.invoke(
            app,
            ["scenarios", "add", "-w", str(ws), "--from-thread", str(prod / f"{thread}.jsonl"),
             "--expect", "issued", "--effect", effect, "--split", split, "--category", "partial-refund"],
        )  # fmt: skip
        assert added.exit_code == 0, added.output
    assert runner.invoke(app, ["scenarios", "check", "-w", str(ws)]).exit_code == 0
    repo = git.Repo(ws)
    repo.git.add(A=True)
    repo.git.commit(m="three production threads labelled", author="Dana <dana@example.invalid>")

    outcome = cli(ws, "round", "--policy", "v0", "--k", "1", "--json")["rounds"][0]
    assert outcome["status"] == "recommended", outcome["decision_detail"]
    assert "refundable" in outcome["rationale"]
    assert outcome["scores"]["held-out"]["before"] == 0.0 and outcome["scores"]["held-out"]["after"] == 1.0

    # The production impact preview: the mined rule (no refund in 90 days: refund what is refundable)
    # changes the 4 threads that asked for more than was left (their refused refund, then the
    # escalation), and one small ticket where it would refund the whole order instead of the part asked
    # for: what a reviewer should see before merging. The other small ticket's answer is the same.
    impact = outcome["impact"]
    assert (impact["available"], impact["threads"], impact["decisions"], impact["changed"]) == (6, 6, 6, 5)
    assert impact["unknown"] == impact["unreadable"] == 0
    change, small = impact["changes"]
    assert (change["decision"], change["before"], change["after"], change["threads"]) == (
        "chooseResolution", "ESCALATE", "REFUND", 4
    )  # fmt: skip
    first = PARTIAL[int(change["examples"][0].split("-")[1]) - 1]
    assert change["example"] == f"ESCALATE -> REFUND{{amount={float(first[2] - first[3])}}}"
    assert (small["before"], small["after"], small["examples"]) == ("REFUND", "REFUND", ["prod-0006"])
    assert small["example"] == "REFUND{amount=20.0} -> REFUND{amount=45.0}"
    body = (ws / outcome["report"] / "pr.md").read_text()
    assert "## Production impact preview" in body
    assert "the candidate would answer 5 (83.3%) differently at some decision" in body
    assert f"`{change['examples'][0]}` ({change['example']})" in body
    page = runner.invoke(app, ["report", "--html", "-w", str(ws)])
    assert page.exit_code == 0, page.output
    html = next((ws / "reports").glob("*/report.html")).read_text()
    assert "Production impact preview" in html and change["examples"][0] in html


@pytest.mark.slow
def test_a_round_keeps_each_kind_of_tampered_thread_and_uses_none_of_them(tmp_path: Path) -> None:
    from .test_replay import TAMPERS

    ws = copy_workspace(tmp_path / "ws")
    commit_workspace(ws, user="t", message="workspace")
    cli(ws, "run", "--split", "train", "--k", "2", "--json")
    (ws / "traces" / "traces.duckdb").unlink()  # the tampered files reach the warehouse through the round
    kinds = ["an event field", "an actor's output", "an effect", "a usage entry's counts", "an attempt",
             "removing an entry", "inserting one", "downgrading one to version 1"]  # fmt: skip
    threads = sorted((ws / "traces").glob("train:v0:naive:partial-refund-*.jsonl"))
    expected = {}
    for kind, path in zip(kinds, threads, strict=False):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        tampered, index = TAMPERS[kind][0](lines)
        path.write_text("".join(json.dumps(line) + "\n" for line in tampered))
        expected[path.stem] = index
    truncated = threads[len(kinds)]
    truncated.write_text("".join(line + "\n" for line in truncated.read_text().splitlines()[:-1]))

    damaged = {path.name: path.read_bytes() for path in threads if path.stem in expected or path == truncated}

    # No copy of them in the warehouse: none is used as it stands; each file is kept in .improve/damaged/
    # (never lost), and its scenario run again from the start.
    result = runner.invoke(
        app,
        ["round", "--policy", "v0", "--k", "2", "--json", "-w", str(ws)],
        env={"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"},
    )
    assert result.exit_code in (0, 1), result.output
    outcome = json.loads(result.stdout)["rounds"][0]
    assert outcome["quarantined"] == []
    kept = {p.name: p.read_bytes() for p in (ws / ".improve" / "damaged").glob("*/*.jsonl")}
    assert kept == damaged
    said = " ".join(result.stderr.split())
    assert f"{len(damaged)} recorded thread(s) whose file did not verify were run again" in said, said
    # The first three are named, each by its entry.
    assert any(f"{t}: does not verify: thread {t}: entry {i} (" in said for t, i in expected.items()), said
    scored = {r["thread_id"] for r in sql(ws, "SELECT thread_id FROM outcomes")}
    assert set(expected) | {truncated.stem} <= scored
    verified = runner.invoke(app, ["replay", "-w", str(ws), str(ws / "traces"), "--verify"])
    assert verified.exit_code == 0, verified.output


def test_a_command_that_opens_the_warehouse_is_told_when_it_waits_for_another_writer(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `improve sql` said it waited on an ingest's lock; run, score and a round, which open the warehouse
    # through the ledger, still waited without a word. The ledger hands the command's `say` to the
    # opening that waits (tests/test_warehouse.py drives that wait with a real second process).
    import improve.evals.ledger as ledger_module
    from improve.evals.ledger import Ledger

    given: list[object] = []

    def opening(path: Path, **options: Any) -> Any:
        given.append(options.get("say"))
        raise RuntimeError("stop here")

    monkeypatch.setattr(ledger_module, "open_database", opening)
    space = Workspace.load(ws / "improve.toml")
    said: list[str] = []
    with pytest.raises(RuntimeError, match="stop here"):
        _ = Ledger(space, space.environment(), said.append).con
    assert given == [said.append]
