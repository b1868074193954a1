"""The gates: each one passes the good and fails the bad with a detail a proposer can act on; fuzzed
garbage never crashes them."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from improve.cli.main import app
from improve.errors import WorkspaceError
from improve.evals.scenarios import load_scenarios
from improve.evals.workspace import Workspace
from improve.loop.gates import (
    BUILTIN_GATES,
    GATE_NAMES,
    GateContext,
    GateResult,
    Unparsed,
    gates_for,
    passed,
    run_gates,
    scenario_literals,
)
from improve.loop.probes import probe_requests
from improve.machine import MAX_DEPTH, check_depth, parse_machine
from improve.runtime import load_environment
from tests.helpers import REPO, copy_workspace, examples

ENV = load_environment("refunds")
SCENARIOS = load_scenarios(REPO / "scenarios" / "refunds.yaml").scenarios
PROBES = probe_requests(ENV, SCENARIOS)
V0 = json.loads((REPO / "policies" / "refunds" / "v0.json").read_text())


def context(**changes: Any) -> GateContext:
    base = {"env": ENV, "expected_hashes": ENV.file_hashes(), "probes": PROBES, "scenarios": SCENARIOS}
    base.update(changes)
    return GateContext(**base)


def v1(route: list[dict[str, Any]], **states: Any) -> dict[str, Any]:
    """v0 with a choice state in front of the model."""
    doc = copy.deepcopy(V0)
    doc["version"] = "1"
    doc["initial"] = "route"
    doc["states"]["route"] = {"type": "choice", "choice": [*route, {"target": "ask_model"}]}
    doc["states"].update(states)
    return doc


def failing(doc: Any, ctx: GateContext | None = None) -> tuple[str, str]:
    results = run_gates(doc, ctx or context())
    assert not results[-1].ok, [r.to_json() for r in results]
    assert all(r.ok for r in results[:-1])
    return results[-1].name, results[-1].detail


def test_probe_requests_come_from_training_scenarios_only() -> None:
    assert len(PROBES) >= 10
    held_out = {json.dumps(s.input["amount"]) for s in SCENARIOS if s.split == "held-out"}
    train = {json.dumps(s.input["amount"]) for s in SCENARIOS if s.split == "train"}
    requested = {json.dumps(p.facts["requested"]) for p in PROBES}
    assert requested <= train
    assert requested.isdisjoint(held_out - train)


def test_v0_and_a_sensible_v1_pass_every_gate() -> None:
    for doc in (V0, v1([{"guard": "facts.customer.refundsLast90d >= 3", "target": "escalate"}])):
        results = run_gates(doc, context())
        assert passed(results), [r.to_json() for r in results]
        assert [r.name for r in results] == list(GATE_NAMES)
        assert "probe request(s)" in results[5].detail


def test_environment_changed_is_discarded_not_repaired() -> None:
    hashes = dict(ENV.file_hashes())
    hashes["machine.json"] = "0" * 64
    name, detail = failing(V0, context(expected_hashes=hashes))
    assert name == "environment-unchanged"
    assert "machine.json (recorded 000000000000" in detail and "discarded (not repaired)" in detail


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ([1, 2], "expected a JSON object"),
        ({**V0, "initial": None}, "$.initial: Input should be a valid string"),
        ({**V0, "states": {"a": {"type": "weird"}}}, "$.states.a.type"),
        (Unparsed("p.json:3:7: invalid JSON: Expecting ','"), "p.json:3:7: invalid JSON"),
    ],
)
def test_validate_names_the_json_path(doc: Any, needle: str) -> None:
    name, detail = failing(doc)
    assert name == "validate" and needle in detail


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (
            v1([{"guard": "facts.customer.vip", "target": "escalate"}]),
            "$.states.route.choice[0].guard: unknown fact path 'facts.customer.vip'; facts are",
        ),
        (
            v1([{"guard": "input.priority > 1", "target": "escalate"}]),
            "unknown request field 'input.priority'",
        ),
        (
            v1([], escalate={"type": "final", "output": {"type": "'REFUND_ALL'"}}),
            "$.states.escalate.output.type: unknown event 'REFUND_ALL'; the decisions allow ['CLOSE', 'ESCALATE', 'REFUND']",
        ),
        (v1([{"guard": {"type": "isVip"}, "target": "escalate"}]), "unknown named guard 'isVip'"),
        (
            v1([], ask_model={"invoke": {"src": "web.search", "onDone": "answer", "onError": "escalate"}}),
            "unknown actor 'web.search'; a policy may invoke ['model.decide', 'judge.sentiment']",
        ),
        (
            v1(
                [],
                ask_model={
                    "invoke": {
                        "src": "model.decide",
                        "input": {"model": "'gpt-9'"},
                        "onDone": "answer",
                        "onError": "escalate",
                    }
                },
            ),
            "unknown model ref \"'gpt-9'\"",
        ),
    ],
)
def test_vocabulary_names_the_unknown_name_and_the_valid_ones(doc: Any, needle: str) -> None:
    name, detail = failing(doc)
    assert name == "vocabulary" and needle in detail


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (v1([{"guard": "facts.requested >", "target": "escalate"}]), "CEL syntax error at column"),
        (v1([{"guard": "facts.requested > 1", "target": "nowhere"}]), "target 'nowhere' does not exist"),
        (
            v1([{"guard": "facts.ticket > 3", "target": "escalate"}]),
            "type error for decision 'chooseResolution'",
        ),
        (v1([{"guard": "facts.order.deliveredDaysAgo + 0.5 > 30.0", "target": "escalate"}]), "type error"),
        (v1([{"guard": "facts.requested", "target": "escalate"}]), "expected a bool"),
        # An operand of `&&` is checked alone: the whole is false on the probe request wherever another
        # operand is, error or not, and these passed the gate (caught, if at all, where explore reached them).
        (
            v1(
                [
                    {
                        "guard": "facts.customer.refundsLast90d <= 'one' && facts.requested > 1e9",
                        "target": "escalate",
                    }
                ]
            ),
            "`facts.customer.refundsLast90d <= 'one'` failed",
        ),
        (
            v1(
                [
                    {
                        "guard": "facts.requested > 1e9 && (true || !(getenv('HOME') == 'x'))",
                        "target": "escalate",
                    }
                ]
            ),
            "Undefined variable or function: 'getenv'",
        ),
    ],
)
def test_lower_compiles_and_type_checks(doc: Any, needle: str) -> None:
    name, detail = failing(doc)
    assert name == "lower" and needle in detail


def test_lint_errors_fail_the_gate() -> None:
    doc = v1([])
    del doc["states"]["ask_model"]["invoke"]["onError"]
    name, detail = failing(doc)
    assert name == "lint" and "invoke-without-on-error at $.states.ask_model" in detail


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (
            v1(
                [{"guard": "facts.requested > 0", "target": "refund_all"}],
                refund_all={
                    "type": "final",
                    "output": {"type": "'REFUND'", "amount": "facts.requested * 2.0"},
                },
            ),
            'can end in state \'refund_all\' answering {"type": "REFUND", "amount": ',
        ),
        (
            v1(
                [{"guard": "facts.order.deliveredDaysAgo > 30", "target": "refund"}],
                refund={"type": "final", "output": {"type": "'REFUND'"}},
            ),
            'can end in state \'refund\' answering {"type": "REFUND"}, which is not one of the offered options',
        ),
    ],
)
def test_explore_catches_outputs_that_are_not_offered(doc: Any, needle: str) -> None:
    """The failure names the final state and what it answers (a user could not tell which state of the
    policy was wrong), and the fix for an answer, not an invoke's onError, where no invoke failed."""
    name, detail = failing(doc)
    assert name == "explore" and needle in detail and "facts" in detail, detail
    assert "Every final's output must be one of the offered options" in detail and "onError" not in detail


