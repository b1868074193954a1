"""The freeform variant: one state that both explores and answers, to compare with the machine.

This is the design the original agent had before its explorer/evaluator split (its "v1"): every turn
the model sees the task, its notes, its working memory and the last turn's outputs, and does one
thing: run a command, keep the outputs, drop a kept output, write a note, forget notes, or answer.
Outputs disappear after one turn unless kept. The loop is bounded by the same turn budget, and bails
out when the same command runs three times in a row (the original's loop detection); there is no
evaluator, so no cycle limit and no forced conclusion, and nothing stops an answer before any output.

It uses the machine's world, tools and stand-in models, asks the model with a `DecisionRequest`
built the same way (the offered options, the same counters as facts), checks each answer in the
decision protocol's order (unknown event, invalid payload, refused by the rules) with two retries,
and returns what the world recorded, so `parity compare` can put it next to the machine:

    parity compare improve.examples.code_agent.freeform:run v0 --env code-agent --model careful --model naive

`compare_designs` does that through the parity library and adds what parity does not compare: the
turns each design used, and whether each run's answer is right (the scenario's label).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from improve.errors import ModelCallError, WorkspaceError
from improve.evals import Scenario, compare_effects
from improve.examples.code_agent.env import DEFAULT_MAX_TURNS, environment
from improve.examples.code_agent.world import CodeWorld, edit_memory, open_repo, record_answer, run_command
from improve.log import Attempt, MemoryStore
from improve.machine import MachineConfig, parse_machine
from improve.parity import ParityReport, ParityRun, Side, compare, new_model
from improve.runtime import MAX_FREE_TEXT, DecisionRequest, Environment, Model, PolicyDecider, compile_policy
from improve.runtime import run as run_machine

LOOP_LENGTH = 3
MAX_RETRIES = 2
EVENTS = ["RUN", "KEEP", "DROP", "NOTE", "FORGET", "ANSWER"]
PROMPT = (
    "Answer the task about this repository. Each turn do one thing: RUN a command, KEEP the last "
    "outputs (they disappear next turn otherwise), DROP a kept output, NOTE a finding, FORGET notes "
    "matching a pattern, or ANSWER with the value only."
)
DIRECT_POLICY: dict[str, Any] = {
    "id": "code-agent-direct",
    "version": "0",
    "description": "The model decides directly (what policies/code-agent/v0.json does), for the machine runner.",
    "initial": "ask_model",
    "states": {
        "ask_model": {
            "invoke": {
                "src": "model.decide",
                "input": {"model": "'decider'"},
                "onDone": {"target": "answer"},
                "onError": {"target": "first_option"},
            }
        },
        "answer": {"type": "final", "output": "event.output"},
        "first_option": {"type": "final", "output": "input.options[0]"},
    },
}


@dataclass(frozen=True)
class DesignRun(ParityRun):
    """A parity run that also says how many turns (model turns, not retries) the design used."""

    turns: int = 0
    model_calls: int = 0


@cache
def _code_agent() -> Environment:
    return environment()


def _check_env(env_name: str) -> Environment:
    env = _code_agent()
    if env_name != env.name:
        raise WorkspaceError(f"the freeform code agent only answers code-agent questions, not {env_name}")
    return env


def run(env_name: str, scenario: Scenario, model: str) -> DesignRun:
    """Answer one scenario's question the freeform way with a fresh stand-in model (a parity runner)."""
    env = _check_env(env_name)
    world = CodeWorld(scenario.world)
    loop = _Freeform(world, new_model(env, model, scenario), dict(scenario.input))
    state = loop.run()
    return DesignRun(
        final_state=state,
        effects=[dict(e) for e in world.effects],
        violations=world.audit(world.effects),
        guard_refusals=loop.refusals,
        status="done",
        turns=loop.turns,
        model_calls=loop.calls,
    )


