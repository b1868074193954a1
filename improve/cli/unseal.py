"""Unsealing the test split from the command line: record each unsealing, and say where."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from improve.cli.common import err

if TYPE_CHECKING:
    from improve.evals import OutcomeRow, ScenarioSet, UnsealedScore, Unsealing, Workspace
    from improve.machine import MachineConfig


def record_unsealed(
    space: Workspace,
    env_name: str,
    scenario_set: ScenarioSet,
    model: str,
    scores: list[UnsealedScore],
    command: str,
    comparison: dict[str, Any] | None = None,
) -> Unsealing:
    """Append the unsealing to the policies' test-unsealings.jsonl and say so on stderr."""
    from improve.evals import current_user, read_unsealings, record_unsealing, set_key, unsealings_path

    path = unsealings_path(space.policies_dir(env_name))
    key = set_key(scenario_set.sealed)
    earlier = [r for r in read_unsealings(path) if r.get("test_set") == key]
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
) -> Unsealing:
    """Record the unsealing of the test split's runs of one policy (`improve run --unseal`)."""
    from improve.evals import SEALED_SPLIT, UnsealedScore, policy_hash, policy_label, scorecard

    card = scorecard(rows, policy_label(policy), SEALED_SPLIT)
    return record_unsealed(
        space, env_name, scenario_set, model, [UnsealedScore.of(card, policy_hash(policy))], command
    )


def unsealings_so_far(space: Workspace, env_name: str, scenario_set: ScenarioSet) -> int:
    """How many times the current test set has been unsealed (its key: `set_key` of its scenarios)."""
    from improve.evals import read_unsealings, set_key, unsealings_path

    key = set_key(scenario_set.sealed)
    path = unsealings_path(space.policies_dir(env_name))
    return sum(1 for r in read_unsealings(path) if r.get("test_set") == key)
