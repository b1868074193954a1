"""Folding many events fast: a compiled machine compiled once more, for replay.

`transition` (interpreter.py) is the reference. Per step it builds a `Scope`, a `Snapshot` and an
`Invocation` with its thunk, and reaches every expression through `Expr.evaluate` and `evaluate_tree`:
about 5 µs a step, most of a replay's time. A replay needs only where the run stands after each entry
(and, to verify, each entry's snapshot hash), so `Fold` compiles every state's transitions into plain
closures over one mapping of root variables, and keeps a run in a small mutable `FoldRun`; a `Snapshot`
is built when one is asked for (`snapshot`).

It does exactly what the reference does, by construction: the fast step handles the plain case only,
committing nothing until it has succeeded. Anything else (an expression that raises or leaves the fast
path's domain, a guard that returns a non-bool, a named guard that raises, a choice with no branch
taken, an eventless loop, an event whose type is not a string) makes it give the step to the reference:
`transition` on the snapshot the run stands at, which returns the result or raises the error the
reference raises. Guards, assigns and named guards are pure (the contract), so evaluating one again
changes nothing. `Fold.fallbacks` counts those steps. The differential tests (tests/test_fold.py) hold
the two to equal snapshots after every event of every bundled thread and of generated event sequences,
and fail when the fast path is broken on purpose.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from improve.machine.expr import CompiledTree, Expr, Scope
from improve.machine.interpreter import (
    DONE_EVENT,
    ERROR_EVENT,
    MAX_MICROSTEPS,
    Invoke,
    Machine,
    State,
    Transition,
    _invocation,
    initial,
    transition,
)
from improve.machine.snapshot import (
    SORTED_ENCODER,
    Invocation,
    Snapshot,
    Status,
    canonical_hash,
    plain_hash,
    plain_json,
    shallow_json,
    snapshot_of,
    sorted_text,
)
from improve.native import digest

Env = dict[str, Any]
"""The root variables of one step (`context`, `event`, `input`, `facts`), as `Scope.values` holds them."""
Value = Callable[[Env], Any]


class _Bail(Exception):
    """The fast step met something outside the plain case: the reference takes the step."""


def _expr_fn(expr: Expr) -> Value:
    if expr.fast is not None:
        return expr.fast  # raises FastCelError or FastCelFallback where `evaluate` would do more: bail
    return lambda env: expr.evaluate(Scope.of(env))


_SCALARS = frozenset({str, int, float, bool, type(None)})
_MICROSTEPS = range(MAX_MICROSTEPS)


def _constant(tree: CompiledTree) -> tuple[bool, Any]:
    """(True, its value) for a tree that evaluates to the same immutable value in any scope: a literal
    scalar, or an expression that reads no variable (`false`, `'no-reply'`) and evaluates on the fast
    path to a scalar; (False, None) for anything else (an expression that fails is left to fail where
    it is evaluated)."""
    if isinstance(tree, Expr):
        if tree.roots or tree.fast is None:
            return False, None
        try:
            value = tree.fast({})
        except Exception:
            return False, None
        return (True, value) if type(value) in _SCALARS else (False, None)
    if isinstance(tree, dict | list):
        return False, None
    return True, tree


def _keys_sorted(tree: CompiledTree) -> CompiledTree:
    """`tree` with the keys of every dict of it in sorted order (the same values)."""
    if isinstance(tree, dict):
        return {key: _keys_sorted(tree[key]) for key in sorted(tree)}
    return tree


def _tree_fn(tree: CompiledTree) -> Value:
    """`evaluate_tree(tree, scope)` as one closure (the same values: literals are returned as they are)."""
    known, value = _constant(tree)
    if known:
        return lambda env: value
    if isinstance(tree, Expr):
        return _expr_fn(tree)
    if isinstance(tree, dict):
        constants = {key: _constant(item) for key, item in tree.items()}
        if any(known for known, _ in constants.values()):
            # A copy of the constant values (every key in its place), then the others evaluated in order.
            fixed = {key: constant for key, (_, constant) in constants.items()}
            rest = tuple((key, _tree_fn(tree[key])) for key, (known, _) in constants.items() if not known)

            def with_constants(env: Env) -> dict[str, Any]:
                out = fixed.copy()
                for key, fn in rest:
                    out[key] = fn(env)
                return out

            return with_constants
        items = tuple((key, _tree_fn(value)) for key, value in tree.items())
        # A dict display for the small ones (a context, an output): a comprehension is a call more.
        if len(items) == 1:
            ((k1, f1),) = items
            return lambda env: {k1: f1(env)}
        if len(items) == 2:
            (k1, f1), (k2, f2) = items
            return lambda env: {k1: f1(env), k2: f2(env)}
        if len(items) == 3:
            (k1, f1), (k2, f2), (k3, f3) = items
            return lambda env: {k1: f1(env), k2: f2(env), k3: f3(env)}
        return lambda env: {key: fn(env) for key, fn in items}
    if isinstance(tree, list):
        fns = tuple(_tree_fn(value) for value in tree)
        return lambda env: [fn(env) for fn in fns]
    return lambda env: tree


Assign = Callable[[Env, dict[str, Any]], dict[str, Any]]


def _assign_fn(assign: dict[str, CompiledTree]) -> Assign:
    """`_apply`: every value evaluated against the context before the step (the one in `env`, which
    the new dict is not), then merged over it, new keys last."""
    items = tuple((key, _tree_fn(tree)) for key, tree in assign.items())
    if len(items) == 1:
        ((key, fn),) = items

        def assign_one(env: Env, context: dict[str, Any]) -> dict[str, Any]:
            out = context.copy()
            out[key] = fn(env)
            return out

        return assign_one

    def assign_many(env: Env, context: dict[str, Any]) -> dict[str, Any]:
        out = context.copy()
        for k, f in items:
            out[k] = f(env)
        return out

    return assign_many


class _Step:
    """One compiled candidate transition."""

    __slots__ = ("assign", "guard", "named", "params", "target", "to")

    def __init__(self, t: Transition) -> None:
        self.guard: Value | None = _expr_fn(t.guard) if t.guard is not None else None
        self.named = t.guard_fn
        self.params: Mapping[str, Any] = t.named_guard.params if t.named_guard is not None else {}
        self.assign: Assign | None = _assign_fn(t.assign) if t.assign else None
        self.target = t.target
        self.to: _State | None = None
        """The target's compiled state (`Fold` links it once every state is compiled)."""