class _Freeform:
    """One loop, one state: every turn the model may run, remember or answer; nothing separates them."""

    def __init__(self, world: CodeWorld, model: Model, input: dict[str, Any]) -> None:
        self.world = world
        self.model = model
        self.task = str(input.get("task", ""))
        self.max_turns = int(input.get("maxTurns", DEFAULT_MAX_TURNS))
        self.menu: list[str] = open_repo(world, {"task": self.task})["menu"]
        self.outputs: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.kept: list[str] = []
        self.notes: list[str] = []
        self.recent: list[str] = []
        self.turns = self.calls = self.refusals = 0
        self.commands_run = self.outputs_seen = self.failed = 0

    def repeats(self) -> int:
        count = 0
        for command in reversed(self.recent):
            if command != self.recent[-1]:
                break
            count += 1
        return count

    def request(self) -> DecisionRequest:
        options: list[dict[str, Any]] = [{"type": "RUN", "command": c} for c in self.menu]
        if self.outputs:
            options.append({"type": "KEEP"})
        options += [{"type": "DROP", "item": k} for k in self.kept]
        options.append({"type": "ANSWER"})
        facts = {
            "task": self.task,
            "notes": list(self.notes),
            "memory": list(self.memory),
            "outputs": list(self.outputs),
            "lastCommand": self.recent[-1] if self.recent else "",
            "turnsUsed": self.turns,
            "turnsLeft": self.max_turns - self.turns,
            "commandsRun": self.commands_run,
            "outputsSeen": self.outputs_seen,
            "failedCommands": self.failed,
            "pendingOutputs": len(self.outputs),
            "memoryCount": len(self.memory),
            "notesCount": len(self.notes),
            "repeats": self.repeats(),
        }
        payloads: dict[str, dict[str, Any]] = {
            "RUN": {"command": list(self.menu)},
            "DROP": {"item": list(self.kept)},
            "NOTE": {"text": "text"},
            "FORGET": {"pattern": "text"},
            "ANSWER": {"text": "text"},
        }
        return DecisionRequest("act", options, facts, list(EVENTS), payloads, PROMPT)

    def refusal(self, event: Any) -> Attempt | None:
        """The decision protocol's checks, in its order, written out for this loop."""
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return Attempt(event=None, kind="no-answer", reason="no-answer: no event with a `type`")
        kind = event["type"]
        if kind not in EVENTS:
            return Attempt(
                event=event, kind="unknown-event", reason=f"unknown-event: '{kind}' is not one of {EVENTS}"
            )
        fields = {
            "RUN": {"command"},
            "DROP": {"item"},
            "NOTE": {"text"},
            "FORGET": {"pattern"},
            "ANSWER": {"text"},
        }
        extra = set(event) - {"type"} - fields.get(kind, set())
        if extra:
            return Attempt(
                event=event,
                kind="invalid-payload",
                reason=f"invalid-payload: '{kind}' takes no field {sorted(extra)[0]!r}",
            )
        if kind == "RUN" and event.get("command") not in self.menu:
            return Attempt(
                event=event,
                kind="invalid-payload",
                reason=f"invalid-payload: command={event.get('command')!r} is not on the menu",
            )
        if kind == "DROP" and event.get("item") not in self.kept:
            return Attempt(
                event=event,
                kind="invalid-payload",
                reason=f"invalid-payload: item={event.get('item')!r} is not kept",
            )
        for name in ("text", "pattern"):
            if name in event and (not isinstance(event[name], str) or len(event[name]) > MAX_FREE_TEXT):
                return Attempt(
                    event=event, kind="invalid-payload", reason=f"invalid-payload: '{name}' must be text"
                )
        allowed = {
            "KEEP": bool(self.outputs),
            "DROP": bool(self.memory),
            "NOTE": bool(event.get("text")),
            "FORGET": bool(self.notes) and bool(event.get("pattern")),
        }.get(kind, True)
        if not allowed:
            return Attempt(
                event=event, kind="rejected-by-guard", reason=f"rejected-by-guard: {kind} is not allowed now"
            )
        return None

    def ask(self) -> dict[str, Any] | None:
        request = self.request()
        attempts: list[Attempt] = []
        while len(attempts) <= MAX_RETRIES:
            try:
                answer = self.model.answer(request.with_attempts(attempts)).event
            except ModelCallError:
                answer = None
            self.calls += 1
            refused = self.refusal(answer)
            if refused is None:
                assert isinstance(answer, dict)
                return answer
            if refused.kind == "rejected-by-guard":
                self.refusals += 1
            attempts.append(refused)
        return None

    def run(self) -> str:
        while self.turns < self.max_turns:
            event = self.ask()
            self.turns += 1
            kind = event["type"] if event else None
            if event is not None and kind == "ANSWER":
                record_answer(self.world, {"text": event.get("text", "")})
                return "answered"
            if event is not None and kind == "RUN":
                done = run_command(self.world, {"command": event["command"], "menu": self.menu})
                self.menu = list(done["menu"])
                self.outputs = [done["result"]]
                self.commands_run += 1
                self.outputs_seen += 1 if done["result"]["ok"] else 0
                self.failed += 0 if done["result"]["ok"] else 1
                self.recent.append(str(event["command"]))
                if self.repeats() >= LOOP_LENGTH:
                    return "looped"
                continue
            if event is not None:
                self.remember(event)
            self.outputs = []  # results disappear next turn unless kept
        return "exhausted"

    def remember(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "KEEP":
            for item in self.outputs:
                if item not in self.memory:
                    self.memory.append(item)
                    self.kept.append(str(item["command"]))
        elif kind == "NOTE" and event["text"] not in self.notes:
            self.notes.append(str(event["text"]))
        elif kind in ("DROP", "FORGET"):
            edit = {"op": kind.lower(), "item": event.get("item"), "pattern": event.get("pattern")}
            edited = edit_memory(
                self.world, {"edit": edit, "memory": self.memory, "kept": self.kept, "notes": self.notes}
            )
            self.memory, self.kept, self.notes = edited["memory"], edited["kept"], edited["notes"]


class MachineRunner:
    """The machine with a policy, as a parity runner that also reports the turns it used."""

    def __init__(self, policy: MachineConfig | None = None) -> None:
        self.env = _code_agent()
        self.policy = policy or parse_machine(DIRECT_POLICY, source="freeform.DIRECT_POLICY")
        self.compiled = compile_policy(self.policy, self.env.judgments, self.env.policy_guards)

    def __call__(self, env_name: str, scenario: Scenario, model: str) -> DesignRun:
        env = _check_env(env_name)
        store = MemoryStore()
        thread = f"parity:v0:{scenario.id}:r1"
        result = run_machine(
            env,
            input=scenario.input,
            world=env.make_world(scenario.world),
            people=scenario.people,
            decider=PolicyDecider(self.compiled, {"decider": new_model(env, model, scenario)}, env.judgments),
            store=store,
            thread_id=thread,
        )
        refusals = sum(
            1 for e in store.read(thread) for a in e.attempts or () if a.kind == "rejected-by-guard"
        )
        violations = env.make_world(scenario.world).audit(result.effects)
        state = env.machine.states[result.final_state]
        if state.config.is_sentinel:
            violations = [
                {"rule": "sentinel", "state": result.final_state, "description": state.config.description},
                *violations,
            ]
        return DesignRun(
            final_state=result.final_state,
            effects=result.effects,
            violations=violations,
            guard_refusals=refusals,
            status=result.status,
            turns=int(result.snapshot.context.get("turns", 0)),
            model_calls=result.model_calls,
        )


def machine(env_name: str, scenario: Scenario, model: str) -> DesignRun:
    """The machine with the model deciding directly (a parity runner, the other side of `run`)."""
    return MachineRunner()(env_name, scenario, model)


# --- the comparison ----------------------------------------------------------------------------------


def correct(scenario: Scenario, result: ParityRun) -> bool:
    """Whether a run ended as labelled with exactly the labelled answer (concluding is not enough)."""
    if result.final_state != scenario.expected.outcome:
        return False
    expected = scenario.expected.effects
    return expected is None or compare_effects(result.effects, expected, ()).ok


@dataclass(frozen=True)
class DesignRow:
    scenario: str
    model: str
    label: str
    freeform: DesignRun
    machine: DesignRun
    freeform_correct: bool
    machine_correct: bool


@dataclass
class DesignComparison:
    """Parity's report (outcome, effects, rule breaks) with correctness and turns per design."""

    report: ParityReport
    rows: list[DesignRow] = field(default_factory=list)

    def summary(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for model in self.report.models:
            rows = [r for r in self.rows if r.model == model]
            out[model] = {
                "scenarios": len(rows),
                "freeform_correct": sum(r.freeform_correct for r in rows),
                "machine_correct": sum(r.machine_correct for r in rows),
                "freeform_turns": sum(r.freeform.turns for r in rows),
                "machine_turns": sum(r.machine.turns for r in rows),
                "differences": sum(r.label != "same" for r in rows),
            }
        return out


def compare_designs(
    scenarios: Sequence[Scenario], models: Sequence[str], policy: MachineConfig | None = None
) -> DesignComparison:
    """Freeform (OLD) against the machine with `policy` (NEW, default: the model decides directly)
    through `improve.parity.compare`, scenario by scenario and model by model."""
    env = _code_agent()
    old = Side("freeform", "runner", "the freeform loop (one state explores and answers)", run)
    runner = MachineRunner(policy)
    new = Side(
        f"machine@{runner.policy.version}",
        "runner",
        f"the explorer/evaluator machine with policy {runner.policy.id}@{runner.policy.version}",
        runner,
    )
    report = compare(env, list(scenarios), old, new, list(models))
    by_id = {s.id: s for s in scenarios}
    rows = []
    for row in report.rows:
        assert isinstance(row.old, DesignRun) and isinstance(row.new, DesignRun)
        scenario = by_id[row.scenario]
        rows.append(
            DesignRow(
                row.scenario,
                row.model,
                row.label,
                row.old,
                row.new,
                correct(scenario, row.old),
                correct(scenario, row.new),
            )
        )
    return DesignComparison(report, rows)