def test_explore_accepts_a_computed_offered_payload() -> None:
    doc = v1(
        [
            {
                "guard": "facts.requested > facts.order.refundable && facts.order.deliveredDaysAgo <= 30",
                "target": "partial",
            }
        ],
        partial={"type": "final", "output": {"type": "'REFUND'", "amount": "facts.order.refundable"}},
    )
    assert passed(run_gates(doc, context()))


def test_overfit_refuses_scenario_literals() -> None:
    unique = scenario_literals(SCENARIOS)
    amount = next(a for a in unique.amounts if a == round(a, 2) and a > 5)
    ticket = SCENARIOS[0].input["ticket"]
    cases = [
        (
            v1([{"guard": f"facts.requested == {amount:g}", "target": "escalate"}]),
            f"appears only in scenario {unique.amounts[amount]}",
        ),
        (
            v1([{"guard": f"facts.ticket == '{ticket[:20]}'", "target": "escalate"}]),
            f"text from scenario {SCENARIOS[0].id}",
        ),
        (
            v1([{"guard": f"input.name == '{SCENARIOS[0].id}'", "target": "escalate"}]),
            "is an identifier from scenario",
        ),
    ]
    for doc, needle in cases:
        name, detail = failing(doc)
        assert name == "overfit" and needle in detail
    # Thresholds shared by many scenarios are rules, not literals.
    assert passed(
        run_gates(v1([{"guard": "facts.order.deliveredDaysAgo > 30", "target": "escalate"}]), context())
    )


# --- fuzz ------------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
names = st.sampled_from(
    [
        "type",
        "guard",
        "target",
        "output",
        "invoke",
        "src",
        "choice",
        "states",
        "initial",
        "facts.requested > 1",
        "'ESCALATE'",
        "event.output",
        "context.x",
        "a" * 600,
        "[1].map(x, x)",
        "facts.nope",
        "{{{",
        "model.decide",
        "ask_model",
        "answer",
    ]
)


@st.composite
def mutated_v0(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(V0)
    for _ in range(draw(st.integers(1, 4))):
        state = draw(st.sampled_from(list(doc["states"]) or ["x"]))
        target = doc["states"].setdefault(state, {})
        if not isinstance(target, dict):
            continue
        target[draw(names)] = draw(st.one_of(names, json_values))
    if draw(st.booleans()):
        doc[draw(names)] = draw(json_values)
    return doc


FUZZ_CASES = {"count": 0}


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, mutated_v0(), st.builds(lambda d: {"states": {"s": d}}, json_values)))
def test_fuzzed_documents_never_crash_a_gate(doc: Any) -> None:
    FUZZ_CASES["count"] += 1
    results = run_gates(doc, context())
    assert results and all(r.detail for r in results)
    assert passed(results) or not results[-1].ok
    for r in results:
        assert "could not check this document" not in r.detail, r.detail


