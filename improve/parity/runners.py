"""The two sides of a comparison: a policy, or a `module:function` runner, and what a run returns.

Each side is a **runner**: `runner(env_name, scenario, model) -> ParityRun`. A policy version or file
is a built-in runner (`PolicyRunner`: the environment's machine with that policy, a fresh stand-in
model per run); anything else, such as an old hand-written agent loop, is a `module:function` with
the same signature (`improve.examples.refunds.legacy:run` is the worked example). A runner must be
deterministic: it makes its model with `new_model`, seeded by the scenario id exactly as the first
run of `improve run` is, so both sides see the same model answers for the same requests.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from improve.errors import EndpointError, WorkspaceError
from improve.evals import (
    ModelGate,
    OutcomeRow,
    Scenario,
    SuiteSpec,
    Workspace,
    policy_failure,
    policy_hash,
    run_suite,
)
from improve.llm import CacheMode
from improve.log import LogEntry, MemoryStore
from improve.machine import MachineConfig
from improve.runtime import DEFAULT_MAX_MODEL_CALLS, Environment, EnvironmentRef, Model, compile_policy


@dataclass(frozen=True)
class ParityRun:
    """What one run did, as parity compares it. Effects are the world's receipts, not the agent's report."""

    final_state: str
    effects: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    guard_refusals: int = 0
    """Answers the guards had to refuse (`rejected-by-guard` attempts)."""
    status: str = "done"
    policy_error: str | None = None
    """Where the policy itself raised instead of answering (a guard that fails on this run's facts), in
    words; the run went on by the decision's onError, so what follows is not a decision of the policy."""

    @property
    def rule_breaks(self) -> int:
        return len(self.violations) + self.guard_refusals

    def to_json(self) -> dict[str, Any]:
        return {
            "final_state": self.final_state,
            "status": self.status,
            "effects": self.effects,
            "violations": self.violations,
            "guard_refusals": self.guard_refusals,
            "rule_breaks": self.rule_breaks,
            "policy_error": self.policy_error,
        }


Runner = Callable[[str, Scenario, str], ParityRun]
"""`runner(env_name, scenario, model) -> ParityRun`: run `scenario` once with a fresh stand-in `model`
(`new_model`), deterministically."""


def model_seed(scenario: Scenario) -> str:
    """The seed of a parity run's model: the scenario id, as in `improve run`'s first run."""
    return f"{scenario.id}:r1"


def new_model(env: Environment, model: str, scenario: Scenario) -> Model:
    """A fresh stand-in model for one run of `scenario`, seeded by its id."""
    if model not in env.models:
        raise WorkspaceError(
            f"environment {env.name} has no model {model!r}; its stand-in models are {sorted(env.models)}"
        )
    return env.models[model](model_seed(scenario))


def _from_row(row: OutcomeRow, entries: Sequence[LogEntry]) -> ParityRun:
    """A scored thread as parity compares it; guard refusals are counted from the journaled attempts."""
    refusals = sum(
        1 for entry in entries for attempt in entry.attempts or () if attempt.kind == "rejected-by-guard"
    )
    return ParityRun(
        final_state=row.final_state,
        effects=row.effects,
        violations=row.violations,
        guard_refusals=refusals,
        status=row.status,
        policy_error=policy_failure(entries),
    )


class PolicyRunner:
    """The built-in runner: the environment's machine deciding with a policy, journaled in memory."""

    def __init__(
        self,
        env: Environment,
        policy: MachineConfig,
        max_model_calls: int = DEFAULT_MAX_MODEL_CALLS,
        workspace: Workspace | None = None,
        cache: CacheMode = "record",
    ) -> None:
        compile_policy(policy, env.judgments, env.policy_guards)  # a bad policy is refused up front
        self.env = env
        self.policy = policy
        self.max_model_calls = max_model_calls
        self.workspace = workspace
        """Resolves a model behind an endpoint (`openai:MODEL`, `[models.NAME]`); None: stand-ins only."""
        self.cache = cache
        self.gate: ModelGate | None = None
        """A model's cap shared by the workers of a cluster (set in a worker); None: this process's own."""

    def __getstate__(self) -> dict[str, Any]:
        # A worker of a cluster loads the environment again by its registered name.
        return {**self.__dict__, "env": self.env.ref or EnvironmentRef(self.env.name)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({**state, "env": state["env"].shared()})

    def __call__(self, env_name: str, scenario: Scenario, model: str) -> ParityRun:
        if env_name != self.env.name:
            raise WorkspaceError(f"this policy runner drives {self.env.name}, not {env_name}")
        store = MemoryStore()
        space = self.workspace
        spec = SuiteSpec(
            policy=self.policy,
            model=model,
            k=1,
            max_model_calls=self.max_model_calls,
            model_spec=space.model_spec(model, self.env) if space is not None else None,
            cache_dir=str(space.cache_dir) if space is not None else None,
            cache_mode=self.cache,
            asks=space.asks if space is not None else None,
        )
        # run_suite seeds the model with `scenario:r1`, the same seed as `model_seed`.
        models = spec.model_factory(self.env, gate=self.gate)
        [row] = run_suite(self.env, [scenario], spec, store, fresh=True, models=models)
        if row.fallbacks:
            # The policy's onError answered for the endpoint: an outcome of the endpoint, not of the policy.
            raise EndpointError(
                f"policy {self.policy.version} on scenario {scenario.id} with model {model}: {row.fallbacks} of "
                f"{row.decisions} decisions fell back to the policy's onError: {row.fallback_reason}. Parity "
                "compares what policies do, so nothing is compared: fix the endpoint and run it again"
            )
        return _from_row(row, store.read(row.thread_id))


@dataclass(frozen=True)
class Side:
    """One side of a comparison: what the user named, and the runner behind it."""

    ref: str
    kind: Literal["policy", "runner"]
    description: str
    runner: Runner


RUNNER_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z")


def load_runner(spec: str, search_path: Path | None = None) -> Runner:
    """Import `module:function`. Runners are people's code (trusted, like an environment or a test);
    policies are never imported. `search_path` (the workspace) is tried after the installed packages."""
    if not RUNNER_SPEC.match(spec):
        raise WorkspaceError(
            f"bad runner spec {spec!r}: expected module:function, e.g. improve.examples.refunds.legacy:run"
        )
    module_name, _, attr = spec.partition(":")
    if search_path is not None and str(search_path) not in sys.path:
        sys.path.append(str(search_path))
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # people's code: a syntax error or a crash on import is theirs to fix
        raise WorkspaceError(f"bad runner spec {spec!r}: cannot import {module_name}: {err}") from None
    runner = getattr(module, attr, None)
    if runner is None or not callable(runner):
        raise WorkspaceError(f"bad runner spec {spec!r}: {module_name} has no function {attr!r}")
    result: Runner = runner
    return result


def names_a_runner(ref: str) -> bool:
    """Whether a side as named is a `module:function` runner; else it is a policy (`v3`, a `.json` path)."""
    looks_like_path = ref.endswith(".json") or "/" in ref or "\\" in ref
    return ":" in ref and not looks_like_path


def resolve_side(
    workspace: Workspace,
    env: Environment,
    ref: str,
    max_model_calls: int = DEFAULT_MAX_MODEL_CALLS,
    cache: CacheMode = "record",
) -> Side:
    """`v3` or a `.json` path is a policy; `module:function` is a runner."""
    if names_a_runner(ref):
        return Side(ref, "runner", f"runner {ref}", load_runner(ref, workspace.root))
    policy = workspace.load_policy(env.name, ref)
    description = f"policy {policy.id}@{policy.version} ({policy_hash(policy)})"
    return Side(ref, "policy", description, PolicyRunner(env, policy, max_model_calls, workspace, cache))
