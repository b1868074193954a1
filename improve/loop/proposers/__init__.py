"""Proposers: given the diagnosis, one small change to the policy.

Two implementations: `rules` (the built-in rule miner, no model needed) and `openai` (any
OpenAI-compatible endpoint). A proposer returns the candidate as data (a JSON document), never code;
on a failing gate it is asked to repair its candidate with the gate's detail, at most three times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from improve.loop.gates import GateResult
from improve.machine import MachineConfig
from improve.runtime.vocabulary import Vocabulary


@dataclass(frozen=True)
class ProposalRequest:
    """Everything a proposer may read. Held-out results are deliberately absent."""

    environment: str
    goal: str
    """The environment's description: its goal with measurable success criteria."""
    policy: MachineConfig
    """The current policy; the candidate keeps its `id` and `description` and bumps `version`."""
    new_version: str
    vocabulary: Vocabulary
    objective: dict[str, Any]
    """The objective on train: pass rate, violations, cost, k."""
    diagnosis: dict[str, Any]
    """The chosen cluster and its hypothesis (see loop/diagnose.py), with evidence thread ids."""
    examples: list[dict[str, Any]] = field(default_factory=list)
    """Training decisions of the cluster: facts, options, what was answered, what the labels imply."""


@dataclass(frozen=True)
class Proposal:
    document: Any
    """The candidate policy as decoded JSON (validated by the gates, never executed)."""
    rationale: str
    """One paragraph: what changed and why."""
    proposer: str
    calls: int = 0
    """Model calls the proposer made (0 for the rule miner)."""


class Proposer(Protocol):
    name: str

    def propose(self, request: ProposalRequest) -> Proposal:
        """One small change addressing the diagnosis."""
        ...

    def repair(self, request: ProposalRequest, previous: Proposal, failure: GateResult) -> Proposal:
        """The same change, fixed so the failing gate passes (its detail says what and where)."""
        ...


class ProposalError(Exception):
    """The proposer could not produce a candidate (no rule separates the cases, the endpoint failed)."""
