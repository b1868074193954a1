"""Lint a machine config: structural mistakes a compiler accepts (or reports one at a time).

`lint(config, kind)` reads a `MachineConfig` (no host registry, no I/O) and returns every finding as a
`Lint(code, severity, path, message)`, ordered by `path`, a JSON path into the document such as
`$.states.ask_model.invoke.onError` (keys that are not identifiers are bracketed: `$.states['ask-model']`).
Each message names the state, says what is wrong and how to fix it, so it can be pasted verbatim into a
prompt that asks a model to repair the document.

`kind` is `"environment"` (people's code) or `"policy"` (a machine answering a decision request, which
must always end in a final state whose output is the chosen event). Some codes are errors for policies
and warnings for environments.

Codes:

    unknown-initial           error    `initial` names no state
    unknown-target            error    a transition targets a state that does not exist
    invalid-expression        error    an expression position holds CEL that does not compile
    unreachable-state         error/w  no path from `initial` reaches the state (sentinels exempt)
    dead-end                  error    a non-final state none of whose transitions leads elsewhere
    no-way-to-finish          error/w  every path from the state loops without reaching a final
    final-with-exit           error    a final state (or sentinel) with `on`/`always`/`choice`/`invoke`
    final-without-output      error/w  a policy final (or a non-sentinel environment final) has no output
    invoke-without-on-done    error    an actor's result is dropped: no `onDone` (decisions exempt)
    invoke-without-on-error   error/w  an actor (or a model) can fail and nothing handles it
    decide-without-events     error    `agent.decide` offers no events; in a policy, a `model.decide`
                                       whose onDone never reaches a final state (a final without an
                                       output is final-without-output)
    decide-event-unhandled    error    an allowed event has no transition in the state's `on`
    invalid-decide-input      error    an `agent.decide` input is not a valid decision request
    choice-without-branches   error    `type: choice` with no `choice` list
    choice-without-default    error    no unguarded branch: the interpreter raises when none matches
    choice-with-other-exits   error    a choice state also has `always` (never read) or `on`/`invoke`
    shadowed-transition       warning  transitions after an unguarded one can never be taken
    self-loop-always          error    an eventless transition back to its own state that loops forever
    always-cycle              error    unguarded eventless transitions that form a cycle
    policy-on-event           error    a policy state with `on`: a policy receives no events
    decide-in-policy          error    a policy invokes `agent.decide` instead of `model.decide`
    policy-output-not-event   error    a policy final's output cannot be an event (`{"type": ...}`)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from improve.errors import ExpressionError
from improve.machine.config import (
    DECIDE_SRC,
    MODEL_DECIDE,
    DecideInputConfig,
    MachineConfig,
    StateConfig,
    TransitionConfig,
    TransitionSpec,
    transitions_of,
)
from improve.machine.expr import ALLOWED_ROOTS, compile_expr

__all__ = ["Kind", "Lint", "Severity", "has_errors", "lint"]

Kind = Literal["environment", "policy"]
Severity = Literal["error", "warning"]


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CEL_STRING = re.compile(r"""^\s*[rR]?('[^']*'|"[^"]*")\s*$""")
_CEL_CONSTANTS = frozenset({"true", "false", "null"})
_QUOTING = "every expression position holds CEL, so a literal string is quoted inside it (\"'text'\")"


@dataclass(frozen=True, slots=True)
class Lint:
    """One finding: a stable `code`, its `severity`, where (`path`) and what to do (`message`)."""

    code: str
    severity: Severity
    path: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "severity": self.severity, "path": self.path, "message": self.message}

    def __str__(self) -> str:
        return f"{self.severity} {self.code} at {self.path}: {self.message}"


def has_errors(lints: list[Lint]) -> bool:
    """Whether any finding is an error (warnings alone do not fail a gate)."""
    return any(item.severity == "error" for item in lints)


# --- paths and transitions ------------------------------------------------------------------------


def _key(path: str, key: str) -> str:
    if _IDENT.match(key):
        return f"{path}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{path}['{escaped}']"


