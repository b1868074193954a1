"""Unsealing the test split from the command line: record each unsealing, and say where."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import duckdb

from improve.cli.common import err
from improve.errors import ImproveError
from improve.evals import (
    SEALED_SPLIT,
    Ledger,
    OutcomeRow,
    ScenarioSet,
    UnsealedScore,
    Unsealing,
    Workspace,
    check_recordable,
    current_user,
    policy_hash,
    policy_label,
    read_unsealings,
    record_unsealing,
    scorecard,
    set_key,
    unsealings_path,
)
from improve.log import ThreadId
from improve.machine import MachineConfig


def check_unsealing(space: Workspace, env_name: str) -> None:
    """Before anything is run or scored: the unsealing must be recordable (`check_recordable`)."""
    check_recordable(unsealings_path(space.policies_dir(env_name)))


def record_unsealed(
    space: Workspace,
    env_name: str,
    scenario_set: ScenarioSet,
    model: str,
    scores: list[UnsealedScore],
    command: str,
    comparison: dict[str, Any] | None = None,
    ledger: Ledger | None = None,
    thread_ids: Sequence[str] = (),
) -> Unsealing:
    """Append the unsealing to the policies' test-unsealings.jsonl and say so on stderr. When it cannot
    be written (a full disk), the test threads `thread_ids` leave the `ledger`'s warehouse again: no test
    score stays recorded without its unsealing."""
    path = unsealings_path(space.policies_dir(env_name))
    key = set_key(scenario_set.sealed)
    earlier = [r for r in read_unsealings(path) if r.get("test_set") == key]
    try:
        unsealing = record_unsealing(
            path,
            who=current_user(space.root),
            command=command,
            environment=env_name,
            test_set=key,
            test_scenarios=len(scenario_set.sealed),
            model=model,
            scores=scores,
            comparison=comparison,
        )
    except ImproveError:
        tests = [t for t in thread_ids if (p := ThreadId.parse(t)) is not None and p.split == SEALED_SPLIT]
        if ledger is not None and tests:
            with contextlib.suppress(ImproveError, OSError, duckdb.Error):
                ledger.forget(tests)
        raise
    before = f"; the first was on {earlier[0].get('at')} by {earlier[0].get('who')}" if earlier else ""
    err.print(
        f"unsealed the test split of {env_name}: unsealing {unsealing.number} of test set {key} "
        f"({unsealing.test_scenarios} scenarios) by {unsealing.who}, recorded in {path}{before}. Commit it "
        "with the policies; a change made because of these scores makes the test split one more reused "
        "held-out set",
        markup=False,
    )
    return unsealing


def record_unsealing_of(
    space: Workspace,
    env_name: str,
    scenario_set: ScenarioSet,
    policy: MachineConfig,
    model: str,
    rows: list[OutcomeRow],
    command: str,
    ledger: Ledger | None = None,
) -> Unsealing:
    """Record the unsealing of the test split's runs of one policy (`improve run --unseal`)."""
    card = scorecard(rows, policy_label(policy), SEALED_SPLIT)
    return record_unsealed(
        space,
        env_name,
        scenario_set,
        model,
        [UnsealedScore.of(card, policy_hash(policy))],
        command,
        ledger=ledger,
        thread_ids=[r.thread_id for r in rows],
    )


def unsealings_so_far(space: Workspace, env_name: str, scenario_set: ScenarioSet) -> int:
    """How many times the current test set has been unsealed (its key: `set_key` of its scenarios)."""
    key = set_key(scenario_set.sealed)
    path = unsealings_path(space.policies_dir(env_name))
    return sum(1 for r in read_unsealings(path) if r.get("test_set") == key)
