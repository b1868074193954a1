"""The pure interpreter: `initial`, `transition` and `can` over a compiled machine.

No I/O happens here and no actor is called: an invoke stops the machine and the snapshot says which
actor is owed (with its evaluated input); whoever drives the machine answers with
`{"type": "xstate.done.actor", "actorId": ..., "output": ...}` or `xstate.error.actor`.

Semantics (a flat subset of XState v5):

- the first transition whose guard passes is taken; `assign` values are evaluated against the context
  before the step, then merged;
- after entering a state, `choice` branches and `always` transitions are taken until the state is
  stable (an eventless loop longer than `MAX_MICROSTEPS` is an error naming the states in it);
- a final state evaluates its `output` and sets `status = "done"`; events after that are ignored;
- `xstate.error.actor` where no `onError` is given sets `status = "error"`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from improve.errors import EvaluationError, MachineConfigError, MachineError, UnknownNameError
from improve.machine.config import (
    DECIDE_SRC,
    PAYLOAD_TYPES,
    RESUMABLE_STATUSES,
    DecideInputConfig,
    MachineConfig,
    NamedGuard,
    StateConfig,
    TransitionConfig,
    TransitionSpec,
    transitions_of,
)
from improve.machine.expr import (
    CompiledTree,
    Expr,
    Scope,
    compile_expr,
    compile_tree,
    evaluate_tree,
    tree_exprs,
)
from improve.machine.snapshot import Invocation, Snapshot, snapshot_of

MAX_MICROSTEPS = 100
FREE_TEXT = "text"
"""A payload field whose expression yields this string takes free text instead of a closed choice."""
DONE_EVENT = "xstate.done.actor"
ERROR_EVENT = "xstate.error.actor"

GuardFn = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]], bool]
"""A host guard: `(context, event, params) -> bool`. It must be pure: replay calls it again."""


@dataclass(frozen=True, slots=True)
class Transition:
    target: str | None
    where: str
    guard: Expr | None = None
    named_guard: NamedGuard | None = None
    guard_fn: GuardFn | None = field(default=None, compare=False)
    assign: dict[str, CompiledTree] | None = None


@dataclass(frozen=True, slots=True)
class DecideInput:
    name: Expr
    allowed_events: tuple[str, ...]
    payloads: dict[str, dict[str, Expr]]
    facts: CompiledTree
    prompt: Expr | None


@dataclass(frozen=True, slots=True)
class Invoke:
    id: str
    src: str
    input: CompiledTree
    decide: DecideInput | None
    on_done: tuple[Transition, ...]
    on_error: tuple[Transition, ...]
    max_retries: int | None


@dataclass(frozen=True, slots=True)
class State:
    name: str
    config: StateConfig
    on: dict[str, tuple[Transition, ...]]
    always: tuple[Transition, ...]
    choice: tuple[Transition, ...]
    invoke: Invoke | None
    output: CompiledTree
    final: bool

    @property
    def idle(self) -> bool:
        """Waits for a person: not final, invokes nothing, and has events to receive."""
        return not self.final and self.invoke is None and bool(self.on)


@dataclass(frozen=True)
class Machine:
    """A machine config compiled once: targets resolved, every CEL expression compiled."""

    config: MachineConfig
    states: dict[str, State]
    context_init: CompiledTree
    guards: Mapping[str, GuardFn]

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def version(self) -> str:
        return self.config.version

    def expressions(self) -> list[Expr]:
        """Every compiled expression, for linting and vocabulary checks."""
        out = tree_exprs(self.context_init)
        for state in self.states.values():
            trans = [*state.always, *state.choice, *(t for ts in state.on.values() for t in ts)]
            if state.invoke:
                trans += [*state.invoke.on_done, *state.invoke.on_error]
                out += tree_exprs(state.invoke.input)
                if state.invoke.decide:
                    d = state.invoke.decide
                    out += [
                        d.name,
                        *tree_exprs(d.facts),
                        *(e for f in d.payloads.values() for e in f.values()),
                    ]
                    out += [d.prompt] if d.prompt else []
            for t in trans:
                out += [t.guard] if t.guard else []
                out += tree_exprs(t.assign) if t.assign else []
            out += tree_exprs(state.output)
        return out


def compile_machine(
    config: MachineConfig,
    guards: Mapping[str, GuardFn] | None = None,
    actors: Collection[str] | None = None,
) -> Machine:
    """Compile a machine config, checking targets, expressions, named guards and actor sources.

    `actors` lists the invoke sources the host provides; `None` skips that check (for describing a
    machine without its host). `agent.decide` is always available.
    """
    guards = dict(guards or {})
    names = list(config.states)
    if config.initial not in config.states:
        raise MachineConfigError(f"initial state '{config.initial}' does not exist; states are {names}")

    def trans(spec: TransitionSpec | list[TransitionConfig] | None, where: str) -> tuple[Transition, ...]:
        out = []
        for i, t in enumerate(transitions_of(spec)):
            here = f"{where}[{i}]"
            if t.target is not None and t.target not in config.states:
                raise MachineConfigError(
                    f"{here}: target '{t.target}' does not exist; valid targets are {names}"
                )
            guard: Expr | None = None
            named: NamedGuard | None = None
            fn: GuardFn | None = None
            if isinstance(t.guard, str):
                guard = compile_expr(t.guard, f"{here}.guard")
            elif isinstance(t.guard, NamedGuard):
                named = t.guard
                if named.type not in guards:
                    raise UnknownNameError(
                        f"{here}.guard: named guard '{named.type}' is not registered; "
                        f"registered guards are {sorted(guards) or 'none'}"
                    )
                fn = guards[named.type]
            assign = {k: compile_tree(v, f"{here}.assign.{k}") for k, v in (t.assign or {}).items()}
            out.append(Transition(t.target, here, guard, named, fn, assign or None))
        return tuple(out)

    states: dict[str, State] = {}
    for name, st in config.states.items():
        where = f"state '{name}'"
        invoke: Invoke | None = None
        if st.invoke is not None:
            inv = st.invoke
            if actors is not None and inv.src != DECIDE_SRC and inv.src not in actors:
                raise UnknownNameError(
                    f"{where}.invoke: actor '{inv.src}' is not registered; registered actors are "
                    f"{sorted(actors) or 'none'} (and {DECIDE_SRC})"
                )
            decide = None
            compiled_input: CompiledTree = None
            if inv.src == DECIDE_SRC:
                decide = _compile_decide(inv.input, f"{where}.invoke.input", st, names)
            else:
                compiled_input = compile_tree(inv.input or {}, f"{where}.invoke.input")
            invoke = Invoke(
                id=inv.id or name,
                src=inv.src,
                input=compiled_input,
                decide=decide,
                on_done=trans(inv.onDone, f"{where}.invoke.onDone"),
                on_error=trans(inv.onError, f"{where}.invoke.onError"),
                max_retries=inv.maxRetries,
            )
        if st.type == "choice" and not st.choice:
            raise MachineConfigError(f"{where}: a choice state needs a non-empty `choice` list")
        if st.type == "final" and (st.on or st.always or st.invoke):
            raise MachineConfigError(f"{where}: a final state cannot have `on`, `always` or `invoke`")
        states[name] = State(
            name=name,
            config=st,
            on={ev: trans(spec, f"{where}.on.{ev}") for ev, spec in st.on.items()},
            always=trans(st.always, f"{where}.always"),
            choice=trans(st.choice, f"{where}.choice"),
            invoke=invoke,
            output=compile_tree(st.output, f"{where}.output") if st.output is not None else None,
            final=st.is_final,
        )
    for state in states.values():
        _check_wait_meta(state)
    context_init = compile_tree(config.context, "context")
    return Machine(config=config, states=states, context_init=context_init, guards=guards)


def _check_wait_meta(state: State) -> None:
    """`meta.status` and `meta.payloads` belong to waiting states and say what a resume needs
    (`improve.machine.waits`); a slip there would only show when a run stops there, so it is refused here."""
    where = f"state '{state.name}'.meta"
    meta = state.config.meta
    if "status" in meta:
        if meta["status"] not in RESUMABLE_STATUSES:
            raise MachineConfigError(
                f"{where}.status: {meta['status']!r} is not a status a run can wait in; use one of "
                f"{', '.join(RESUMABLE_STATUSES)}"
            )
        if not state.idle:
            raise MachineConfigError(
                f"{where}.status: only a waiting state (not final, no invoke, with events in `on`) ends a run "
                "that can be resumed; remove `status` or make the state wait"
            )
    payloads = meta.get("payloads")
    if payloads is None:
        return
    if not state.idle or not isinstance(payloads, dict):
        raise MachineConfigError(
            f"{where}.payloads: a waiting state's payload declaration is an object, event -> field -> type"
        )
    for event, fields in payloads.items():
        if event not in state.on:
            raise MachineConfigError(
                f"{where}.payloads.{event}: the state accepts no event {event!r}; it accepts {sorted(state.on)}"
            )
        if not isinstance(fields, dict):
            raise MachineConfigError(
                f"{where}.payloads.{event}: an object, field -> type, e.g. " + '{"text": "string"}'
            )
        for field_name, kind in fields.items():
            if not isinstance(kind, str) or kind.rstrip("?") not in PAYLOAD_TYPES:
                raise MachineConfigError(
                    f"{where}.payloads.{event}.{field_name}: {kind!r} is not a type; use one of "
                    f"{', '.join(PAYLOAD_TYPES)} (a trailing ? makes the field optional)"
                )


def _compile_decide(raw: Any, where: str, state: StateConfig, names: list[str]) -> DecideInput:
    from pydantic import ValidationError

    from improve.machine.config import format_validation_error

    try:
        spec = DecideInputConfig.model_validate(raw or {})
    except ValidationError as err:
        raise MachineConfigError(format_validation_error(err, where)) from None
    for ev in spec.allowedEvents:
        if ev not in state.on:
            raise MachineConfigError(
                f"{where}.allowedEvents: event '{ev}' has no transition in this state's `on`; "
                f"it handles {sorted(state.on)}"
            )
    for ev in spec.payloads:
        if ev not in spec.allowedEvents:
            raise MachineConfigError(
                f"{where}.payloads: event '{ev}' is not in allowedEvents {spec.allowedEvents}"
            )
    return DecideInput(
        name=compile_expr(spec.name, f"{where}.name"),
        allowed_events=tuple(spec.allowedEvents),
        payloads={
            ev: {fld: compile_expr(src, f"{where}.payloads.{ev}.{fld}") for fld, src in fields.items()}
            for ev, fields in spec.payloads.items()
        },
        facts=compile_tree(spec.facts, f"{where}.facts"),
        prompt=compile_expr(spec.prompt, f"{where}.prompt") if spec.prompt else None,
    )


# --- stepping -------------------------------------------------------------------------------------


def _passes(machine: Machine, t: Transition, scope: Scope, context: Mapping[str, Any], event: Any) -> bool:
    if t.guard is not None:
        return t.guard.check_bool(scope)
    if t.guard_fn is not None:
        assert t.named_guard is not None
        try:
            result = t.guard_fn(context, event, t.named_guard.params)
        except Exception as err:
            raise EvaluationError(f"{t.where}: named guard '{t.named_guard.type}' raised {err!r}") from err
        if not isinstance(result, bool):
            raise EvaluationError(
                f"{t.where}: named guard '{t.named_guard.type}' returned {result!r}, expected a bool"
            )
        return result
    return True


def _select(
    machine: Machine, candidates: tuple[Transition, ...], scope: Scope, context: dict[str, Any], event: Any
) -> Transition | None:
    for t in candidates:
        if _passes(machine, t, scope, context, event):
            return t
    return None


def _apply(t: Transition, scope: Scope, context: dict[str, Any]) -> dict[str, Any]:
    if not t.assign:
        return context
    updates = {key: evaluate_tree(tree, scope) for key, tree in t.assign.items()}
    return {**context, **updates}


def _candidates(state: State, event: Mapping[str, Any]) -> tuple[Transition, ...] | None:
    etype = event.get("type")
    if etype in (DONE_EVENT, ERROR_EVENT):
        inv = state.invoke
        if inv is None or event.get("actorId", inv.id) != inv.id:
            return ()
        if etype == ERROR_EVENT:
            return inv.on_error
        # A decision lands as the chosen event itself, never as a done event.
        return inv.on_done if inv.decide is None else ()
    return state.on.get(str(etype), ())


def _scope(context: Any, event: Any, inp: Any) -> Scope:
    values: dict[str, Any] = {}
    if context is not None:
        values["context"] = context
    if event is not None:
        values["event"] = event
    if inp is not None:
        values["input"] = inp
        # `facts` is shorthand for `input.facts`: a policy's input is a decision request.
        if isinstance(inp, dict) and inp.get("facts") is not None:
            values["facts"] = inp["facts"]
    return Scope.of(values)


def _settle(machine: Machine, value: str, context: dict[str, Any], inp: Any, event: Any) -> Snapshot:
    """Enter `value`, then follow choice and eventless transitions until the state is stable."""
    visited = [value]
    for _ in range(MAX_MICROSTEPS):
        state = machine.states[value]
        if state.final:
            scope = _scope(context, event, inp)
            output = evaluate_tree(state.output, scope) if state.output is not None else None
            return Snapshot(value=value, context=context, status="done", input=inp, output=output)
        branches = state.choice or state.always
        if branches:
            scope = _scope(context, event, inp)
            t = _select(machine, branches, scope, context, event)
            if t is None and state.choice:
                raise MachineError(
                    f"state '{value}': no choice branch matched; give the last branch no guard"
                )
            if t is not None:
                context = _apply(t, scope, context)
                if t.target is not None:
                    value = t.target
                    visited.append(value)
                    continue
        # The owed actor's input is evaluated lazily, and its scope built only then.
        invocation = _invocation(state, context, event, inp)
        return snapshot_of(value, context, "active", inp, None, None, invocation)
    raise MachineError(
        f"eventless transitions did not settle after {MAX_MICROSTEPS} steps: {' -> '.join(visited[-8:])}"
    )


def _invocation(state: State, context: Any, event: Any, inp: Any) -> Invocation | None:
    """The actor `state` invokes, its input evaluated on first use in the scope of `context`, `event` and
    `inp` (built then too: most snapshots' owed input is never read, and a scope cost as much as the
    rest of the invocation)."""
    inv = state.invoke
    if inv is None:
        return None
    if inv.decide is None:
        return Invocation(
            inv.id, inv.src, thunk=lambda: evaluate_tree(inv.input, _scope(context, event, inp))
        )
    return Invocation(inv.id, inv.src, thunk=lambda: _decide_input(inv, _scope(context, event, inp)))


def _decide_input(inv: Invoke, scope: Scope) -> dict[str, Any]:
    assert inv.decide is not None
    d = inv.decide
    payloads: dict[str, dict[str, Any]] = {}
    for ev, fields in d.payloads.items():
        payloads[ev] = {}
        for fld, expr in fields.items():
            values = expr.evaluate(scope)
            if values == FREE_TEXT:
                payloads[ev][fld] = values
                continue
            if not isinstance(values, list):
                raise EvaluationError(
                    f"{expr.where}: `{expr.source}` returned {values!r}; payload options must be a list "
                    f"(a closed choice) or '{FREE_TEXT}' (free text)"
                )
            payloads[ev][fld] = _dedupe(values)
    return {
        "name": d.name.evaluate(scope),
        "allowedEvents": list(d.allowed_events),
        "payloads": payloads,
        "facts": evaluate_tree(d.facts, scope),
        "prompt": d.prompt.evaluate(scope) if d.prompt else None,
    }


def _dedupe(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def initial(machine: Machine, input: Any = None) -> Snapshot:
    """The snapshot after starting the machine with `input` (context initialised, then settled)."""
    scope = _scope(None, None, input)
    context = evaluate_tree(machine.context_init, scope)
    return _settle(
        machine, machine.config.initial, dict(context), input, {"type": "xstate.init", "input": input}
    )


def _step(machine: Machine, snapshot: Snapshot, event: Mapping[str, Any]) -> tuple[Transition | None, Scope]:
    state = machine.states[snapshot.value]
    # The scope lives only for this step's guards and assigns, and a result read from the event is a
    # copy (fastcel's `export`, or cel's own), so a plain dict is read as it is, not copied first.
    scope = _scope(snapshot.context, event if type(event) is dict else dict(event), snapshot.input)
    candidates = _candidates(state, event)
    if not candidates:
        return None, scope
    return _select(machine, candidates, scope, snapshot.context, event), scope


def transition(machine: Machine, snapshot: Snapshot, event: Mapping[str, Any]) -> Snapshot:
    """The snapshot after `event`; the same snapshot when no transition takes it."""
    if snapshot.status != "active":
        return snapshot
    if "type" not in event:
        raise MachineError(f"event {dict(event)!r} has no `type`")
    state = machine.states[snapshot.value]
    taken, scope = _step(machine, snapshot, event)
    if taken is None:
        if (
            event.get("type") == ERROR_EVENT
            and state.invoke is not None
            and not state.invoke.on_error
            and event.get("actorId", state.invoke.id) == state.invoke.id
        ):
            return Snapshot(
                value=snapshot.value,
                context=snapshot.context,
                status="error",
                input=snapshot.input,
                error=event.get("error"),
            )
        return snapshot
    context = _apply(taken, scope, snapshot.context)
    target = taken.target if taken.target is not None else snapshot.value
    if taken.target is None:
        # A targetless transition stays without re-entering: the same actor is still owed.
        return Snapshot(
            value=target, context=context, status="active", input=snapshot.input, invoke=snapshot.invoke
        )
    return _settle(machine, target, context, snapshot.input, dict(event))


def refusing_guard(machine: Machine, snapshot: Snapshot, event: Mapping[str, Any]) -> str | None:
    """Which guard refused `event` here (the first candidate's), e.g. for the `attempts` view."""
    state = machine.states[snapshot.value]
    scope = _scope(snapshot.context, dict(event), snapshot.input)
    for t in _candidates(state, event) or ():
        if not _passes(machine, t, scope, snapshot.context, event):
            where = t.where.removeprefix("state ")
            if t.guard is not None:
                return f"{where}: {t.guard.source}"
            if t.named_guard is not None:
                return f"{where}: guard:{t.named_guard.type}"
    return None


def can(machine: Machine, snapshot: Snapshot, event: Mapping[str, Any]) -> bool:
    """Whether `event` would be taken by some transition in the current state."""
    if snapshot.status != "active":
        return False
    taken, _ = _step(machine, snapshot, event)
    return taken is not None