def _state_path(name: str) -> str:
    return _key("$.states", name)


def _relative(path: str, name: str) -> str:
    """The part of `path` below the state, for messages (`on.ISSUE[0].guard`)."""
    rest = path.removeprefix(_state_path(name)).lstrip(".")
    return f"`{rest}`" if rest else "the state"


_NATURAL = re.compile(r"(\d+)")


def _sort_key(item: Lint) -> tuple[tuple[str, ...], str]:
    """Paths in natural order (`[2]` before `[10]`), then codes."""
    parts = _NATURAL.split(item.path)
    return tuple(p if i % 2 == 0 else p.zfill(12) for i, p in enumerate(parts)), item.code


@dataclass(frozen=True, slots=True)
class _Edge:
    """One candidate transition, with where it is written and what kind of exit it is."""

    source: str
    kind: Literal["on", "always", "choice", "onDone", "onError"]
    path: str
    transition: TransitionConfig
    event: str | None = None

    @property
    def target(self) -> str | None:
        return self.transition.target

    @property
    def guarded(self) -> bool:
        guard = self.transition.guard
        return guard is not None and not (isinstance(guard, str) and guard.strip() == "true")


def _items(
    spec: TransitionSpec | list[TransitionConfig] | None, path: str
) -> list[tuple[str, TransitionConfig]]:
    if spec is None:
        return []
    if isinstance(spec, list):
        return [(f"{path}[{i}]", t) for i, t in enumerate(transitions_of(spec))]
    return [(path, t) for t in transitions_of(spec)]


def _groups(name: str, state: StateConfig) -> list[tuple[str, list[_Edge]]]:
    """Every transition list of a state, each with its path: `on.EVENT`, `always`, `choice`, `onDone`..."""
    sp = _state_path(name)
    groups: list[tuple[str, list[_Edge]]] = []
    for event, spec in state.on.items():
        path = _key(f"{sp}.on", event)
        groups.append((path, [_Edge(name, "on", p, t, event) for p, t in _items(spec, path)]))
    if state.always is not None:
        path = f"{sp}.always"
        groups.append((path, [_Edge(name, "always", p, t) for p, t in _items(state.always, path)]))
    if state.choice is not None:
        path = f"{sp}.choice"
        groups.append((path, [_Edge(name, "choice", f"{path}[{i}]", t) for i, t in enumerate(state.choice)]))
    if state.invoke is not None:
        path = f"{sp}.invoke.onDone"
        groups.append((path, [_Edge(name, "onDone", p, t) for p, t in _items(state.invoke.onDone, path)]))
        path = f"{sp}.invoke.onError"
        groups.append((path, [_Edge(name, "onError", p, t) for p, t in _items(state.invoke.onError, path)]))
    return groups


def _edges(name: str, state: StateConfig) -> list[_Edge]:
    return [edge for _, edges in _groups(name, state) for edge in edges]


# --- the linter -----------------------------------------------------------------------------------