# --- the CLI ---------------------------------------------------------------------------------------------


def test_verify_cli_exit_codes_and_json(tmp_path: Path) -> None:
    copy_workspace(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", "v0", "-w", str(tmp_path), "--json"])
    assert ok.exit_code == 0, ok.output
    gates = json.loads(ok.stdout)["gates"]
    assert [g["name"] for g in gates] == list(GATE_NAMES)
    # Without a lock the environment is not checked, and verify says so, with how to lock it.
    assert gates[0]["detail"].startswith("not checked: no lock") and "`improve lock`" in gates[0]["detail"]
    (tmp_path / "policies" / "refunds" / "v9.json").write_text('{"id": "x",\n "version": }')
    bad = runner.invoke(app, ["verify", "v9", "-w", str(tmp_path)])
    assert bad.exit_code == 1 and "v9.json:2:13: invalid JSON" in bad.stdout
    # A trailing comma is found by the decoder at the brace after it, a line later: named where it is.
    (tmp_path / "policies" / "refunds" / "v9.json").write_text('{"id": "x",\n "version": "9",\n}')
    bad = runner.invoke(app, ["verify", "v9", "-w", str(tmp_path)])
    assert bad.exit_code == 1, bad.output
    assert (
        "v9.json:2:16: invalid JSON: a trailing comma before the '}' on line 3 (JSON allows none)"
        in bad.stdout
    )
    # A key given twice is the validate gate's failure too, at the repeat: JSON kept the last silently.
    (tmp_path / "policies" / "refunds" / "v9.json").write_text('{"id": "x",\n "version": "9",\n "id": "y"}')
    bad = runner.invoke(app, ["verify", "v9", "-w", str(tmp_path)])
    assert bad.exit_code == 1, bad.output
    assert "v9.json:3: $.id: the key 'id' is given twice in one object (first on line 1)" in bad.stdout
    # A recorded lock makes the first gate bite when the environment changes.
    assert runner.invoke(app, ["lock", "-w", str(tmp_path)]).exit_code == 0
    lock = tmp_path / "policies" / "refunds" / "environment.lock.json"
    data = json.loads(lock.read_text())
    data["files"]["machine.json"] = "f" * 64
    lock.write_text(json.dumps(data))
    changed = runner.invoke(app, ["verify", "v0", "-w", str(tmp_path)])
    assert changed.exit_code == 1 and "FAIL environment-unchanged" in changed.stdout
    # It says where the hashes were recorded and how to record a meant change; no round is involved.
    said = " ".join(changed.stdout.split())
    assert f"changed since it was locked in {lock}: machine.json" in said and "`improve lock`" in said, said
    assert "round" not in said and "discarded" not in said


# --- extension gates -------------------------------------------------------------------------------------

MYGATES = """
from improve.loop.gates import GateContext, GateResult


class HasGoal:
    name = "has-goal"

    def run(self, ctx: GateContext) -> GateResult:
        return GateResult(self.name, bool(ctx.policy.description), "ok")


class NoEscalate:
    name = "no-escalate"

    def run(self, ctx: GateContext) -> GateResult:
        escalating = [
            name for name, state in ctx.policy.states.items() if state.output == {"type": "'ESCALATE'"}
        ]
        if escalating:
            return GateResult(
                self.name, False, f"final state(s) {escalating} answer ESCALATE; this desk never escalates"
            )
        return GateResult(self.name, True, "ok")


def misnamed() -> NoEscalate:
    return NoEscalate()
"""


@pytest.fixture
def gate_workspace(tmp_path: Path) -> Any:
    """The example workspace with two gates of its own, in `mygates.py` next to improve.toml."""
    copy_workspace(tmp_path)
    (tmp_path / "mygates.py").write_text(MYGATES)
    with (tmp_path / "improve.toml").open("a") as toml:
        toml.write('\n[gates.no-escalate]\nmodule = "mygates:NoEscalate"\n')
        toml.write('\n[gates.has-goal]\nmodule = "mygates:HasGoal"\n')
    yield tmp_path
    sys.modules.pop("mygates", None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_workspace_gates_run_after_the_built_in_ones_in_name_order(gate_workspace: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["verify", "v0", "-w", str(gate_workspace), "--json"])
    assert result.exit_code == 1, result.output
    gates = json.loads(result.stdout)["gates"]
    assert [g["name"] for g in gates] == [*GATE_NAMES, "has-goal", "no-escalate"]
    assert all(g["ok"] for g in gates[:-1])
    assert gates[-1] == {
        "name": "no-escalate",
        "ok": False,
        "detail": "final state(s) ['escalate'] answer ESCALATE; this desk never escalates",
    }
    # A candidate stopped early lists the workspace's gates among those not run.
    (gate_workspace / "policies" / "refunds" / "v9.json").write_text("[]")
    early = runner.invoke(app, ["verify", "v9", "-w", str(gate_workspace)])
    assert early.exit_code == 1
    assert (
        "not run: vocabulary, lower, lint, explore, overfit, interactions, has-goal, no-escalate"
        in early.stdout
    )


def test_a_gate_must_be_registered_under_its_own_name(gate_workspace: Path) -> None:
    toml = gate_workspace / "improve.toml"
    toml.write_text(toml.read_text().replace("mygates:HasGoal", "mygates:misnamed"))
    with pytest.raises(
        WorkspaceError, match=r"gate 'has-goal' .* calls itself 'no-escalate'; set its `name`"
    ):
        gates_for(Workspace.find(gate_workspace))


def test_a_gate_that_crashes_or_returns_garbage_fails_the_candidate() -> None:
    class Crashes:
        name = "crashes"

        def run(self, ctx: GateContext) -> GateResult:
            raise KeyError("facts")

    class Garbage:
        name = "garbage"

        def run(self, ctx: GateContext) -> Any:
            return "fine"

    for gate, needle in (
        (Crashes(), "could not check this document (KeyError"),
        (Garbage(), "returned 'fine'"),
    ):
        results = run_gates(V0, context(gates=[*BUILTIN_GATES, gate]))
        assert [r.ok for r in results] == [True] * len(BUILTIN_GATES) + [False]
        assert results[-1].name == gate.name and needle in results[-1].detail


def test_an_output_that_cannot_be_evaluated_on_some_path_fails_the_explore_gate() -> None:
    """Found by the fuzzer: the model call's onError leads to a final whose output reads event.output,
    which an error event does not have. The gate says so instead of crashing."""
    doc = json.loads((REPO / "policies" / "refunds" / "v0.json").read_text())
    doc["states"]["escalate"]["output"] = "event.output"
    results = run_gates(doc, context())
    assert results[-1].name == "explore" and not results[-1].ok
    assert "fails on some path" in results[-1].detail and "no such key 'output'" in results[-1].detail


def test_overfit_accepts_a_threshold_with_scenarios_on_both_sides() -> None:
    # The boundary case of a real threshold is labelled once: its amount is in one scenario, yet the
    # training scenarios fall on both sides of it, so the threshold is a rule.
    unique = scenario_literals(SCENARIOS)
    requested = sorted(float(s.input["amount"]) for s in SCENARIOS if s.split == "train")
    middle = next(a for a in unique.amounts if a in requested[3:-3])
    doc = v1([{"guard": f"facts.requested > {middle:g}", "target": "escalate"}])
    results = run_gates(doc, context())
    overfit = next(r for r in results if r.name == "overfit")
    assert overfit.ok and "supported from both sides" in overfit.detail and f"{middle:g}" in overfit.detail
    # The same amount as an equality singles its scenario out: it holds in one scenario only.
    name, detail = failing(v1([{"guard": f"facts.requested == {middle:g}", "target": "escalate"}]))
    assert name == "overfit" and "holds in 1 training scenario(s)" in detail


def test_overfit_refuses_a_word_only_one_scenario_says() -> None:
    def word_in(count: int) -> str:
        texts = [s.input["ticket"].lower() for s in SCENARIOS]
        for word in sorted({w for t in texts for w in re.findall(r"[a-z]{5,11}", t)}):
            if sum(bool(re.search(rf"\b{word}\b", t)) for t in texts) == count:
                return word
        raise AssertionError(f"no word in exactly {count} scenarios")

    lonely, shared = word_in(1), word_in(3)
    pattern = "facts.ticket.matches('(?i)\\\\b{}\\\\b')"
    name, detail = failing(v1([{"guard": pattern.format(lonely), "target": "escalate"}]))
    assert name == "overfit" and "is text from scenario" in detail and lonely in detail
    assert passed(run_gates(v1([{"guard": pattern.format(shared), "target": "escalate"}]), context()))


REFUND_OUT = {"type": "'REFUND'", "amount": "facts.order.refundable"}
OLD_ORDERS = "facts.order.deliveredDaysAgo > 30 && {'type': 'CLOSE'} in input.options"


def decision(scenario: str, days: int, refunds: int) -> dict[str, Any]:
    facts = {
        "ticket": "please refund",
        "requested": 20,
        "order": {"total": 20, "refunded": 0, "refundable": 20, "deliveredDaysAgo": days},
        "customer": {"refundsLast90d": refunds, "accountAgeDays": 400},
    }
    options = [{"type": "REFUND", "amount": 20}, {"type": "CLOSE"}, {"type": "ESCALATE"}]
    return {"scenario": scenario, "name": "chooseResolution", "facts": facts, "options": options}


# Old orders and frequent refunders are each in the training data, never together.
DECISIONS = [decision("a", 10, 0), decision("b", 45, 0), decision("c", 12, 4), decision("d", 50, 0)]


def test_interactions_refuse_a_new_branch_that_overrides_another_where_no_case_shows_both() -> None:
    close = {"type": "final", "output": {"type": "'CLOSE'"}}
    baseline = v1([{"guard": OLD_ORDERS, "target": "close"}], close=close)
    new = {"guard": "facts.customer.refundsLast90d >= 3 && " + offered_refund(), "target": "refund"}
    doc = v1(
        [new, {"guard": OLD_ORDERS, "target": "close"}],
        close=close,
        refund={"type": "final", "output": REFUND_OUT},
    )
    ctx = context(baseline=parse_machine(baseline), decisions=DECISIONS)
    name, detail = failing(doc, ctx)
    assert name == "interactions"
    assert "branch 0" in detail and "branch 1" in detail and "facts.order.deliveredDaysAgo = 31" in detail
    assert "Place the new branch after branch 1" in detail
    # After the old branch, it changes nothing the old one answers.
    after = v1(
        [{"guard": OLD_ORDERS, "target": "close"}, new],
        close=close,
        refund={"type": "final", "output": REFUND_OUT},
    )
    assert passed(run_gates(after, context(baseline=parse_machine(baseline), decisions=DECISIONS)))
    # A training decision that combines both conditions covers the case.
    covered = [*DECISIONS, decision("e", 40, 5)]
    assert passed(run_gates(doc, context(baseline=parse_machine(baseline), decisions=covered)))
    # An answer the environment ranks safer (escalated above closed) settles it.
    safer = {"guard": "facts.customer.refundsLast90d >= 3", "target": "escalate"}
    first = v1([safer, {"guard": OLD_ORDERS, "target": "close"}], close=close)
    assert passed(run_gates(first, context(baseline=parse_machine(baseline), decisions=DECISIONS)))


def test_interactions_move_a_fact_across_a_comparison_with_a_margin() -> None:
    """A comparison of two facts of one unit is crossed where its margin puts the edge (13 days before
    the supply runs out), not where the other fact's value is."""
    from improve.loop.gates.interactions import variants

    facts = {"rx": {"since": 20, "supply": 30}, "paid": 10.0}
    assert variants("facts.rx.since <= facts.rx.supply - 13", facts, {}) == [
        [("rx.since", 16)],
        [("rx.since", 17)],
        [("rx.since", 18)],
    ]
    assert variants("facts.paid >= double(facts.rx.supply) + 12.5", facts, {}) == [
        [("paid", 42.49)],
        [("paid", 42.5)],
        [("paid", 42.51)],
    ]
    assert variants("facts.rx.since < facts.rx.supply", facts, {}) == [
        [("rx.since", 29)],
        [("rx.since", 30)],
        [("rx.since", 31)],
    ]


def offered_refund() -> str:
    return "{'type': 'REFUND', 'amount': facts.order.refundable} in input.options"


def test_explore_fails_a_policy_that_can_end_in_error() -> None:
    from improve.loop.gates import ExploreGate, LowerGate, ValidateGate

    doc = copy.deepcopy(V0)
    del doc["states"]["ask_model"]["invoke"]["onError"]  # a failed model call now ends the policy in error
    ctx = context(document=doc)
    for gate in (ValidateGate(), LowerGate()):
        assert gate.run(ctx).ok
    result = ExploreGate().run(ctx)
    assert not result.ok and "can end in error in state 'ask_model'" in result.detail, result.detail
    assert "Give every invoke an onError" in result.detail
    assert "after: ask_model failed." in result.detail  # the path that gets there, event by event
    # run_gates stops at the first failing gate, and passed() says so.
    results = run_gates(doc, context())
    assert not passed(results) and not results[-1].ok
    assert not passed([])


# --- bad input to verify: a message with the file and the exit code, never a traceback -----------------


def clean_exit(result: Any, code: int) -> str:
    """The exit code is `code`, no exception escaped the command, and stderr and stdout together hold
    no traceback. Returns both, for the message checks."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    return text


def test_verify_refuses_a_policy_nested_ten_thousand_deep(tmp_path: Path) -> None:
    copy_workspace(tmp_path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 10_000 + "]" * 10_000)
    result = CliRunner().invoke(app, ["verify", str(deep), "-w", str(tmp_path)])
    text = clean_exit(result, 1)
    assert f"FAIL validate: {deep}: $: nested deeper than {MAX_DEPTH} levels" in text


def test_verify_refuses_a_policy_too_deep_for_the_gates_but_not_for_json(tmp_path: Path) -> None:
    # 900 levels decode, but validating or lowering them recursed into a RecursionError.
    copy_workspace(tmp_path)
    doc = json.loads((tmp_path / "policies" / "refunds" / "v0.json").read_text())
    doc.setdefault("context", {})["nested"] = json.loads("[" * 900 + "]" * 900)
    path = tmp_path / "ctx.json"
    path.write_text(json.dumps(doc))
    text = clean_exit(CliRunner().invoke(app, ["verify", str(path), "-w", str(tmp_path)]), 1)
    assert f"$.context.nested[0]...: nested deeper than {MAX_DEPTH} levels" in text
    # The limit leaves room for any real policy: v0 itself is a dozen levels deep.
    check_depth(doc["states"], "v0")


def test_verify_refuses_a_binary_policy_file(tmp_path: Path) -> None:
    copy_workspace(tmp_path)
    path = tmp_path / "policies" / "refunds" / "v8.json"
    path.write_bytes(b'{"id": "\x80\x81"}')
    text = clean_exit(CliRunner().invoke(app, ["verify", "v8", "-w", str(tmp_path)]), 2)
    assert f"error: {path}: not UTF-8 text (byte 0x80 at offset 8)" in " ".join(text.split())


@pytest.mark.parametrize("name", ["adir", "v7.json", "v7"])
def test_verify_refuses_a_directory_as_policy(tmp_path: Path, name: str) -> None:
    copy_workspace(tmp_path)
    where = tmp_path / "policies" / "refunds" if name == "v7" else tmp_path
    path = where / ("v7.json" if name == "v7" else name)
    path.mkdir()
    arg = name if name == "v7" else str(path) + ("/" if name == "adir" else "")
    text = clean_exit(CliRunner().invoke(app, ["verify", arg, "-w", str(tmp_path)]), 2)
    assert f"{path}: is a directory, not a policy" in " ".join(text.split())


def test_explore_passes_when_no_scenario_reached_a_decision() -> None:
    from improve.loop.gates import ExploreGate

    result = ExploreGate().run(context(document=copy.deepcopy(V0), probes=[]))
    assert result.ok and "no probe requests" in result.detail


@pytest.mark.parametrize(
    ("output", "same"),
    [
        ({"type": "REFUND", "amount": 23.5}, True),
        ({"type": "REFUND", "amount": 47 / 2}, True),
        ({"type": "REFUND", "amount": 23.5, "note": "and a voucher"}, False),  # a field the option lacks
        ({"type": "REFUND"}, False),
        ({"type": "CLOSE", "amount": 23.5}, False),
        ({"type": "REFUND", "amount": "23.5"}, False),
        ("REFUND", False),
    ],
)
def test_an_output_is_an_offered_option_only_field_for_field(output: Any, same: bool) -> None:
    from improve.loop.gates.explore import _same_event

    assert _same_event(output, {"type": "REFUND", "amount": 23.5}) is same
    assert _same_event({"type": "X", "n": 1.0}, {"type": "X", "n": 1}) is True
    # The decision protocol refuses True for 1 (runtime/decision.py), so the proof must too.
    assert _same_event({"type": "X", "n": True}, {"type": "X", "n": 1}) is False
    assert _same_event({"type": "X", "n": 1}, {"type": "X", "n": True}) is False


def test_explore_branches_on_each_answer_a_judgment_may_give() -> None:
    """Only the judgment's `angry: true` answer leads to an unoffered refund: explore must try it."""
    doc = copy.deepcopy(V0)
    doc["version"] = "1"
    doc["initial"] = "judge"
    doc["states"]["judge"] = {
        "invoke": {
            "src": "judge.sentiment",
            "onDone": [{"guard": "event.output.angry", "target": "refund_double"}, {"target": "ask_model"}],
            "onError": {"target": "ask_model"},
        }
    }
    doc["states"]["refund_double"] = {
        "type": "final",
        "output": {"type": "'REFUND'", "amount": "facts.requested * 2.0"},
    }
    name, detail = failing(doc)
    assert name == "explore" and 'after: judge answered {"angry": true}.' in detail, detail
    # On the very first probe, a calm ticket: the proof branches on the answer, not on the stand-in's.
    assert "cracked corner" in detail


def test_explore_takes_every_judgment_after_a_model_one() -> None:
    """A plain judgment listed after the model judgment is run on the probe too (its answer branches)."""
    import dataclasses

    env = dataclasses.replace(
        ENV, judgments={**ENV.judgments, "judge.vip": lambda request, context: {"vip": True}}
    )
    doc = copy.deepcopy(V0)
    doc["version"] = "1"
    doc["initial"] = "vip"
    doc["states"]["vip"] = {
        "invoke": {
            "src": "judge.vip",
            "onDone": [{"guard": "event.output.vip", "target": "refund_double"}, {"target": "ask_model"}],
            "onError": {"target": "ask_model"},
        }
    }
    doc["states"]["refund_double"] = {
        "type": "final",
        "output": {"type": "'REFUND'", "amount": "facts.requested * 2.0"},
    }
    name, detail = failing(doc, context(env=env))
    assert name == "explore" and 'after: vip answered {"vip": true}.' in detail, detail


def test_explore_proves_paths_up_to_forty_actor_calls_deep_and_no_deeper() -> None:
    """The explore gate's depth bound: 39 judgments then the model is 40 calls (proved), one more judgment
    is a path the proof does not finish (a failure, never a silent pass)."""
    from improve.loop.gates import ExploreGate, LowerGate, ValidateGate

    def chain(judgments: int) -> dict[str, Any]:
        doc = copy.deepcopy(V0)
        doc["version"] = "1"
        doc["initial"] = "j0"
        for i in range(judgments):
            after = f"j{i + 1}" if i + 1 < judgments else "ask_model"
            doc["states"][f"j{i}"] = {
                "invoke": {
                    "src": "judge.sentiment",
                    "onDone": {"target": after},
                    "onError": {"target": after},
                }
            }
        return doc

    def explore(doc: dict[str, Any]) -> GateResult:
        ctx = context(document=doc)
        assert ValidateGate().run(ctx).ok and LowerGate().run(ctx).ok
        return ExploreGate().run(ctx)

    assert explore(chain(39)).ok
    deeper = explore(chain(40))
    assert not deeper.ok and "did not finish" in deeper.detail


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=200),
        st.builds(lambda n: b"[" * n + b"]" * n, st.integers(150, 5000)),
        st.builds(lambda n: b'{"a": ' * n + b"1" + b"}" * n, st.integers(150, 5000)),
        st.sampled_from([b"\xef\xbb\xbf{}", b"{}", b"", b"null", b'{"states": 1}', b"\xff\xfe{}"]),
    )
)
def test_fuzz_the_policy_reader_refuses_any_bytes_clearly(tmp_path: Path, data: bytes) -> None:
    """Whatever a policy file holds, reading it gives a policy or an error that names the file."""
    from improve.errors import ImproveError
    from improve.runtime.policy import load_policy

    path = tmp_path / "fuzz.json"
    path.write_bytes(data)
    try:
        load_policy(path)
    except ImproveError as error:
        assert str(path) in str(error), str(error)


