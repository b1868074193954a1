"""Running a policy: a JSON machine that answers an environment's decision requests.

The policy's input is the request (`name`, `options`, `facts`, `attempts`, ...); `facts` is also bound
as a variable. Its states are `choice` branches, `model.decide` invokes (a model ref such as
`decider` picks among the offered options) and finals whose `output` is the chosen event. A policy is
data: the interpreter folds it like any machine; nothing in it is ever executed as code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from improve.errors import (
    ConfigError,
    ImproveError,
    MachineError,
    ModelAnswerError,
    ModelCallError,
    RunError,
    WorkspaceError,
)
from improve.machine import (
    DONE_EVENT,
    ERROR_EVENT,
    GuardFn,
    Invocation,
    Machine,
    MachineConfig,
    compile_expr,
    compile_machine,
    expressions,
    initial,
    json_lines,
    json_syntax_error,
    line_of,
    loads_document,
    parse_json_path,
    parse_machine,
    transition,
)
from improve.machine import MODEL_DECIDE as MODEL_DECIDE
from improve.runtime.decision import POLICY_ERROR, Decision, DecisionRequest, Usage, asked_digest
from improve.runtime.judgment import Judgment, ModelJudgment
from improve.runtime.models import Model, ModelReply

DEFAULT_MODEL_REF = "decider"
MAX_POLICY_STEPS = 50


def read_document_text(path: Path, what: str = "JSON document") -> str:
    """A document's text, or a `WorkspaceError` that names the file and why it is not one: missing, a
    directory (or a FIFO, a device: reading those could block forever), unreadable, or not UTF-8. A
    leading UTF-8 byte-order mark is dropped, as editors on some systems write one."""
    if not path.exists():
        raise WorkspaceError(f"{path}: no such file")
    if path.is_dir():
        raise WorkspaceError(f"{path}: is a directory, not a {what}: give the .json file inside it")
    if not path.is_file():
        raise WorkspaceError(f"{path}: not a regular file, so not a {what}: give a .json file")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise WorkspaceError(f"{path}: cannot be read ({error.strerror}): check its permissions") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise WorkspaceError(
            f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}): a {what} is "
            "a UTF-8 JSON file; is this the file you meant?"
        ) from None


def load_json(path: Path, what: str = "JSON document") -> Any:
    """Read a JSON document; a syntax error names the file, line and column, and a document nested
    deeper than `MAX_DEPTH` is refused (improve.machine.config says why)."""
    return load_json_text(path, what)[1]


def load_json_text(path: Path, what: str = "JSON document") -> tuple[str, Any]:
    """`load_json`, with the text it was decoded from: for errors that name a JSON path to give its line."""
    text = read_document_text(path, what)
    try:
        return text, loads_document(text, source=str(path))
    except json.JSONDecodeError as err:
        raise WorkspaceError(json_syntax_error(str(path), err)) from None


def load_policy(path: Path) -> MachineConfig:
    """A policy file, validated; a CEL typo in it is said with the file, the line and the JSON path (it
    was said by state alone, after `run` had warned and started)."""
    text, data = load_json_text(path, "policy")
    config = parse_machine(data, source=str(path), text=text)
    problems = syntax_problems(config)
    if problems:
        raise located(path, text, problems)
    return config


def syntax_problems(config: MachineConfig) -> list[tuple[str, str]]:
    """(JSON path, what is wrong) for each expression of `config` that does not parse as CEL."""
    problems: list[tuple[str, str]] = []
    for expr in expressions(config):
        try:
            compile_expr(expr.source, expr.path)
        except ImproveError as err:
            problems.append((expr.path, str(err).removeprefix(f"{expr.path}: ")))
    return problems


def located(path: Path, text: str, problems: list[tuple[str, str]]) -> ConfigError:
    """Every problem of a JSON file at once, `file:line: $.path: what`, in the order of its lines (one
    line's problems in the order found), so one edit fixes them all."""
    lines = json_lines(text)
    found = [(line_of(lines, parse_json_path(where)), where, what) for where, what in problems]
    found.sort(key=lambda one: one[0] or 0)
    return ConfigError(
        "\n".join(f"{path}{f':{line}' if line else ''}: {where}: {what}" for line, where, what in found)
    )


def compile_policy(
    config: MachineConfig,
    judgments: Mapping[str, Any] | None = None,
    guards: Mapping[str, GuardFn] | None = None,
) -> Machine:
    """Compile a policy against what its environment offers: judgment actors and exported guards."""
    return compile_machine(config, guards=guards, actors={MODEL_DECIDE, *(judgments or {})})


class PolicyDecider:
    """Answers decision requests by folding the policy machine, calling models where it invokes them."""

    def __init__(
        self, policy: Machine, models: Mapping[str, Model], judgments: Mapping[str, Judgment] | None = None
    ) -> None:
        self.policy = policy
        self.models = dict(models)
        self.judgments = dict(judgments or {})

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
                snapshot = transition(self.policy, snapshot, self._call(invocation, request, usage))
        except MachineError as err:
            # A policy that fails to evaluate gives no answer; the environment records the attempt.
            return Decision(event=None, usage=usage, source=f"{POLICY_ERROR}{err}")
        if snapshot.status != "done" or not isinstance(snapshot.output, dict):
            return Decision(event=None, usage=usage, source=f"policy:{snapshot.value}")
        return Decision(event=dict(snapshot.output), usage=usage, source=f"policy:{snapshot.value}")

    def _call(self, invocation: Invocation, request: DecisionRequest, usage: list[Usage]) -> dict[str, Any]:
        """Run the actor a policy state invokes; its answer (or failure) as the event for the policy."""
        done: dict[str, Any] = {"type": DONE_EVENT, "actorId": invocation.id}
        failed: dict[str, Any] = {"type": ERROR_EVENT, "actorId": invocation.id}
        if invocation.src != MODEL_DECIDE:
            judgment = self.judgments.get(invocation.src)
            if judgment is None:
                raise RunError(f"policy actor '{invocation.src}' is not a judgment of this environment")
            decider = self.models.get(DEFAULT_MODEL_REF)
            judge = getattr(decider, "judge", None)
            if isinstance(judgment, ModelJudgment) and decider is not None and judge is not None:
                # The decider is a model behind an endpoint: it answers the judgment's question too.
                name = invocation.src
                ask = Ask(f"judge:{name}", decider, request, lambda: judge(name, judgment, request))
                return self._ask(ask, usage, invocation)
            try:
                return {**done, "output": judgment(request.to_input(), dict(invocation.input or {}))}
            except Exception as err:  # a judgment is people's code: its failure is the policy's onError
                return {**failed, "error": {"message": str(err)}}
        ref = str((invocation.input or {}).get("model", DEFAULT_MODEL_REF))
        model = self.models.get(ref)
        if model is None:
            raise RunError(
                f"policy {self.policy.id}@{self.policy.version} asks model ref '{ref}', which is not "
                f"bound; bound refs are {sorted(self.models)} (bind it with --model)"
            )
        return self._ask(Ask(ref, model, request, lambda: model.answer(request)), usage, invocation)

    def _ask(self, ask: Ask, usage: list[Usage], invocation: Invocation) -> dict[str, Any]:
        """A model call as the event the policy receives; its usage (or its failure) journaled, with
        what was asked and what the model answered."""
        actor_id = invocation.id
        model = ask.model
        try:
            reply = ask.call()
        except ModelCallError as err:
            # Journaled as a call that failed, so the thread shows why the policy took its onError.
            usage.append(
                Usage(
                    ask.ref,
                    model.name,
                    0,
                    0,
                    error=str(err),
                    answer_error=isinstance(err, ModelAnswerError),
                    asked=ask.asked,
                )
            )
            return {"type": ERROR_EVENT, "actorId": actor_id, "error": {"message": str(err)}}
        usage.append(
            Usage(
                ask.ref,
                model.name,
                reply.input_tokens,
                reply.output_tokens,
                reply.cost_usd,
                reply.recorded,
                reply.fingerprint,
                asked=ask.asked,
                answer=reply.event,
            )
        )
        return {"type": DONE_EVENT, "actorId": actor_id, "output": reply.event}


@dataclass(frozen=True)
class Ask:
    """One model call a policy makes: the ref it asks (`judge:NAME` for a judgment's question), the model
    bound to it, the decision request, and the call itself."""

    ref: str
    model: Model
    request: DecisionRequest
    call: Callable[[], ModelReply]

    @property
    def asked(self) -> str:
        """What is asked, as a digest (`asked_digest`), computed once. Not a functools.cached_property:
        on Python 3.11 its lock is one for every instance, and concurrent runs queued on it."""
        found: str | None = self.__dict__.get("_asked")
        if found is None:
            found = self.__dict__["_asked"] = asked_digest(self.ref, self.model.name, self.request)
        return found
