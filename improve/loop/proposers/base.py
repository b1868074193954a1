"""What a proposer is: what it may read (`ProposalRequest`), what it returns (`Proposal`), what it is
made from for a round (`ProposerSetup`), and the `Proposer` protocol itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from improve.evals import Scenario
from improve.llm import ModelSpec
from improve.loop.gates import GateResult
from improve.machine import MachineConfig
from improve.runtime import Environment, Vocabulary


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
    discarded: list[dict[str, str]] = field(default_factory=list)
    """Branches already discarded against this policy (its CHANGELOG): `guard` and `answer` (as
    `EVENT{field: source}`), and the `round` that discarded them. Proposing one again wastes a round."""
    narrower: list[dict[str, str]] = field(default_factory=list)
    """When the cluster's candidate was discarded for reaching too far: its branches (`guard`,
    `answer`, the `candidate` version and its `round`). A rule for the cluster must then answer what one
    of them answered, on strictly fewer training decisions; or, after those, on other training decisions
    than they did (another cause: the novelty gate refuses it where it answers held-out decisions as the
    discarded one did)."""
    broader: list[dict[str, str]] = field(default_factory=list)
    """When the cluster's candidate was discarded for gaining too little: its branches, as `narrower`.
    A rule for the cluster may then reach as far as its evidence allows: its thresholds at the edge of
    the training decisions answered otherwise, not of its right answers."""
    behind: list[dict[str, str]] = field(default_factory=list)
    """Branches of candidates discarded for reaching too far that are tried again behind the policy's
    branches (`Round._renew`), as `narrower`: a rule with one of their answers goes behind every branch
    there, not in front of a less safe one, where held-out decisions showed them answering rightly."""


@dataclass(frozen=True)
class Proposal:
    document: Any
    """The candidate policy as decoded JSON (validated by the gates, never executed)."""
    rationale: str
    """One paragraph: what changed and why."""
    proposer: str
    calls: int = 0
    """Model calls the proposer made (0 for the rule miner)."""
    notes: tuple[str, ...] = ()
    """What the round should say about how it was asked: a refused response format, a request trimmed
    to fit the model's context."""


class Proposer(Protocol):
    name: str

    def propose(self, request: ProposalRequest) -> Proposal:
        """One small change addressing the diagnosis."""
        ...

    def repair(self, request: ProposalRequest, previous: Proposal, failure: GateResult) -> Proposal:
        """The same change, fixed so the failing gate passes (its detail says what and where)."""
        ...


@dataclass(frozen=True)
class ProposerSetup:
    """What a proposer is made from, once per round (a proposer keeps state across repairs)."""

    environment: Environment
    scenarios: Sequence[Scenario]
    """Every scenario of the workspace: what the overfit gate guards against (a proposer must not
    read held-out outcomes; none are here)."""
    root: Path
    """The workspace root: where a proposer may keep a cache (`.improve/`)."""
    model: str | None = None
    """The proposer's own model, for a proposer that asks one (`--proposer-model`)."""
    base_url: str | None = None
    """Its OpenAI-compatible endpoint (`--base-url`; None: the model's, else the provider's default)."""
    model_spec: ModelSpec | None = None
    """The proposer model's `[models.NAME]` of improve.toml when `model` names one: its endpoint, key,
    timeout and context window."""
    cache: Literal["live", "record", "replay"] = "record"
    """How its model calls are cached (`--cache`)."""


ProposerFactory = Callable[[ProposerSetup], Proposer]
"""How a proposer is registered: a callable taking the setup (a class whose `__init__` takes it works)."""