def test_novelty_refuses_a_branch_already_discarded_against_the_policy() -> None:
    """A round whose CHANGELOG remembers discarded branches runs `novelty` right after `validate`; a
    candidate adding only branches discarded before fails it, one adding another passes."""
    from improve.loop.branches import DiscardedBranch, added
    from improve.loop.gates import NoveltyGate

    seen = v1([{"guard": "facts.customer.refundsLast90d >= 3", "target": "escalate"}])
    baseline = parse_machine(V0)
    new = added(baseline, parse_machine(seen))
    memory = [DiscardedBranch(b.guard or "", b.answer(), "20260101-000000-refunds-v1") for b in new]
    gates = [*BUILTIN_GATES[:2], NoveltyGate(), *BUILTIN_GATES[2:]]
    ctx = context(baseline=baseline, gates=gates, discarded=memory)
    results = run_gates(seen, ctx)
    assert [r.name for r in results] == ["environment-unchanged", "validate", "novelty"]
    assert not results[-1].ok and "already discarded against refunds-policy@0" in results[-1].detail
    assert "`facts.customer.refundsLast90d >= 3` -> " in results[-1].detail
    assert "20260101-000000-refunds-v1" in results[-1].detail
    other = v1([{"guard": "facts.customer.refundsLast90d >= 4", "target": "escalate"}])
    assert passed(run_gates(other, ctx))
    assert passed(run_gates(seen, context(baseline=baseline, gates=gates)))  # nothing discarded before