def _steps(ts: tuple[Transition, ...]) -> tuple[_Step, ...]:
    return tuple(_Step(t) for t in ts)


def _select(steps: tuple[_Step, ...], env: Env, context: dict[str, Any], event: Any) -> _Step | None:
    """The first candidate whose guard passes (`interpreter._select`), or None; bails where the
    reference would raise."""
    for s in steps:
        if s.guard is not None:
            passed = s.guard(env)
        elif s.named is not None:
            passed = s.named(context, event, s.params)
        else:
            return s
        if passed is True:
            return s
        if passed is not False:
            raise _Bail  # not a bool: the reference says so
    return None


class _State:
    """A state compiled for folding."""

    __slots__ = (
        "actor",
        "branches",
        "choice",
        "decide",
        "done",
        "error",
        "final",
        "invoke",
        "name",
        "on",
        "output",
        "rest",
        "rest_owing",
        "source",
        "stable",
    )

    def __init__(self, name: str, state: State) -> None:
        self.name = name
        self.source = state
        self.final = state.final
        self.output: Value | None = _tree_fn(state.output) if state.output is not None else None
        self.on = {event: _steps(ts) for event, ts in state.on.items()}
        self.choice = bool(state.choice)
        self.branches = _steps(state.choice or state.always)
        inv = state.invoke
        self.invoke: Invoke | None = inv
        self.actor = inv.id if inv is not None else None
        self.decide = inv is not None and inv.decide is not None
        self.done = _steps(inv.on_done) if inv is not None else ()
        self.error = _steps(inv.on_error) if inv is not None else ()
        self.stable = not self.final and not self.branches
        """Entered, it is where the run stands: no output to evaluate, no branch to follow."""
        # What `_snapshot_pieces` writes after the context, error and input of an active run here without
        # output: owing no actor, and owing its own (`Fold.matches` reads them instead of writing them).
        self.rest = _rest_text(None, "active", name, None)
        self.rest_owing = _rest_text((inv.id, inv.src), "active", name, None) if inv is not None else None

    def steps(self) -> tuple[_Step, ...]:
        return (*self.branches, *self.done, *self.error, *(s for ts in self.on.values() for s in ts))


