"""Proposers by name: `rules` and `openai` bundled, others from installed packages (entry points in
the group `improve.proposers`) or the workspace (`[proposers.NAME] module = "package.module:Factory"`).

A proposer is registered as a factory: a callable taking a `ProposerSetup` and returning a `Proposer`,
made once per round (it may keep state across repairs, like the rule miner's ranked candidates).
"""

from __future__ import annotations

import os

from improve.errors import WorkspaceError
from improve.evals import Workspace
from improve.llm import API_KEY_ENV
from improve.loop.branches import answer_rank
from improve.loop.proposers.base import Proposer, ProposerFactory, ProposerSetup
from improve.loop.proposers.rules import RuleMinerProposer
from improve.machine import MachineConfig, compared, literals
from improve.registry import Registry
from improve.runtime import decision_sources, read_from, vocabulary


def _factory(target: object, where: str) -> ProposerFactory:
    if not callable(target):
        raise WorkspaceError(
            f"{where}: is {type(target).__name__}; a proposer is registered as a callable taking a "
            "ProposerSetup and returning a Proposer (a class whose __init__ takes the setup works)"
        )
    factory: ProposerFactory = target
    return factory


def rule_miner(setup: ProposerSetup) -> Proposer:
    """The built-in rule miner: the environment's own constants (rule thresholds, enumerated payload
    values) preferred, each threshold for the facts the machine compares it with (`thresholds`), and
    each answer ranked by how safe its outcomes are, for placing a branch."""
    env = setup.environment
    constants = [c.value for c in literals(env.config)]
    ranks = {event: answer_rank(env, event) for event in vocabulary(env).events}
    return RuleMinerProposer(constants=constants, ranks=ranks, thresholds=thresholds(env.config))


def thresholds(config: MachineConfig) -> dict[str, frozenset[float]]:
    """Each decision fact's own thresholds: the numbers the machine's expressions compare the value it
    is read from with (`context.order.deliveredDaysAgo <= 30` makes 30 a threshold of
    `facts.order.deliveredDaysAgo` wherever a decision reads that fact from it, or from
    `context.order`). A constant is the environment's rule about the values it is compared with; about
    any other fact it is one number among many."""
    sources: dict[str, set[str]] = {}
    for read in decision_sources(config).values():
        for source, paths in read.items():
            sources.setdefault(source, set()).update(paths)
    found: dict[str, set[float]] = {}
    for comparison in compared(config):
        for path in read_from(sources, comparison.operand):
            found.setdefault(path, set()).add(comparison.value)
    return {path: frozenset(values) for path, values in found.items()}


def openai_proposer(setup: ProposerSetup) -> Proposer:
    """A model behind an OpenAI-compatible endpoint, every call cached under `.improve/`."""
    # Imported here: the openai SDK is loaded only by the rounds that ask a model.
    from improve.llm import CACHE_DIR, ResponseCache
    from improve.loop.proposers.openai import OpenAIProposer

    if not setup.model:
        raise WorkspaceError(
            "--proposer openai needs --proposer-model (and --base-url for a non-OpenAI endpoint)"
        )
    # A reply the recording does not hold is data missing, as for a decider (`ReplayMissError`, exit 3),
    # not a proposal the proposer failed to make: that was recorded as a discarded candidate.
    cache = ResponseCache(setup.root / CACHE_DIR, setup.cache)
    spec = setup.model_spec
    key = (spec.api_key() if spec is not None else None) or os.environ.get(API_KEY_ENV)
    if not key and setup.cache != "replay":
        raise WorkspaceError(
            f"the openai proposer has no API key for {setup.model!r}: set {API_KEY_ENV}, or api_key_env in "
            f"[models.{setup.model}] (any non-empty value for a local endpoint that needs none), or replay "
            "recorded responses (--cache replay)"
        )
    if spec is None:
        return OpenAIProposer(model=setup.model, base_url=setup.base_url, cache=cache)
    return OpenAIProposer(
        model=spec.model,
        base_url=setup.base_url or spec.endpoint(),
        api_key=spec.api_key(),
        cache=cache,
        temperature=spec.temperature,
        # A whole policy takes longer to write than one decision: at least 120 s, unless the workspace
        # set the model's timeout_s itself.
        timeout=spec.timeout_s if "timeout_s" in spec.model_fields_set else max(spec.timeout_s, 120.0),
        max_retries=spec.max_retries,
        context_tokens=spec.context_tokens,
    )


PROPOSERS: Registry[ProposerFactory] = Registry("proposers", _factory)
PROPOSERS.bundle("rules", rule_miner)
PROPOSERS.bundle("openai", openai_proposer)


def make_proposer(name: str, setup: ProposerSetup, workspace: Workspace | None = None) -> Proposer:
    """The proposer registered as `name`, made for this round."""
    local = workspace.specs("proposers") if workspace is not None else {}
    factory = PROPOSERS.load(name, local, workspace.root if workspace is not None else None)
    proposer = factory(setup)
    if not callable(getattr(proposer, "propose", None)) or not callable(getattr(proposer, "repair", None)):
        raise WorkspaceError(
            f"proposer {name!r} made {type(proposer).__name__}, which lacks propose(request) and "
            "repair(request, previous, failure)"
        )
    return proposer
