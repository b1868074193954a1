"""Where a run can go: targets that exist, states that can be reached, and runs that can end.

Codes: unknown-initial, unknown-target, unreachable-state, dead-end, no-way-to-finish, self-loop-always,
always-cycle
"""

from __future__ import annotations

from improve.machine.lint.document import Document, relative
from improve.machine.walk import Edge, state_path


def check(doc: Document) -> None:
    _initial_and_targets(doc)
    _reachability(doc)
    for name, state in doc.config.states.items():
        if doc.is_dead_end(name) and not (state.type == "choice" and not state.choice):
            # An empty choice state is reported once, as choice-without-branches.
            _dead_end(doc, name)
    _self_loops(doc)
    _cycles(doc)


def _initial_and_targets(doc: Document) -> None:
    names = list(doc.config.states)
    if doc.config.initial not in doc.config.states:
        doc.add(
            "unknown-initial",
            "error",
            "$.initial",
            f"`initial` is '{doc.config.initial}', which is not a state; set it to one of {names}.",
        )
    for name, edges in doc.edges.items():
        for edge in edges:
            if edge.target is not None and edge.target not in doc.config.states:
                doc.add(
                    "unknown-target",
                    "error",
                    edge.path,
                    f"In state '{name}', the transition at {relative(edge.path, name)} targets "
                    f"'{edge.target}', which is not a state. Targets name a key of `states`: use one "
                    f"of {names}, or add a state '{edge.target}'.",
                )


def _reachability(doc: Document) -> None:
    states = doc.config.states
    if doc.config.initial in states:
        reached = doc.reachable_from([doc.config.initial])
        for name, state in states.items():
            if name in reached or state.is_sentinel:
                continue
            doc.add(
                "unreachable-state",
                doc.soft(),
                state_path(name),
                f"State '{name}' is unreachable: no chain of transitions (`on`, `always`, `choice`, "
                f"`invoke.onDone`, `invoke.onError`) from the initial state '{doc.config.initial}' "
                f"targets it. Add a transition whose target is '{name}' where it belongs, or delete "
                "the state.",
            )
    else:
        reached = set(states)
    finals = {name for name, state in states.items() if state.is_final}
    broken = {n for n, edges in doc.edges.items() if any(e.target not in (None, *states) for e in edges)}
    can_finish = doc.can_reach(finals | broken)  # a broken target is reported as unknown-target
    dead = {name for name in states if doc.is_dead_end(name)}
    leads_to_dead = doc.can_reach(dead)
    for name in sorted(reached - can_finish - finals - leads_to_dead, key=list(states).index):
        loop = sorted(doc.reachable_from([name]) - {name}, key=list(states).index)
        via = f" (it only leads to {', '.join(repr(s) for s in loop)})" if loop else ""
        doc.add(
            "no-way-to-finish",
            doc.soft(),
            state_path(name),
            f"From state '{name}' no final state can be reached{via}: every path loops forever. "
            f"Add a transition from '{name}' (or from a state it leads to) whose target is a "
            "final state, e.g. on `invoke.onError` or as an unguarded last `always` branch.",
        )


def _dead_end(doc: Document, name: str) -> None:
    state = doc.config.states[name]
    doc.add(
        "dead-end",
        "error",
        state_path(name),
        f"State '{name}' is not final but has no way out: "
        + (
            "it has no `on`, `always`, `choice` or `invoke`"
            if not doc.edges[name] and state.invoke is None
            else "none of its transitions targets another state"
        )
        + ", so a run that enters it never ends. Add a transition to another state, or make it "
        'a final state (`"type": "final"` with an `output`).',
    )


def _self_loops(doc: Document) -> None:
    """Eventless transitions back to their own state that nothing can stop."""
    for name, state in doc.config.states.items():
        if state.is_final:
            continue
        for edge in doc.edges[name]:
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
            doc.add(
                "self-loop-always",
                "error",
                edge.path,
                f"In state '{name}', the eventless transition {relative(edge.path, name)} targets "
                f"'{name}' itself and {why}: the machine loops forever and the interpreter stops with "
                "an error. Target another state, or give it a guard and an `assign` that makes the "
                "guard false.",
            )


def _cycles(doc: Document) -> None:
    """Unguarded eventless transitions: a state is left at once for its forced successor."""
    order = list(doc.config.states)
    forced: dict[str, Edge] = {}
    for name, state in doc.config.states.items():
        if state.is_final:
            continue
        branches = [e for e in doc.edges[name] if e.kind == ("choice" if state.choice else "always")]
        if branches and not branches[0].guarded and branches[0].target in doc.config.states:
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
                    first = min(cycle, key=order.index)
                    edge = forced[first]
                    ring = " -> ".join([*cycle[cycle.index(first) :], *cycle[: cycle.index(first)], first])
                    doc.add(
                        "always-cycle",
                        "error",
                        edge.path,
                        f"States {ring} form a cycle of unguarded eventless transitions (`always` or "
                        f"`choice`): entering any of them loops forever and the interpreter stops with "
                        f"an error. Give one of these transitions (e.g. {relative(edge.path, first)} of "
                        f"state '{first}') a guard that becomes false, or target a different state.",
                    )
                break
            chain.append(nxt)