class FoldRun:
    """Where a folded run stands: what a `Snapshot` holds, kept in place from step to step.

    The owed actor is kept as the state that owes it and the context and event it was entered with
    (`Invocation` objects are built by `Fold.snapshot`, once)."""

    __slots__ = (
        "context",
        "context_text",
        "env",
        "error",
        "input",
        "input_text",
        "invocation",
        "output",
        "owed",
        "plain_context",
        "plain_input",
        "status",
        "text_context",
        "value",
        "written_in_order",
    )

    def __init__(self, input: Any) -> None:
        self.input = input
        self.value = ""
        self.context: dict[str, Any] = {}
        self.status: Status = "active"
        self.output: Any = None
        self.error: Any = None
        # The owed actor: None, or (state, context, event) until `snapshot` builds its Invocation.
        self.owed: tuple[State, dict[str, Any], Any] | None = None
        self.invocation: Invocation | None = None
        # What `Fold.hash` found `plain_json` so far: the input (None: not asked yet), and the last
        # context all of whose values are (a step's context shares most of its values with the last).
        self.plain_input: bool | None = None
        self.plain_context: dict[str, Any] | None = None
        # What `Fold.hash` wrote of the snapshot so far (msgspec's sorted text, `_snapshot_text`): the
        # input, and the last context written with its text (the same object has the same text: see
        # `_plain_run`).
        self.input_text: bytes | None = None
        self.text_context: dict[str, Any] | None = None
        self.context_text = b""
        # Whether its contexts are written in their own key order (their dicts' keys sorted, as `start`
        # makes them and a replayed event's are): until a state's text in that order hashes otherwise
        # than journaled, which may be the order's fault; from then on they are written sorted.
        self.written_in_order = True
        # The roots every step shares: `input` and `facts` as `_scope` adds them; `context` and
        # `event` are set before each evaluation.
        env: Env = {}
        if input is not None:
            env["input"] = input
            if isinstance(input, dict) and input.get("facts") is not None:
                env["facts"] = input["facts"]
        self.env = env


