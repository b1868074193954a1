"""Scenarios, the workspace, outcome rows and running suites of scenarios."""

from improve.evals.outcome import OutcomeRow, compare_effects, effects_from_log, outcome_row
from improve.evals.scenarios import Expected, Scenario, ScenarioSet, load_scenarios
from improve.evals.suite import SuiteSpec, run_suite
from improve.evals.workspace import Workspace, policy_hash, policy_label

__all__ = [
    "Expected",
    "OutcomeRow",
    "Scenario",
    "ScenarioSet",
    "SuiteSpec",
    "Workspace",
    "compare_effects",
    "effects_from_log",
    "load_scenarios",
    "outcome_row",
    "policy_hash",
    "policy_label",
    "run_suite",
]