class _Linter:
    def __init__(self, config: MachineConfig, kind: Kind) -> None:
        self.config = config
        self.kind = kind
        self.policy = kind == "policy"
        self.found: list[Lint] = []
        self.edges = {name: _edges(name, state) for name, state in config.states.items()}
        self.succ = {
            name: [e.target for e in edges if e.target is not None and e.target in config.states]
            for name, edges in self.edges.items()
        }

    def add(self, code: str, severity: Severity, path: str, message: str) -> None:
        self.found.append(Lint(code, severity, path, message))

    def soft(self) -> Severity:
        """Errors for policies, warnings for environments."""
        return "error" if self.policy else "warning"

    def run(self) -> list[Lint]:
        self.initial_and_targets()
        self.expressions()
        self.reachability()
        for name, state in self.config.states.items():
            self.state_shape(name, state)
            self.transition_lists(name, state)
            if state.invoke is not None:
                self.invoke(name, state)
            if state.is_final:
                self.final(name, state)
            elif self.policy and state.on and (state.invoke is None or state.invoke.src != DECIDE_SRC):
                self.add(
                    "policy-on-event",
                    "error",
                    f"{_state_path(name)}.on",
                    f"Policy state '{name}' has `on` transitions ({', '.join(state.on)}), but a policy "
                    "receives no events: it only sees the results of the actors it invokes. Branch on the "
                    "request with a `choice` state, or move these transitions to `invoke.onDone` / "
                    "`invoke.onError`, and remove `on`.",
                )
        self.cycles()
        return sorted(self.found, key=_sort_key)

    # --- the document as a graph

    def initial_and_targets(self) -> None:
        names = list(self.config.states)
        if self.config.initial not in self.config.states:
            self.add(
                "unknown-initial",
                "error",
                "$.initial",
                f"`initial` is '{self.config.initial}', which is not a state; set it to one of {names}.",
            )
        for name, edges in self.edges.items():
            for edge in edges:
                if edge.target is not None and edge.target not in self.config.states:
                    self.add(
                        "unknown-target",
                        "error",
                        edge.path,
                        f"In state '{name}', the transition at {_relative(edge.path, name)} targets "
                        f"'{edge.target}', which is not a state. Targets name a key of `states`: use one "
                        f"of {names}, or add a state '{edge.target}'.",
                    )

    def reachable_from(self, starts: list[str]) -> set[str]:
        seen: set[str] = set()
        todo = [s for s in starts if s in self.config.states]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo.extend(self.succ[name])
        return seen

    def reachability(self) -> None:
        states = self.config.states
        if self.config.initial in states:
            reached = self.reachable_from([self.config.initial])
            for name, state in states.items():
                if name in reached or state.is_sentinel:
                    continue
                self.add(
                    "unreachable-state",
                    self.soft(),
                    _state_path(name),
                    f"State '{name}' is unreachable: no chain of transitions (`on`, `always`, `choice`, "
                    f"`invoke.onDone`, `invoke.onError`) from the initial state '{self.config.initial}' "
                    f"targets it. Add a transition whose target is '{name}' where it belongs, or delete "
                    "the state.",
                )
        else:
            reached = set(states)
        finals = {name for name, state in states.items() if state.is_final}
        broken = {n for n, edges in self.edges.items() if any(e.target not in (None, *states) for e in edges)}
        can_finish = self._can_reach(finals | broken)  # a broken target is reported as unknown-target
        dead = {name for name in states if self._is_dead_end(name)}
        leads_to_dead = self._can_reach(dead)
        for name in sorted(reached - can_finish - finals - leads_to_dead, key=list(states).index):
            loop = sorted(self.reachable_from([name]) - {name}, key=list(states).index)
            via = f" (it only leads to {', '.join(repr(s) for s in loop)})" if loop else ""
            self.add(
                "no-way-to-finish",
                self.soft(),
                _state_path(name),
                f"From state '{name}' no final state can be reached{via}: every path loops forever. "
                f"Add a transition from '{name}' (or from a state it leads to) whose target is a "
                "final state, e.g. on `invoke.onError` or as an unguarded last `always` branch.",
            )

    def _can_reach(self, goals: set[str]) -> set[str]:
        """States from which some state in `goals` is reachable (the goals included)."""
        back: dict[str, set[str]] = {name: set() for name in self.config.states}
        for name, targets in self.succ.items():
            for target in targets:
                back[target].add(name)
        seen: set[str] = set()
        todo = list(goals)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo.extend(back[name])
        return seen

    def _is_dead_end(self, name: str) -> bool:
        state = self.config.states[name]
        return (
            not state.is_final
            and not any(t != name for t in self.succ[name])
            and not any(e.target is not None and e.target not in self.config.states for e in self.edges[name])
        )

    def cycles(self) -> None:
        """Unguarded eventless transitions: a state is left at once for its forced successor."""
        forced: dict[str, _Edge] = {}
        for name, state in self.config.states.items():
            if state.is_final:
                continue
            branches = [e for e in self.edges[name] if e.kind == ("choice" if state.choice else "always")]
            if branches and not branches[0].guarded and branches[0].target in self.config.states:
                forced[name] = branches[0]
        reported: set[str] = set()
        for start in forced:
            chain = [start]
            while True:
                nxt = forced[chain[-1]].target
                if nxt is None or nxt not in forced or nxt in reported:
                    break
                if nxt in chain:
                    cycle = chain[chain.index(nxt) :]
                    reported.update(cycle)
                    if len(cycle) > 1:
                        first = min(cycle, key=list(self.config.states).index)
                        edge = forced[first]
                        ring = " -> ".join(
                            [*cycle[cycle.index(first) :], *cycle[: cycle.index(first)], first]
                        )
                        self.add(
                            "always-cycle",
                            "error",
                            edge.path,
                            f"States {ring} form a cycle of unguarded eventless transitions (`always` or "
                            f"`choice`): entering any of them loops forever and the interpreter stops with "
                            f"an error. Give one of these transitions (e.g. {_relative(edge.path, first)} of "
                            f"state '{first}') a guard that becomes false, or target a different state.",
                        )
                    break
                chain.append(nxt)

    # --- per state

    def state_shape(self, name: str, state: StateConfig) -> None:
        sp = _state_path(name)
        if state.is_final:
            return
        if self._is_dead_end(name) and not (state.type == "choice" and not state.choice):
            self.add(
                "dead-end",
                "error",
                sp,
                f"State '{name}' is not final but has no way out: "
                + (
                    "it has no `on`, `always`, `choice` or `invoke`"
                    if not self.edges[name] and state.invoke is None
                    else "none of its transitions targets another state"
                )
                + ", so a run that enters it never ends. Add a transition to another state, or make it "
                'a final state (`"type": "final"` with an `output`).',
            )
        if state.type == "choice" and not state.choice:
            self.add(
                "choice-without-branches",
                "error",
                sp,
                f'State \'{name}\' has `"type": "choice"` but no `choice` branches. Add a `choice` list '
                '(e.g. `[{"guard": "...", "target": "..."}, {"target": "..."}]`, last branch unguarded), '
                "or remove the type.",
            )
        if not state.choice:
            return
        guarded = all(_Edge(name, "choice", "", t).guarded for t in state.choice)
        if guarded:
            last = len(state.choice) - 1
            self.add(
                "choice-without-default",
                "error",
                f"{sp}.choice[{last}]",
                f"Every branch of choice state '{name}' has a guard, and the interpreter raises an error "
                f"when none matches. Add a last branch without a guard (a default, e.g. "
                f'`{{"target": "..."}}`), or remove the guard of choice[{last}].',
            )
        for key, present in (("always", state.always is not None), ("invoke", state.invoke is not None)):
            if not present:
                continue
            why = (
                "`always` is never read when a state has `choice` branches"
                if key == "always"
                else "a choice state branches as soon as it is entered"
            )
            self.add(
                "choice-with-other-exits",
                "error",
                f"{sp}.{key}",
                f"Choice state '{name}' also has `{key}`, but {why}. Put these into the `choice` list, or "
                f"move `{key}` to a separate state that a branch targets.",
            )
        if state.on and not guarded:
            self.add(
                "choice-with-other-exits",
                "error",
                f"{sp}.on",
                f"Choice state '{name}' also has `on`, but it always leaves through a `choice` branch as "
                f"soon as it is entered, so these events are never handled there. Move `on` to a separate "
                f"state that a branch targets.",
            )

    def transition_lists(self, name: str, state: StateConfig) -> None:
        for path, edges in _groups(name, state):
            for i, edge in enumerate(edges):
                if not edge.guarded and i + 1 < len(edges):
                    rest = edges[i + 1 :]
                    self.add(
                        "shadowed-transition",
                        "warning",
                        rest[0].path,
                        f"In state '{name}', {_relative(edge.path, name)} has no guard, so it is always "
                        f"taken and the {len(rest)} transition(s) after it in {_relative(path, name)} "
                        f"({', '.join(_relative(e.path, name) for e in rest)}) can never be taken. Give "
                        f"{_relative(edge.path, name)} a guard, move it last, or delete the ones after it.",
                    )
                    break
            if state.is_final:
                continue
            for edge in edges:
                if edge.kind not in ("always", "choice") or edge.target != name:
                    continue
                if not edge.guarded:
                    why = "it has no guard, so it is taken again on every entry"
                elif not edge.transition.assign:
                    why = (
                        "it assigns nothing, so its guard sees the same context and event after the "
                        "step and, once true, stays true"
                    )
                else:
                    continue
                self.add(
                    "self-loop-always",
                    "error",
                    edge.path,
                    f"In state '{name}', the eventless transition {_relative(edge.path, name)} targets "
                    f"'{name}' itself and {why}: the machine loops forever and the interpreter stops with "
                    "an error. Target another state, or give it a guard and an `assign` that makes the "
                    "guard false.",
                )

    def invoke(self, name: str, state: StateConfig) -> None:
        assert state.invoke is not None
        inv = state.invoke
        sp = _state_path(name)
        ip = f"{sp}.invoke"
        if inv.src == DECIDE_SRC:
            self.decide(name, state)
            if self.policy:
                self.add(
                    "decide-in-policy",
                    "error",
                    f"{ip}.src",
                    f"Policy state '{name}' invokes `{DECIDE_SRC}`, the environment's decision request; a "
                    f'policy cannot send one. Ask a model instead: `"src": "{MODEL_DECIDE}", "input": '
                    f'{{"model": "\'decider\'"}}`, with `onDone` leading to a final state whose output '
                    'is `"event.output"`, and remove this state\'s `on` (a policy receives no events).',
                )
        elif self.policy and inv.src == MODEL_DECIDE:
            self.model_decide(name, state)
        elif inv.onDone is None:
            self.add(
                "invoke-without-on-done",
                "error",
                ip,
                f"State '{name}' invokes '{inv.src}' but has no `invoke.onDone`, so the actor's result is "
                "dropped and the run stays in this state forever. Add "
                '`"onDone": {"target": "..."}` (read the result as `event.output`).',
            )
        if inv.onError is None:
            what = (
                "a decision can be exhausted (every answer refused)"
                if inv.src == DECIDE_SRC
                else "a model call can fail"
                if inv.src == MODEL_DECIDE
                else f"the actor '{inv.src}' can fail"
            )
            then = (
                "the policy gives no answer"
                if self.policy
                else "the run stops with status 'error' instead of reaching a final state"
            )
            self.add(
                "invoke-without-on-error",
                self.soft(),
                ip,
                f"State '{name}' invokes '{inv.src}' without `invoke.onError`: {what}, and then {then}. "
                'Add `"onError": {"target": "..."}` leading to a state that handles the failure'
                + (' (e.g. a final whose output is `{"type": "\'ESCALATE\'"}`).' if self.policy else "."),
            )

    def decide(self, name: str, state: StateConfig) -> None:
        assert state.invoke is not None
        inp = f"{_state_path(name)}.invoke.input"
        raw = state.invoke.input or {}
        try:
            spec = DecideInputConfig.model_validate(raw)
        except ValidationError as err:
            spec = None
            for problem in err.errors():
                loc = problem["loc"]
                if loc == ("allowedEvents",) and problem["type"] == "missing":
                    continue  # reported below as decide-without-events
                path = inp
                for part in loc:
                    path = f"{path}[{part}]" if isinstance(part, int) else _key(path, str(part))
                self.add(
                    "invalid-decide-input",
                    "error",
                    path,
                    f"State '{name}' invokes `{DECIDE_SRC}` with an invalid decision request: "
                    f"{_relative(path, name)}: {problem['msg']}. A decision request has `name` (CEL, e.g. "
                    "\"'classify'\"), `allowedEvents` (a list of event names, not CEL), and optional "
                    "`payloads` (event -> field -> CEL list of options, or \"'text'\"), `facts` and `prompt`.",
                )
        events = raw.get("allowedEvents") if isinstance(raw, dict) else None
        if events is None or events == []:
            self.add(
                "decide-without-events",
                "error",
                f"{inp}.allowedEvents" if events is not None else inp,
                f"State '{name}' asks for a decision (`{DECIDE_SRC}`) but offers no events, so no answer "
                "can ever be accepted. List the events a decider may answer in `invoke.input.allowedEvents` "
                f"(each handled in this state's `on`: {sorted(state.on) or 'none yet'}).",
            )
        if spec is None:
            return
        for i, event in enumerate(spec.allowedEvents):
            if event not in state.on:
                self.add(
                    "decide-event-unhandled",
                    "error",
                    f"{inp}.allowedEvents[{i}]",
                    f"State '{name}' offers the event '{event}' in its decision, but its `on` has no "
                    f"transition for '{event}' (it handles {sorted(state.on) or 'nothing'}), so that "
                    f'answer would go nowhere. Add `"on": {{"{event}": {{"target": "..."}}}}` or remove '
                    f"'{event}' from allowedEvents.",
                )
        for event in spec.payloads:
            if event not in spec.allowedEvents:
                self.add(
                    "invalid-decide-input",
                    "error",
                    _key(f"{inp}.payloads", event),
                    f"State '{name}' describes payloads for '{event}', which is not in allowedEvents "
                    f"{spec.allowedEvents}. Add '{event}' to allowedEvents or remove its payloads.",
                )

    def model_decide(self, name: str, state: StateConfig) -> None:
        assert state.invoke is not None
        ip = f"{_state_path(name)}.invoke"
        # Any final counts here: one without an output is reported once, as final-without-output.
        answers = {n for n, s in self.config.states.items() if s.is_final}
        starts = [e.target for e in self.edges[name] if e.kind == "onDone" and e.target is not None]
        if self.reachable_from(starts) & answers:
            return
        if state.invoke.onDone is None:
            what = "has no `invoke.onDone`, so the model's answer is dropped"
            path = ip
        else:
            what = "has an `invoke.onDone` that never leads to a final state"
            path = f"{ip}.onDone"
        self.add(
            "decide-without-events",
            "error",
            path,
            f"Policy state '{name}' asks a model (`{MODEL_DECIDE}`) but {what}: the policy can never answer "
            'with the chosen event. Add `"onDone": {"target": "answer"}` with a final state `"answer": '
            '{"type": "final", "output": "event.output"}`.',
        )

    def final(self, name: str, state: StateConfig) -> None:
        sp = _state_path(name)
        what = "Sentinel" if state.is_sentinel else "Final state"
        for key, present in (
            ("on", bool(state.on)),
            ("always", state.always is not None),
            ("choice", state.choice is not None),
            ("invoke", state.invoke is not None),
        ):
            if present:
                self.add(
                    "final-with-exit",
                    "error",
                    f"{sp}.{key}",
                    f"{what} '{name}' has `{key}`, but a final state ends the run: nothing in it is ever "
                    f"taken or invoked. Remove `{key}`, or make '{name}' a non-final state"
                    + (" (a sentinel must stay final: it marks an invariant)." if state.is_sentinel else "."),
                )
        if state.output is None:
            if self.policy:
                self.add(
                    "final-without-output",
                    "error",
                    sp,
                    f"Policy final state '{name}' has no `output`, but a policy's final output is the "
                    'chosen event. Add `"output": "event.output"` (the model\'s answer) or a fixed event '
                    'such as `{"type": "\'ESCALATE\'"}`.',
                )
            elif not state.is_sentinel:
                self.add(
                    "final-without-output",
                    "warning",
                    sp,
                    f"Final state '{name}' has no `output`, so a run that ends here reports no outcome. "
                    'Add an `output`, e.g. `{"outcome": "\'' + name + "'\"}`.",
                )
        elif self.policy:
            self.policy_output(name, state.output)

    def policy_output(self, name: str, output: Any) -> None:
        op = f"{_state_path(name)}.output"
        fix = 'Write the chosen event as an object with a `type`, e.g. `{"type": "\'ESCALATE\'"}`, or '
        fix += '`"event.output"` for a model\'s answer.'
        if isinstance(output, dict):
            if "type" not in output:
                self.add(
                    "policy-output-not-event",
                    "error",
                    op,
                    f"Policy final state '{name}' outputs an object without `type`, so it is not an "
                    f"event and the environment cannot take it. Add `type` with the event name quoted "
                    'inside the CEL, e.g. `"type": "\'ESCALATE\'"`.',
                )
            elif not isinstance(output["type"], str):
                self.add(
                    "policy-output-not-event",
                    "error",
                    f"{op}.type",
                    f"Policy final state '{name}' outputs an event whose `type` is "
                    f"{json.dumps(output['type'])}, not an event name. Write it as a quoted CEL string, e.g. "
                    '`"type": "\'ESCALATE\'"`.',
                )
        elif isinstance(output, str):
            if _CEL_STRING.match(output):
                self.add(
                    "policy-output-not-event",
                    "error",
                    op,
                    f"Policy final state '{name}' outputs the string {output.strip()}, not an event. "
                    f'Write `{{"type": "{output.strip()}"}}` instead.',
                )
        else:
            self.add(
                "policy-output-not-event",
                "error",
                op,
                f"Policy final state '{name}' outputs {json.dumps(output)}, which is not an event. {fix}",
            )

    # --- expressions

    def expressions(self) -> None:
        for path, source in _tree(self.config.context, "$.context"):
            self.expression(path, source, None, "context initialiser")
        for name, state in self.config.states.items():
            for edge in self.edges[name]:
                if isinstance(edge.transition.guard, str):
                    self.expression(f"{edge.path}.guard", edge.transition.guard, name, "guard")
                for path, source in _tree(edge.transition.assign, f"{edge.path}.assign"):
                    self.expression(path, source, name, "assign value")
            if state.invoke is not None:
                ip = f"{_state_path(name)}.invoke.input"
                raw = state.invoke.input
                if state.invoke.src == DECIDE_SRC and isinstance(raw, dict):
                    for key, value in raw.items():
                        if key == "allowedEvents":
                            continue  # event names, not CEL
                        if key == "payloads" and not isinstance(value, dict):
                            continue  # invalid-decide-input says so
                        for path, source in _tree(value, _key(ip, key)):
                            self.expression(path, source, name, "decision input")
                else:
                    for path, source in _tree(raw, ip):
                        self.expression(path, source, name, "invoke input")
            for path, source in _tree(state.output, f"{_state_path(name)}.output"):
                self.expression(path, source, name, "output")

    def expression(self, path: str, source: str, state: str | None, what: str) -> None:
        try:
            compile_expr(source, path)
        except ExpressionError as err:
            detail = str(err).removeprefix(f"{path}: ")
            where = (
                f"In state '{state}', the {what} at {_relative(path, state)}"
                if state is not None
                else f"The {what} at {path}"
            )
            hint = ""
            word = source.strip()
            if _IDENT.match(word) and word not in ALLOWED_ROOTS and word not in _CEL_CONSTANTS:
                hint = f" If you meant the literal string, write \"'{word}'\"."
            self.add(
                "invalid-expression",
                "error",
                path,
                f"{where} is not a valid expression: {detail}.{hint} Fix the CEL; {_QUOTING}.",
            )


def _tree(tree: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every expression (a string) in an expression tree, with its JSON path."""
    if isinstance(tree, str):
        yield path, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tree(value, _key(path, str(key)))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _tree(value, f"{path}[{i}]")


def lint(config: MachineConfig, kind: Kind) -> list[Lint]:
    """Every finding for `config` read as an environment or a policy, ordered by path."""
    return _Linter(config, kind).run()