class Fold:
    """`initial` and `transition` for a replay: `start`, `step`, and `snapshot` when one is needed."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.states = states = {name: _State(name, state) for name, state in machine.states.items()}
        for state in states.values():
            for step in state.steps():
                if step.target is not None:
                    step.to = states[step.target]
        # The context's keys in sorted order, nested ones too: msgspec then writes a context's text in
        # its own order, as its sorted text, without sorting it (`_snapshot_pieces`).
        self.context_init = _tree_fn(_keys_sorted(machine.context_init))
        self.context_tree = isinstance(machine.context_init, dict)  # evaluated to a fresh dict
        self.initial = machine.config.initial
        self.fallbacks = 0
        """Steps (and starts) the reference took because the fast path bailed."""

    # --- the public steps ---------------------------------------------------------------------------

    def start(self, input: Any = None) -> FoldRun:
        """The run `initial(machine, input)` starts."""
        run = FoldRun(input)
        try:
            env = run.env
            context = self.context_init(env)
            if not self.context_tree:
                context = dict(context)  # an expression's result: the run's own copy, as `initial` makes
            self._settle(run, self.states[self.initial], context, {"type": "xstate.init", "input": input})
        except Exception:
            self.fallbacks += 1
            self._load(run, initial(self.machine, input))
        return run

    def step(self, run: FoldRun, event: Mapping[str, Any]) -> bool:
        """Fold `event` into `run`, as `transition` would; False (and `run` unchanged) when the machine
        does not take it, where `transition` returns the snapshot it was given."""
        if run.status != "active":
            return False
        # The fast path, in this method (a call less on every event); anything it bails on or that
        # raises is the reference's step (`_reference_step`).
        try:
            if type(event) is not dict:
                raise _Bail  # not the plain case
            # Read as the dict it is: a Mapping's `get` is a method looked up on every call.
            plain: dict[str, Any] = event
            etype = plain.get("type")
            if type(etype) is not str:
                raise _Bail  # no type: the reference raises
            state = self.states[run.value]
            if etype in (DONE_EVENT, ERROR_EVENT):
                if state.actor is None or plain.get("actorId", state.actor) != state.actor:
                    return False
                if etype == ERROR_EVENT:
                    candidates = state.error
                    if not candidates:
                        # An actor failed where no onError is given: the run ends in error.
                        run.status = "error"
                        run.error = plain.get("error")
                        run.output = None
                        run.owed = run.invocation = None
                        return True
                else:
                    candidates = () if state.decide else state.done
            else:
                candidates = state.on.get(etype, ())
            if not candidates:
                return False
            context = run.context
            env = run.env
            env["context"] = context
            env["event"] = event
            taken = _select(candidates, env, context, event)
            if taken is None:
                return False
            if taken.assign is not None:
                context = taken.assign(env, context)
            to = taken.to
            if to is None:
                # A targetless transition stays without re-entering: the same actor is still owed.
                run.context = context
                return True
            if to.stable:
                # `_settle`'s last step, the only one it would take (the commonest target: an actor's state).
                run.value, run.context = to.name, context
                run.owed = (to.source, context, dict(event)) if to.invoke is not None else None
                run.invocation = None
                return True
            self._settle(run, to, context, dict(event))
            return True
        except Exception:
            return self._reference_step(run, event)

    def _reference_step(self, run: FoldRun, event: Mapping[str, Any]) -> bool:
        """`transition` takes the step from the snapshot the run stands at (the fast path bailed)."""
        self.fallbacks += 1
        before = self.snapshot(run)
        after = transition(self.machine, before, event)
        if after is before:
            return False
        self._load(run, after)
        return True

    def snapshot(self, run: FoldRun) -> Snapshot:
        """The `Snapshot` the reference reaches at this point of the run."""
        invocation = run.invocation
        if invocation is None and run.owed is not None:
            state, context, event = run.owed
            invocation = _invocation(state, context, event, run.input)
            run.invocation = invocation
            run.owed = None
        return snapshot_of(run.value, run.context, run.status, run.input, run.output, run.error, invocation)

    def hash(self, run: FoldRun, journaled: str | None = None) -> str:
        """`snapshot(run).hash()`, without building the snapshot or its owed actor.

        `journaled`: the hash the caller compares it with. When msgspec's text of the snapshot hashes
        to it, that is the hash (`sorted_text`), found without asking `plain_json` of the run's values."""
        invoke = _invoke_of(run)
        if journaled is not None:
            text = _snapshot_text(run, invoke)
            if text is not None and _sha256(text).hexdigest() == journaled:
                return journaled
        shallow = shallow_json(run.value, run.context, run.status, run.input, run.output, run.error, invoke)
        if _plain_run(run):
            return plain_hash(shallow)
        return canonical_hash(shallow)

    def matches(self, run: FoldRun, journaled: str) -> bool:
        """Whether msgspec's text of the run's snapshot hashes to `journaled`: `hash(run, journaled) ==
        journaled` as most of a verified replay asks it, without the canonical text a mismatch needs (the
        caller asks `hash` for that)."""
        if _STATE_IS is not None and run.error is None and run.invocation is None and run.written_in_order:
            # Hashed in C from where the last state's context and input left off, when it keeps them
            # (`state_is`). The text's end: for the commonest state, read from the state (`_State.rest`);
            # for a run that ended (its output in it), written.
            rest: bytes | None
            if run.status == "active" and run.output is None:
                state = self.states[run.value]
                owed = run.owed
                rest = state.rest if owed is None else state.rest_owing if owed[0] is state.source else None
            else:
                rest = _rest_text(_invoke_of(run), run.status, run.value, run.output)
            if rest is not None:
                context_text = _context_text(run)
                input_text = _input_text(run)
                if (
                    context_text is not None
                    and input_text is not None
                    and _STATE_IS(context_text, input_text, rest, journaled)
                ):
                    return True
        invoke = _invoke_of(run)
        pieces = _snapshot_pieces(run, invoke, in_order=True)
        if pieces is not None and _hashes_to(pieces, journaled):
            return True
        if not run.written_in_order:
            return False
        # Written in the context's own order, which was not sorted after all (a dict a step built in
        # another order: an assigned map): sorted from now on, and this state again.
        run.written_in_order, run.text_context = False, None
        pieces = _snapshot_pieces(run, invoke)
        return pieces is not None and _hashes_to(pieces, journaled)

    def actor_source(self, run: FoldRun) -> str | None:
        """The source of the actor the run owes (`snapshot(run).invoke.src`), None when it owes none."""
        invoke = _invoke_of(run)
        return invoke[1] if invoke is not None else None

    def text(self, run: FoldRun) -> bytes | None:
        """msgspec's text of what `hash` covers (`sorted_text(shallow_json(...))`, None where msgspec
        cannot write it), as `hash` makes it: from pieces written once (`_snapshot_text`)."""
        return _snapshot_text(run, _invoke_of(run))

    # --- the fast path ------------------------------------------------------------------------------

    def _settle(self, run: FoldRun, state: _State, context: dict[str, Any], event: dict[str, Any]) -> None:
        """`interpreter._settle`: enter `state`, follow choices and eventless transitions; commits to
        `run` only once the state is stable."""
        env = run.env
        env["event"] = event
        for _ in _MICROSTEPS:
            if state.final:
                env["context"] = context
                output = state.output(env) if state.output is not None else None
                run.value, run.context, run.status, run.output = state.name, context, "done", output
                run.owed = run.invocation = None
                return
            branches = state.branches
            if branches:
                env["context"] = context
                taken = _select(branches, env, context, event)
                if taken is None:
                    if state.choice:
                        raise _Bail  # no branch matched: the reference raises
                else:
                    if taken.assign is not None:
                        context = taken.assign(env, context)
                    if taken.to is not None:
                        state = taken.to
                        continue
            run.value, run.context = state.name, context
            run.owed = (state.source, context, event) if state.invoke is not None else None
            run.invocation = None
            return
        raise _Bail  # the eventless loop did not settle: the reference says where

    def _load(self, run: FoldRun, snapshot: Snapshot) -> None:
        """Stand `run` where the reference's `snapshot` is."""
        run.value = snapshot.value
        run.context = snapshot.context
        run.status = snapshot.status
        run.output = snapshot.output
        run.error = snapshot.error
        run.invocation = snapshot.invoke
        run.owed = None


