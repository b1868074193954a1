"""The improvement loop: diagnose the training failures, propose one change, gate it, replay it, apply
the promotion rule, record the round, and open a pull request a person reviews.

    >>> from improve.loop import RoundOptions, run_round
    >>> record = run_round(Workspace.find(), RoundOptions(policy="v3", k=3))

Each name is imported from its module when it is first asked for, so a command that needs the
CHANGELOG or a round's report does not load the proposers, the gates and what they import.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from improve.loop.branches import DiscardedBranch
    from improve.loop.changelog import Changelog, Entry, HeldOutStatus, Memory, policy_history
    from improve.loop.counterfactuals import Counterfactuals
    from improve.loop.diagnose import Diagnosis, diagnose
    from improve.loop.evidence import Evidence, TrainDiagnosis, diagnose_policy
    from improve.loop.gates import (
        GATE_NAMES,
        GATES,
        STATIC_GATES,
        EnvironmentGate,
        ExploreGate,
        Gate,
        GateContext,
        GateResult,
        NoveltyGate,
        Unparsed,
        gates_for,
        passed,
        run_gates,
        type_problems,
        vocabulary_problems,
    )
    from improve.loop.inputs import Inputs, RoundOptions, locate, review_branch
    from improve.loop.probes import probe_requests
    from improve.loop.production import ProductionCluster, ProductionDiagnosis, diagnose_production
    from improve.loop.proposers import PROPOSERS, Proposal, ProposalRequest, Proposer, ProposerSetup
    from improve.loop.render import pr_body, round_lines
    from improve.loop.report_page import WrittenPage, find_round, write_round_page
    from improve.loop.round import MAX_DISCARDED_IN_A_ROW, Round, round_failed, run_round, run_rounds
    from improve.loop.round_record import RoundRecord, read_round_record
    from improve.loop.score import ScoreRequest, Scores, score_policy

_MODULES = {
    "improve.loop.branches": ("DiscardedBranch",),
    "improve.loop.changelog": ("Changelog", "Entry", "HeldOutStatus", "Memory", "policy_history"),
    "improve.loop.counterfactuals": ("Counterfactuals",),
    "improve.loop.diagnose": ("Diagnosis", "diagnose"),
    "improve.loop.evidence": ("Evidence", "TrainDiagnosis", "diagnose_policy"),
    "improve.loop.gates": (
        "GATE_NAMES",
        "GATES",
        "STATIC_GATES",
        "EnvironmentGate",
        "ExploreGate",
        "Gate",
        "GateContext",
        "GateResult",
        "NoveltyGate",
        "Unparsed",
        "gates_for",
        "passed",
        "run_gates",
        "type_problems",
        "type_problems",
        "vocabulary_problems",
    ),
    "improve.loop.inputs": ("Inputs", "RoundOptions", "locate", "review_branch"),
    "improve.loop.probes": ("probe_requests",),
    "improve.loop.production": ("ProductionCluster", "ProductionDiagnosis", "diagnose_production"),
    "improve.loop.proposers": ("PROPOSERS", "Proposal", "ProposalRequest", "Proposer", "ProposerSetup"),
    "improve.loop.render": ("pr_body", "round_lines"),
    "improve.loop.report_page": ("WrittenPage", "find_round", "write_round_page"),
    "improve.loop.round": ("MAX_DISCARDED_IN_A_ROW", "Round", "round_failed", "run_round", "run_rounds"),
    "improve.loop.round_record": ("RoundRecord", "read_round_record"),
    "improve.loop.score": ("ScoreRequest", "Scores", "score_policy"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "GATES",
    "GATE_NAMES",
    "MAX_DISCARDED_IN_A_ROW",
    "PROPOSERS",
    "STATIC_GATES",
    "Changelog",
    "Counterfactuals",
    "Diagnosis",
    "DiscardedBranch",
    "Entry",
    "EnvironmentGate",
    "Evidence",
    "ExploreGate",
    "Gate",
    "GateContext",
    "GateResult",
    "HeldOutStatus",
    "Inputs",
    "Memory",
    "NoveltyGate",
    "ProductionCluster",
    "ProductionDiagnosis",
    "Proposal",
    "ProposalRequest",
    "Proposer",
    "ProposerSetup",
    "Round",
    "RoundOptions",
    "RoundRecord",
    "ScoreRequest",
    "Scores",
    "TrainDiagnosis",
    "Unparsed",
    "WrittenPage",
    "diagnose",
    "diagnose_policy",
    "diagnose_production",
    "find_round",
    "gates_for",
    "locate",
    "passed",
    "policy_history",
    "pr_body",
    "probe_requests",
    "read_round_record",
    "review_branch",
    "round_failed",
    "round_lines",
    "run_gates",
    "run_round",
    "run_rounds",
    "score_policy",
    "type_problems",
    "vocabulary_problems",
    "write_round_page",
]
