"""Exploration proofs: sentinels unreachable with a complete search, for every distinct input shape; a
loosened guard makes them reachable (or the proof proves nothing); every normal final is reachable."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from improve.cli.main import app
from improve.machine import compile_machine
from improve.machine.config import MachineConfig, TransitionConfig
from improve.machine.explore import ExploreOptions, beyond_choice, can_reach, explore_paths
from improve.machine.snapshot import Snapshot
from improve.runtime import load_environment
from improve.runtime.environment import Environment

REFUNDS = load_environment("refunds")
APPROVAL = load_environment("refund-approval")


def recompile(env: Environment, config: MachineConfig) -> Any:
    return compile_machine(config, guards=env.guards, actors=set(env.actors))


@pytest.mark.parametrize("env", [REFUNDS, APPROVAL], ids=lambda e: e.name)
def test_sentinel_is_unreachable_and_the_search_is_complete(env: Environment) -> None:
    assert env.probe is not None and env.probe_inputs
    for sentinel in env.config.sentinels():
        for inp in env.probe_inputs:
            result = can_reach(env.machine, sentinel, inp, env.probe)
            assert not result.reachable, result.witness
            assert result.complete, result.cuts
            assert result.states > 5


@pytest.mark.parametrize("env", [REFUNDS, APPROVAL], ids=lambda e: e.name)
def test_every_normal_final_state_is_reachable(env: Environment) -> None:
    assert env.probe is not None
    reached: set[str] = set()
    for inp in env.probe_inputs:
        reached |= set(explore_paths(env.machine, inp, env.probe).terminals)
    normal = set(env.config.final_states()) - set(env.config.sentinels())
    assert normal <= reached, normal - reached
    assert not set(env.config.sentinels()) & reached


def test_a_loosened_refund_guard_reaches_the_sentinel_with_a_witness() -> None:
    config = REFUNDS.config.model_copy(deep=True)
    refund = config.states["choosingResolution"].on["REFUND"]
    assert isinstance(refund, TransitionConfig)
    refund.guard = "event.amount > 0"  # the remaining-amount and window checks removed
    result = can_reach(recompile(REFUNDS, config), "illegallyIssued", REFUNDS.probe_inputs[1], REFUNDS.probe)
    assert result.reachable
    assert result.witness is not None
    refunds = [e for e in result.witness if e["type"] == "REFUND"]
    assert refunds and refunds[0]["amount"] > 0


def test_a_closed_choice_search_reaches_only_through_offered_answers() -> None:
    """The gates' search (`closed_choice`) sends a decision only what it offers: a guard that lets through
    an amount no decision offers is `improve explore`'s finding, not the agent's reach, while a guard
    that lets through an offered one is both."""
    config = REFUNDS.config.model_copy(deep=True)
    refund = config.states["choosingResolution"].on["REFUND"]
    assert isinstance(refund, TransitionConfig) and REFUNDS.probe is not None
    closed = dataclasses.replace(REFUNDS.probe, closed_choice=True)
    machine, start = recompile(REFUNDS, config), REFUNDS.probe_inputs[1]
    assert not can_reach(machine, "illegallyIssued", start, closed).reachable
    refund.guard = "event.amount > 0"  # the remaining-amount and window checks removed
    loosened = recompile(REFUNDS, config)
    reached = can_reach(loosened, "illegallyIssued", start, closed)
    assert reached.reachable and reached.witness is not None
    offered = [e for e in reached.witness if e["type"] == "REFUND"]
    assert offered and not beyond_choice(loosened, start, reached.witness)
    # Past the closed choice only: an amount the probe tries and no decision offers.
    refund.guard = (
        f"({REFUNDS.config.states['choosingResolution'].on['REFUND'].guard}) || event.amount == 101"
    )
    beyond = recompile(REFUNDS, config)
    opened = can_reach(beyond, "illegallyIssued", start, REFUNDS.probe)
    assert opened.reachable and beyond_choice(beyond, start, opened.witness or [])
    assert not can_reach(beyond, "illegallyIssued", start, closed).reachable


def test_a_loosened_approval_threshold_reaches_the_sentinel() -> None:
    config = REFUNDS.config.model_copy(deep=True)
    always = config.states["checkingApproval"].always
    assert isinstance(always, list) and isinstance(always[0], TransitionConfig)
    always[0].guard = "context.refundAmount > 1000"
    result = can_reach(recompile(REFUNDS, config), "illegallyIssued", REFUNDS.probe_inputs[1], REFUNDS.probe)
    assert result.reachable and result.complete is not None
    assert not any(e["type"] == "APPROVE" for e in result.witness or [])


def test_a_loosened_issue_guard_reaches_the_approval_sentinel() -> None:
    config = APPROVAL.config.model_copy(deep=True)
    issue = config.states["classifying"].on["ISSUE"]
    assert isinstance(issue, TransitionConfig)
    issue.guard = None
    result = can_reach(
        recompile(APPROVAL, config), "illegallyIssued", {"amount": 240, "reason": "x"}, APPROVAL.probe
    )
    assert result.reachable and result.witness == [{"type": "ISSUE"}]


def test_a_person_s_event_without_probe_values_is_sent_with_a_value_of_its_type() -> None:
    """The approval desk's person sends APPROVE{approver}; read without `has()` (`event.approver`), the
    field is required. A probe that gives no approver used to send APPROVE without one, and the machine's
    read of it stopped the search (`improve explore` exit 3 on a bare CEL error); a value of the field's
    type is sent instead, and the search goes on through the approval."""
    assert APPROVAL.probe is not None
    config = APPROVAL.config.model_copy(deep=True)
    approve = config.states["approving"].on["APPROVE"]
    assert isinstance(approve, TransitionConfig) and approve.assign is not None
    approve.assign["approver"] = "event.approver"
    bare = dataclasses.replace(
        APPROVAL.probe, payloads={k: v for k, v in APPROVAL.probe.payloads.items() if k != "APPROVE"}
    )
    large = next(i for i in APPROVAL.probe_inputs if i["amount"] > 100)
    found = explore_paths(recompile(APPROVAL, config), large, bare)
    assert {"issued", "rejected"} <= set(found.terminals), found.terminals
    assert not set(APPROVAL.config.sentinels()) & set(found.terminals)


def test_predicate_targets_and_limits_make_the_search_incomplete() -> None:
    assert REFUNDS.probe is not None

    def paid_over_100(s: Snapshot) -> bool:
        return s.value == "paying" and s.context["refundAmount"] > 100 and not s.context["approved"]

    assert not can_reach(REFUNDS.machine, paid_over_100, REFUNDS.probe_inputs[1], REFUNDS.probe).reachable
    short = ExploreOptions(REFUNDS.probe.payloads, REFUNDS.probe.outputs, REFUNDS.probe.errors, max_depth=2)
    result = explore_paths(REFUNDS.machine, REFUNDS.probe_inputs[1], short, target="illegallyIssued")
    assert not result.reachable and not result.complete and "depth 2" in result.cuts[0]
    no_outputs = ExploreOptions(REFUNDS.probe.payloads, {}, ())
    result = explore_paths(REFUNDS.machine, REFUNDS.probe_inputs[0], no_outputs)
    assert not result.complete and "crm.verifyCustomer" in result.cuts[0]


@pytest.mark.parametrize("env", [REFUNDS, APPROVAL], ids=lambda e: e.name)
def test_a_full_exploration_reached_exactly_the_states_a_search_for_each_can_reach(env: Environment) -> None:
    # `improve explore` answers every target a complete exploration never reached from that exploration.
    assert env.probe is not None
    for inp in env.probe_inputs:
        full = explore_paths(env.machine, inp, env.probe)
        assert full.complete and full.reached <= set(env.machine.states)
        for state in env.machine.states:
            assert can_reach(env.machine, state, inp, env.probe).reachable == (state in full.reached), state


def test_explore_cli_proves_and_finds(tmp_path: Any) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["explore", "--env", "refunds", "--json"])
    assert ok.exit_code == 0, ok.output
    rows = json.loads(ok.stdout)["results"]
    assert len(rows) == len(REFUNDS.probe_inputs) and all(r["proof"] for r in rows)
    given = runner.invoke(
        app,
        [
            "explore",
            "--env",
            "refund-approval",
            "--target",
            "issued",
            "--input",
            '{"amount": 50, "reason": "x"}',
        ],
    )
    assert given.exit_code == 1 and "witness for issued" in given.stdout
    # Each event says the state it came to: a decision's answer, a tool's output, a person's event.
    steps = [line.strip() for line in given.stdout.splitlines() if line.strip().startswith("in '")]
    assert steps and all(re.match(r"in '[A-Za-z_]+': \{", line) for line in steps), given.stdout
    # A witness whose answer no decision offered (a probe value beyond the closed choice) says so: the
    # guard lets through what the decision protocol would refuse from a decider.
    sales = runner.invoke(app, ["explore", "--env", "triage", "--target", "routed", "--json"])
    (found, *_) = [r for r in json.loads(sales.stdout)["results"] if r["reachable"]]
    assert {"type": "ROUTE", "queue": "sales"} in found["witness"]  # the shortest way there: a probe value
    at = found["witness"].index({"type": "ROUTE", "queue": "sales"})
    assert found["witness_states"][at] == "triaging" and len(found["witness_states"]) == len(found["witness"])
    assert found["beyond_choice"] == [
        "ROUTE{queue: 'sales'} is outside the values decision 'triaging' offers "
        "('billing', 'technical', 'security', 'accounts')"
    ]
    shown = runner.invoke(app, ["explore", "--env", "triage", "--target", "routed"])
    assert "note: ROUTE{queue: 'sales'} is outside" in " ".join(shown.stdout.split())
    bad = runner.invoke(app, ["explore", "--env", "refunds", "--target", "nowhere"])
    assert bad.exit_code == 2 and "target state 'nowhere' does not exist" in bad.stderr


def test_explore_cli_bounds_the_approval_desks_resumes() -> None:
    # One wait (the approval) on any path, and no fresh budget per resume: at most the run's budget.
    runner = CliRunner()
    ok = runner.invoke(app, ["explore", "--env", "refund-approval", "--json"])
    assert ok.exit_code == 0, ok.output
    resumes = json.loads(ok.stdout)["resumes"]
    assert resumes["holds"] and resumes["complete"] and resumes["max_resumes"] == 1
    assert resumes["resume_budget"] is None and resumes["most_model_calls"] == 100
    table = runner.invoke(app, ["explore", "--env", "refund-approval"])
    assert "resumes share the run's budget" in table.stdout and "at most 1 resume(s)" in table.stdout