def _invoke_of(run: FoldRun) -> tuple[str, str] | None:
    """The id and source of the run's owed actor, if any (built or not yet)."""
    if run.invocation is not None:
        return run.invocation.id, run.invocation.src
    if run.owed is not None and run.owed[0].invoke is not None:
        return run.owed[0].invoke.id, run.owed[0].invoke.src
    return None


def _snapshot_text(run: FoldRun, invoke: tuple[str, str] | None) -> bytes | None:
    """`sorted_text(shallow_json(...))` of the run (`_snapshot_pieces`, joined)."""
    pieces = _snapshot_pieces(run, invoke)
    return None if pieces is None else b"".join(pieces)


def _snapshot_pieces(
    run: FoldRun, invoke: tuple[str, str] | None, in_order: bool = False
) -> tuple[bytes, ...] | None:
    """`sorted_text(shallow_json(...))` of the run in pieces, written once each: the input once per run, the
    context once per context object (a step that assigns nothing keeps it), the rest once per state,
    actor and status while there is no output. msgspec writes a dict's members one after
    another, keys sorted, so the pieces joined in the keys' order (context, error, input, then invoke,
    output, status, value) are the text of the whole; None where msgspec cannot write a piece.

    `in_order`: the context written in its own order while the run's contexts are taken to have their
    keys sorted (`FoldRun.written_in_order`): the same text, unless they are not (`Fold.matches`)."""
    input_text = _input_text(run)
    if input_text is None:
        return None
    # msgspec's sort of every dict's keys was a twentieth of verifying a replay: a context is written in
    # its own order while that is taken to be sorted (`_context_text`).
    if run.written_in_order and not in_order:
        try:  # the text kept is in the context's own order: the sorted one is written, not kept
            context_text = SORTED_ENCODER.encode(run.context)
        except Exception:
            return None
    else:
        kept = _context_text(run)
        if kept is None:
            return None
        context_text = kept
    error = b"null" if run.error is None else sorted_text(run.error)
    if error is None:
        return None
    key = (invoke, run.status, run.value) if run.output is None else None
    rest = _REST.get(key) if key is not None else None
    if rest is None:
        rest = _rest_text(invoke, run.status, run.value, run.output)
        if rest is None:
            return None
        if key is not None and len(_REST) < _REST_KEPT:
            _REST[key] = rest
    # shallow_json's keys in order: context, error, input, then the rest (invoke, output, status, value).
    return (b'{"context":', context_text, b',"error":', error, b',"input":', input_text, b",", rest)


