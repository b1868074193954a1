"""Rule evals: every guarded state covered, every eval passing, and an eval that fails when its rule is
loosened (or the eval checks nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from improve.cli.main import app
from improve.machine import compile_machine
from improve.machine.config import TransitionConfig
from improve.machine.rules import guarded_states, run_rule_evals, uncovered
from improve.runtime import load_environment


@pytest.mark.parametrize("name", ["refunds", "refund-approval", "triage"])
def test_rule_evals_pass_and_cover_every_guarded_state(name: str) -> None:
    env = load_environment(name)
    results = run_rule_evals(env.machine, env.rule_evals)
    assert results and all(r.ok for r in results), [r.detail for r in results if not r.ok]
    assert uncovered(env.machine, results) == []
    assert len(guarded_states(env.machine)) >= 2


def test_a_loosened_window_rule_fails_its_eval() -> None:
    env = load_environment("refunds")
    config = env.config.model_copy(deep=True)
    refund = config.states["choosingResolution"].on["REFUND"]
    assert isinstance(refund, TransitionConfig)
    refund.guard = "event.amount > 0 && event.amount <= context.order.refundable"
    machine = compile_machine(config, guards=env.guards, actors=set(env.actors))
    failed = [r for r in run_rule_evals(machine, env.rule_evals) if not r.ok]
    assert [r.name for r in failed] == ["no refund more than 30 days after delivery"]
    assert "was accepted in 'choosingResolution'; the rules must refuse it" in failed[0].detail


def test_rules_cli() -> None:
    result = CliRunner().invoke(app, ["rules", "--env", "refunds", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["uncovered"] == [] and all(r["ok"] for r in doc["results"])
    assert {"choosingResolution", "checkingApproval"} <= {s for r in doc["results"] for s in r["covers"]}


def test_an_eval_naming_no_state_says_so_and_where_it_is_written(tmp_path: Path) -> None:
    # `state="awaitingSupervisr"` only failed as "ended in 'awaitingSupervisor', expected ...", with no
    # word that no such state exists nor where the eval is written.
    ws = tmp_path / "evals-agent"
    assert CliRunner().invoke(app, ["init", str(ws), "--env", "evalname-desk"]).exit_code == 0
    rules = ws / "evalname_desk" / "rules.py"
    text = rules.read_text()
    assert '("resolving", "checkingCredit"),' in text
    rules.write_text(text.replace('("resolving", "checkingCredit"),', '("resolving", "checkingCredt"),', 1))
    line = next(
        n
        for n, row in enumerate(rules.read_text().splitlines(), 1)
        if "a credit within the fee is paid" in row
    )
    result = CliRunner().invoke(app, ["rules", "-w", str(ws)])
    said = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert (
        "FAIL a credit within the fee is paid (covers resolving, checkingCredt): names state 'checkingCredt', "
        f"which is no state of the machine (did you mean 'checkingCredit'?) ({rules}:{line})"
    ) in said, said
