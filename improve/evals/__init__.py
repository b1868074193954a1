"""Scenarios, the workspace, outcome rows and running suites of scenarios."""

import importlib
from typing import TYPE_CHECKING, Any

from improve.evals.cluster import ExecutorChoice, open_fanout, parse_executor
from improve.evals.deploy import Agent, deploy
from improve.evals.fanout import Fanout, ModelGate
from improve.evals.from_thread import find_thread, scenario_from_thread
from improve.evals.holdout import HeldOutRead, bias_bound, scenarios_needed, set_key, supported_reads
from improve.evals.outcome import (
    Fallbacks,
    OutcomeRow,
    Quarantined,
    compare_effects,
    effects_from_log,
    fallbacks,
    outcome_row,
)
from improve.evals.resume import ResumeRequest, resume_thread, thread_environment
from improve.evals.scenario_writer import (
    append_scenario,
    leak_warnings,
    scenario_yaml,
    split_warnings,
    write_drafts,
)
from improve.evals.scenarios import (
    OPEN_SPLITS,
    SEALED_SPLIT,
    SPLITS,
    UNSEAL_HOW,
    Expected,
    Scenario,
    ScenarioSet,
    load_scenarios,
    read_yaml,
    scenario_lines,
    valid_scenarios,
)
from improve.evals.suite import (
    PlannedRun,
    Slots,
    StartFrom,
    SuiteSpec,
    every,
    recorded_with,
    run_scenario,
    run_suite,
    stale,
    suite_spec,
    write_threads,
)
from improve.evals.unsealing import (
    UNSEALINGS_FILE,
    Unsealed,
    UnsealedScore,
    Unsealing,
    check_recordable,
    check_unsealable,
    current_user,
    read_unsealings,
    record_unsealing,
    unseal,
    unsealings_path,
    unsealings_so_far,
)
from improve.evals.workspace import (
    CONFIG_NAME,
    PRODUCTION_DIR,
    Workspace,
    label_problem,
    policy_content,
    policy_hash,
    policy_label,
)

if TYPE_CHECKING:
    from improve.evals.charts import VersionScore, category_chart, history_chart, svg_chart
    from improve.evals.export import ExportSelection, OtlpExport, otlp_export, select_for_export
    from improve.evals.fact_check import (
        ReferenceCheck,
        mistyped_facts,
        mistyped_warnings,
        reference_check,
        reference_disagrees,
    )
    from improve.evals.ledger import OUTCOMES_SQL, Ledger, Production, Recorded
    from improve.evals.materialize import refresh_outcomes, score_threads
    from improve.evals.out_of_sample import (
        AgainstReference,
        OutOfSample,
        against_reference,
        check_out_of_sample,
    )
    from improve.evals.promotion import Check, PromotionDecision, decide, fixed_note, gain_phrase, p_value
    from improve.evals.report import describe_model, scorecard_markdown
    from improve.evals.reruns import Batch, RerunRule, Reruns, Settled, rerun_scenarios, settle
    from improve.evals.scorecards import (
        Comparison,
        Scorecard,
        compare,
        paired,
        scorecard,
        scorecard_from_json,
    )