def _input_text(run: FoldRun) -> bytes | None:
    """The sorted text of the run's input, written once; None where msgspec cannot write it. (msgspec is
    called here and in `_context_text` itself, not through `sorted_text`: a call into a module the build
    does not compile costs a frame each time.)"""
    if run.input_text is None:
        try:
            run.input_text = SORTED_ENCODER.encode(run.input)
        except Exception:
            return None
    return run.input_text


def _context_text(run: FoldRun) -> bytes | None:
    """The text of the run's context as the run writes it (`FoldRun.written_in_order`), kept for the next
    state while it keeps the context; None where msgspec cannot write it."""
    context = run.context
    if context is not run.text_context:
        try:
            text = None
            if run.written_in_order:
                # Made from the last context's text where it was assigned from that context (C).
                if run.text_context is not None and _CONTEXT_TEXT is not None:
                    text = _CONTEXT_TEXT(context, run.text_context, run.context_text, _WRITE_IN_ORDER)
                if text is None:
                    text = IN_ORDER.encode(context)
            else:
                text = SORTED_ENCODER.encode(context)
        except Exception:  # a lone surrogate, nesting past the stack: as `sorted_text` says
            return None
        run.text_context, run.context_text = context, text
    return run.context_text


def _rest_text(invoke: tuple[str, str] | None, status: str, value: str, output: Any) -> bytes | None:
    """The end of a snapshot's text, after its input (`_snapshot_pieces`); None where msgspec cannot write it."""
    try:
        return SORTED_ENCODER.encode(
            {
                "invoke": {"id": invoke[0], "src": invoke[1]} if invoke else None,
                "output": output,
                "status": status,
                "value": value,
            }
        )[1:]
    except Exception:
        return None


def _hashes_to(pieces: tuple[bytes, ...], journaled: str) -> bool:
    if _SHA256_IS is not None:  # hashed where the pieces lie (improve/_digest.c)
        return bool(_SHA256_IS(pieces, journaled))
    return _sha256(b"".join(pieces)).hexdigest() == journaled


IN_ORDER = msgspec.json.Encoder()
"""msgspec's text of a value in its own order: its sorted text when every dict's keys are sorted."""

_WRITE_IN_ORDER = IN_ORDER.encode
_CONTEXT_TEXT: Any = getattr(digest(), "context_text", None)
"""`context_text` of improve/_digest.c, or None: a context's text is written whole."""

_sha256 = hashlib.sha256
_SHA256_IS: Any = getattr(digest(), "sha256_is", None)
_STATE_IS: Any = getattr(digest(), "state_is", None)
"""`state_is` of improve/_digest.c, or None: `Fold.matches` joins the pieces (`_snapshot_pieces`)."""
"""`sha256_is` of improve/_digest.c (`improve.native.digest`), or None: hashlib on the joined text."""

_REST: dict[tuple[tuple[str, str] | None, str, str], bytes] = {}
"""`_snapshot_text`'s rest of a snapshot without output, by its actor, status and state: as many as the
states of the machines replayed (kept up to `_REST_KEPT`)."""
_REST_KEPT = 4096


def _plain_run(run: FoldRun) -> bool:
    """`plain_json` of what a run's hash covers (its state, status and actor are strings), asking only
    of the input once and of the context's values that were not in the last context found plain: values
    are never changed in place (a step's assign makes a new context; what it reads from an event is a
    copy), so the same object is still plain."""
    if run.plain_input is None:
        run.plain_input = plain_json(run.input)
    if not run.plain_input or not (run.output is None or plain_json(run.output)):
        return False
    if not (run.error is None or plain_json(run.error)):
        return False
    context = run.context
    if context is not run.plain_context:
        if not plain_json(context, run.plain_context):
            return False
        run.plain_context = context
    return True


def fold_of(machine: Machine) -> Fold:
    """`machine` compiled once more for folding many events (replay), once per machine: kept on the
    machine itself, as a cached property would be, so every replay of its threads shares it."""
    found = machine.__dict__.get("_fold")
    if found is None:
        found = machine.__dict__["_fold"] = Fold(machine)
    return found
