"""`parity compare` end to end: the real CLI over a scratch copy of the example workspace."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from improve.cli.main import app as improve_app
from improve.cli.parity import app
from improve.evals.scenarios import Scenario, load_scenarios
from improve.parity import ParityRun, diff_runs, label_difference, same_or_safer
from improve.runtime import load_environment
from tests.helpers import REPO

runner = CliRunner()
V0 = json.loads((REPO / "policies" / "refunds" / "v0.json").read_text())
REFUNDS = load_environment("refunds")


@pytest.fixture(autouse=True)
def _not_in_github_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    # When this suite itself runs in GitHub Actions, only the test that asks for it may annotate.
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def write_policy(ws: Path, name: str, doc: dict[str, Any]) -> str:
    # A policy file holds the version it is named for (a v3.json saying "2" is refused).
    doc = {**doc, "version": name.removeprefix("v")}
    (ws / "policies" / "refunds" / f"{name}.json").write_text(json.dumps(doc, indent=2))
    return name


def guarded_v1() -> dict[str, Any]:
    """v0, but the model's answer is checked before it is handed over: a refund the rules forbid (past
    the 30-day window, or more than is left to refund) goes to a person instead of to the guards."""
    doc = copy.deepcopy(V0)
    doc["version"] = "1"
    offered = "(event.output.amount == facts.requested || event.output.amount == facts.order.refundable)"
    forbidden = "(facts.order.deliveredDaysAgo > 30 || event.output.amount > facts.order.refundable)"
    doc["states"]["ask_model"]["invoke"]["onDone"] = [
        {"guard": f"event.output.type == 'REFUND' && {offered} && {forbidden}", "target": "escalate"},
        {"target": "answer"},
    ]
    return doc


def pays_the_rest_v2(amount: str = "facts.order.refundable") -> dict[str, Any]:
    """Closes tickets past the window and pays what is left itself (or `amount`), without asking the model."""
    doc = copy.deepcopy(V0)
    doc["version"] = "2"
    doc["initial"] = "route"
    doc["states"]["route"] = {
        "type": "choice",
        "choice": [
            {"guard": "facts.customer.refundsLast90d >= 3", "target": "ask_model"},
            {"guard": "facts.order.deliveredDaysAgo > 30", "target": "close"},
            {"guard": "facts.requested > facts.order.refundable", "target": "pay_rest"},
            {"target": "ask_model"},
        ],
    }
    doc["states"]["close"] = {"type": "final", "output": {"type": "'CLOSE'"}}
    doc["states"]["pay_rest"] = {
        "type": "final",
        "output": {"type": "'REFUND'", "amount": amount},
    }
    return doc


def always(event: str, version: str) -> dict[str, Any]:
    doc = copy.deepcopy(V0)
    doc["version"] = version
    doc["initial"] = "decided"
    doc["states"]["decided"] = {"type": "final", "output": {"type": f"'{event}'"}}
    return doc


def compare(ws: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, ["compare", *args, "-w", str(ws)], env=env)


def compare_json(ws: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = compare(ws, *args, "--json")
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def rows(doc: dict[str, Any], model: str | None = None, label: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in doc["rows"]
        if (model is None or r["model"] == model) and (label is None or r["label"] == label)
    ]


# --- labels -----------------------------------------------------------------------------------------


def scenario_count(ws: Path, split: str | None = None) -> int:
    """The scenarios parity compares: the split's, or train and held-out (never the sealed test split)."""
    scenarios = load_scenarios(ws / "scenarios" / "refunds.yaml").scenarios
    return len([s for s in scenarios if s.split == split or (split is None and s.split != "test")])


@pytest.mark.slow
def test_v0_against_itself_is_all_same(ws: Path) -> None:
    code, doc = compare_json(ws, "v0", "v0")
    assert code == 0
    assert doc["models"] == ["careful", "sloppy"]
    n = scenario_count(ws)
    assert doc["summary"] == {
        "careful": {"same": n, "intended": 0, "regression": 0},
        "sloppy": {"same": n, "intended": 0, "regression": 0},
    }
    # The sloppy model does break rules under v0; identical runs are still `same`.
    assert any(r["old"]["rule_breaks"] > 0 for r in rows(doc, "sloppy"))
    table = compare(ws, "v0", "v0", "--split", "held-out")
    assert table.exit_code == 0
    assert f"careful: {scenario_count(ws, 'held-out')} same, 0 intended, 0 regression" in table.stdout
    assert "no unreviewed regression" in table.stdout


