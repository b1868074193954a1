"""The improvement loop: diagnose the training failures, propose one change, gate it, replay it, apply
the promotion rule, record the round, and open a pull request a person reviews.

    >>> from improve.loop import RoundOptions, run_round
    >>> result = run_round(Workspace.find(), RoundOptions(policy="v3", k=3))
"""

from improve.loop.diagnose import Diagnosis, diagnose
from improve.loop.evidence import diagnose_train
from improve.loop.gates import (
    GATE_NAMES,
    GATES,
    EnvironmentGate,
    ExploreGate,
    Gate,
    GateContext,
    GateResult,
    Unparsed,
    gates_for,
    passed,
    run_gates,
)
from improve.loop.heldout import held_out_status
from improve.loop.history import Measured, measured_from_record, policy_history, read_entries
from improve.loop.inputs import Inputs, RoundOptions, RoundResult, locate, next_version, review_branch
from improve.loop.probes import probe_requests
from improve.loop.production import ProductionCluster, ProductionDiagnosis, diagnose_production
from improve.loop.proposers import PROPOSERS, Proposal, ProposalRequest, Proposer, ProposerSetup
from improve.loop.record import pr_body
from improve.loop.report_page import WrittenPage, find_round, write_round_page
from improve.loop.round import run_round, run_rounds

__all__ = [
    "GATES",
    "GATE_NAMES",
    "PROPOSERS",
    "Diagnosis",
    "EnvironmentGate",
    "ExploreGate",
    "Gate",
    "GateContext",
    "GateResult",
    "Inputs",
    "Measured",
    "ProductionCluster",
    "ProductionDiagnosis",
    "Proposal",
    "ProposalRequest",
    "Proposer",
    "ProposerSetup",
    "RoundOptions",
    "RoundResult",
    "Unparsed",
    "WrittenPage",
    "diagnose",
    "diagnose_production",
    "diagnose_train",
    "find_round",
    "gates_for",
    "held_out_status",
    "locate",
    "measured_from_record",
    "next_version",
    "passed",
    "policy_history",
    "pr_body",
    "probe_requests",
    "read_entries",
    "review_branch",
    "run_gates",
    "run_round",
    "run_rounds",
    "write_round_page",
]
