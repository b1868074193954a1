"""Running a policy: a JSON machine that answers an environment's decision requests.

The policy's input is the request (`name`, `options`, `facts`, `attempts`, ...); `facts` is also bound
as a variable. Its states are `choice` branches, `model.decide` invokes (a model ref such as
`decider` picks among the offered options) and finals whose `output` is the chosen event. A policy is
data: the interpreter folds it like any machine; nothing in it is ever executed as code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from improve.errors import MachineError, RunError, WorkspaceError
from improve.machine import (
    DONE_EVENT,
    ERROR_EVENT,
    Machine,
    MachineConfig,
    compile_machine,
    initial,
    parse_machine,
    transition,
)
from improve.runtime.decision import Decision, DecisionRequest, Usage
from improve.runtime.models import Model, ModelCallError

MODEL_DECIDE = "model.decide"
"""The invoke source of a model request inside a policy; its input names the model ref."""
DEFAULT_MODEL_REF = "decider"
MAX_POLICY_STEPS = 50


def load_json(path: Path) -> Any:
    """Read a JSON document; a syntax error names the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkspaceError(f"{path}: no such file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise WorkspaceError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None


def load_policy(path: Path) -> MachineConfig:
    return parse_machine(load_json(path), source=str(path))


def compile_policy(config: MachineConfig, judgments: Mapping[str, Any] | None = None) -> Machine:
    return compile_machine(config, actors={MODEL_DECIDE, *(judgments or {})})


class PolicyDecider:
    """Answers decision requests by folding the policy machine, calling models where it invokes them."""

    def __init__(self, policy: Machine, models: Mapping[str, Model]) -> None:
        self.policy = policy
        self.models = dict(models)

    def decide(self, request: DecisionRequest) -> Decision:
        usage: list[Usage] = []
        try:
            snapshot = initial(self.policy, request.to_input())
            for _ in range(MAX_POLICY_STEPS):
                if snapshot.status != "active":
                    break
                invocation = snapshot.invoke
                if invocation is None:
                    raise RunError(
                        f"policy {self.policy.id}@{self.policy.version} stopped in state "
                        f"'{snapshot.value}', which neither decides nor invokes anything"
                    )
                if invocation.src != MODEL_DECIDE:
                    raise RunError(f"policy actor '{invocation.src}' has no implementation in this runtime")
                ref = str((invocation.input or {}).get("model", DEFAULT_MODEL_REF))
                model = self.models.get(ref)
                if model is None:
                    raise RunError(
                        f"policy {self.policy.id}@{self.policy.version} asks model ref '{ref}', which is not "
                        f"bound; bound refs are {sorted(self.models)} (bind it with --model)"
                    )
                try:
                    reply = model.answer(request)
                    usage.append(Usage(ref, model.name, reply.input_tokens, reply.output_tokens))
                    event: dict[str, Any] = {
                        "type": DONE_EVENT,
                        "actorId": invocation.id,
                        "output": reply.event,
                    }
                except ModelCallError as err:
                    event = {"type": ERROR_EVENT, "actorId": invocation.id, "error": {"message": str(err)}}
                snapshot = transition(self.policy, snapshot, event)
        except MachineError as err:
            # A policy that fails to evaluate gives no answer; the environment records the attempt.
            return Decision(event=None, usage=usage, source=f"policy-error: {err}")
        if snapshot.status != "done" or not isinstance(snapshot.output, dict):
            return Decision(event=None, usage=usage, source=f"policy:{snapshot.value}")
        return Decision(event=dict(snapshot.output), usage=usage, source=f"policy:{snapshot.value}")
