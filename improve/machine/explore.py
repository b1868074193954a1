"""State-space exploration: every path a machine can take under given inputs, and proofs of reachability.

The world is made finite by the options: the values to try for each event's payload fields (probe the
guards' boundaries: 0, 40, 100, 101, 240, ...), the outputs each actor may return (one branch each),
which actors may fail, and whether a decision may be exhausted. From the initial snapshot every branch
is followed depth-first; snapshots already seen (by `dedupe_by`, the snapshot hash by default) are not
expanded twice.

`complete` is true only when no path was cut by a limit (`max_depth`, `max_paths`) or by an actor with
no outputs given: then "unreachable" is a proof, relative to the options. With a cut it means only
"not found".

Decisions (`agent.decide`) branch on every allowed event with every combination of its enumerated
payload values *and* the probe values: a guard is tested even against answers the decision protocol
would refuse as invalid payloads, so a proof holds for a decider that ignores the closed choice too.
Idle states (waiting for a person) branch on every event they accept, with the probe payloads (a field
the event needs that the probe gives no values for takes one of its declared or derived type).

Resumes. A run that stops in a waiting state can be resumed (`improve resume`), and a resume may grant
a fresh model-call budget (`Environment.resume_budget`), so the number of resumes along one path bounds
what a thread can spend. A full exploration (not stopped at a target) keeps the graph of snapshots it
saw and reports `resumes`: the most waiting states any path passes through, or, when a cycle of
snapshots runs through a waiting state, that the resumes are unbounded, with the loop as a witness.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.errors import ConfigError, MachineError
from improve.machine.config import DECIDE_SRC
from improve.machine.interpreter import DONE_EVENT, ERROR_EVENT, FREE_TEXT, Machine, initial, transition
from improve.machine.snapshot import Snapshot

Target = str | Callable[[Snapshot], bool]
"""A state id, or a predicate over the snapshot."""

PROBE_TEXT = "probe"
MAX_COMBINATIONS = 500


@dataclass(frozen=True)
class ExploreOptions:
    """What the world may do. Everything not listed is not explored (and cuts the path when needed)."""

    payloads: Mapping[str, Mapping[str, Sequence[Any]]] = field(default_factory=dict)
    """Event type -> payload field -> values to try (added to a decision's own enumerated values)."""
    outputs: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    """Actor src -> the outputs it may return, one branch each."""
    errors: Collection[str] = ()
    """Actor srcs that may fail: one `xstate.error.actor` branch each."""
    decide_errors: bool = True
    """A decision may be exhausted (every answer refused): one error branch per decision."""
    dedupe_by: Callable[[Snapshot], Hashable] | None = None
    """Key of a snapshot for 'seen before' (default: its canonical hash)."""
    max_depth: int = 60
    max_paths: int = 200_000
    """At most this many transitions are tried."""
    closed_choice: bool = False
    """A decision answers only what it offers: `payloads` add no values to its enumerated fields (free
    text still takes them), as the decision protocol refuses any other answer from a decider. Off, the
    search is for a decider that ignores the closed choice too (`beyond_choice` names such answers)."""


@dataclass
class ResumeBound:
    """How often one path can stop in a waiting state and be resumed."""

    max_resumes: int | None
    """The most resumes one path can take: waiting snapshots it passes through and leaves again; None:
    unbounded (a cycle of snapshots runs through a waiting state)."""
    loop: list[dict[str, Any]] | None = None
    """When unbounded: the events from the start to a waiting state, then round a cycle back to it."""
    loop_state: str | None = None
    """The waiting state the loop returns to."""
    waiting_states: list[str] = field(default_factory=list)
    """The waiting states some path reaches."""

    @property
    def bounded(self) -> bool:
        return self.max_resumes is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "bounded": self.bounded,
            "max_resumes": self.max_resumes,
            "loop": self.loop,
            "loop_state": self.loop_state,
            "waiting_states": self.waiting_states,
        }


