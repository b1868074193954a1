"""Proposers by name: `rules` and `openai` bundled, others from installed packages (entry points in
the group `improve.proposers`) or the workspace (`[proposers.NAME] module = "package.module:Factory"`).

A proposer is registered as a factory: a callable taking a `ProposerSetup` and returning a `Proposer`,
made once per round (it may keep state across repairs, like the rule miner's ranked candidates).
"""

from __future__ import annotations

from improve.errors import ProposalError, WorkspaceError
from improve.evals import Workspace
from improve.loop.branches import answer_rank
from improve.loop.proposers.base import Proposer, ProposerFactory, ProposerSetup
from improve.loop.proposers.rules import RuleMinerProposer
from improve.machine import DECIDE_SRC, MachineConfig, compared, literals, related
from improve.registry import Registry
from improve.runtime import vocabulary


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
    values) preferred, each threshold for the facts the machine compares it with (`thresholds`), the
    facts it measures in one unit (`units`), and each answer ranked by how safe its outcomes are, for
    placing a branch."""
    env = setup.environment
    constants = [c.value for c in literals(env.config)]
    ranks = {event: answer_rank(env, event) for event in vocabulary(env).events}
    return RuleMinerProposer(
        constants=constants, ranks=ranks, thresholds=thresholds(env.config), units=units(env.config)
    )


def thresholds(config: MachineConfig) -> dict[str, frozenset[float]]:
    """Each decision fact's own thresholds: the numbers the machine's expressions compare the value it
    is read from with (`context.order.deliveredDaysAgo <= 30` makes 30 a threshold of
    `facts.order.deliveredDaysAgo` wherever a decision reads that fact from it, or from
    `context.order`). A constant is the environment's rule about the values it is compared with; about
    any other fact it is one number among many."""
    sources = _sources(config)
    found: dict[str, set[float]] = {}
    for comparison in compared(config):
        for path in _read_from(sources, comparison.operand):
            found.setdefault(path, set()).add(comparison.value)
    return {path: frozenset(values) for path, values in found.items()}


def units(config: MachineConfig) -> dict[str, str]:
    """The units the machine itself shows its decision facts in: two facts read from values its
    expressions compare or add or subtract (`context.amount - context.policy.deductible`,
    `context.rx.daysSinceFill < context.rx.daysSupply`) measure one thing, and so does every fact
    joined to them that way. Each such class of facts is one unit, named after its first fact; the
    facts a decision declares a unit for (`"int:days"`) keep theirs (`RuleMinerProposer`)."""
    sources = _sources(config)
    parent: dict[str, str] = {}

    def root(path: str) -> str:
        while parent.get(path, path) != path:
            path = parent[path]
        return path

    for left, right in related(config):
        for a in _read_from(sources, left):
            for b in _read_from(sources, right):
                ra, rb = root(a), root(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    return {path: f"as {root(path)}" for path in parent.keys() | set(parent.values())}


def _sources(config: MachineConfig) -> dict[str, set[str]]:
    """Each selection a decision reads a fact from -> the fact paths read from it."""
    sources: dict[str, set[str]] = {}
    for state in config.states.values():
        if state.invoke is None or state.invoke.src != DECIDE_SRC or not isinstance(state.invoke.input, dict):
            continue
        for path, source in _facts(state.invoke.input.get("facts") or {}, "facts"):
            sources.setdefault(source.strip(), set()).add(path)
    return sources


def _read_from(sources: dict[str, set[str]], operand: str) -> list[str]:
    """The fact paths holding the value at `operand`: read from it, or from a selection it lies under
    (`context.order` read as `facts.order` holds `context.order.total` at `facts.order.total`)."""
    return [
        path + operand[len(source) :]
        for source, paths in sources.items()
        if operand == source or operand.startswith(source + ".")
        for path in paths
    ]


def _facts(tree: object, prefix: str) -> list[tuple[str, str]]:
    """A decision's facts as (fact path, the expression it is read from)."""
    if isinstance(tree, dict):
        return [pair for key, sub in tree.items() for pair in _facts(sub, f"{prefix}.{key}")]
    return [(prefix, tree)] if isinstance(tree, str) else []


def openai_proposer(setup: ProposerSetup) -> Proposer:
    """A model behind an OpenAI-compatible endpoint, every call cached under `.improve/`."""
    # Imported here: the openai SDK is loaded only by the rounds that ask a model.
    from improve.llm import CACHE_DIR, ResponseCache
    from improve.loop.proposers.openai import OpenAIProposer

    if not setup.model:
        raise WorkspaceError(
            "--proposer openai needs --proposer-model (and --base-url for a non-OpenAI endpoint)"
        )
    cache = ResponseCache(setup.root / CACHE_DIR, setup.cache, miss=ProposalError)
    spec = setup.model_spec
    if spec is None:
        return OpenAIProposer(model=setup.model, base_url=setup.base_url, cache=cache)
    return OpenAIProposer(
        model=spec.model,
        base_url=setup.base_url or spec.endpoint(),
        api_key=spec.api_key(),
        cache=cache,
        temperature=spec.temperature,
        timeout=max(spec.timeout_s, 120.0),  # a whole policy takes longer to write than one decision
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