def test_novelty_refuses_a_candidate_that_answers_as_a_discarded_one_did() -> None:
    """Two branches that answer the same decisions the same way are one candidate: a candidate whose
    guard is written otherwise but answers every known decision (training and held-out) as a
    discarded candidate did fails `novelty`; one that answers some decision otherwise passes."""
    from improve.loop.discards import DiscardedCandidate, RouteBranch
    from improve.loop.gates import NoveltyGate

    escalate = {"type": "'ESCALATE'"}
    offered = "{'type': 'ESCALATE'} in input.options"
    was = RouteBranch(f"facts.customer.refundsLast90d >= 3 && {offered}", escalate)
    tried = DiscardedCandidate("20260101-000000-refunds-v1", "v0", "v1", "c", "reach", (was,), (was,))
    baseline = parse_machine(V0)
    gates = [*BUILTIN_GATES[:2], NoveltyGate(), *BUILTIN_GATES[2:]]
    held_out = [{"name": p.name, "facts": p.facts, "options": p.options} for p in PROBES[:3]]
    ctx = context(baseline=baseline, gates=gates, tried=[tried], held_out_decisions=held_out)
    refunds = {p.facts["customer"]["refundsLast90d"] for p in PROBES}
    assert 3 in refunds and max(refunds) > 3, refunds  # decisions on both sides of each guard below
    same = v1([{"guard": f"facts.customer.refundsLast90d > 2 && {offered}", "target": "escalate"}])
    results = run_gates(same, ctx)
    assert [r.name for r in results] == ["environment-unchanged", "validate", "novelty"]
    assert not results[-1].ok and "exactly as candidate v1 did" in results[-1].detail, results[-1].detail
    assert "discarded against v0 in round 20260101-000000-refunds-v1" in results[-1].detail
    other = v1([{"guard": f"facts.customer.refundsLast90d >= 4 && {offered}", "target": "escalate"}])
    assert passed(run_gates(other, ctx)), [r.to_json() for r in run_gates(other, ctx)]
    # One that never passed its gates was never judged on what it answers: alike is no reason to refuse.
    import dataclasses

    never_ran = context(
        baseline=baseline,
        gates=gates,
        tried=[dataclasses.replace(tried, reason="gates")],
        held_out_decisions=held_out,
    )
    assert passed(run_gates(same, never_ran)), [r.to_json() for r in run_gates(same, never_ran)]

    # Discarded because the labels refused its answer on a held-out decision (`wrong`): a candidate that
    # answers that decision the same way on the same held-out set is refused, however else it answers.
    from improve.loop.branches import decision_key
    from improve.loop.discards import wrong_key

    every = [{"name": p.name, "facts": p.facts, "options": p.options} for p in PROBES]
    refused = next(d for d in every if d["facts"]["customer"]["refundsLast90d"] >= 4)
    key = wrong_key(decision_key(refused["name"], refused["facts"], refused["options"]))
    wrong = dataclasses.replace(tried, held_out=("set-a", 1), wrong=(key,))
    again = context(
        baseline=baseline, gates=gates, tried=[wrong], held_out_decisions=every, held_out_key="set-a"
    )
    refusal = run_gates(other, again)[-1]
    assert not refusal.ok and "the labels of the same held-out set refuse" in refusal.detail, refusal.detail
    # Another held-out set, or another answer there, is another question.
    elsewhere = dataclasses.replace(again, held_out_key="set-b")
    assert passed(run_gates(other, elsewhere)), [r.to_json() for r in run_gates(other, elsewhere)]
    closing = v1(
        [
            {
                "guard": "facts.customer.refundsLast90d >= 4 && {'type': 'CLOSE'} in input.options",
                "target": "close",
            }
        ],
        close={"type": "final", "output": {"type": "'CLOSE'"}},
    )
    novelty = next(r for r in run_gates(closing, again) if r.name == "novelty")
    assert novelty.ok, novelty.detail


