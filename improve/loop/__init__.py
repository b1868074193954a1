"""The improvement loop: diagnose the training failures, propose one change, gate it, replay it, apply
the promotion rule, record the round, and open a pull request a person reviews.

    >>> from improve.loop import RoundOptions, run_round
    >>> record = run_round(Workspace.find(), RoundOptions(policy="v3", k=3))
"""

from improve.loop.changelog import Changelog, DiscardedBranch, Entry, HeldOutStatus, policy_history
from improve.loop.diagnose import Diagnosis, diagnose
from improve.loop.evidence import Evidence
from improve.loop.gates import (
    GATE_NAMES,
    GATES,
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
)
from improve.loop.inputs import Inputs, RoundOptions, locate, review_branch
from improve.loop.probes import probe_requests
from improve.loop.production import ProductionCluster, ProductionDiagnosis, diagnose_production
from improve.loop.proposers import PROPOSERS, Proposal, ProposalRequest, Proposer, ProposerSetup
from improve.loop.render import pr_body, round_lines
from improve.loop.report_page import WrittenPage, find_round, write_round_page
from improve.loop.round import Round, run_round, run_rounds
from improve.loop.round_record import RoundRecord, read_round_record

__all__ = [
    "GATES",
    "GATE_NAMES",
    "PROPOSERS",
    "Changelog",
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
    "Unparsed",
    "WrittenPage",
    "diagnose",
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
    "round_lines",
    "run_gates",
    "run_round",
    "run_rounds",
    "write_round_page",
]
