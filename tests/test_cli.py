"""The CLI end to end: drive `improve` with CliRunner, then inspect the files it wrote."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from improve.cli.main import app
from improve.clock import FrozenClock
from improve.demo import commit_workspace
from improve.log.entry import LogEntry
from tests.helpers import FROZEN_AT, REPO

runner = CliRunner()


def test_run_writes_one_thread_per_run_and_prints_json(ws: Path) -> None:
    result = runner.invoke(
        app,
        [
            "run",
            "-w",
            str(ws),
            "--env",
            "refunds",
            "--policy",
            "v0",
            "--model",
            "naive",
            "--split",
            "held-out",
            "--k",
            "2",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    held_out = [s for s in doc["scenarios"]]
    assert doc["k"] == 2 and doc["summary"]["runs"] == 2 * len(held_out)
    files = sorted(p.name for p in (ws / "traces").glob("*.jsonl"))
    assert len(files) == doc["summary"]["runs"]
    assert all(
        name.startswith("held-out:v0:") and name.endswith((":r1.jsonl", ":r2.jsonl")) for name in files
    )
    # The stamp on entry 0 says what produced the thread.
    first = LogEntry.model_validate_json((ws / "traces" / files[0]).read_text().splitlines()[0])
    assert first.metadata is not None
    assert first.metadata["models"] == {"decider": "naive"}
    assert first.metadata["split"] == "held-out" and first.metadata["run"] in (1, 2)
    assert first.metadata["policy"]["version"] == "0"
    # naive refunds fraud signals: the held-out fraud scenario fails, the small refund passes.
    by_category = {s["category"]: s for s in doc["scenarios"]}
    assert by_category["fraud-signal"]["passed"] == 0
    assert by_category["small-refund"]["passed"] == 2
    assert doc["summary"]["violations"] == 0


def test_second_run_reuses_recorded_threads(ws: Path) -> None:
    args = ["run", "-w", str(ws), "--split", "held-out", "--k", "1", "--scenario", "small-refund-04"]
    assert runner.invoke(app, args).exit_code == 0
    path = next((ws / "traces").glob("*.jsonl"))
    before = path.read_text()
    again = runner.invoke(app, args)
    assert again.exit_code == 0
    assert "reused 1 recorded threads" in again.stderr
    assert path.read_text() == before
    fresh = runner.invoke(app, [*args, "--fresh"])
    assert fresh.exit_code == 0 and path.read_text() != before
    # A thread recorded before what its run starts from changed is evidence of other inputs: it is run
    # again (not refused, not reused). So is one whose stamp carries no digests (an older improve's).
    scenarios = ws / "scenarios" / "refunds.yaml"
    scenarios.write_text(scenarios.read_text().replace("deliveredDaysAgo: 1}", "deliveredDaysAgo: 2}", 1))
    for change in ("scenario", "no digests"):
        if change == "no digests":
            lines = path.read_text().splitlines()
            entry = json.loads(lines[0])
            del entry["metadata"]["digests"]
            path.write_text("\n".join([json.dumps(entry), *lines[1:]]) + "\n")
        before = path.read_text()
        again = runner.invoke(app, args)
        assert again.exit_code == 0 and "reused" not in again.stderr, again.output
        assert path.read_text() != before
        said = " ".join(again.stderr.split())
        assert f"ran 1 recorded thread(s) again, each replaced: {path.stem}: recorded before" in said, said
    stamp = json.loads(path.read_text().splitlines()[0])["metadata"]
    assert set(stamp["digests"]) == {"environment", "scenario"}
    # A thread cut short (its last lines lost, a run killed): run again, and said so, with where it stopped.
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n")
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and len(path.read_text().splitlines()) == len(lines), again.output
    said = " ".join(again.stderr.split())
    assert f"{path.stem}: cut short after entry 2 (no end entry)" in said, said


def test_run_never_reuses_a_thread_that_does_not_verify_and_never_loses_one(ws: Path) -> None:
    """Four recorded threads damaged in traces/ (a tool output edited, two lines swapped, a middle line
    deleted, the end line deleted): `replay --verify` fails them, yet `run` reused three as passes and
    ran the cut one again over the file and the warehouse's complete original. Now `run` verifies what
    it reuses as `replay --verify` does: each damaged file is kept in .improve/damaged/, and the
    warehouse's verified copy is written back (byte for byte) and reused; with no copy there, the
    scenario runs again and the damaged file is still kept (docs/contracts.md)."""
    scenarios = ["small-refund-01", "small-refund-02", "small-refund-03", "partial-refund-01"]
    args = ["run", "-w", str(ws), "--split", "train", "--k", "1", "--model", "careful"]
    for scenario in scenarios:
        args += ["--scenario", scenario]
    assert runner.invoke(app, args).exit_code == 0
    paths = [ws / "traces" / f"train:v0:careful:{scenario}:r1.jsonl" for scenario in scenarios]
    originals = [path.read_bytes() for path in paths]

    def damage() -> list[bytes]:
        edited = paths[0].read_text().replace('"refundsLast90d":0', '"refundsLast90d":1', 1)
        assert edited != paths[0].read_text()
        paths[0].write_text(edited)
        lines = paths[1].read_text().splitlines(keepends=True)
        lines[2], lines[3] = lines[3], lines[2]
        paths[1].write_text("".join(lines))
        lines = paths[2].read_text().splitlines(keepends=True)
        paths[2].write_text("".join(lines[:3] + lines[4:]))
        lines = paths[3].read_text().splitlines(keepends=True)
        paths[3].write_text("".join(lines[:-1]))
        return [path.read_bytes() for path in paths]

    damaged = damage()
    checked = runner.invoke(app, ["replay", "-w", str(ws), *map(str, paths), "--verify", "--json"])
    assert checked.exit_code == 1, checked.output
    assert (json.loads(checked.stdout)["tampered"], json.loads(checked.stdout)["incomplete"]) == (3, 1)

    again = runner.invoke(app, [*args, "--json"])
    assert again.exit_code == 0, again.output
    said = " ".join(again.stderr.split())
    assert (
        "restored 4 recorded thread(s) whose file did not verify from the warehouse's verified copy" in said
    )
    assert "reused" not in said.replace("not reused", "") and "ran " not in said, said
    assert [path.read_bytes() for path in paths] == originals  # the evidence, whole again
    kept = {p.name: p.read_bytes() for p in (ws / ".improve" / "damaged").glob("*/*.jsonl")}
    assert kept == {path.name: data for path, data in zip(paths, damaged, strict=True)}
    assert f"its file was kept as {ws / '.improve' / 'damaged'}" in said
    verified = runner.invoke(app, ["replay", "-w", str(ws), *map(str, paths), "--verify"])
    assert verified.exit_code == 0, verified.output
    # A run's output in the table as JSON, as everywhere else (it read as a Python repr: `{'outcome': ...`).
    assert '{"outcome": "issued"' in verified.stdout and "{'outcome'" not in verified.stdout, verified.stdout
    assert json.loads(again.stdout)["summary"]["runs"] == 4

    # No copy to restore (the warehouse rebuilt without them): the scenario runs again, the file kept.
    (ws / "traces" / "traces.duckdb").unlink()
    shutil.rmtree(ws / ".improve" / "damaged")
    damaged = damage()
    third = runner.invoke(app, args)
    assert third.exit_code == 0, third.output
    said = " ".join(third.stderr.split())
    assert "ran 4 recorded thread(s) again, each replaced:" in said and "its file was kept as" in said, said
    kept = {p.name: p.read_bytes() for p in (ws / ".improve" / "damaged").glob("*/*.jsonl")}
    assert kept == {path.name: data for path, data in zip(paths, damaged, strict=True)}
    assert runner.invoke(app, ["replay", "-w", str(ws), *map(str, paths), "--verify"]).exit_code == 0


def test_score_leaves_out_runs_recorded_before_the_scenario_changed(ws: Path) -> None:
    # `run` and `round` run such a thread again rather than reuse it (evidence of other inputs); `score`
    # used to score it all the same, so a changed world or tool read as the old one's pass rate.
    run = ["run", "-w", str(ws), "--split", "held-out", "--k", "1", "--model", "naive"]
    for scenario in ("small-refund-04", "fraud-signal-04"):
        assert runner.invoke(app, [*run, "--scenario", scenario]).exit_code == 0
    score = ["score", "-w", str(ws), "-p", "v0", "-m", "naive", "-s", "held-out", "--json"]

    unscored: list[Any] = []

    def scored() -> tuple[list[str], float, str]:
        result = runner.invoke(app, score)
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        (card,) = doc["scorecards"]
        unscored[:] = doc["unscored"]
        return sorted(s["scenario"] for s in card["scenarios"]), card["pass_rate"], result.stderr

    scenarios, rate, said = scored()
    assert (scenarios, rate) == (["fraud-signal-04", "small-refund-04"], 0.5)
    # The held-out scenarios never run are left out, and said so: a count column alone hid them.
    held_out = [
        s["id"]
        for s in yaml.safe_load((ws / "scenarios" / "refunds.yaml").read_text())["scenarios"]
        if s.get("split") == "held-out"
    ]
    (left,) = unscored
    assert left["of"] == len(held_out) and len(left["scenarios"]) == len(held_out) - 2
    assert set(left["scenarios"]) == set(held_out) - {"fraud-signal-04", "small-refund-04"}
    assert (
        f"warning: held-out: {len(held_out) - 2} of {len(held_out)} scenarios have no current recorded run"
        in said
    )
    assert "improve run --env refunds --policy v0 --model naive --split held-out" in said
    markdown = runner.invoke(app, [*score[:-1], "--format", "markdown"])
    assert markdown.exit_code == 0, markdown.output
    assert (
        f"held-out: {len(held_out) - 2} of {len(held_out)} scenarios have no recorded run of v0"
        in markdown.stdout
    )
    path = ws / "scenarios" / "refunds.yaml"
    text = path.read_text()
    old = "orders: {O-5004: {customerId: C-1004, total: 38.25, refunded: 0, deliveredDaysAgo: 1}}"
    assert old in text
    path.write_text(text.replace(old, old.replace("deliveredDaysAgo: 1", "deliveredDaysAgo: 2")))
    scenarios, rate, said = scored()
    assert (scenarios, rate) == (["fraud-signal-04"], 0.0)
    assert "held-out: 1 recorded run(s) of v0 with model naive are not scored" in said
    assert "held-out:v0:naive:small-refund-04:r1" in said
    # Run again, it is scored again.
    assert runner.invoke(app, [*run, "--scenario", "small-refund-04"]).exit_code == 0
    scenarios, rate, said = scored()
    assert (scenarios, rate) == (["fraud-signal-04", "small-refund-04"], 0.5) and "not scored" not in said


def test_score_of_an_unknown_policy_says_only_that(ws: Path) -> None:
    # It used to say first that the sealed test split is not scored, as if scoring had begun.
    result = runner.invoke(app, ["score", "-w", str(ws), "-p", "v99"])
    assert result.exit_code == 2
    assert "policy 'v99' not found" in result.stderr and "sealed test split" not in result.stderr


def test_a_policy_file_named_for_another_version_is_refused_by_every_command(ws: Path) -> None:
    # A copy of v0 saved as v5: `verify` passed, `run --policy v5` wrote v0's threads, and `score --policy
    # v5 --vs v0` compared v0 with itself.
    (ws / "policies" / "refunds" / "v5.json").write_text(
        (ws / "policies" / "refunds" / "v0.json").read_text()
    )
    for command in (
        ["verify", "v5"],
        ["run", "--policy", "v5", "--k", "1"],
        ["score", "-p", "v5", "--vs", "v0"],
    ):
        result = runner.invoke(app, [*command, "-w", str(ws)])
        said = " ".join(result.stderr.split())
        assert result.exit_code == 2, (command, result.output)
        assert "v5.json: its \"version\" is '0', but the file is v5.json" in said, said
        assert 'set "version": "5"' in said and not list((ws / "traces").glob("*:v0:*")), said


def test_a_cel_typo_in_a_policy_is_named_with_its_file_and_line_before_anything_runs(ws: Path) -> None:
    # `run` warned of a type error, started, and stopped on "state 'route'.choice[0].guard: CEL syntax error".
    from improve.loop.branches import insert_branch

    policy = json.loads((ws / "policies" / "refunds" / "v0.json").read_text())
    doc = insert_branch(
        policy, "facts.requested = 3", {"type": "'CLOSE'"}, 0, version="6", name="c", description="d"
    )
    path = ws / "policies" / "refunds" / "v6.json"
    path.write_text(json.dumps(doc, indent=2))
    line = next(n for n, row in enumerate(path.read_text().splitlines(), 1) if "facts.requested = 3" in row)
    result = runner.invoke(app, ["run", "-w", str(ws), "--policy", "v6", "--k", "1"])
    said = " ".join(result.stderr.split())
    assert (
        result.exit_code == 2 and f"v6.json:{line}: $.states.route.choice[0].guard: CEL syntax error" in said
    ), said
    assert "running" not in result.stderr and not list((ws / "traces").glob("*:v6:*"))


def test_score_of_a_policy_file_without_runs_says_the_run_that_makes_them(ws: Path, tmp_path: Path) -> None:
    # It suggested `improve run --policy v7` for a file numbered 7, which `run` could not find.
    policy = json.loads((ws / "policies" / "refunds" / "v0.json").read_text())
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**policy, "version": "7"}))
    result = runner.invoke(app, ["score", "-w", str(ws), "-p", str(path), "--model", "naive"])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 2 and "no recorded runs of v7 with model naive" in said, result.output
    assert f"`improve run --env refunds --policy {path} --model naive --k 3` first" in said
    held_out = runner.invoke(app, ["score", "-w", str(ws), "-p", str(path), "--split", "held-out"])
    assert "--model naive --split held-out --k 3` first" in " ".join(held_out.stderr.split())


def test_threads_of_two_models_for_one_policy_coexist(ws: Path) -> None:
    args = ["run", "-w", str(ws), "--split", "held-out", "--k", "1", "--scenario", "fraud-signal-04"]
    assert runner.invoke(app, [*args, "--model", "naive"]).exit_code == 0
    careful = runner.invoke(app, [*args, "--model", "careful", "--json"])
    assert careful.exit_code == 0, careful.output
    names = sorted(p.name for p in (ws / "traces").glob("*.jsonl"))
    assert names == [
        "held-out:v0:careful:fraud-signal-04:r1.jsonl",
        "held-out:v0:naive:fraud-signal-04:r1.jsonl",
    ]
    # Each model's runs are scored apart: careful escalates the fraud signal, naive refunds it.
    scores = {}
    for model in ("naive", "careful"):
        scored = runner.invoke(
            app, ["score", "-w", str(ws), "-p", "v0", "-m", model, "-s", "held-out", "--json"]
        )
        assert scored.exit_code == 0, scored.output
        scores[model] = json.loads(scored.stdout)["scorecards"][0]["pass_rate"]
    assert scores == {"naive": 0.0, "careful": 1.0}


def test_a_scenario_file_about_another_environment_is_refused(ws: Path) -> None:
    path = ws / "scenarios" / "refunds.yaml"
    text = path.read_text()
    line = text.splitlines().index("environment: refunds") + 1
    path.write_text(text.replace("environment: refunds", "environment: tool-loop"))
    # run and round refuse (a usage error); scenarios check reports it as a failed check.
    for command, code in (
        (["run", "--k", "1"], 2),
        (["round", "--policy", "v0"], 2),
        (["scenarios", "check"], 1),
    ):
        result = runner.invoke(app, [*command, "-w", str(ws)])
        assert result.exit_code == code, (command, result.output)
        assert f"refunds.yaml:{line}: environment: 'tool-loop'" in result.stderr, result.stderr
        assert "'refunds'" in result.stderr
    assert not (ws / "traces").exists() or not list((ws / "traces").glob("*.jsonl"))


def test_a_scenario_file_that_is_not_there_is_a_usage_error_for_every_command(ws: Path) -> None:
    """No file is no check that failed: `scenarios check --file` of a path that is not there exits 2 with
    `improve run` (and says which file it would check without it)."""
    missing = ws / "scenarios" / "refundz.yaml"
    checked = runner.invoke(app, ["scenarios", "check", "-w", str(ws), "--file", str(missing), "--json"])
    assert checked.exit_code == 2, checked.output
    assert f"{missing}: no such scenario file" in checked.stderr and "refunds.yaml" in checked.stderr
    assert checked.stdout == ""
    (ws / "scenarios" / "refunds.yaml").unlink()
    for command in (["scenarios", "check"], ["run", "--k", "1"]):
        result = runner.invoke(app, [*command, "-w", str(ws)])
        assert result.exit_code == 2, (command, result.output)
        assert "refunds.yaml: no such scenario file" in result.stderr, result.stderr


def test_replay_verifies_and_flags_divergence(ws: Path) -> None:
    runner.invoke(
        app, ["run", "-w", str(ws), "--split", "train", "--k", "1", "--scenario", "partial-refund-01"]
    )
    thread = "train:v0:naive:partial-refund-01:r1"
    ok = runner.invoke(app, ["replay", "-w", str(ws), thread, "--verify", "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["diverged"] == doc["tampered"] == doc["incomplete"] == 0
    assert doc["threads"][0]["final_state"] == "escalated"
    assert doc["threads"][0]["verification"] == "verified"
    # Tamper with a journaled tool output: replay with --verify must notice.
    path = ws / "traces" / f"{thread}.jsonl"
    lines = path.read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    target = next(i for i, e in enumerate(entries) if e["event"].get("actorId") == "verifyingCustomer")
    entries[target]["event"]["output"]["customer"]["refundsLast90d"] = 99
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    bad = runner.invoke(app, ["replay", "-w", str(ws), str(path), "--verify"])
    assert bad.exit_code == 1
    # The hash chain names it first (every way of tampering is in tests/test_replay.py).
    assert f"entry {target} (xstate.done.actor" in bad.stderr and "content changed" in bad.stderr


def test_a_thread_that_does_not_fold_is_named_and_the_others_still_replay(ws: Path) -> None:
    """A thread recorded by other files of the environment under the same version (its machine reads an
    input this run does not have) is named as invalid, with why it may be; the rest replay; exit 1."""
    for scenario in ("partial-refund-01", "small-refund-01"):
        runner.invoke(app, ["run", "-w", str(ws), "--split", "train", "--k", "1", "--scenario", scenario])
    path = ws / "traces" / "train:v0:naive:small-refund-01:r1.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    del entries[0]["event"]["input"]["customerId"]
    entries[0]["metadata"]["digests"]["environment"] = "0" * 64
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    result = runner.invoke(app, ["replay", "-w", str(ws), str(ws / "traces"), "--json"])
    assert result.exit_code == 1, result.output
    assert "INVALID train:v0:naive:small-refund-01:r1: entry 0 (@agent.init)" in result.stderr
    assert "recorded with other files of environment 'refunds': digest 000000000000" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["invalid"] == 1 and [t["final_state"] for t in doc["threads"] if "final_state" in t]


def test_replay_of_a_malformed_file_names_the_line(ws: Path) -> None:
    path = ws / "broken.jsonl"
    path.write_text('{"schemaVersion": 1}\n')
    result = runner.invoke(app, ["replay", "-w", str(ws), str(path)])
    assert result.exit_code == 1  # named invalid, as a thread that does not fold is
    assert f"INVALID {path}:1: not a log entry" in result.stderr


@pytest.mark.parametrize("content", [None, "", "\n  \n"])
def test_replay_of_nothing_is_not_a_pass(ws: Path, content: str | None) -> None:
    # An empty file, a blank one, or a directory without threads: nothing verified is not exit 0.
    path = ws / "nothing.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    result = runner.invoke(app, ["replay", "-w", str(ws), str(path), "--verify"])
    assert result.exit_code in (2, 3), result.output
    expected = "nothing to replay" if content is None else f"{path}: thread nothing is empty"
    assert expected in " ".join(result.stderr.split())


def test_an_empty_file_in_a_directory_is_named_and_the_others_still_replay(ws: Path) -> None:
    """`zz.jsonl` (0 bytes) and `blank.jsonl` (line breaks only) beside good threads stopped the whole
    directory at the first (`thread blank is empty`, exit 3, nothing under --json, a bare stem): each is
    named by its path as invalid, the others replayed and verified, exit 1 (docs/cli.md, replay)."""
    runner.invoke(
        app, ["run", "-w", str(ws), "--split", "train", "--k", "1", "--scenario", "small-refund-01"]
    )
    folder = ws / "threads"
    folder.mkdir()
    for thread in (ws / "traces").glob("*.jsonl"):
        (folder / thread.name).write_bytes(thread.read_bytes())
    (folder / "zz.jsonl").write_bytes(b"")
    (folder / "blank.jsonl").write_bytes(b"\n\n")
    result = runner.invoke(app, ["replay", "-w", str(ws), str(folder), "--verify", "--json"])
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    for name in ("zz", "blank"):
        assert f"INVALID {folder / name}.jsonl: thread {name} is empty" in said, said
    doc = json.loads(result.stdout)
    assert doc["invalid"] == 2 and doc["tampered"] == doc["incomplete"] == 0
    assert sorted(t["thread"] for t in doc["threads"] if t.get("empty")) == ["blank", "zz"]
    assert [t["verification"] for t in doc["threads"] if not t.get("empty")] == ["verified"]
    table = runner.invoke(app, ["replay", "-w", str(ws), str(folder), "--verify"])
    assert table.exit_code == 1 and "replayed 3 thread(s) (2 did not verify)" in table.stdout, table.output


@pytest.mark.parametrize(
    ("fmt", "needle"),
    [("text", "Resolve refund tickets"), ("mermaid", "stateDiagram-v2"), ("xstate", '"id": "refunds"')],
)
def test_describe_formats(ws: Path, fmt: str, needle: str) -> None:
    result = runner.invoke(app, ["describe", "-w", str(ws), "--env", "refunds", "--format", fmt])
    assert result.exit_code == 0, result.output
    assert needle in result.stdout
    if fmt == "text":
        # The goal comes first.
        assert result.stdout.lstrip().startswith("Goal") or result.stdout.lstrip().startswith("Resolve")
        # A decision's facts with their types: what a policy and the rule miner may use.
        assert "facts: ticket (string), requested (number), order.total (number)" in result.stdout


def test_describe_says_which_numbers_are_in_one_unit(ws: Path) -> None:
    # The tool loop's guards compare its counters with their limits: each pair is one unit, which the
    # rule miner may compare; a policy described alone has no environment to type its facts.
    result = runner.invoke(app, ["describe", "-w", str(ws), "--env", "tool-loop"])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "one unit, compared with each other (the machine compares them): turn.max, turn.used" in lines
    assert "turn.used (int)" in result.stdout and "plan (list)" in result.stdout
    # `improve vocabulary` says the units too (it dropped them).
    words = runner.invoke(app, ["vocabulary", "-w", str(ws), "--env", "tool-loop"])
    assert "fact  facts.turn.used: int (one unit with facts.turn.max)" in words.stdout, words.stdout


def test_vocabulary_names_the_payload_values_a_machine_offers() -> None:
    # `RENEW {days: choice}` left out the values a branch must answer with (`describe` named them).
    desks = REPO / "tests" / "fixtures" / "desks"
    words = runner.invoke(app, ["vocabulary", "-w", str(desks), "--env", "library-loans"])
    assert words.exit_code == 0, words.output
    assert "  event RENEW {days: one of 7, 14, 28}" in words.stdout.splitlines(), words.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--env", "nope"], "unknown environment 'nope'"),
        (
            ["run", "--env", "refund_approval"],
            "unknown environment 'refund_approval' (did you mean 'refund-approval'?)",
        ),
        (["run", "--policy", "v9"], "policy 'v9' not found"),
        (["verify", "v9"], "v9.json; versions here: ['v0']"),
        (["round", "--policy", "V3"], "V3.json; versions here: ['v0']"),
        (["run", "--model", "gpt-9"], "has no model 'gpt-9'"),
        (["run", "--model", "carefull"], "has no model 'carefull' (did you mean 'careful'?)"),
        (["run", "--split", "dev"], "unknown split 'dev'"),
        (["run", "--scenario", "no-such"], "unknown scenario id(s) ['no-such']"),
        (["describe", "--format", "svg"], "unknown format 'svg'"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(ws: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, [args[0], "-w", str(ws), *args[1:]])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_bad_scenario_file_names_file_line_scenario_and_field(ws: Path) -> None:
    path = ws / "scenarios" / "refunds.yaml"
    text = path.read_text().replace("split: held-out", "split: dev", 1)
    path.write_text(text)
    result = runner.invoke(app, ["run", "-w", str(ws), "--k", "1"])
    assert result.exit_code == 2
    line = next(i for i, raw in enumerate(text.splitlines(), 1) if "split: dev" in raw)
    assert (
        "refunds.yaml:" in result.stderr
        and "split" in result.stderr
        and "'train', 'held-out' or 'test'" in result.stderr
    )
    scenario_line = int(result.stderr.split("refunds.yaml:")[1].split(":")[0])
    assert scenario_line <= line


def test_a_file_and_line_is_printed_as_written_never_as_an_emoji(capsys: pytest.CaptureFixture[str]) -> None:
    """rich reads `:100:` as an emoji code: `scenarios.yaml:100:` printed as `scenarios.yaml💯`, in
    progress notes, errors and tables alike."""
    from improve.cli.common import err, out, report, say
    from improve.errors import ScenarioError

    say("s.yaml:100: a note")
    report(ScenarioError("s.yaml:100: scenario 'x': a problem at :smile: too"))
    out.print("t.yaml:100:", markup=False)
    err.print("u.yaml:1234:", markup=False)
    captured = capsys.readouterr()
    assert "s.yaml:100: a note" in captured.err and "s.yaml:100: scenario 'x'" in captured.err
    assert ":smile:" in captured.err and "u.yaml:1234:" in captured.err and "t.yaml:100:" in captured.out


def test_a_policy_whose_guard_fails_on_every_decision_is_said_before_and_in_each_failed_run(ws: Path) -> None:
    """A guard that does not type-check against the facts (a number compared with text) fails at every
    decision it is asked: `run` says so before it runs (as `verify`'s lower gate would), and each failed
    run's first reason is the policy's failure, not the fallback's answer read as the model's."""
    from improve.loop.branches import insert_branch

    policy = json.loads((ws / "policies" / "refunds" / "v0.json").read_text())
    guard = "facts.requested > 'forty' && {'type': 'CLOSE'} in input.options"
    doc = insert_branch(policy, guard, {"type": "'CLOSE'"}, 0, version="1", name="close", description="d")
    (ws / "policies" / "refunds" / "v1.json").write_text(json.dumps(doc))
    result = runner.invoke(app, ["run", "-w", str(ws), "--policy", "v1", "--k", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert "warning: policy v1 does not type-check against refunds's facts" in result.stderr
    assert "`improve verify v1` runs every gate" in result.stderr
    threads = json.loads(result.stdout)["threads"]
    failed = [t for t in threads if not t["passed"]]
    assert failed and all(
        t["reason"].startswith("the policy failed at decision 'chooseResolution': ") for t in failed
    ), [t["reason"] for t in failed][:3]
    # Runs that pass are not blamed on it (the fallback's answer was the label), and v0 is not warned about.
    plain = runner.invoke(app, ["run", "-w", str(ws), "--k", "1", "--scenario", "small-refund-01"])
    assert "warning" not in plain.stderr


def test_a_decision_that_refused_every_answer_is_the_first_reason_of_its_run(ws: Path) -> None:
    """A branch answering an amount the decision does not offer: each answer is refused, the machine goes
    on by its onError, and the table said only where the run ended ("ended in 'escalated'"), the refusal
    kept in the thread."""
    from improve.loop.branches import insert_branch

    policy = json.loads((ws / "policies" / "refunds" / "v0.json").read_text())
    guard = "input.name == 'chooseResolution'"
    doc = insert_branch(
        policy, guard, {"type": "'REFUND'", "amount": "999"}, 0, version="1", name="big", description="d"
    )
    (ws / "policies" / "refunds" / "v1.json").write_text(json.dumps(doc))
    result = runner.invoke(app, ["run", "-w", str(ws), "--policy", "v1", "--k", "1", "--json"])
    assert result.exit_code == 0, result.output
    failed = [t for t in json.loads(result.stdout)["threads"] if not t["passed"]]
    assert failed and all(
        t["reason"].startswith(
            "decision 'chooseResolution' took none of its answers (answered by the policy's final 'big'): "
        )
        and "the last: invalid-payload: amount=999" in t["reason"].split("; ")[0]
        for t in failed
    ), [t["reason"] for t in failed][:3]


def test_a_scenario_file_read_twice_gives_two_documents_and_an_edit_is_read_anew(tmp_path: Path) -> None:
    # Parsed documents are kept (a command reads one file several times): each read is still the
    # caller's own to change, dates stay dates, and a changed file is parsed again.
    from improve.errors import ScenarioError
    from improve.evals.scenarios import parse_yaml

    path = tmp_path / "s.yaml"
    text = "when: 2026-01-02\nitems: &a [1, {x: 2}]\nagain: *a\n"
    first = parse_yaml(text, path, ScenarioError)
    first["items"][1]["x"] = 99
    second = parse_yaml(text, path, ScenarioError)
    assert second == yaml.safe_load(text) and second["when"].isoformat() == "2026-01-02"
    assert second["items"] is second["again"]  # an alias is the same object, as YAML built it
    assert parse_yaml(text.replace("2026", "2027"), path, ScenarioError)["when"].year == 2027
    # Found only at the end of the file, a quote or bracket never closed is named where it opens.
    with pytest.raises(
        ScenarioError, match=r"s.yaml:1:4: invalid YAML: .*\(at line 2\) while parsing a flow"
    ):
        parse_yaml("a: [1", path, ScenarioError)
    with pytest.raises(ScenarioError, match=r"s.yaml:2:7: invalid YAML: .* quoted scalar that starts here"):
        parse_yaml('a: 1\nnote: "unclosed\nb: 2\nc: 3\n', path, ScenarioError)
    with pytest.raises(ScenarioError, match=r"s.yaml:3:2: invalid YAML"):  # elsewhere: where it is found
        parse_yaml("a:\n  - 1\n b: 2\n", path, ScenarioError)
    # A key given twice in one mapping is refused at the repeat (YAML kept the last without a word), keys
    # compared as YAML reads them (`yes` and `on` are both true), each repeat said once; a key set again
    # over a merge (`<<: *base`) overrides it on purpose, and one key in two mappings is no repeat.
    with pytest.raises(ScenarioError) as info:
        parse_yaml("a: &x {k: 1, k: 2}\nb: *x\nc:\n  - {yes: 1, on: 2}\n", path, ScenarioError)
    assert str(info.value).splitlines() == [
        f"{path}:1:14: a.k: the key 'k' is given twice in one mapping (first on line 1); YAML keeps only "
        "the last, dropping the first ('1') without a word: give each key once",
        f"{path}:4:14: c[0].on: the key 'on' is the key 'yes' again, as YAML reads them (first on line 4); "
        "YAML keeps only the last, dropping the first ('1') without a word: give each key once",
    ]
    merged = "base: &b {k: 1, j: 2}\nover: {<<: *b, k: 3}\nlist: [{k: 1}, {k: 2}]\n"
    assert parse_yaml(merged, path, ScenarioError) == yaml.safe_load(merged)


def test_a_scenario_file_with_no_scenario_to_run_is_a_problem(ws: Path) -> None:
    path = ws / "scenarios" / "refunds.yaml"
    path.write_text("environment: refunds\nscenarios: []\n")
    result = runner.invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert result.exit_code == 1 and "no scenario in train or held-out" in result.stderr, result.output


def test_a_label_given_twice_in_a_scenario_is_refused_at_its_line(ws: Path) -> None:
    # `outcome: issued` then `outcome: escalated`: YAML kept the last, the label changed without a word, and
    # `scenarios check` passed (exit 0).
    path = ws / "scenarios" / "refunds.yaml"
    text = path.read_text()
    path.write_text(
        text.replace("      outcome: issued\n", "      outcome: issued\n      outcome: escalated\n", 1)
    )
    lines = path.read_text().splitlines()
    first = lines.index("      outcome: issued") + 1
    said = (
        f"{path}:{first + 1}:7: scenario 'small-refund-01': expected.outcome: the key 'outcome' is given "
        f"twice in one mapping (first on line {first}); YAML keeps only the last, dropping the first "
        "('issued') without a word: give each key once"
    )
    checked = runner.invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert checked.exit_code == 1 and said in " ".join(checked.output.split()), checked.output
    ran = runner.invoke(app, ["run", "--k", "1", "-w", str(ws)])
    assert ran.exit_code == 2 and said in " ".join(ran.output.split()), ran.output
    assert "Traceback" not in checked.output + ran.output


def test_a_scenario_file_of_another_environment_says_the_line_to_write(ws: Path) -> None:
    path = ws / "scenarios" / "refunds.yaml"
    path.write_text(path.read_text().replace("environment: refunds", "environment: refund_desk", 1))
    result = runner.invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert result.exit_code == 1, result.output
    assert (
        "environment: 'refund_desk', but it is being used with the environment 'refunds'; fix the file's line "
        "(`environment: refunds`), or pass --env refund_desk"
    ) in " ".join(result.stderr.split())


def test_a_scenario_whose_input_the_machine_cannot_start_with_is_named_by_check_and_by_run(ws: Path) -> None:
    """A key misspelt in a scenario's input (`customerid`): `scenarios check` names the file, line,
    scenario and key; a run that reaches it stops with exit 2 naming the scenario, not only the path."""
    path = ws / "scenarios" / "refunds.yaml"
    doc = yaml.safe_load(path.read_text())
    victim = doc["scenarios"][3]
    victim["input"]["customerid"] = victim["input"].pop("customerId")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    rows = path.read_text().splitlines()
    start = next(n for n, text in enumerate(rows, 1) if f"id: {victim['id']}" in text)
    line = next(n for n, text in enumerate(rows[start:], start + 1) if text.strip() == "input:")
    checked = runner.invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert checked.exit_code == 1, checked.output
    # At the line of its `input`, not the scenario's first: the key misspelt is among those lines.
    assert (
        f"{path}:{line}: scenario '{victim['id']}': input: refunds's machine cannot start with it"
        in checked.stderr
    )
    assert "input.customerId" in checked.stderr and "Traceback" not in checked.output
    ran = runner.invoke(app, ["run", "-w", str(ws), "--k", "1", "--scenario", victim["id"]])
    assert ran.exit_code == 2, ran.output
    assert (
        f"scenario '{victim['id']}' ({victim['split']}, run 1): environment refunds's machine" in ran.stderr
    )
    assert "input.customerId" in ran.stderr
    # A split misspelt in another scenario: the file no longer loads, and one check still names all three.
    doc["scenarios"][5]["split"] = "trian"
    doc["scenarios"][7]["expected"]["outcome"] = "isued"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    every = runner.invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert every.exit_code == 1, every.output
    rows = path.read_text().splitlines()
    split = next(n for n, text in enumerate(rows, 1) if text.strip() == "split: trian")
    outcome = next(n for n, text in enumerate(rows, 1) if text.strip() == "outcome: isued")
    said = " ".join(every.stderr.split())
    assert f"{path}:{split}: scenario '{doc['scenarios'][5]['id']}': split: Input should be" in said
    assert (
        f"{path}:{outcome}: scenario '{doc['scenarios'][7]['id']}': expected.outcome 'isued' is not a final "
        "state" in said
    )
    assert f"scenario '{victim['id']}': input: refunds's machine cannot start with it" in every.stderr
    # And an id used twice, a category given no held-out scenario: said in the same check, not the next
    # (a user needed three tries for one file).
    doc["scenarios"][9]["id"] = doc["scenarios"][8]["id"]
    doc["scenarios"].append({**doc["scenarios"][0], "id": "lonely-1", "category": "lonely"})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    every = runner.invoke(app, ["scenarios", "check", "-w", str(ws)])
    said = " ".join(every.stderr.split())
    assert f"scenario id '{doc['scenarios'][8]['id']}' is used twice (first as item 9)" in said, said
    assert "category 'lonely' has no scenario in held-out" in said and "split: Input should be" in said


def test_a_fact_value_its_declared_type_does_not_allow_is_named_by_check(tmp_path: Path) -> None:
    """The triage desk declares the customer's plan an enumeration (free, pro, enterprise): a world that
    gives `enterprize` runs, and no rule over the plan could match it. `scenarios check` runs each
    scenario once with careful, in memory, and names the decision, the fact and the declared values."""
    ws = tmp_path / "triage"
    assert runner.invoke(app, ["init", str(ws), "--from", "triage"]).exit_code == 0
    path = ws / "scenarios" / "triage.yaml"
    doc = yaml.safe_load(path.read_text())
    victim, crasher = [s for s in doc["scenarios"] if s.get("world", {}).get("accounts")][:2]
    (account,) = victim["world"]["accounts"].values()
    account["plan"] = "enterprize"
    # A world the tool cannot read (seats written as a word): the account lookup raises, and `improve run`
    # would stop the whole suite there. The check names it first, with its line.
    (seated,) = crasher["world"]["accounts"].values()
    seated["seats"] = "two"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    checked = runner.invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert checked.exit_code == 1, checked.output
    said = " ".join(checked.stderr.split())
    # At the line of the field that gave the value (through the tool's output), not the scenario's first.
    plan = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "plan: enterprize" in text)
    assert (
        f"{path}:{plan}: scenario '{victim['id']}': decision 'triage': customer.plan = 'enterprize' is not "
        "one of" in said
    ), said
    assert "'enterprise'" in said
    line = next(
        n for n, text in enumerate(path.read_text().splitlines(), 1) if f"id: {crasher['id']}" in text
    )
    assert (
        f"triage.yaml:{line}: scenario '{crasher['id']}': a run with careful stops: actor 'accounts.lookup' "
        "crashed in state" in said
    ), said
    assert "ValueError" in said and "Traceback" not in checked.output
    assert re.search(r"ValueError: .*\(/.*/world\.py:\d+\)", said), said  # where the tool raised it
    # `improve run` stops on it, naming the scenario and the check that finds every one like it.
    ran = runner.invoke(app, ["run", "-w", str(ws), "--k", "1", "--scenario", crasher["id"]])
    assert ran.exit_code == 3, ran.output
    said = " ".join(ran.stderr.split())
    assert f"scenario '{crasher['id']}' (" in said and "`improve scenarios check`" in said, said
    # A run (and a round, before it learns from them) says the misspelt value before it runs, with its
    # file and line, and runs as asked.
    ran = runner.invoke(app, ["run", "-w", str(ws), "--k", "1", "--scenario", victim["id"]])
    assert ran.exit_code == 0, ran.output
    said = " ".join(ran.stderr.split())
    assert (
        f"warning: {path}:{plan}: scenario '{victim['id']}': decision 'triage': customer.plan = 'enterprize'"
        in said
    )
    assert said.index("warning:") < said.index("running 1 scenarios")


def test_a_problem_every_scenario_shares_is_said_once() -> None:
    """A machine expression that fails on any data stops every scenario's run: `scenarios check` said it
    once per scenario (56 lines); it says it once, with the first line and the count, and the others as
    they were. `--json` keeps each."""
    from improve.cli.evals import _grouped

    same = "a run with careful stops: state 'x'.on.E[0].guard: `context.a.typo` failed"
    problems = [f"s.yaml:{4 + 10 * i}: scenario 's{i}': {same}" for i in range(5)]
    problems.insert(2, "s.yaml:99: scenario 'odd': decision 'd': facts.plan = 'gold' is not one of [...]")
    problems.append("s.yaml: category 'c' has no scenario in held-out")
    grouped = _grouped(problems)
    assert grouped == [
        f"s.yaml:4: scenario 's0' and 4 more scenario(s) ('s0', 's1', 's2', ...): {same} (the same in each: "
        "look at the machine or the tool before the scenarios)",
        problems[2],
        problems[-1],
    ]
    assert _grouped(problems[:2]) == problems[:2]  # two alike are said as they are
    # The values an expression failed with differ from scenario to scenario: the same failure all the same.
    valued = [f"s.yaml:{4 + 10 * i}: scenario 's{i}': {same} with event.months = {i} (int)" for i in range(3)]
    (one,) = _grouped(valued)
    assert one.startswith("s.yaml:4: scenario 's0' and 2 more scenario(s)") and "event.months = 0" in one


def test_demo_and_lock_print_one_json_document_for_scripts(tmp_path: Path, ws: Path) -> None:
    """`--json`: what the demo did (each round's record as `improve round --json` prints it), and what
    `improve lock` recorded; the progress goes to stderr."""
    import json as _json

    demo = runner.invoke(app, ["demo", "--rounds", "1", "--k", "1", "--dir", str(tmp_path / "d"), "--json"])
    assert demo.exit_code == 0, demo.output
    doc = _json.loads(demo.stdout)
    assert (doc["environment"], doc["start_version"], doc["workspace"]) == (
        "refunds",
        "v0",
        str(tmp_path / "d"),
    )
    assert len(doc["rounds"]) == 1 and doc["rounds"][0]["round_id"] and "round 1" in demo.stderr
    assert doc["promoted"] == sum(r["status"] == "recommended" for r in doc["rounds"])
    locked = runner.invoke(app, ["lock", "-w", str(ws), "--json"])
    assert locked.exit_code == 0, locked.output
    found = _json.loads(locked.stdout)
    assert found["environment"] == "refunds" and found["files"] and Path(found["path"]).is_file()
    assert _json.loads(Path(found["path"]).read_text())["files"] == found["files"]


def test_a_policy_that_reads_a_fact_its_environment_does_not_offer_runs_with_a_warning(ws: Path) -> None:
    """A hand-edited policy file whose guard reads `facts.loyaltyYears`: `improve verify` refuses it;
    `improve run` runs it as asked, but says first why its decisions will end in policy-error; `parity
    compare` and `improve round` refuse to start from it."""
    import json as _json

    doc = _json.loads((ws / "policies" / "refunds" / "v0.json").read_text())
    doc["version"] = "9"
    doc["states"] = {
        "route": {
            "type": "choice",
            "choice": [
                {"guard": "facts.loyaltyYears > 5", "target": "escalate"},
                {"target": doc["initial"]},
            ],
        },
        "escalate": {"type": "final", "output": {"type": "'ESCALATE'"}},
        **doc["states"],
    }
    doc["initial"] = "route"
    path = ws / "hand.json"
    path.write_text(_json.dumps(doc))
    ran = runner.invoke(
        app, ["run", "-w", str(ws), "--policy", str(path), "--k", "1", "--scenario", "small-refund-01"]
    )
    assert ran.exit_code in (0, 1), ran.output
    said = " ".join(ran.stderr.split())
    assert "warning: policy" in said and "loyaltyYears" in said and "improve verify" in said, said
    # The thread says the policy failed, not that a decider gave no answer.
    (thread,) = (ws / "traces").glob("*:v9:*small-refund-01*.jsonl")
    errors = [
        e["event"]["error"]["message"]
        for e in map(_json.loads, thread.read_text().splitlines())
        if "error" in e["event"]
    ]
    assert errors and "the policy failed: state 'route'.choice[0].guard" in errors[0], errors
    assert "loyaltyYears" in errors[0] and "did not produce an event" not in errors[0]
    # `parity compare` refuses it (a usage error, with the file and line): compared, its policy-errors
    # would read as the policy's own decisions, or pass unseen where no scenario reaches the guard.
    compared = runner.invoke(
        app,
        [
            "parity",
            "compare",
            "v0",
            str(path),
            "-w",
            str(ws),
            "--model",
            "careful",
            "--scenario",
            "small-refund-01",
        ],
    )
    assert compared.exit_code == 2, compared.output
    said = " ".join(compared.stderr.split())
    assert f"NEW policy {path} cannot run as written: it fails the vocabulary gate" in said, said
    assert f"{path}:1: $.states.route.choice[0].guard: unknown fact path 'facts.loyaltyYears'" in said
    assert "Nothing was compared" in said and "OLD" not in said and "Traceback" not in compared.output
    # A round cannot start from it: every baseline run would end in policy-error and be diagnosed as the
    # agent's failures. It says so before anything runs, with the file.
    threads = sorted(p.name for p in (ws / "traces").rglob("*.jsonl"))
    rounded = runner.invoke(app, ["round", "-w", str(ws), "--policy", str(path)])
    assert rounded.exit_code == 2, rounded.output
    said = " ".join(rounded.stderr.split())
    assert f"{path}: a round cannot start from this policy" in said and "facts.loyaltyYears" in said, said
    assert f"improve verify {path}" in said and "Traceback" not in rounded.output
    assert sorted(p.name for p in (ws / "traces").rglob("*.jsonl")) == threads


def test_a_label_that_is_no_final_state_is_refused_by_every_command_that_scores(ws: Path) -> None:
    """`expected.outcome: isued` can never be reached: a run, a score or a round would count every run
    of the scenario as the agent's failure. Refused before anything runs, with the file and the line of
    the label itself."""
    path = ws / "scenarios" / "refunds.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["scenarios"][2]["expected"]["outcome"] = "isued"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if t.strip() == "outcome: isued")
    for command in (["run", "--k", "1"], ["round", "--policy", "v0", "--k", "1"]):
        refused = runner.invoke(app, [*command, "-w", str(ws)])
        assert refused.exit_code == 2, refused.output
        assert (
            f"{path}:{line}: scenario '{doc['scenarios'][2]['id']}': expected.outcome 'isued' is not a final"
            in (" ".join(refused.stderr.split()))
        )
    # Nor a sentinel, which a run must never reach: such a label could never pass (it was a warning).
    doc["scenarios"][2]["expected"]["outcome"] = "illegallyIssued"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for command in (["run", "--k", "1"], ["scenarios", "check"]):
        refused = runner.invoke(app, [*command, "-w", str(ws)])
        assert refused.exit_code != 0, refused.output
        said = " ".join(refused.output.split())
        assert "expected.outcome 'illegallyIssued' is a sentinel state of refunds" in said, said


def test_a_value_of_the_wrong_type_in_improve_toml_names_its_line(ws: Path) -> None:
    """`k = "three"` under [objective]: the error names the file, the line and the path, as a TOML
    syntax error does; a key in a dotted table header, and a table the file has, are found too."""
    toml = ws / "improve.toml"
    text = re.sub(r"(?m)^k = .*$", 'k = "three"', toml.read_text(), count=1)
    toml.write_text(text + '\n[models.smol]\nprovider = "openai"\nmodel = "m"\nconcurrency = "many"\n')
    lines = toml.read_text().splitlines()
    k = lines.index('k = "three"') + 1
    many = lines.index('concurrency = "many"') + 1
    result = runner.invoke(app, ["run", "-w", str(ws)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert f"{toml.resolve()}:{k}: $.objective.k: Input should be a valid integer" in said, said
    assert f"{toml.resolve()}:{many}: $.models.smol.concurrency:" in said, said
    assert "Traceback" not in result.output
    # A table or key misspelt: its line, and the name meant.
    toml.write_text(
        text.replace("[objective]", "[objectve]", 1) + '\n[enviroments.refunds]\nscenarios = "s.yaml"\n'
    )
    lines = toml.read_text().splitlines()
    said = " ".join(runner.invoke(app, ["run", "-w", str(ws)]).stderr.split())
    at = lines.index("[enviroments.refunds]") + 1
    assert (
        f"{toml.resolve()}:{at}: $.enviroments: Extra inputs are not permitted (did you mean 'environments'?)"
        in said
    ), said
    assert "$.objectve: Extra inputs are not permitted (did you mean 'objective'?)" in said, said
    toml.write_text(text.replace("k = ", "min_gian = 0.1\nk = ", 1))
    said = " ".join(runner.invoke(app, ["run", "-w", str(ws)]).stderr.split())
    assert "$.objective.min_gian: Extra inputs are not permitted (did you mean 'min_gain'?)" in said, said
    # TOML refuses a key or a table given twice itself; the error says where, and that it is a repeat.
    toml.write_text(text.replace("k = ", "k = 5\nk = ", 1))
    at = toml.read_text().splitlines().index('k = "three"') + 1
    refused = runner.invoke(app, ["run", "-w", str(ws)])
    said = " ".join(refused.stderr.split())
    assert refused.exit_code == 2, refused.output
    assert (
        f"{toml.resolve()}:{at}:12: invalid TOML: Cannot overwrite a value: a key or a table is given "
        "twice, and TOML takes each once: keep one, or merge them" in said
    ), said


def seal(
    ws: Path,
    ids: tuple[str, ...] = ("small-refund-05", "fraud-signal-09", "over-window-09"),
    *,
    fresh: bool = True,
) -> list[str]:
    """Label copies of a few held-out scenarios `split: test` (new ids, the same world and label); `fresh`:
    in place of the sealed scenarios already there (the desk's own)."""
    path = ws / "scenarios" / "refunds.yaml"
    doc = yaml.safe_load(path.read_text())
    by_id = {s["id"]: s for s in doc["scenarios"]}
    sealed = [{**by_id[i], "id": f"{i}-t", "split": "test"} for i in ids]
    doc["scenarios"] = [s for s in doc["scenarios"] if not (fresh and s["split"] == "test")] + sealed
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return [s["id"] for s in sealed]


@pytest.mark.slow
def test_the_test_split_is_sealed_until_unsealed_and_each_unsealing_is_recorded(
    ws: Path, clock: FrozenClock
) -> None:
    commit_workspace(ws, user="t", message="workspace")  # who unseals: git's user where the workspace is
    sealed = seal(ws)
    checked = runner.invoke(app, ["scenarios", "check", "-w", str(ws), "--json"])
    assert checked.exit_code == 0, checked.output
    counts = json.loads(checked.stdout)
    assert counts["test"] == 3 and counts["ok"] and counts["test_set"]
    assert counts["train"] + counts["held_out"] + counts["test"] == counts["scenarios"]
    text = runner.invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert "/ 3 test (sealed)" in text.stdout

    # Nothing reads the sealed split without --unseal: not `run --split all`, not a test scenario by id.
    ran = runner.invoke(app, ["run", "-w", str(ws), "--k", "1", "--json"])
    assert ran.exit_code == 0, ran.output
    assert "sealed test split (3 scenarios) is left out" in ran.stderr
    assert not any(s in {r["scenario"] for r in json.loads(ran.stdout)["threads"]} for s in sealed)
    assert not list((ws / "traces").glob("test:*")) and not list((ws / "traces").glob(f"*{sealed[0]}*"))
    for args in (
        ["run", "--split", "test"],
        ["run", "--scenario", sealed[0]],
        ["score", "-p", "v0", "--split", "test"],
    ):
        refused = runner.invoke(
            app, [*args, "-w", str(ws), "--k", "1"] if args[0] == "run" else [*args, "-w", str(ws)]
        )
        assert refused.exit_code == 2, refused.output
        assert "the test split is sealed" in refused.stderr and "--unseal" in refused.stderr
    wrong = runner.invoke(app, ["score", "-w", str(ws), "-p", "v0", "--split", "held-out", "--unseal"])
    assert wrong.exit_code == 2 and "pass --split test" in wrong.stderr
    assert not (ws / "policies" / "refunds" / "test-unsealings.jsonl").exists()

    # Unsealed: scored (its runs made here), and recorded before it is shown.
    args = ["score", "-w", str(ws), "--policy", "v0", "--split", "test", "--unseal", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    (card,) = doc["scorecards"]
    assert card["split"] == "test" and {s["scenario"] for s in card["scenarios"]} == set(sealed)
    unsealing = doc["unsealing"]
    assert unsealing["number"] == 1 and unsealing["test_set"] == counts["test_set"]
    assert unsealing["who"] == "t <improve@example.invalid>"
    assert unsealing["at"].startswith(FROZEN_AT[:14])  # stamped by the product's clock (frozen here)
    assert unsealing["scores"][0]["version"] == "v0" and len(unsealing["scores"][0]["policy_hash"]) == 16
    assert doc["sealed"] == {"test_scenarios": 3, "unsealed": True, "unsealings": 1}
    assert "recorded in" in first.stderr and "test-unsealings.jsonl" in first.stderr
    log = ws / "policies" / "refunds" / "test-unsealings.jsonl"
    (line,) = log.read_text().splitlines()
    assert json.loads(line) == unsealing

    # Each unsealing is one more line; a changed test set starts its count again.
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and json.loads(again.stdout)["unsealing"]["number"] == 2
    assert f"the first was on {FROZEN_AT[:10]}" in " ".join(again.stderr.split())
    seal(ws, ("small-refund-04",), fresh=False)
    third = json.loads(runner.invoke(app, args).stdout)["unsealing"]
    assert third["number"] == 1 and third["test_set"] != counts["test_set"] and third["test_scenarios"] == 4
    assert len(log.read_text().splitlines()) == 3
    markdown = runner.invoke(app, [*args[:-1], "--format", "markdown"])
    assert markdown.exit_code == 0, markdown.output
    assert "| test | v0 | 4 |" in markdown.stdout
    assert f"unsealing 2 of test set `{third['test_set']}` (4 scenarios) by t <" in markdown.stdout


HEAVY = ("scipy", "openai", "github", "google.protobuf", "opentelemetry", "dask", "distributed")
# `--help` lists the commands without importing any of them (improve.cli.lazy).
NOT_FOR_HELP = (*HEAVY, "duckdb", "numpy", "git", "improve.evals", "improve.warehouse", "improve.loop")


@pytest.mark.parametrize(
    ("args", "unwanted"),
    [
        # importlib.metadata only for `--version`, which reads the installed version with it.
        (["--help"], (*NOT_FOR_HELP, "importlib.metadata")),
        (["describe", "--env", "refunds"], HEAVY),
    ],
)
def test_commands_that_need_no_statistics_or_endpoints_do_not_import_them(
    args: list[str], unwanted: tuple[str, ...]
) -> None:
    """Start-up time is import time: scipy, the openai SDK, PyGithub, protobuf and dask load only in the commands that use
    them (a fresh interpreter, so nothing imported by another test counts)."""
    import subprocess

    code = (
        "import sys\n"
        "from improve.cli.main import app\n"
        f"try:\n    app({args!r})\nexcept SystemExit:\n    pass\n"
        f"print('loaded:', ','.join(m for m in {unwanted!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
    )
    assert done.stdout.splitlines()[-1] == "loaded: ", done.stdout[-500:]


def test_version_is_the_installed_distributions(monkeypatch: pytest.MonkeyPatch) -> None:
    """`improve --version` says the version pip installed (the distribution's metadata), and exits 0;
    a source tree nobody installed has none, and says so (exit 2), with no traceback."""
    import importlib.metadata

    from improve import DISTRIBUTION

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{DISTRIBUTION} {importlib.metadata.version(DISTRIBUTION)}\n"
    assert "--version" in runner.invoke(app, ["--help"]).stdout

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 2 and result.stdout == ""
    assert f"error: {DISTRIBUTION} is not installed" in result.stderr and "pip install -e ." in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


# A command's own `--help` imports its module and typer, not the layers the command runs with.
NOT_FOR_A_COMMANDS_HELP = (
    *NOT_FOR_HELP,
    "improve.machine",
    "improve.log",
    "improve.runtime",
    "improve.parity",
    "improve.llm",
    "improve.examples",
    "cel",
    "msgspec",
    "httpx2",
    "rich",  # the consoles and tables print a command's result, never its help (about 30 ms of a start)
    "pydantic",  # typer coerces an option's value through it, but no option's value is read for --help
)


def test_no_commands_help_imports_what_the_command_runs_with() -> None:
    """Every command's `--help` (and each sub-command's) in one fresh interpreter: none of them imports
    DuckDB, the evaluation package, rich or any layer below the CLI, so each costs what typer costs."""
    import subprocess

    from improve.cli.main import ImproveGroup

    helps = [[c.name, "--help"] for c in ImproveGroup.LAZY]
    helps += [["scenarios", "check", "--help"], ["tape", "replay", "--help"], ["parity", "compare", "--help"]]
    code = (
        "import sys\n"
        "from improve.cli.main import app\n"
        f"for args in {helps!r}:\n"
        "    try:\n        app(args)\n    except SystemExit:\n        pass\n"
        f"print('loaded:', ','.join(m for m in {NOT_FOR_A_COMMANDS_HELP!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
    )
    assert done.stdout.splitlines()[-1] == "loaded: ", done.stdout[-500:]


def test_the_defaults_a_commands_help_shows_are_the_librarys() -> None:
    """The defaults the CLI writes out (so that `--help` imports no library) are the library's own."""
    from improve.cli import parity, warehouse
    from improve.cli.policy import verify_command
    from improve.log import MAX_LINE_BYTES
    from improve.loop import GATE_NAMES, EnvironmentGate, ExploreGate
    from improve.parity import DEFAULT_RUN_TIMEOUT, REVIEWED_FILE

    assert warehouse.MAX_LINE_BYTES == MAX_LINE_BYTES
    assert (parity.DEFAULT_RUN_TIMEOUT, parity.REVIEWED_FILE) == (DEFAULT_RUN_TIMEOUT, REVIEWED_FILE)
    # `improve verify --help` lists the built-in gates in the order they run, and names two of them.
    doc = " ".join((verify_command.__doc__ or "").split())
    assert f"Gates: {', '.join(GATE_NAMES)};" in doc
    assert f"{EnvironmentGate.name} compares with" in doc
    assert f"; {ExploreGate.name} probes with" in doc


def test_the_command_listing_matches_every_command_it_loads_lazily() -> None:
    """`improve --help` lists each command's one line from improve.cli.main without importing the
    command; loading it must give a command whose own first line is the same (and that exists)."""
    import typer.main

    from improve.cli.main import ImproveGroup

    group = typer.main.get_command(app)
    assert isinstance(group, ImproveGroup)
    assert [c.name for c in ImproveGroup.LAZY] == list(group.commands)
    for listed in ImproveGroup.LAZY:
        loaded = group.load(listed.name)
        assert loaded.name == listed.name
        assert loaded.get_short_help_str(limit=1000) == listed.help, listed.name


def _comparable(page: str) -> list[str]:
    """The reference without what typer's versions within the pins render otherwise: the usage line and
    the metavars (`--env <str>` and `--env TEXT`, `[statement]` and `statement`)."""
    lines = []
    for line in page.splitlines():
        if line.startswith("$ improve"):
            continue
        item = re.match(r"\* `([^`]*)`(.*)", line)
        if item:
            words = item.group(1).split()
            names = [w.strip(",") for w in words if w.startswith("-")] or [words[0].strip("[]").lower()]
            line = f"* {' '.join(names)}{item.group(2)}"
        lines.append(line)
    return lines


def test_the_command_reference_is_what_the_commands_say() -> None:
    """docs/cli.md is written from the commands (`make docs`): every command, its arguments, options and
    defaults. An option added or a help changed without writing it again fails here, saying how to."""
    from improve.cli.reference import reference

    written = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert _comparable(written) == _comparable(reference()), "docs/cli.md is out of date: run `make docs`"
    for option in ("`--outcomes", "`--max-paths", ", --openai-model", "`--lake"):
        assert option in written, option


def _commands() -> list[tuple[list[str], Any]]:
    """Every command and group of `improve` (loaded), with the words that reach it; and `parity`'s own."""
    import typer.main

    from improve.cli import parity
    from improve.cli.main import ImproveGroup

    group = typer.main.get_command(app)
    found: list[tuple[list[str], Any]] = [([], group)]
    for listed in ImproveGroup.LAZY:
        command = group.load(listed.name)
        found.append(([listed.name], command))
        for name, sub in getattr(command, "commands", {}).items():
            found.append(([listed.name, name], sub))
    found.append((["parity-script"], typer.main.get_command(parity.app)))
    return found


def _lone_words(lines: list[str], verbatim: set[str]) -> list[str]:
    """Lines of one word that continue a wrapped paragraph (a heading, an option name or an example's
    line, kept as written, is not one)."""
    lone = []
    for before, line in zip(["", *lines], lines, strict=False):
        text = line.strip()
        if before.strip() and " " not in text and not text.endswith(":") and not text.startswith("-"):
            lone += [line] if text and text not in verbatim else []
    return lone


@pytest.mark.parametrize("width", [80, 100])
def test_every_help_reads_well_at_80_and_100_columns(width: int) -> None:
    """Paragraphs re-flowed with no word left alone on a line, `Example:` blocks as written, every
    bracketed text kept (`[cluster]`, `[models.NAME]`) and every option name whole."""
    import re

    from improve.cli import parity

    for words, command in _commands():
        target, args = (parity.app, ["--help"]) if words == ["parity-script"] else (app, [*words, "--help"])
        shown = runner.invoke(target, args, env={"COLUMNS": str(width)})
        assert shown.exit_code == 0, (words, shown.output)
        text, lines = shown.output, shown.output.splitlines()
        where = " ".join(words) or "improve"
        assert "…" not in text and "╭" not in text, where
        assert all(len(line) <= width for line in lines), (where, [x for x in lines if len(x) > width])
        flat = " ".join(text.split())
        sources = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        examples = {
            line.strip()
            for source in sources
            for block in re.findall(r"Example:\n\n((?:[ \t]+\S.*\n?)+)", inspect.cleandoc(source))
            for line in block.splitlines()
        }
        for example in examples:  # as written, on a line of its own
            assert any(line.strip() == example for line in lines), (where, example)
        assert _lone_words(lines, examples) == [], (where, width)
        for source in sources:
            for bracketed in re.findall(r"\[[^\]\s][^\]]*\]", source):
                assert " ".join(bracketed.split()) in flat, (where, bracketed)
        for param in command.params:
            for name in [*param.opts, *param.secondary_opts]:
                if name.startswith("-"):
                    assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), (where, name)


def test_verify_says_a_policy_does_not_parse_before_running_any_probe(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe runs (v0 on the training scenarios) came first: a tool crashing there hid the file's
    own error, which is the one to fix."""
    import improve.loop

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no probe is needed to see that the file does not parse")

    monkeypatch.setattr(improve.loop, "probe_requests", crash)
    bad = tmp_path / "v9.json"
    bad.write_text('{"id": "refunds-policy",, "version": "9"}')
    result = runner.invoke(app, ["verify", str(bad), "-w", str(ws)])
    assert result.exit_code == 1, result.output
    assert f"FAIL validate: {bad}:1:" in result.stdout and "invalid JSON" in result.stdout


def test_verify_names_the_policy_file_line_of_each_problem(ws: Path) -> None:
    """A vocabulary or compile problem was said at a JSON path (or a state and transition) alone, where a
    machine file's problems are said at their line too."""
    doc = json.loads((ws / "policies" / "refunds" / "v0.json").read_text())
    doc["version"] = "8"
    text = json.dumps(doc, indent=2)
    final = next(name for name, st in doc["states"].items() if isinstance(st.get("output"), dict))
    event = doc["states"][final]["output"]["type"]
    path = ws / "policies" / "refunds" / "v8.json"
    path.write_text(text.replace(event, event[:-1] + "X'", 1))
    line = next(n for n, row in enumerate(path.read_text().splitlines(), 1) if event[:-1] + "X'" in row)
    result = runner.invoke(app, ["verify", "v8", "-w", str(ws)])
    assert result.exit_code == 1, result.output
    assert f"- {path}:{line}: $.states.{final}.output.type: unknown event" in result.stdout, result.stdout
    # A target no state has: the compiler names the state and its transition, said at the file's line.
    path.write_text(text.replace('"target": "', '"target": "nowhere-', 1))
    line = next(n for n, row in enumerate(path.read_text().splitlines(), 1) if "nowhere-" in row)
    result = runner.invoke(app, ["verify", "v8", "-w", str(ws)])
    assert result.exit_code == 1, result.output
    said = next(row for row in result.stdout.splitlines() if row.startswith("FAIL lower: "))
    assert said.startswith(f"FAIL lower: {path}:") and "target 'nowhere-" in said, said
    assert int(said.split(f"{path}:")[1].split(":")[0]) in (line - 1, line), (said, line)


def test_scenario_passes_averages_as_a_scorecard_does(ws: Path) -> None:
    """Averaged over `outcomes` rows, a split's pass rate weighs scenarios run more often more (a round
    runs changed scenarios again); `scenario_passes` is per scenario, so its mean is the scorecard's."""
    run = ["run", "-w", str(ws), "--split", "held-out", "--model", "naive"]
    assert runner.invoke(app, [*run, "--k", "1"]).exit_code == 0
    assert runner.invoke(app, [*run, "--k", "3", "--scenario", "fraud-signal-04"]).exit_code == 0
    score = runner.invoke(app, ["score", "-w", str(ws), "-p", "v0", "-s", "held-out", "--json"])
    (card,) = json.loads(score.stdout)["scorecards"]
    query = (
        "SELECT avg(pass_fraction) AS per_scenario, (SELECT avg(passed::INTEGER) FROM outcomes WHERE "
        "split = 'held-out') AS per_row FROM scenario_passes WHERE split = 'held-out' AND model = 'naive'"
    )
    result = runner.invoke(app, ["sql", "-w", str(ws), query, "--format", "json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["per_scenario"] == pytest.approx(card["pass_rate"]) and row["per_row"] != row["per_scenario"]


def test_outside_a_workspace_which_environment_says_so_not_where_to_edit_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said to set [workspace] environment in <dir>/improve.toml, a file that did not exist.
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["parity", "compare", "v0", "v1"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "which environment? pass --env NAME" in said and "run it in a workspace (no improve.toml" in said
    assert f"in {tmp_path}/improve.toml" not in said