@pytest.mark.slow
def test_improve_parity_compare_is_the_parity_console_script(ws: Path) -> None:
    # `improve parity compare` is the same command as the `parity compare` console script CI uses.
    held_out = ("v0", "v0", "--split", "held-out", "-w", str(ws))
    table = runner.invoke(improve_app, ["parity", "compare", *held_out])
    assert table.exit_code == 0, table.output
    assert f"careful: {scenario_count(ws, 'held-out')} same, 0 intended, 0 regression" in table.stdout
    assert "no unreviewed regression" in table.stdout
    assert table.stdout == compare(ws, "v0", "v0", "--split", "held-out").stdout
    as_json = runner.invoke(improve_app, ["parity", "compare", *held_out, "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == json.loads(
        compare(ws, "v0", "v0", "--split", "held-out", "--json").stdout
    )


@pytest.mark.slow
def test_blocking_the_sloppy_models_rule_breaks_is_intended(ws: Path) -> None:
    write_policy(ws, "v1", guarded_v1())
    code, doc = compare_json(ws, "v0", "v1")
    assert code == 0, [r for r in doc["rows"] if r["label"] == "regression"]
    assert doc["summary"]["careful"] == {"same": scenario_count(ws), "intended": 0, "regression": 0}
    intended = rows(doc, "sloppy", "intended")
    assert len(intended) >= 2 and "over-window-02" in {r["scenario"] for r in intended}
    order = REFUNDS.safety_order
    for row in intended:
        assert row["old"]["rule_breaks"] > row["new"]["rule_breaks"] == 0
        old, new = row["difference"]["outcome"]["old"], row["difference"]["outcome"]["new"]
        assert new == "escalated" and order[new] >= order[old]
        assert row["reason"].startswith("blocks rule breaks the baseline made")
    assert rows(doc, "sloppy", "same") and not rows(doc, label="regression")


def run(state: str, refusals: int = 0, violations: int = 0, effects: int = 0) -> ParityRun:
    return ParityRun(
        final_state=state,
        effects=[{"kind": "closure", "reason": f"r{i}"} for i in range(effects)],
        violations=[{"rule": "outside-window", "orderId": "O-1", "amount": 40}] * violations,
        guard_refusals=refusals,
    )


@pytest.mark.parametrize(
    ("old", "new", "label", "why"),
    [
        (run("closed", 1, effects=1), run("closed", 1, effects=1), "same", "as before"),
        (run("closed", 2), run("closed", 0), "intended", "same outcome"),
        (run("issued", 1), run("escalated", 0, effects=1), "intended", "safer outcome issued -> escalated"),
        (run("issued", 0, violations=1), run("failed"), "intended", "safer outcome"),
        (run("closed", 0), run("escalated"), "regression", "the baseline broke no rule"),
        (run("closed", 1), run("closed", 1, effects=1), "regression", "rule breaks not reduced (1 -> 1)"),
        (run("escalated", 2), run("closed", 0), "regression", "escalated -> closed is not the same or safer"),
        (run("issued", 2), run("issued", 0, violations=1), "regression", "new violation(s): outside-window"),
        (run("closed", 1), run("awaitingOrderId"), "regression", "is not the same or safer"),
        # Blocking a rule break by raising is no decision: the onError's outcome is not NEW's choice.
        (
            run("issued", 1),
            dataclasses.replace(run("escalated"), policy_error="the policy failed at decision 'd': boom"),
            "regression",
            "NEW's policy raised instead of deciding, so the run went on by the decision's onError: "
            "the policy failed at decision 'd': boom",
        ),
    ],
)
def test_label_rules(old: ParityRun, new: ParityRun, label: str, why: str) -> None:
    got, reason = label_difference(REFUNDS, old, new, diff_runs(REFUNDS, old, new))
    assert got == label
    assert why in reason


def test_without_a_safety_order_no_changed_outcome_is_safer() -> None:
    unranked = dataclasses.replace(REFUNDS, safety_order={})
    states = sorted(unranked.machine.states)
    for old_state, new_state in itertools.product(states, states):
        assert same_or_safer(unranked, old_state, new_state) == (old_state == new_state)
    # What the refund desk's order calls a safer outcome is a regression once the order is gone.
    old, new = run("issued", 1), run("escalated", 0, effects=1)
    assert label_difference(REFUNDS, old, new, diff_runs(REFUNDS, old, new))[0] == "intended"
    label, reason = label_difference(unranked, old, new, diff_runs(unranked, old, new))
    assert label == "regression"
    assert "issued -> escalated is not the same or safer (no order for this environment)" in reason
    # Blocking a rule break with the outcome unchanged needs no order.
    old, new = run("closed", 2), run("closed", 0)
    assert label_difference(unranked, old, new, diff_runs(unranked, old, new)) == (
        "intended",
        "blocks rule breaks the baseline made (2 -> 0), same outcome",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("event", "changed"), [("ESCALATE", "small-refund-01"), ("CLOSE", "fraud-signal-01")]
)
def test_a_policy_that_changes_outcomes_is_a_regression(ws: Path, event: str, changed: str) -> None:
    write_policy(ws, "v9", always(event, "9"))
    result = compare(ws, "v0", "v9", "--model", "careful")
    assert result.exit_code == 1, result.output
    line = next(line for line in result.stdout.splitlines() if changed in line)
    assert "regression" in line
    assert "regression(s)" in result.stdout.splitlines()[-1]
    code, doc = compare_json(ws, "v0", "v9", "--model", "careful")
    assert code == 1 and doc["regressions"] > 0 and not doc["passed"]
    row = next(r for r in doc["rows"] if r["scenario"] == changed)
    assert row["label"] == "regression"
    assert "the baseline broke no rule" in row["reason"]
    # First what a reviewer needs: careful's run was as labelled, and NEW's is not.
    assert row["reason"].startswith(f"it leaves the label: {changed} expects '"), row["reason"]
    assert row["review_entry"]["scenario"] == changed and row["review_entry"]["model"] == "careful"


def test_a_difference_the_labels_ask_for_is_intended_whatever_the_rule_breaks(ws: Path) -> None:
    """v2 pays what is left where the sloppy model closed the ticket: the baseline broke no rule, so by
    the rule-break rules alone this is a regression; the labels ask for exactly this run, so it is
    intended (the change a round makes). Paying five short is what no label asks for: a regression."""
    write_policy(ws, "v2", pays_the_rest_v2())
    args = ("--model", "sloppy", "--scenario", "partial-refund-01")
    code, doc = compare_json(ws, "v0", "v2", *args)
    assert code == 0, doc["rows"]
    (row,) = doc["rows"]
    assert (row["label"], row["outcome"]) == ("intended", "closed -> issued")
    assert row["reason"] == "the labels ask for it: partial-refund-01 expects 'issued' (closed -> issued)"
    write_policy(ws, "v3", pays_the_rest_v2("facts.order.refundable - 5.0"))
    code, doc = compare_json(ws, "v0", "v3", *args)
    assert code == 1 and doc["rows"][0]["label"] == "regression"
    assert "the baseline broke no rule" in doc["rows"][0]["reason"]


# --- the reviewed-differences file --------------------------------------------------------------------


def test_reviewed_differences_accept_exactly_what_was_reviewed(ws: Path) -> None:
    # Five short of what is left: not what the labels ask for (that would be intended without review).
    write_policy(ws, "v2", pays_the_rest_v2("facts.order.refundable - 5.0"))
    args = (
        "v0",
        "v2",
        "--model",
        "sloppy",
        "--scenario",
        "partial-refund-01",
        "--scenario",
        "over-window-02",
    )
    code, doc = compare_json(ws, *args)
    assert code == 1
    [regression] = rows(doc, label="regression")
    assert regression["scenario"] == "partial-refund-01" and regression["outcome"] == "closed -> escalated"
    assert [r["scenario"] for r in rows(doc, label="intended")] == ["over-window-02"]

    entry = {
        "scenario": "partial-refund-01",
        "model": "sloppy",
        "outcome": "closed -> escalated",
        "effects": {
            "added": [{"kind": "escalation", "reason": "decision-exhausted"}],
            "removed": [{"kind": "closure", "reason": "agent-closed"}],
        },
        "accepted_by": "dana",
        "why": "v2's short payment is refused and the ticket goes to a person; the sloppy model used to close it",
    }
    # The ready-to-paste entry in the JSON says the same as the one written by hand.
    pasted = regression["review_entry"]
    assert (pasted["outcome"], pasted["effects"]["removed"]) == (
        entry["outcome"],
        entry["effects"]["removed"],
    )
    (ws / "parity-reviewed.yaml").write_text(yaml.safe_dump({"differences": [entry]}))
    code, doc = compare_json(ws, *args)
    assert code == 0
    accepted = next(r for r in doc["rows"] if r["scenario"] == "partial-refund-01")
    assert accepted["label"] == "intended" and accepted["reviewed_by"] == "dana"
    assert doc["reviewed"]["file"].endswith("parity-reviewed.yaml")

    # Reviewed another reason for the escalation: no longer exactly the reviewed difference.
    stale = copy.deepcopy(entry)
    stale["effects"]["added"][0]["reason"] = "angry-customer"
    (ws / "parity-reviewed.yaml").write_text(yaml.safe_dump({"differences": [stale]}))
    result = compare(ws, *args)
    assert result.exit_code == 1, result.output
    code, doc = compare_json(ws, *args)
    row = next(r for r in doc["rows"] if r["scenario"] == "partial-refund-01")
    assert row["label"] == "regression"
    assert "no longer matches" in row["reason"] and "effects added differ" in row["reason"]

    # A reviewed difference that disappeared is stale too: the file must be cleaned up.
    gone = {**entry, "scenario": "small-refund-01"}
    other = ws / "reviewed-elsewhere.yaml"
    other.write_text(yaml.safe_dump({"differences": [gone]}))
    code, doc = compare_json(
        ws, "v0", "v2", "--model", "sloppy", "--scenario", "small-refund-01", "--reviewed", str(other)
    )
    assert code == 1
    assert "the row is now the same" in doc["rows"][0]["reason"]


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"scenario": "small-refund-01", "model": "sloppy", "outcome": "closed -> issued"}, "accepted_by"),
        (
            {
                "scenario": "small-refund-01",
                "model": "sloppy",
                "outcome": "closed => issued",
                "accepted_by": "d",
            },
            "outcome",
        ),
        (
            {"scenario": "no-such", "model": "sloppy", "outcome": "closed -> issued", "accepted_by": "d"},
            "scenario",
        ),
        (
            {
                "scenario": "small-refund-01",
                "model": "gpt",
                "outcome": "closed -> issued",
                "accepted_by": "d",
            },
            "model",
        ),
        (
            {
                "scenario": "small-refund-01",
                "model": "sloppy",
                "outcome": "closed -> paid",
                "accepted_by": "d",
            },
            "outcome",
        ),
    ],
)
def test_a_bad_reviewed_file_is_a_usage_error_naming_file_entry_and_field(
    ws: Path, entry: dict[str, Any], field: str
) -> None:
    good = {
        "scenario": "small-refund-02",
        "model": "careful",
        "outcome": "issued -> issued",
        "accepted_by": "d",
    }
    (ws / "parity-reviewed.yaml").write_text(yaml.safe_dump({"differences": [good, entry]}))
    result = compare(ws, "v0", "v0", "--scenario", "small-refund-01")
    assert result.exit_code == 2, result.output
    assert "parity-reviewed.yaml:" in result.stderr
    assert f"differences[1]: {field}:" in result.stderr
    assert "differences[0]" not in result.stderr