@dataclass
class ExploreResult:
    reachable: bool
    complete: bool
    witness: list[dict[str, Any]] | None
    """The events from the initial snapshot to the target, when reachable."""
    terminals: dict[str, int]
    """Final (or stuck) state -> how many explored branches ended there."""
    pruned_by_guard: int
    """Events tried that no transition took (a guard refused them, or nothing handles them)."""
    transitions: int
    """Events tried."""
    states: int
    """Distinct snapshots expanded."""
    cuts: list[str] = field(default_factory=list)
    """Why the search is incomplete (first few reasons)."""
    resumes: ResumeBound | None = None
    """How many resumes one path can take (None when the search stopped at a target before the end)."""
    reached: set[str] = field(default_factory=set)
    """Every state a transition tried led to (and the initial one): a state missing from a complete
    search's `reached` is unreachable, as `can_reach` would prove with a search of its own."""

    def to_json(self) -> dict[str, Any]:
        return {
            "resumes": self.resumes.to_json() if self.resumes is not None else None,
            "reachable": self.reachable,
            "complete": self.complete,
            "proof": self.complete and not self.reachable,
            "witness": self.witness,
            "terminals": self.terminals,
            "pruned_by_guard": self.pruned_by_guard,
            "transitions": self.transitions,
            "states": self.states,
            "cuts": self.cuts,
        }


def _matches(target: Target | None, snapshot: Snapshot) -> bool:
    if target is None:
        return False
    if callable(target):
        return bool(target(snapshot))
    return snapshot.value == target