def test_a_value_no_enumerated_fact_takes_is_refused_with_the_values_it_does_take() -> None:
    """`plan == 'enterprize'` passed every gate: the branch never fired, and nothing said why."""
    from improve.loop.gates import vocabulary_problems
    from improve.runtime import load_environment

    env = load_environment("triage")
    doc = json.loads((REPO / "policies" / "triage" / "v0.json").read_text())
    first = doc["initial"]
    doc["initial"] = "route"
    doc["states"]["route"] = {
        "type": "choice",
        "choice": [
            {"guard": "facts.customer.plan == 'enterprize'", "target": first},
            {
                "guard": "'pro' != facts.customer.plan && facts.customer.plan in ['free', 'visiter']",
                "target": first,
            },
            {"guard": "facts.customer.plan in ['free', 'enterprise']", "target": first},
            {"target": first},
        ],
    }
    problems = vocabulary_problems(parse_machine(doc), env)
    assert problems == [
        "$.states.route.choice[0].guard: 'enterprize' is not a value of the enumerated fact "
        "'facts.customer.plan' (so the condition never holds as meant); its values are "
        "['visitor', 'free', 'pro', 'enterprise']",
        "$.states.route.choice[1].guard: 'visiter' is not a value of the enumerated fact "
        "'facts.customer.plan' (so the condition never holds as meant); its values are "
        "['visitor', 'free', 'pro', 'enterprise']",
    ], problems