def test_unknown_policy_and_bad_runner_are_usage_errors(ws: Path) -> None:
    result = compare(ws, "v0", "v7")
    assert result.exit_code == 2
    assert "policy 'v7' not found" in result.stderr
    result = compare(ws, "no.such.module:run", "v0")
    assert result.exit_code == 2
    assert "bad runner spec 'no.such.module:run'" in result.stderr
    result = compare(ws, "v0", "v0", "--model", "brilliant")
    assert result.exit_code == 2 and "brilliant" in result.stderr
    assert "without --model" not in result.stderr


def test_a_default_model_the_environment_lacks_says_it_was_the_default(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A desk written without a `sloppy` stand-in: the user named no model, so the message says where the
    # one it lacks came from and how to choose.
    import improve.parity

    monkeypatch.setattr(improve.parity, "DEFAULT_MODELS", ("careful", "clumsy"))
    result = compare(ws, "v0", "v0")
    assert result.exit_code == 2, result.output
    assert "without --model, parity compare runs careful and clumsy" in result.stderr
    assert "has no model 'clumsy'" in result.stderr and "--model careful" in result.stderr


def test_a_policy_nested_ten_thousand_deep_is_refused_with_the_limit(ws: Path) -> None:
    deep = ws / "deep.json"
    deep.write_text("[" * 10_000 + "]" * 10_000)
    result = compare(ws, "v0", str(deep))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert f"{deep}: $: nested deeper than 200 levels" in " ".join(result.stderr.split())


def routed(guard: str, answer: str = "'ESCALATE'") -> dict[str, Any]:
    """v0 behind a choice: `guard` answers `answer`, anything else goes to the model."""
    doc = copy.deepcopy(V0)
    doc["initial"] = "route"
    doc["states"]["route"] = {
        "type": "choice",
        "choice": [{"guard": guard, "target": "decided"}, {"target": "ask_model"}],
    }
    doc["states"]["decided"] = {"type": "final", "output": {"type": answer}}
    return doc


@pytest.mark.parametrize(
    ("policy", "gate", "problem"),
    [
        # An unknown fact in a branch no scenario takes: every run is the same, and parity used to pass it.
        (
            routed("(facts.requested > 99999.0 && facts.customer.refundz == 1) || facts.requested > 99999.0"),
            "vocabulary",
            "$.states.route.choice[0].guard: unknown fact path 'facts.customer.refundz'",
        ),
        (routed("true", "'REFUNDX'"), "vocabulary", "$.states.decided.output.type: unknown event 'REFUNDX'"),
        (
            routed("facts.customer.refundsLast90d <= 'one'"),
            "lower",
            "$.states.route: type error for decision 'chooseResolution'",
        ),
        (routed("getenv('HOME') == '/root'"), "lower", "Undefined variable or function: 'getenv'"),
        (routed("facts.requested >"), "lower", "the policy does not compile"),
        ({**V0, "initial": 7}, "validate", "the policy is not a valid machine document"),
    ],
    ids=["latent-unknown-fact", "unknown-event", "type-error", "unknown-function", "cel-syntax", "schema"],
)
def test_a_policy_improve_verify_refuses_before_it_runs_is_refused_naming_the_gate_and_line(
    ws: Path, policy: dict[str, Any], gate: str, problem: str
) -> None:
    """What `improve verify` refuses without running anything (validate, vocabulary, lower) is refused
    here too (exit 2, nothing run), with its file and line: run, a decision reaching it ends in
    policy-error, read as regressions that are not the policy's decisions, or as no difference at all."""
    path = ws / "broken.json"
    path.write_text(json.dumps({**policy, "version": "9"}, indent=2))
    for old, new, which in (("v0", str(path), "NEW"), (str(path), "v0", "OLD")):
        result = compare(ws, old, new, "--model", "careful")
        assert result.exit_code == 2, result.output
        said = result.stderr
        assert (
            f"{which} policy {path} cannot run as written: it fails the {gate} gate of `improve verify`"
            in said
        )
        assert problem in said, said
        assert "Nothing was compared" in said and f"improve verify {path}" in said
        assert "harness:" not in said and "Traceback" not in result.output
    if gate != "validate":
        # At the line of the file where the problem is written (the validate gate says its own place).
        assert re.search(rf"{re.escape(str(path))}:\d+: ", said), said


def test_a_guard_that_raises_on_a_runs_facts_is_said_as_raised_not_as_a_behaviour_change(ws: Path) -> None:
    """A guard that passes the gates that run nothing but divides by a fact that is 0 on some tickets:
    where it raises, the machine goes on by the decision's onError (escalated). The row and the summary
    say the policy raised, where and why, not "the baseline broke no rule"."""
    guard = "facts.customer.accountAgeDays / facts.customer.refundsLast90d > 100000"
    write_policy(ws, "v9", routed(guard))
    args = (
        "v0",
        "v9",
        "--model",
        "careful",
        "--scenario",
        "small-refund-01",
        "--scenario",
        "small-refund-02",
    )
    code, doc = compare_json(ws, *args)
    assert code == 1 and doc["policy_errors"] == {"old": 0, "new": 1}, doc["rows"]
    raised = next(r for r in doc["rows"] if r["scenario"] == "small-refund-01")
    assert raised["label"] == "regression" and raised["outcome"] == "issued -> escalated"
    assert raised["reason"].startswith("NEW's policy raised instead of deciding"), raised["reason"]
    assert f"state 'route'.choice[0].guard: `{guard}` failed" in raised["reason"]
    assert "division by zero" in raised["reason"] and "the baseline broke no rule" not in raised["reason"]
    assert raised["new"]["policy_error"] and raised["old"]["policy_error"] is None
    # Where the fact is not 0 the guard answers as written: no error, the row as before.
    other = next(r for r in doc["rows"] if r["scenario"] == "small-refund-02")
    assert other["new"]["policy_error"] is None and "raised" not in other["reason"]
    table = compare(ws, *args)
    assert table.exit_code == 1
    said = " ".join(table.stdout.split())
    assert "NEW's policy (v9) raised instead of deciding in 1 of 2 runs" in said, said
    assert "first small-refund-01 (careful): the policy failed at decision 'chooseResolution'" in said


# --- the harness check ------------------------------------------------------------------------------

_calls = itertools.count()


def flaky_runner(env_name: str, scenario: Scenario, model: str) -> ParityRun:
    """A runner that is not deterministic: a different outcome on every call."""
    return ParityRun(final_state=("closed", "escalated")[next(_calls) % 2])


def broken_runner(env_name: str, scenario: Scenario, model: str) -> ParityRun:
    raise KeyError("orderId")


def test_the_harness_check_refuses_a_nondeterministic_runner(ws: Path) -> None:
    result = compare(ws, "tests.test_parity:flaky_runner", "v0", "--scenario", "small-refund-01")
    assert result.exit_code == 3, result.output
    assert "the harness is not deterministic: OLD (runner tests.test_parity:flaky_runner)" in result.stderr
    assert "small-refund-01" in result.stderr
    assert result.stdout == ""
    # Never "the harness is deterministic" first and "error: ... not deterministic" after it.
    assert "the harness is deterministic" not in result.stderr
    crashed = compare(ws, "v0", "tests.test_parity:broken_runner", "--scenario", "small-refund-01")
    assert crashed.exit_code == 3
    assert "could not complete scenario small-refund-01" in crashed.stderr


def test_a_nondeterministic_new_side_is_nondeterminism_not_regressions(ws: Path) -> None:
    result = compare(ws, "v0", "tests.test_parity:flaky_runner", "--scenario", "small-refund-01", "--json")
    assert result.exit_code == 3, result.output
    assert "the harness is not deterministic: NEW (runner tests.test_parity:flaky_runner)" in result.stderr
    assert "OLD (" not in result.stderr  # v0 agrees with itself
    assert "regression" not in result.stdout + result.stderr and result.stdout == ""
    assert "Traceback" not in result.output


def exiting_runner(env_name: str, scenario: Scenario, model: str) -> ParityRun:
    raise SystemExit(0)


def interrupting_runner(env_name: str, scenario: Scenario, model: str) -> ParityRun:
    raise KeyboardInterrupt


def hanging_runner(env_name: str, scenario: Scenario, model: str) -> ParityRun:
    time.sleep(120)
    return ParityRun(final_state="closed")


def dying_runner(env_name: str, scenario: Scenario, model: str) -> ParityRun:
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("runner_name", "message"),
    [
        ("exiting_runner", "raised SystemExit(0) instead of returning a ParityRun"),
        ("interrupting_runner", "raised KeyboardInterrupt() instead of returning a ParityRun"),
        ("hanging_runner", "did not finish within 3 s"),
        ("dying_runner", "the runner's worker process ended (exit code 0) before returning a result"),
    ],
)
@pytest.mark.parametrize("side", ["OLD", "NEW"])
def test_a_runner_that_exits_hangs_or_dies_stops_parity_with_exit_3(
    ws: Path, runner_name: str, message: str, side: str
) -> None:
    spec = f"tests.test_parity:{runner_name}"
    old, new = (spec, "v0") if side == "OLD" else ("v0", spec)
    # Three seconds: the hanging runner never ends within them, and v0's one run on the other side ends
    # well inside them on a busy machine. That the message says so shows the limit, not the run, ended it.
    result = compare(ws, old, new, "--scenario", "small-refund-01", "--timeout", "3")
    assert result.exit_code == 3, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    said = " ".join(result.stderr.split())
    assert f"error: runner {spec} on scenario small-refund-01 with model careful" in said
    assert message in said
    assert "the harness is deterministic" not in said