# Scorecards, the promotion rule and reports need numpy, materializing outcomes needs
# DuckDB: each is imported when one of its names is first asked for, so a command that uses
# none of them starts without loading them.
_LAZY = {
    "VersionScore": "improve.evals.charts",
    "category_chart": "improve.evals.charts",
    "history_chart": "improve.evals.charts",
    "svg_chart": "improve.evals.charts",
    "Batch": "improve.evals.reruns",
    "RerunRule": "improve.evals.reruns",
    "Reruns": "improve.evals.reruns",
    "Settled": "improve.evals.reruns",
    "settle": "improve.evals.reruns",
    "rerun_scenarios": "improve.evals.reruns",
    "Comparison": "improve.evals.scorecards",
    "PromotionDecision": "improve.evals.promotion",
    "Check": "improve.evals.promotion",
    "Scorecard": "improve.evals.scorecards",
    "compare": "improve.evals.scorecards",
    "paired": "improve.evals.scorecards",
    "decide": "improve.evals.promotion",
    "p_value": "improve.evals.promotion",
    "gain_phrase": "improve.evals.promotion",
    "fixed_note": "improve.evals.promotion",
    "refresh_outcomes": "improve.evals.materialize",
    "ExportSelection": "improve.evals.export",
    "OtlpExport": "improve.evals.export",
    "otlp_export": "improve.evals.export",
    "select_for_export": "improve.evals.export",
    "score_threads": "improve.evals.materialize",
    "reference_disagrees": "improve.evals.fact_check",
    "mistyped_facts": "improve.evals.fact_check",
    "mistyped_warnings": "improve.evals.fact_check",
    "reference_check": "improve.evals.fact_check",
    "ReferenceCheck": "improve.evals.fact_check",
    "OutOfSample": "improve.evals.out_of_sample",
    "AgainstReference": "improve.evals.out_of_sample",
    "against_reference": "improve.evals.out_of_sample",
    "check_out_of_sample": "improve.evals.out_of_sample",
    "Ledger": "improve.evals.ledger",
    "Recorded": "improve.evals.ledger",
    "Production": "improve.evals.ledger",
    "OUTCOMES_SQL": "improve.evals.ledger",
    "scorecard": "improve.evals.scorecards",
    "scorecard_from_json": "improve.evals.scorecards",
    "describe_model": "improve.evals.report",
    "scorecard_markdown": "improve.evals.report",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "CONFIG_NAME",
    "OPEN_SPLITS",
    "OUTCOMES_SQL",
    "PRODUCTION_DIR",
    "SEALED_SPLIT",
    "SPLITS",
    "UNSEALINGS_FILE",
    "UNSEAL_HOW",
    "AgainstReference",
    "Agent",
    "Batch",
    "Check",
    "Comparison",
    "ExecutorChoice",
    "Expected",
    "ExportSelection",
    "Fallbacks",
    "Fanout",
    "HeldOutRead",
    "Ledger",
    "ModelGate",
    "OtlpExport",
    "OutOfSample",
    "OutcomeRow",
    "PlannedRun",
    "Production",
    "PromotionDecision",
    "Quarantined",
    "Recorded",
    "ReferenceCheck",
    "RerunRule",
    "Reruns",
    "ResumeRequest",
    "Scenario",
    "ScenarioSet",
    "Scorecard",
    "Settled",
    "Slots",
    "StartFrom",
    "SuiteSpec",
    "Unsealed",
    "UnsealedScore",
    "Unsealing",
    "VersionScore",
    "Workspace",
    "against_reference",
    "append_scenario",
    "bias_bound",
    "category_chart",
    "check_out_of_sample",
    "check_recordable",
    "check_unsealable",
    "compare",
    "compare_effects",
    "current_user",
    "decide",
    "deploy",
    "describe_model",
    "effects_from_log",
    "every",
    "fallbacks",
    "find_thread",
    "fixed_note",
    "gain_phrase",
    "history_chart",
    "label_problem",
    "leak_warnings",
    "load_scenarios",
    "mistyped_facts",
    "mistyped_warnings",
    "open_fanout",
    "otlp_export",
    "outcome_row",
    "p_value",
    "paired",
    "parse_executor",
    "policy_content",
    "policy_hash",
    "policy_label",
    "read_unsealings",
    "read_yaml",
    "record_unsealing",
    "recorded_with",
    "reference_check",
    "reference_disagrees",
    "refresh_outcomes",
    "rerun_scenarios",
    "resume_thread",
    "run_scenario",
    "run_suite",
    "scenario_from_thread",
    "scenario_lines",
    "scenario_yaml",
    "scenarios_needed",
    "score_threads",
    "scorecard",
    "scorecard_from_json",
    "scorecard_markdown",
    "select_for_export",
    "set_key",
    "settle",
    "split_warnings",
    "stale",
    "suite_spec",
    "supported_reads",
    "svg_chart",
    "thread_environment",
    "unseal",
    "unsealings_path",
    "unsealings_so_far",
    "valid_scenarios",
    "write_drafts",
    "write_threads",
]
