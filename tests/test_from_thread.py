"""`improve scenarios add --from-thread`: a recorded thread (a scenario's run, or a production run) made
into a labelled scenario whose rebuilt world answers the tools the same way, so running it again with
the same stand-in model ends in the same state with the same effects."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from improve.cli.main import app
from improve.errors import LogError, ScenarioError, WorkspaceError, WorldFromThreadError
from improve.evals import (
    Scenario,
    Workspace,
    append_scenario,
    find_thread,
    load_scenarios,
    scenario_from_thread,
)
from improve.examples.refunds.world import world_from_thread
from improve.log import JsonlDirStore
from improve.runtime import (
    ActorCall,
    Environment,
    PolicyDecider,
    RecordedThread,
    compile_policy,
    load_environment,
    load_policy,
    recorded_thread,
    run,
)
from tests.helpers import REPO

runner = CliRunner()

APPROVAL_RUN = "train:v0:careful:large-refund-approved-01:r1"


def improve(ws: Path, *args: str) -> Any:
    return runner.invoke(app, [*args, "-w", str(ws)])


def run_json(ws: Path, *args: str) -> dict[str, Any]:
    result = improve(ws, "run", "--policy", "v0", "--model", "careful", "--k", "1", "--json", *args)
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def only_thread(document: dict[str, Any]) -> dict[str, Any]:
    (thread,) = document["threads"]
    assert isinstance(thread, dict)
    return thread


def add(ws: Path, *args: str) -> Any:
    return improve(ws, "scenarios", "add", *args)


def refunds() -> Environment:
    return load_environment("refunds")


def test_a_scenario_run_becomes_a_scenario_that_runs_the_same(ws: Path) -> None:
    original = only_thread(run_json(ws, "--scenario", "large-refund-approved-01"))
    assert original["final_state"] == "issued" and original["passed"]
    path = ws / "scenarios" / "refunds.yaml"
    before = path.read_text()

    effects = [json.dumps(e) for e in original["effects"]]
    result = add(
        ws,
        *("--from-thread", APPROVAL_RUN, "--expect", "issued", "--split", "held-out"),
        *(arg for effect in effects for arg in ("--effect", effect)),
        *("--category", "large-refund-approved", "--id", "approval-replayed-01", "--json"),
    )
    assert result.exit_code == 0, result.output
    added = json.loads(result.stdout)
    assert added["thread"] == APPROVAL_RUN
    # A copy of a train scenario in held-out would score what training saw: allowed, and said.
    (leak,) = added["warnings"]
    assert "'large-refund-approved-01' (train), 'approval-replayed-01' (held-out) start from the same" in leak
    assert added["recorded"] == {"final_state": "issued", "status": "done", "effects": original["effects"]}

    # Appended as text: everything that was there stays, comments included, and the item reads back.
    after = path.read_text()
    assert after.startswith(before) and f"# From thread {APPROVAL_RUN}" in after
    scenarios = load_scenarios(path, "refunds").by_id()
    new, old = scenarios["approval-replayed-01"], scenarios["large-refund-approved-01"]
    assert new.input == old.input and new.people == old.people
    assert new.world == old.world  # what the tools read, as they read it (140 == 140.0)
    assert new.expected.effects == original["effects"]

    replayed = only_thread(run_json(ws, "--scenario", "approval-replayed-01"))
    assert replayed["passed"], replayed["reason"]
    assert replayed["final_state"] == original["final_state"]
    assert replayed["effects"] == original["effects"]

    checked = improve(ws, "scenarios", "check", "--json")
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.stdout)["ok"] is True and json.loads(checked.stdout)["warnings"] == [leak]
    said = improve(ws, "scenarios", "check")
    assert said.exit_code == 0 and f"warning: {ws / 'scenarios' / 'refunds.yaml'}: {leak}" in said.stderr

    # The same case labelled otherwise, in one split: no policy passes both, which the check says.
    relabelled = add(
        ws,
        *("--from-thread", APPROVAL_RUN, "--expect", "escalated", "--split", "train"),
        *("--category", "large-refund-approved", "--id", "approval-relabelled-01", "--json"),
    )
    assert relabelled.exit_code == 0, relabelled.output
    (otherwise,) = [w for w in json.loads(relabelled.stdout)["warnings"] if "labelled otherwise" in w]
    assert (
        "'large-refund-approved-01' (issued), 'approval-replayed-01' (issued), 'approval-relabelled-01' (escalated)"
        in otherwise
    )
    checked = improve(ws, "scenarios", "check", "--json")
    assert checked.exit_code == 0 and otherwise in json.loads(checked.stdout)["warnings"], checked.output


def test_defaults_outcome_only_and_the_one_split_warning(ws: Path) -> None:
    original = only_thread(run_json(ws, "--scenario", "missing-order-reply-01"))
    thread = "train:v0:careful:missing-order-reply-01:r1"

    result = add(ws, "--from-thread", thread, "--expect", original["final_state"], "--split", "train")
    assert result.exit_code == 0, result.output
    # The category is the expected state; the id names it and the scenario the thread ran.
    assert "added scenario 'issued-missing-order-reply-01' (category issued, train)" in result.stdout
    assert "warning: category 'issued' has no scenario in held-out" in result.stderr
    added = load_scenarios(ws / "scenarios" / "refunds.yaml").by_id()["issued-missing-order-reply-01"]
    assert added.expected.effects is None  # no --effect: the outcome alone is compared
    # The customer named the order when asked: a person's answer to the waiting state.
    assert added.people == {"awaitingOrderId": [{"type": "PROVIDE_ORDER_ID", "orderId": "O-5021"}]}
    assert "orderId" not in added.input

    replayed = only_thread(run_json(ws, "--scenario", added.id))
    assert replayed["passed"] and replayed["effects"] == original["effects"]

    checked = improve(ws, "scenarios", "check", "--json")
    assert checked.exit_code == 1
    assert json.loads(checked.stdout)["problems"] == [
        f"{ws / 'scenarios' / 'refunds.yaml'}: category 'issued' has no scenario in held-out"
    ]

    # The same thread again gets the same id, which is taken.
    again = add(ws, "--from-thread", thread, "--expect", "issued", "--split", "held-out", "--json")
    assert again.exit_code == 2 and "already used" in again.output


def test_a_label_the_reference_does_not_reach_is_added_with_a_warning(ws: Path) -> None:
    """An effect typed with another order's id: the label is the person's and is added, but `careful`,
    the environment's reference, ends otherwise, and the command says how, before a round learns from it."""
    original = only_thread(run_json(ws, "--scenario", "large-refund-approved-01"))
    wrong = [{**e, "orderId": "O-9999"} if "orderId" in e else e for e in original["effects"]]
    result = add(
        ws,
        *(
            "--from-thread",
            APPROVAL_RUN,
            "--expect",
            "issued",
            "--split",
            "train",
            "--id",
            "typo-01",
            "--category",
            "large-refund-approved",
            "--json",
        ),
        *(arg for effect in wrong for arg in ("--effect", json.dumps(effect))),
    )
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    said = [
        w for w in warnings if w.startswith("careful, the environment's reference, does not reach this label")
    ]
    assert said and "O-9999" in said[0] and "wrong effects: expected" in said[0], warnings
    assert "typo-01" in load_scenarios(ws / "scenarios" / "refunds.yaml").by_id()
    # `scenarios check` says it too (a warning: the label is the person's), of that scenario alone.
    checked = improve(ws, "scenarios", "check", "--json")
    assert checked.exit_code == 0, checked.output
    unreached = [w for w in json.loads(checked.stdout)["warnings"] if "does not reach its label" in w]
    assert len(unreached) == 1 and unreached[0].startswith("scenario 'typo-01' (line "), unreached


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--expect", "checkingPayment", "--split", "train"], "is not a final state of refunds"),
        (
            ["--expect", "isued", "--split", "train"],
            "is not a final state of refunds (did you mean 'issued'?)",
        ),
        # `scenarios check` refuses a sentinel label (it could never pass): `add` writes none.
        (["--expect", "illegallyIssued", "--split", "train"], "is a sentinel state of refunds"),
        (["--expect", "issued", "--split", "train", "--id", "small-refund-01"], "is already used"),
        (["--expect", "issued", "--split", "dev"], "--split 'dev'"),
        (["--expect", "issued", "--split", "train", "--effect", "refund 140"], "--effect #1"),
        # The example is the thread's own effect, not another desk's.
        (
            ["--expect", "issued", "--split", "train", "--effect", '{"orderId": "O-5005"}'],
            "with a `kind`; write one as the world records it, as the thread recorded one: '{",
        ),
        (["--expect", "issued", "--split", "train", "--id", "no spaces please"], "id: String should match"),
    ],
)
def test_a_bad_label_or_a_taken_id_writes_nothing_and_exits_2(
    ws: Path, args: list[str], message: str
) -> None:
    run_json(ws, "--scenario", "large-refund-approved-01")
    folder = ws / "scenarios"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = add(ws, "--from-thread", APPROVAL_RUN, *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_an_environment_without_the_hook_says_what_to_add(ws: Path) -> None:
    run_json(ws, "--env", "refund-approval", "--scenario", "small-01")
    thread = "train:v0:careful:small-01:r1"
    before = (ws / "scenarios" / "refund-approval.yaml").read_bytes()
    result = add(
        ws, "--env", "refund-approval", "--from-thread", thread, "--expect", "issued", "--split", "train"
    )
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "environment refund-approval cannot rebuild a world from a thread" in said
    assert "world_from_thread=" in said and "docs/extending.md" in said
    assert (ws / "scenarios" / "refund-approval.yaml").read_bytes() == before


def test_a_thread_of_another_machine_or_nowhere_is_refused(ws: Path) -> None:
    run_json(ws, "--scenario", "small-refund-01")
    _, entries = find_thread("train:v0:careful:small-refund-01:r1", Workspace.load(ws / "improve.toml"))
    foreign = [e.model_copy(update={"machineId": "support-desk"}) for e in entries]
    with pytest.raises(WorkspaceError, match=r"recorded by machine 'support-desk'.*pass --env"):
        scenario_from_thread(refunds(), foreign, expect="issued", effects=None, split="train")
    missing = add(ws, "--from-thread", "train:v0:careful:nope:r1", "--expect", "issued", "--split", "train")
    assert missing.exit_code == 2 and "no thread 'train:v0:careful:nope:r1'" in missing.output


def production_run(ws: Path, thread_id: str, world: dict[str, Any], people: dict[str, Any]) -> Any:
    """A thread recorded outside any scenario: an input and a world of our own, no stamp."""
    env = refunds()
    policy = compile_policy(
        load_policy(ws / "policies" / "refunds" / "v0.json"), env.judgments, env.policy_guards
    )
    decider = PolicyDecider(policy, {"decider": env.models["careful"]("production")}, env.judgments)
    return run(
        env,
        input={
            "ticket": "The standing desk motor died after a week; I'd like the 180 back.",
            "customerId": "C-9001",
            "orderId": "O-9001",
            "amount": 180,
        },
        world=env.make_world(world),
        people=people,
        decider=decider,
        store=JsonlDirStore(ws / "traces"),
        thread_id=thread_id,
    )


PRODUCTION_WORLD = {
    "customers": {
        "C-9001": {"refundsLast90d": 1, "accountAgeDays": 900},
        "C-9002": {"refundsLast90d": 0, "accountAgeDays": 12},  # never looked at: stays out
    },
    "orders": {
        "O-9001": {"customerId": "C-9001", "total": 180, "refunded": 0, "deliveredDaysAgo": 8},
        "O-9002": {"customerId": "C-9002", "total": 15, "refunded": 0, "deliveredDaysAgo": 2},
    },
}


@pytest.mark.parametrize(("payments_fail", "outcome"), [(False, "issued"), (True, "failed")])
def test_a_production_thread_becomes_a_scenario(ws: Path, payments_fail: bool, outcome: str) -> None:
    world = {**PRODUCTION_WORLD, **({"paymentsFail": True} if payments_fail else {})}
    people = {"awaitingApproval": [{"type": "APPROVE", "approver": "sam"}]}
    recorded = production_run(ws, "prod-2026-11-30-0042", world, people)
    assert recorded.final_state == outcome

    # Given as a path to the thread's file, as one copied out of a production system would be.
    path = ws / "traces" / "prod-2026-11-30-0042.jsonl"
    effects = [json.dumps(e) for e in recorded.effects]
    result = add(
        ws,
        *("--from-thread", str(path), "--expect", outcome, "--split", "held-out", "--json"),
        *(arg for effect in effects for arg in ("--effect", effect)),
    )
    assert result.exit_code == 0, result.output
    added = json.loads(result.stdout)
    scenario = added["scenario"]
    assert re.fullmatch(rf"{outcome}-[0-9a-f]{{8}}", scenario["id"]) and scenario["category"] == outcome
    assert scenario["world"] == {
        "customers": {"C-9001": {"refundsLast90d": 1, "accountAgeDays": 900}},
        "orders": {
            "O-9001": {"customerId": "C-9001", "total": 180.0, "refunded": 0.0, "deliveredDaysAgo": 8}
        },
        **({"paymentsFail": True} if payments_fail else {}),
    }
    assert scenario["people"] == people
    assert added["warnings"] and "has no scenario in train" in added["warnings"][0]

    replayed = only_thread(run_json(ws, "--scenario", scenario["id"]))
    assert replayed["passed"], replayed["reason"]
    assert replayed["final_state"] == outcome and replayed["effects"] == recorded.effects


def test_a_hook_that_leaves_out_what_a_tool_reads_is_caught_at_the_entry(ws: Path) -> None:
    production_run(ws, "prod-1", PRODUCTION_WORLD, {"awaitingApproval": [{"type": "REJECT"}]})
    _, entries = find_thread("prod-1", Workspace.load(ws / "improve.toml"))
    forgetful = dataclasses.replace(refunds(), world_from_thread=lambda thread: {"customers": {}})
    with pytest.raises(WorldFromThreadError, match=r"thread prod-1, entry 1 \(crm.verifyCustomer"):
        scenario_from_thread(
            forgetful, entries, expect="closed", effects=None, split="train", thread_id="prod-1"
        )


def test_bookkeeping_entries_are_passed_over_and_unreproducible_failures_refused(ws: Path) -> None:
    production_run(ws, "prod-2", PRODUCTION_WORLD, {"awaitingApproval": [{"type": "REJECT"}]})
    _, entries = find_thread("prod-2", Workspace.load(ws / "improve.toml"))
    assert entries[-1].type == "@agent.end"  # the run's own end entry is passed over like usage
    thread = recorded_thread(refunds().machine, entries, "prod-2")
    assert thread.final_state == "closed" and thread.status == "done"
    assert [c.src for c in thread.calls] == [
        "crm.verifyCustomer",
        "orders.lookup",
        "approvals.request",
        "tickets.close",
    ]
    assert thread.people() == {"awaitingApproval": [{"type": "REJECT"}]}

    broken = RecordedThread(
        thread_id="prod-3",
        input={},
        calls=(ActorCall(index=1, state="verifyingCustomer", src="crm.verifyCustomer", input={}, error={}),),
        answers=(),
        final_state="failed",
        status="done",
    )
    with pytest.raises(WorldFromThreadError, match=r"entry 1: crm\.verifyCustomer failed"):
        world_from_thread(broken)
    with pytest.raises(LogError, match="thread prod-2"):
        recorded_thread(refunds().machine, entries[1:], "prod-2")


def item(id: str, ticket: str = "plain") -> Scenario:
    return Scenario.model_validate(
        {
            "id": id,
            "category": "c",
            "split": "train",
            "input": {"ticket": ticket, "n": 1},
            "world": {"flags": {"on": True}},
            "expected": {"outcome": "done", "effects": [{"kind": "x", "text": "a: b # c"}]},
        }
    )


@pytest.mark.parametrize(
    "text",
    [
        "# head\nenvironment: e\nscenarios:\n\n  - id: a\n    category: c\n    split: train\n    input: {}\n"
        "    expected: {outcome: done}\n# trailing comment\n",
        "scenarios:\n- id: a\n  category: c\n  split: train\n  input: {}\n  expected: {outcome: done}\n"
        "\n# about the environment\nenvironment: e  # kept\n",
        "environment: e\nscenarios: []  # none yet\n",
        "environment: e\nscenarios:\n    - id: a\n      category: c\n      split: train\n      input: {}\n"
        "      expected: {outcome: done}",
    ],
    ids=["last-key", "key-after", "empty-flow", "deep-indent-no-newline"],
)
def test_appending_keeps_the_file_and_reads_back(tmp_path: Path, text: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    new = item("b", 'Two lines:\n"quoted" and a #hash, then ünïcode')
    loaded = append_scenario(path, new, "e", comment="From thread t")
    assert loaded.by_id()["b"] == new and len(loaded.scenarios) == 2 - text.count("[]")
    after = iter(path.read_text().splitlines())
    # Every line that was there is still there, in order (the new item's lines in between).
    assert all(any(line == got for got in after) for line in text.replace("[]", "").splitlines())
    assert yaml.safe_load(path.read_text())["environment"] == "e"


def test_appending_creates_a_missing_file_and_refuses_a_flow_list(tmp_path: Path) -> None:
    path = tmp_path / "new" / "s.yaml"
    append_scenario(path, item("a"), "e")
    assert load_scenarios(path, "e").by_id()["a"] == item("a")
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        "environment: e\nscenarios: [{id: a, category: c, split: train, input: {}, expected: {outcome: done}}]\n"
    )
    with pytest.raises(ScenarioError, match="flow style"):
        append_scenario(flow, item("b"), "e")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flow.yaml", "new"]


WRITERS = """
import os, sys
from pathlib import Path
from improve.evals import Scenario, append_scenario, record_unsealing

def write(n):
    if sys.argv[1] == "scenario":
        scenario = Scenario.model_validate(
            {"id": f"c{n}", "category": "c", "split": "train", "input": {"n": n}, "expected": {"outcome": "done"}}
        )
        append_scenario(Path("s.yaml"), scenario, "e")
    else:
        record_unsealing(Path("u.jsonl"), who="t", command="c", environment="e", test_set="k",
                         test_scenarios=1, model="m", scores=[])

# Six processes forked from this one (a single thread: forking is safe), improve imported once for all.
go_read, go_write = os.pipe()
children = []
for n in range(6):
    pid = os.fork()
    if pid == 0:
        os.close(go_write)
        os.read(go_read, 1)  # every writer starts when the parent says go: as close to at once as it gets
        try:
            write(n)
        except BaseException as error:
            print(f"writer {n}: {error!r}", file=sys.stderr)
            os._exit(1)
        os._exit(0)
    children.append(pid)
os.close(go_read)
os.write(go_write, b"g" * 6)
print([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children])
"""


@pytest.mark.slow
@pytest.mark.parametrize("what", ["scenario", "unsealing"])
def test_writers_of_one_file_in_six_processes_at_once_lose_nothing(tmp_path: Path, what: str) -> None:
    """Six `improve scenarios add` (or unsealings) at once: each reads, changes and writes the file under
    its lock, so all six land (a read-modify-write without one kept one or two of six)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", WRITERS, what],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.split() == ["[0,", "0,", "0,", "0,", "0,", "0]"], done.stderr
    if what == "scenario":
        assert sorted(load_scenarios(tmp_path / "s.yaml", "e").by_id()) == [f"c{n}" for n in range(6)]
    else:
        lines = (tmp_path / "u.jsonl").read_text().splitlines()
        assert sorted(json.loads(line)["number"] for line in lines) == [1, 2, 3, 4, 5, 6]


def test_the_template_environment_rebuilds_its_world(tmp_path: Path) -> None:
    # A name no other test uses: the package is imported into this process.
    ws = tmp_path / "threads"
    assert runner.invoke(app, ["init", str(ws), "--env", "thread-desk"]).exit_code == 0
    original = only_thread(run_json(ws, "--scenario", "over-fee-01"))
    result = add(
        ws,
        *("--from-thread", "train:v0:careful:over-fee-01:r1", "--expect", original["final_state"]),
        *("--split", "held-out", "--category", "over-fee", "--id", "over-fee-replayed"),
        *(arg for effect in original["effects"] for arg in ("--effect", json.dumps(effect))),
    )
    assert result.exit_code == 0, result.output
    added = load_scenarios(ws / "scenarios" / "thread-desk.yaml").by_id()["over-fee-replayed"]
    assert added.world == {"accounts": {"A-201": {"plan": "pro", "monthlyFee": 30, "creditsThisYear": 0}}}
    replayed = only_thread(run_json(ws, "--scenario", "over-fee-replayed"))
    assert replayed["passed"] and replayed["effects"] == original["effects"]
    assert improve(ws, "scenarios", "check").exit_code == 0
    assert (REPO / "improve" / "scaffold" / "template" / "world.py").read_text().count(
        "def world_from_thread"
    ) == 1