def test_an_empty_comparison_is_an_error_not_a_pass(ws: Path) -> None:
    path = ws / "scenarios" / "refunds.yaml"
    path.write_text(path.read_text().replace("split: held-out", "split: train"))
    # Every held-out scenario is in train now: --split held-out selects nothing.
    result = compare(ws, "v0", "v0", "--split", "held-out")
    assert result.exit_code == 3, result.output
    assert "nothing to compare: no scenario selected" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.output


def test_the_timeout_must_be_positive(ws: Path) -> None:
    result = compare(ws, "v0", "v0", "--timeout", "0")
    assert (
        result.exit_code == 2
        and "--timeout 0: a run's time limit must be more than 0 seconds" in result.stderr
    )


# --- GitHub Actions -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_github_actions_gets_a_step_summary_and_at_most_ten_annotations(ws: Path, tmp_path: Path) -> None:
    write_policy(ws, "v9", always("ESCALATE", "9"))
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    gha = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    result = compare(ws, "v0", "v9", env=gha)
    assert result.exit_code == 1
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 10
    assert all(line.startswith("::error title=parity regression::") for line in errors)
    assert "small-refund-01 (careful): issued -> escalated" in result.stdout
    text = summary.read_text()
    assert text.startswith("earlier step\n")
    assert "| model | same | intended | regression |" in text
    assert "| careful | small-refund-01 | issued -> escalated |" in text

    # With --json, stdout is exactly one JSON document; the annotations go to stderr.
    as_json = compare(ws, "v0", "v9", "--json", env=gha)
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)
    assert doc["regressions"] > 10
    counts = doc["summary"]["careful"]
    assert counts["regression"] > 0
    assert f"| careful | {counts['same']} | {counts['intended']} | {counts['regression']} |" in text
    assert "::error" not in as_json.stdout
    assert sum(line.startswith("::error") for line in as_json.stderr.splitlines()) == 10

    # No regression: no annotation at all.
    clean = compare(ws, "v0", "v0", "--scenario", "small-refund-01", env=gha)
    assert clean.exit_code == 0 and "::error" not in clean.stdout


# --- the legacy loop ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_legacy_loop_behaves_like_the_machine_with_v0(ws: Path) -> None:
    models = ("--model", "careful", "--model", "sloppy", "--model", "naive")
    code, doc = compare_json(ws, "improve.examples.refunds.legacy:run", "v0", *models)
    assert code == 0
    assert doc["old"]["kind"] == "runner" and doc["new"]["kind"] == "policy"
    assert all(r["label"] == "same" for r in doc["rows"]), [r for r in doc["rows"] if r["label"] != "same"]
    # Not vacuous: the loop refuses the sloppy model's rule breaks exactly where the guards do.
    breaking = [r for r in rows(doc, "sloppy") if r["old"]["guard_refusals"]]
    assert len(breaking) >= 2
    assert all(r["old"]["guard_refusals"] == r["new"]["guard_refusals"] for r in doc["rows"])
    assert all(r["old"]["effects"] == r["new"]["effects"] for r in doc["rows"])
