"""docs/extending.md's worked examples, run as written: its proposer, gate and importer registered in
a workspace that `improve init` wrote, then used by name through the CLI; its deployed agent serving a
ticket, whose thread the warehouse then reads as production."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import git
import pytest
from typer.testing import CliRunner

from improve.cli.main import app
from improve.loop.gates import GATE_NAMES

runner = CliRunner()
DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.slow
def test_the_documented_proposer_gate_and_importer_work_as_written(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert runner.invoke(app, ["init", str(ws), "--env", "doc-desk"]).exit_code == 0
    modules = {}
    for code in blocks("python"):
        first = code.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            modules[first[2:]] = code
    assert sorted(modules) == ["desk_gates.py", "my_importers.py", "my_proposers.py", "serve.py"]
    for name, code in modules.items():
        (ws / name).write_text(code)
    registrations = [b for b in blocks("toml") if re.match(r"\[(proposers|gates|importers)\.", b)]
    assert len(registrations) == 3
    with (ws / "improve.toml").open("a") as config:
        config.write("\n" + "\n".join(registrations))

    verified = runner.invoke(app, ["verify", "v0", "-w", str(ws), "--json"])
    assert verified.exit_code == 0, verified.output
    gates = [g["name"] for g in json.loads(verified.stdout)["gates"]]
    assert gates == [*GATE_NAMES, "no-blind-credits"]

    repo = git.Repo.init(ws, initial_branch="main")
    repo.git.add(A=True)
    repo.git.commit(m="workspace", author="Dana <dana@example.invalid>")
    env = {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    args = ["round", "-w", str(ws), "--policy", "v0", "--k", "1", "--proposer", "repeat-claims", "--json"]
    rounds = runner.invoke(app, args, env=env)
    assert rounds.exit_code in (0, 1), rounds.output
    (outcome,) = json.loads(rounds.stdout)["rounds"]
    assert outcome["proposer"] == "repeat-claims" and outcome["candidate_version"] == "v1"
    # The eight, the workspace's own, then the check on generated cases `improve init` turns on.
    assert [(g["name"], g["ok"]) for g in outcome["gates"]] == [
        (name, True) for name in (*GATE_NAMES, "no-blind-credits", "out-of-sample")
    ]
    # The repeat claimants it escalates are fixed on both splits.
    assert outcome["scores"]["train"]["after"] > outcome["scores"]["train"]["before"]

    logs = ws / "logs"
    logs.mkdir()
    (logs / "s1.jsonl").write_text(
        '{"kind": "user", "timestamp": "2026-11-30T10:00:00Z", "text": "hi"}\n'
        '{"kind": "assistant", "timestamp": "2026-11-30T10:00:01Z", "text": "hello"}\n'
        '{"kind": "tool"}\n'
    )
    ingested = runner.invoke(
        app, ["ingest", "-w", str(ws), "--format", "chatlog", str(logs), "--allow-rejects"]
    )
    assert ingested.exit_code == 0, ingested.output
    query = "SELECT event_type FROM entries WHERE thread_id = 'chatlog:s1' ORDER BY \"index\""
    rows = runner.invoke(app, ["sql", "-w", str(ws), query, "--format", "json"])
    assert rows.exit_code == 0, rows.output
    assert [r["event_type"] for r in json.loads(rows.stdout)] == ["chatlog.user", "chatlog.assistant"]

    served = subprocess.run(
        [sys.executable, "serve.py"], cwd=ws, capture_output=True, text=True, timeout=120, check=False
    )
    assert served.returncode == 0 and served.stdout.strip() == "credited", served.stderr
    production = ws / "traces" / "production"
    assert runner.invoke(app, ["ingest", "-w", str(ws), str(production)]).exit_code == 0
    found = runner.invoke(app, ["diagnose", "-w", str(ws), "--source", "production", "--json"])
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["threads"] == 1