def test_a_fact_compared_with_a_literal_of_another_kind_is_refused() -> None:
    """`facts.customer.locked == 0` passed every gate: CEL holds no bool equal to an int, so the branch
    never fired. A literal of the fact's kind, a number for an int fact, or null (a fact left out) pass."""
    from improve.loop.gates import vocabulary_problems
    from improve.runtime import load_environment

    env = load_environment("triage")
    doc = json.loads((REPO / "policies" / "triage" / "v0.json").read_text())
    first = doc["initial"]
    doc["initial"] = "route"
    guards = [
        "facts.customer.locked == 0",
        "'3' == facts.customer.seats",
        "facts.ticket.subject == 1 && facts.ticket.spamScore != true",
        "facts.customer.locked == true && facts.customer.seats >= 2.5 && facts.ticket.spamScore < 1",
        "facts.ticket.subject != null && facts.customer.plan == 'pro' && input.facts.openTicket.hoursAgo <= 24",
    ]
    doc["states"]["route"] = {
        "type": "choice",
        "choice": [*({"guard": g, "target": first} for g in guards), {"target": first}],
    }
    problems = vocabulary_problems(parse_machine(doc), env)
    assert [p.split(": ", 1)[0] for p in problems] == [
        "$.states.route.choice[0].guard",
        "$.states.route.choice[1].guard",
        "$.states.route.choice[2].guard",
        "$.states.route.choice[2].guard",
    ], problems
    assert problems[0] == (
        "$.states.route.choice[0].guard: 'facts.customer.locked' is a bool fact, compared with 0 (a number): "
        "CEL holds no bool equal to a number, so the condition never holds as meant; compare it with a bool"
    )
    assert "'facts.customer.seats' is an int fact, compared with '3' (a text)" in problems[1]
    # An enumerated fact is compared with literals of its values' kind: numbers for `days` of 7, 14, 28.
    from improve.loop.gates.vocabulary import _enum_takes

    assert [_enum_takes(v) for v in (["free", "pro"], [7, 14, 28], [1, "a"], [])] == [
        "text",
        "number",
        None,
        None,
    ]


def test_an_answer_with_a_payload_value_no_decision_offers_is_refused() -> None:
    """`DENY{reason: 'alergy'}` passed every gate: the decision never offers it, so the branch's `in
    input.options` test never holds and it never answers. A value the machine computes is not judged."""
    from improve.loop.branches import insert_branch
    from improve.loop.gates import vocabulary_problems
    from improve.runtime import load_environment

    env = load_environment("triage")
    doc = json.loads((REPO / "policies" / "triage" / "v0.json").read_text())
    # A number written as JSON (`"amount": 150`) as well as CEL text.
    for name, queue in (("sales", "'sales'"), ("billing", "'billing'"), ("numbered", 7)):
        doc = insert_branch(
            doc,
            "facts.customer.plan == 'pro'",
            {"type": "'ROUTE'", "queue": queue},
            0,
            version="1",
            name=name,
            description="d",
        )
    problems = vocabulary_problems(parse_machine(doc), env)
    assert problems == [
        f"$.states.{name}.output.queue: {value} is not a value any decision offers for ROUTE.queue (['billing', "
        "'technical', 'security', 'accounts']): the answer is never offered, so the branch never answers"
        for name, value in (("sales", "'sales'"), ("numbered", "7"))
    ], problems