def _combos(event_type: str, fields: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    if not fields:
        return [{"type": event_type}]
    names = list(fields)
    values = itertools.islice(itertools.product(*(fields[n] for n in names)), MAX_COMBINATIONS)
    return [{"type": event_type, **dict(zip(names, combo, strict=True))} for combo in values]


_TYPED: dict[str | None, list[Any]] = {
    "string": [PROBE_TEXT],
    "number": [0, 1.5],
    "integer": [0, 1],
    "boolean": [False, True],
    "object": [{}],
    "array": [[]],
}
"""Values of each payload type (`waits.PAYLOAD_TYPES`) for a waiting state's event whose field the probe
gives none for."""


def _waited(machine: Machine, state: str) -> dict[str, Mapping[str, Any]]:
    """What the waiting `state` accepts, by event: the JSON Schema of each payload (`waits.waiting_for`)."""
    from improve.machine.waits import waiting_for

    return {w["type"]: w["payload"] for w in waiting_for(machine, state)}


def _merge(own: Any, probes: Sequence[Any]) -> list[Any]:
    base = [PROBE_TEXT] if own == FREE_TEXT else list(own or [])
    out: list[Any] = []
    for value in [*base, *probes]:
        if not any(type(v) is type(value) and v == value for v in out):
            out.append(value)
    return out


def branches(
    machine: Machine, snapshot: Snapshot, options: ExploreOptions
) -> tuple[list[dict[str, Any]], str | None]:
    """The events the world may send in this snapshot, and a reason when the path must be cut."""
    invocation = snapshot.invoke
    if invocation is None:
        state = machine.states[snapshot.value]
        events: list[dict[str, Any]] = []
        wanted = _waited(machine, snapshot.value) if state.idle else {}
        for event_type in state.on:
            fields = dict(options.payloads.get(event_type, {}))
            # A field a person's event needs that the probe gives no values for: one of its type, so the
            # search goes on through the state (sent without it, the machine's read of it fails).
            schema = wanted.get(event_type, {})
            for name in schema.get("required", ()):
                if name not in fields:
                    fields[name] = _TYPED.get(schema["properties"][name].get("type"), [None])
            events += _combos(event_type, fields)
        return events, None
    if invocation.src == DECIDE_SRC:
        request = invocation.input
        events = []
        for event_type in request["allowedEvents"]:
            own = request.get("payloads", {}).get(event_type, {})
            probes = options.payloads.get(event_type, {})
            if options.closed_choice:
                fields = {
                    name: _merge(values, probes.get(name, ()) if values == FREE_TEXT else ())
                    for name, values in own.items()
                }
            else:
                fields = {name: _merge(own.get(name), probes.get(name, ())) for name in {*own, *probes}}
            events += _combos(event_type, fields)
        if options.decide_errors:
            events.append(
                {"type": ERROR_EVENT, "actorId": invocation.id, "error": {"kind": "decision-exhausted"}}
            )
        return events, None
    outputs = options.outputs.get(invocation.src)
    events = [{"type": DONE_EVENT, "actorId": invocation.id, "output": out} for out in outputs or ()]
    if invocation.src in options.errors:
        events.append({"type": ERROR_EVENT, "actorId": invocation.id, "error": {"code": "probe"}})
    if not events:
        return [], f"actor '{invocation.src}' in state '{snapshot.value}' has no outputs or errors to explore"
    return events, None


def beyond_choice(machine: Machine, input: Any, witness: Sequence[Mapping[str, Any]]) -> list[str]:
    """The answers of a witness that its decisions did not offer: a payload value outside a decision's
    enumerated values (a probe value, `APPROVE{months: -1}`), or an event it does not allow. The decision
    protocol refuses such an answer from a decider, but a guard that lets it through is still a finding:
    the proof is for a decider that ignores the closed choice too (module docstring)."""
    found: list[str] = []
    snapshot = initial(machine, input)
    for event in witness:
        invocation = snapshot.invoke
        if (
            invocation is not None
            and invocation.src == DECIDE_SRC
            and event.get("type") not in (ERROR_EVENT,)
        ):
            request = invocation.input
            own = request.get("payloads", {}).get(event.get("type"), {})
            if event.get("type") not in request.get("allowedEvents", ()):
                found.append(f"{event.get('type')} is not an event decision '{snapshot.value}' allows")
            for name, allowed in own.items():
                value = event.get(name)
                if allowed != FREE_TEXT and isinstance(allowed, list) and value not in allowed:
                    found.append(
                        f"{event.get('type')}{{{name}: {value!r}}} is outside the values decision "
                        f"'{snapshot.value}' offers ({', '.join(map(repr, allowed))})"
                    )
        snapshot = transition(machine, snapshot, dict(event))
    return found


def explore_paths(
    machine: Machine,
    input: Any,
    options: ExploreOptions | None = None,
    target: Target | None = None,
    stop_at_target: bool = False,
) -> ExploreResult:
    """Explore every path from `initial(machine, input)`; report terminals and, given a target, a witness."""
    opts = options or ExploreOptions()
    key_of = opts.dedupe_by or Snapshot.key
    start = initial(machine, input)
    result = ExploreResult(False, True, None, {}, 0, 0, 0)
    reached = result.reached
    reached.add(start.value)
    if _matches(target, start):
        result.reachable, result.witness = True, []
        return result
    seen: set[Hashable] = {key_of(start)}
    # The graph of snapshots, for the resume bound: edges (with their events), the waiting snapshots, and
    # the path that first reached each waiting snapshot (the start of a witness).
    graph = _Graph(key_of(start))
    # Depth-first, with the path of events kept on the stack for the witness.
    stack: list[tuple[Snapshot, list[dict[str, Any]]]] = [(start, [])]
    while stack:
        snapshot, path = stack.pop()
        result.states += 1
        if snapshot.status != "active":
            result.terminals[snapshot.value] = result.terminals.get(snapshot.value, 0) + 1
            continue
        here = key_of(snapshot)
        if snapshot.invoke is None and machine.states[snapshot.value].idle:
            graph.waits.setdefault(here, (snapshot.value, path))
        if len(path) >= opts.max_depth:
            _cut(result, f"depth {opts.max_depth} reached in state '{snapshot.value}'")
            continue
        events, cut = branches(machine, snapshot, opts)
        if cut:
            _cut(result, cut)
            continue
        if not events:
            result.terminals[snapshot.value] = result.terminals.get(snapshot.value, 0) + 1
            continue
        for event in events:
            if result.transitions >= opts.max_paths:
                _cut(result, f"max_paths {opts.max_paths} reached")
                result.resumes = graph.bound()
                return result
            result.transitions += 1
            try:
                nxt = transition(machine, snapshot, event)
            except MachineError as err:
                raise ProbeError(_failed_step(input, [*path, event], err), err) from None
            if nxt is snapshot:
                result.pruned_by_guard += 1
                continue
            reached.add(nxt.value)
            if _matches(target, nxt):
                if not result.reachable:
                    result.reachable, result.witness = True, [*path, event]
                if stop_at_target:
                    return result
            key = key_of(nxt)
            graph.edges.setdefault(here, []).append((event, key))
            if key in seen:
                continue
            seen.add(key)
            stack.append((nxt, [*path, event]))
    result.resumes = graph.bound()
    return result


class ProbeError(ConfigError):
    """The machine could not take a step of the search: one of its expressions read what the probe's
    world does not give. Exit 2: the machine or the probe is the person's to fix. `step`: the machine's
    own error (a gate that searches a policy's paths says that one)."""

    def __init__(self, message: str, step: MachineError) -> None:
        super().__init__(message)
        self.step = step


def _failed_step(input: Any, path: Sequence[Mapping[str, Any]], err: MachineError) -> str:
    steps = " -> ".join(_shown(e) for e in path)
    return (
        f"exploring from probe input {json.dumps(input, default=str)[:200]}, the machine could not take the "
        f"step {steps}: {err}. One of its expressions reads what the probe's world does not give: a field "
        "spelled otherwise in the machine (its JSON path above), or a tool's output in the probe "
        "(`ExploreOptions.outputs`) or an event's payload (`payloads`) without it"
    )


def _shown(event: Mapping[str, Any]) -> str:
    """An event as a step of a path: its type, an actor's id, a payload's fields."""
    kind = str(event.get("type"))
    if "actorId" in event:
        return f"{kind}({event['actorId']})"
    fields = {k: v for k, v in event.items() if k != "type"}
    return kind + (json.dumps(fields, default=str)[:80] if fields else "")


class _Graph:
    """The snapshots an exploration saw, as a graph, and the resume bound read off it."""

    def __init__(self, start: Hashable) -> None:
        self.start = start
        self.edges: dict[Hashable, list[tuple[dict[str, Any], Hashable]]] = {}
        self.waits: dict[Hashable, tuple[str, list[dict[str, Any]]]] = {}
        """Waiting snapshot -> (its state, the events that first reached it)."""

    def bound(self) -> ResumeBound:
        states = sorted({state for state, _ in self.waits.values()})
        components = self._components()
        component_of = {node: i for i, members in enumerate(components) for node in members}
        for members in components:
            looping = len(members) > 1 or any(k == members[0] for _, k in self.edges.get(members[0], ()))
            for node in members:
                if looping and node in self.waits:
                    state, reach = self.waits[node]
                    return ResumeBound(None, [*reach, *self._cycle(node, set(members))], state, states)
        # No waiting snapshot lies on a cycle: the longest path, counting waiting snapshots, is finite.
        # Tarjan's components come out in reverse topological order, so each one's successors are done.
        best: list[int] = []
        for members in components:
            # A wait with a way out is a stop and a resume; one without (every event refused) only a stop.
            own = sum(node in self.waits and bool(self.edges.get(node)) for node in members)
            after = [
                best[component_of[k]]
                for node in members
                for _, k in self.edges.get(node, ())
                if component_of[k] != len(best)
            ]
            best.append(own + max(after, default=0))
        return ResumeBound(best[component_of[self.start]] if best else 0, None, None, states)

    def _cycle(self, node: Hashable, members: set[Hashable]) -> list[dict[str, Any]]:
        """The events of a shortest cycle from `node` back to itself, inside its component."""
        came: dict[Hashable, tuple[Hashable, dict[str, Any]]] = {}
        queue = [node]
        for current in queue:
            for event, nxt in self.edges.get(current, ()):
                if nxt not in members or nxt in came:
                    continue
                came[nxt] = (current, event)
                if nxt == node:
                    queue.clear()
                    break
                queue.append(nxt)
        events: list[dict[str, Any]] = []
        at = node
        while True:
            before, event = came[at]
            events.append(event)
            at = before
            if at == node:
                return events[::-1]

    def _components(self) -> list[list[Hashable]]:
        """Strongly connected components (Tarjan, iterative), in reverse topological order."""
        index: dict[Hashable, int] = {}
        low: dict[Hashable, int] = {}
        on_stack: set[Hashable] = set()
        stack: list[Hashable] = []
        out: list[list[Hashable]] = []
        counter = 0
        nodes = [self.start, *(n for n in self.edges if n != self.start)]
        for root in nodes:
            if root in index:
                continue
            work: list[tuple[Hashable, int]] = [(root, 0)]
            while work:
                node, position = work.pop()
                if position == 0:
                    index[node] = low[node] = counter
                    counter += 1
                    stack.append(node)
                    on_stack.add(node)
                successors = self.edges.get(node, ())
                if position < len(successors):
                    work.append((node, position + 1))
                    nxt = successors[position][1]
                    if nxt not in index:
                        work.append((nxt, 0))
                    elif nxt in on_stack:
                        low[node] = min(low[node], index[nxt])
                    continue
                if low[node] == index[node]:
                    members: list[Hashable] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    out.append(members)
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
        return out


def check_target(machine: Machine, target: Target) -> None:
    """A target named by its state must be one of the machine's states."""
    if isinstance(target, str) and target not in machine.states:
        from improve.errors import MachineConfigError

        raise MachineConfigError(f"target state '{target}' does not exist; states are {list(machine.states)}")


def can_reach(
    machine: Machine, target: Target, input: Any, options: ExploreOptions | None = None
) -> ExploreResult:
    """Whether `target` (a state id or a predicate) is reachable; stops at the first witness."""
    check_target(machine, target)
    return explore_paths(machine, input, options, target=target, stop_at_target=True)


def _cut(result: ExploreResult, reason: str) -> None:
    result.complete = False
    if len(result.cuts) < 10 and reason not in result.cuts:
        result.cuts.append(reason)
