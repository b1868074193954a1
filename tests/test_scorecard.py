"""Scorecards checked by hand, the paired statistics, and a simulation of the promotion rule."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from improve.errors import ConfigError
from improve.evals.outcome import OutcomeRow
from improve.evals.promotion import decide
from improve.evals.scorecards import compare, scorecard
from improve.evals.workspace import ObjectiveSection


def row(
    scenario: str,
    version: str,
    passed: bool,
    split: str = "held-out",
    run: int = 1,
    calls: int = 1,
    violations: int = 0,
    state: str = "issued",
) -> OutcomeRow:
    return OutcomeRow(
        thread_id=f"{split}:{version}:{scenario}:r{run}",
        scenario=scenario,
        category=scenario.split("-")[0],
        split=split,
        policy_version=version,
        run=run,
        status="done",
        final_state=state,
        output=None,
        expected_outcome="issued",
        passed=passed,
        reason="ok" if passed else "wrong",
        violations=[{"rule": "x"}] * violations,
        model_calls=calls,
        input_tokens=100 * calls,
        output_tokens=10 * calls,
    )


def rows(version: str, table: dict[str, list[bool]], **kw: object) -> list[OutcomeRow]:
    return [row(s, version, p, run=i + 1, **kw) for s, passes in table.items() for i, p in enumerate(passes)]  # type: ignore[arg-type]


BASE = {
    "a-1": [True, True, True],
    "b-1": [True, False, False],
    "c-1": [False, False, False],
    "d-1": [True, True, False],
}
CAND = {
    "a-1": [True, True, True],
    "b-1": [True, True, True],
    "c-1": [True, False, True],
    "d-1": [False, False, False],
}


def test_scorecard_numbers_by_hand() -> None:
    card = scorecard(rows("v0", BASE, calls=2) + rows("v1", CAND), "v0", "held-out")
    assert [s.scenario for s in card.scenarios] == ["a-1", "b-1", "c-1", "d-1"]
    assert [s.pass_fraction for s in card.scenarios] == [1.0, 1 / 3, 0.0, 2 / 3]
    assert card.pass_rate == pytest.approx((1 + 1 / 3 + 0 + 2 / 3) / 4)  # 0.5
    assert (card.k, card.runs, card.model_calls, card.tokens) == (3, 12, 24, 12 * 220)
    assert card.cost("model_calls") == 2.0
    assert scorecard(rows("v0", BASE), "v0", "train").scenarios == []


def test_paired_comparison_by_hand() -> None:
    base = scorecard(rows("v0", BASE), "v0", "held-out")
    cand = scorecard(rows("v1", CAND), "v1", "held-out")
    result = compare(base, cand, seed=7, resamples=2000)
    diffs = np.array([0.0, 2 / 3, 2 / 3, -2 / 3])
    assert result.mean_diff == pytest.approx(diffs.mean())
    assert (result.wins, result.ties, result.losses) == (2, 1, 1)
    assert result.sign_p == pytest.approx(stats.binomtest(2, 3, 0.5).pvalue)
    assert result.wilcoxon_p == pytest.approx(
        stats.wilcoxon(diffs, zero_method="zsplit", method="asymptotic").pvalue
    )
    assert [c.scenario for c in result.changed] == ["b-1", "c-1", "d-1"]
    assert result.regressions == []  # d-1 did not pass all k runs before
    assert result.ci_low <= result.mean_diff <= result.ci_high
    again = compare(base, cand, seed=7, resamples=2000)
    assert (again.ci_low, again.ci_high) == (result.ci_low, result.ci_high)  # the seed reproduces it


def test_regression_means_a_scenario_that_passed_all_k_now_drops() -> None:
    base = scorecard(rows("v0", {"a-1": [True] * 3, "b-1": [True] * 3}), "v0", "held-out")
    cand = scorecard(rows("v1", {"a-1": [True, True, False], "b-1": [True] * 3}), "v1", "held-out")
    assert [c.scenario for c in compare(base, cand).regressions] == ["a-1"]
    assert compare(base, cand, tolerance=0.34).regressions == []


def test_unpaired_scenarios_are_refused() -> None:
    base = scorecard(rows("v0", {"a-1": [True]}), "v0", "held-out")
    cand = scorecard(rows("v1", {"b-1": [True]}), "v1", "held-out")
    with pytest.raises(ConfigError, match=r"scenarios \['a-1', 'b-1'\] are scored on one side only"):
        compare(base, cand)


def _cards(version: str, probs: np.ndarray, k: int, rng: np.random.Generator, split: str, calls: int = 1):  # type: ignore[no-untyped-def]
    table = {f"s-{i}": list(rng.random(k) < p) for i, p in enumerate(probs)}
    return scorecard(rows(version, table, split=split, calls=calls), version, split)


def pass_probabilities(n: int, rng: np.random.Generator, noisy: float) -> np.ndarray:  # type: ignore[type-arg]
    """Like the refund desk under stand-in models: most scenarios always pass or always fail, a share
    `noisy` pass sometimes (a Beta(2, 2) probability)."""
    p = np.where(rng.random(n) < 0.7, 1.0, 0.0)
    noisy_ones = rng.random(n) < noisy
    p[noisy_ones] = rng.beta(2, 2, size=int(noisy_ones.sum()))
    return p


def simulate(
    trials: int, n: int, k: int, fixed: float, seed: int, noisy: float = 0.2, tolerance: float = 0.0
) -> float:
    """How often the rule promotes: a candidate that makes each always-failing scenario pass with
    probability `fixed` (0 for a candidate that behaves identically)."""
    rng = np.random.default_rng(seed)
    objective = ObjectiveSection(bootstrap_resamples=1000, tolerance=tolerance)
    promoted = 0
    for _ in range(trials):
        p = pass_probabilities(n, rng, noisy)
        q = p.copy()
        q[p == 0.0] = fixed
        base = [_cards("v0", p, k, rng, s) for s in ("train", "held-out")]
        cand = [_cards("v1", q, k, rng, s) for s in ("train", "held-out")]
        promoted += decide(base[0], base[1], cand[0], cand[1], objective).promote
    return promoted / trials


def test_identical_versions_are_promoted_at_most_about_5_percent() -> None:
    for noisy in (0.2, 0.6):
        rate = simulate(trials=300, n=11, k=3, fixed=0.0, seed=1, noisy=noisy)
        print(
            f"false promotion rate (n=11 held-out scenarios, k=3, {noisy:.0%} noisy, 300 trials): {rate:.3f}"
        )
        assert rate <= 0.06


def test_a_realistic_gain_is_found() -> None:
    # The no-regression check is strict: a noisy scenario that happened to pass all k baseline runs and
    # drops once blocks the promotion. A tolerance of one run in three buys the power back.
    strict = simulate(trials=200, n=11, k=3, fixed=0.9, seed=2)
    tolerant = simulate(trials=200, n=11, k=3, fixed=0.9, seed=2, tolerance=0.34)
    print(
        f"power when a candidate fixes the failing scenarios (pass 0 -> 0.9), n=11, k=3: "
        f"{strict:.3f} at tolerance 0, {tolerant:.3f} at tolerance 0.34"
    )
    assert strict >= 0.25 and tolerant > strict


def test_decision_checks_each_condition() -> None:
    objective = ObjectiveSection(bootstrap_resamples=500)
    good = {f"s-{i}": [True] * 3 for i in range(8)}
    bad = {f"s-{i}": [False] * 3 for i in range(8)}
    base = [scorecard(rows("v0", bad, split=s), "v0", s) for s in ("train", "held-out")]
    cand = [scorecard(rows("v1", good, split=s), "v1", s) for s in ("train", "held-out")]
    verdict = decide(base[0], base[1], cand[0], cand[1], objective)
    assert verdict.promote and [c.ok for c in verdict.checks] == [True, True, True, True]
    violating = [scorecard(rows("v1", good, split=s, violations=1), "v1", s) for s in ("train", "held-out")]
    assert not decide(base[0], base[1], violating[0], violating[1], objective).checks[0].ok
    costly = [scorecard(rows("v1", good, split=s, calls=2), "v1", s) for s in ("train", "held-out")]
    cost = decide(base[0], base[1], costly[0], costly[1], objective).checks[3]
    assert not cost.ok and "2.00 model calls per run against 1.00 (budget 1.5x = 1.50)" in cost.detail
    same = decide(base[0], base[1], base[0], base[1], objective)
    assert not same.promote and not same.checks[1].ok


# --- improve score / improve scenarios check from the CLI -------------------------------------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from typer.testing import CliRunner  # noqa: E402

from improve.cli.main import app  # noqa: E402
from tests.conftest import copy_workspace  # noqa: E402

V1 = {
    "id": "refunds-policy",
    "version": "1",
    "description": "escalate repeat refunders",
    "initial": "route",
    "states": {
        "route": {
            "type": "choice",
            "choice": [
                {"guard": "facts.customer.refundsLast90d >= 3", "target": "escalate"},
                {"target": "ask_model"},
            ],
        },
        "ask_model": {
            "invoke": {
                "src": "model.decide",
                "input": {"model": "'decider'"},
                "onDone": "answer",
                "onError": "escalate",
            }
        },
        "answer": {"type": "final", "output": "event.output"},
        "escalate": {"type": "final", "output": {"type": "'ESCALATE'"}},
    },
}


def workspace_copy(tmp_path: Path) -> Path:
    copy_workspace(tmp_path)
    (tmp_path / "policies" / "refunds" / "v1.json").write_text(json.dumps(V1))
    return tmp_path


def test_score_cli_compares_versions_and_renders_markdown(tmp_path: Path) -> None:
    ws = workspace_copy(tmp_path)
    runner = CliRunner()
    missing = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1"])
    assert missing.exit_code == 2 and "improve run --env refunds --policy v1" in missing.stderr
    for version in ("v0", "v1"):
        assert runner.invoke(app, ["run", "-w", str(ws), "--policy", version, "--k", "2"]).exit_code == 0
    result = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1", "--vs", "v0", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    held = next(c for c in doc["comparisons"] if c["split"] == "held-out")
    fraud = sorted(c["scenario"] for c in held["changed"])
    assert fraud and all(s.startswith("fraud-signal") for s in fraud)
    assert held["wins"] == len(fraud) and held["losses"] == 0 and held["seed"] == doc["seed"]
    cards = {(c["policy_version"], c["split"]): c for c in doc["scorecards"]}
    assert cards[("v1", "held-out")]["pass_rate"] > cards[("v0", "held-out")]["pass_rate"]
    md = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1", "--vs", "v0", "--format", "markdown"])
    assert "## Scorecard: v1 vs v0" in md.stdout and "```mermaid" in md.stdout and "| held-out |" in md.stdout
    assert "class route changed" in md.stdout or "route" in md.stdout.split("```mermaid")[1]


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda t: t.replace("outcome: escalated", "outcome: escalatedd", 1),
            "is not a final state of refunds",
        ),
        (lambda t: t.replace("split: held-out", "split: train"), "has no scenario in held-out"),
        (lambda t: t.replace("id: small-refund-02", "id: small-refund-01", 1), "is used twice"),
    ],
)
def test_scenarios_check_finds_problems(tmp_path: Path, edit: object, needle: str) -> None:
    ws = workspace_copy(tmp_path)
    path = ws / "scenarios" / "refunds.yaml"
    path.write_text(edit(path.read_text()))  # type: ignore[operator]
    result = CliRunner().invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert result.exit_code in (1, 2) and needle in result.stderr
    assert CliRunner().invoke(app, ["scenarios", "check"]).exit_code == 0
