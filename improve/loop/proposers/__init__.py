"""Proposers: given the diagnosis, one small change to the policy.

Bundled: `rules` (the rule miner, no model needed) and `openai` (any OpenAI-compatible endpoint);
others register by name (see `registry.py`). A proposer returns the candidate as data (a JSON
document), never code; on a failing gate it is asked to repair its candidate with the gate's detail,
at most three times.
"""

from improve.errors import ProposalError
from improve.loop.proposers.base import Proposal, ProposalRequest, Proposer, ProposerFactory, ProposerSetup
from improve.loop.proposers.registry import PROPOSERS, make_proposer

__all__ = [
    "PROPOSERS",
    "Proposal",
    "ProposalError",
    "ProposalRequest",
    "Proposer",
    "ProposerFactory",
    "ProposerSetup",
    "make_proposer",
]
