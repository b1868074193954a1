"""`explore`: the environment's sentinels stay unreachable under its own probe (the search `improve
explore` makes: whatever a policy answers, a person's event or a tool's output must not lead there). For
each probe request (recorded decisions of training scenarios), every final output is one of the options
offered, on every path, including when the model call fails. And, when the
environment grants a fresh budget per resume (`resume_budget`), the resumes along every path of the
environment are finitely many, so no thread can outspend its budgets (`improve.runtime.resume_bound`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from improve.errors import MachineError
from improve.loop.gates.gate import GateContext, GateResult
from improve.machine import (
    ExploreOptions,
    Machine,
    ProbeError,
    Snapshot,
    canonical_json,
    explore_paths,
    initial,
    transition,
)
from improve.runtime import MODEL_DECIDE, ModelJudgment, prove_resumes, reach_sentinels


class ExploreGate:
    name = "explore"

    def run(self, ctx: GateContext) -> GateResult:
        resumes = ""
        if ctx.env.resume_budget is not None:
            proof = prove_resumes(ctx.env)
            if not proof.holds:
                return GateResult(self.name, False, f"the environment's resume paths: {proof.summary(0)}")
            resumes = (
                f"; at most {proof.max_resumes} resume(s) on any path, each with {proof.resume_budget} calls"
            )
        reach = reach_sentinels(ctx.env)
        if reach.reachable:
            return GateResult(self.name, False, reach.summary())
        resumes += f"; {reach.summary()}"
        if not ctx.probes:
            return GateResult(
                self.name, True, "no probe requests (no training scenario reached a decision)" + resumes
            )
        machine = ctx.compiled
        total_states = 0
        for request in ctx.probes:
            options = request.options
            outputs: dict[str, list[Any]] = {MODEL_DECIDE: [dict(o) for o in options]}
            for name, judgment in ctx.env.judgments.items():
                if isinstance(judgment, ModelJudgment):
                    # A model may give any of its closed answers: the proof branches on each.
                    outputs[name] = judgment.outputs()
                    continue
                try:
                    outputs[name] = [judgment(request.to_input(), {})]
                except Exception as err:
                    return GateResult(self.name, False, f"judgment '{name}' failed on a probe request: {err}")
            probe = ExploreOptions(
                outputs=outputs, errors={MODEL_DECIDE, *ctx.env.judgments}, max_depth=40, max_paths=20_000
            )

            def bad(snapshot: Snapshot, options: list[dict[str, Any]] = options) -> bool:
                if snapshot.status == "error":
                    return True
                return snapshot.status == "done" and not any(_same_event(snapshot.output, o) for o in options)

            try:
                result = explore_paths(machine, request.to_input(), probe, target=bad, stop_at_target=True)
            except (ProbeError, MachineError) as failed:
                step = failed.step if isinstance(failed, ProbeError) else failed
                # A path on which the policy cannot evaluate an expression (an output reading a field the
                # event it was reached by does not have) ends in error just as surely.
                return GateResult(
                    self.name,
                    False,
                    f"on decision '{request.name}' with facts {canonical_json(request.facts)}, the policy fails "
                    f"on some path: {step}. Every path must end in an offered option: check what each final's "
                    "output reads (an onError is reached by an error event, which has no `output`)",
                )
            total_states += result.states
            facts = canonical_json(request.facts)
            if result.reachable:
                witness = result.witness or []
                steps = " -> ".join(_describe(e) for e in witness)
                return GateResult(
                    self.name,
                    False,
                    f"on decision '{request.name}' with facts {facts} and options {json.dumps(options)}, "
                    f"{_ending(machine, request.to_input(), witness)}, "
                    f"{'after: ' + steps if steps else 'before asking anything'}. {_fix(witness)}",
                )
            if not result.complete:
                return GateResult(
                    self.name,
                    False,
                    f"exploring decision '{request.name}' with facts {facts} did not finish: {result.cuts}",
                )
        return GateResult(
            self.name,
            True,
            f"{len(ctx.probes)} probe request(s), {total_states} state(s): every output is offered" + resumes,
        )


def _ending(machine: Machine, input: Any, witness: list[dict[str, Any]]) -> str:
    """Where the path the proof found ends, and with what: the final state and the answer it gives, or
    the error, read off the snapshot the witness reaches (`transition`, step by step)."""
    try:
        snapshot = initial(machine, input)
        for event in witness:
            snapshot = transition(machine, snapshot, event)
    except MachineError as err:
        return f"the policy can end in error ({err})"
    if snapshot.status == "error":
        return f"the policy can end in error in state '{snapshot.value}' ({json.dumps(snapshot.error, default=str)})"
    return (
        f"the policy can end in state '{snapshot.value}' answering {json.dumps(snapshot.output)}, which is "
        "not one of the offered options"
    )


def _fix(witness: list[dict[str, Any]]) -> str:
    """What to change: the final's output, or, on a path where an invoke failed, its onError."""
    if any(e.get("type") == "xstate.error.actor" for e in witness):
        return (
            "Give every invoke an onError that leads to a final with a safe offered event (one per "
            "decision, chosen by `input.name`, where decisions offer different events: docs/contracts.md, "
            "Policy)"
        )
    return (
        "Every final's output must be one of the offered options: its `type` an offered event's, and each "
        "payload field an offered value, of the same JSON type (a number, not a string of one)"
    )


def _same_event(a: Any, b: Mapping[str, Any]) -> bool:
    """`a` is the offered event `b`: the same fields, numbers equal as numbers, nothing else coerced
    (`True` is not `1`: the decision protocol refuses it, so the proof must not accept it)."""
    if not isinstance(a, dict) or a.get("type") != b.get("type") or set(a) != set(b):
        return False
    for key, value in b.items():
        other = a[key]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (value, other))
        if not (other == value if numeric else type(other) is type(value) and other == value):
            return False
    return True


def _describe(event: Mapping[str, Any]) -> str:
    if event.get("type") == "xstate.done.actor":
        return f"{event.get('actorId')} answered {json.dumps(event.get('output'))}"
    if event.get("type") == "xstate.error.actor":
        return f"{event.get('actorId')} failed"
    return json.dumps(dict(event))
