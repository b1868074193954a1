"""The shape of each state: choice states that can branch, transitions that can be taken, finals that end.

Codes: choice-without-branches, choice-without-default, choice-with-other-exits, shadowed-transition,
final-with-exit, final-without-output
"""

from __future__ import annotations

from improve.machine.config import StateConfig
from improve.machine.lint.document import Document, relative
from improve.machine.walk import state_path, transition_lists


def check(doc: Document) -> None:
    for name, state in doc.config.states.items():
        if state.is_final:
            _final(doc, name, state)
        else:
            _choice(doc, name, state)
        _shadowed(doc, name, state)


def _choice(doc: Document, name: str, state: StateConfig) -> None:
    sp = state_path(name)
    if state.type == "choice" and not state.choice:
        doc.add(
            "choice-without-branches",
            "error",
            sp,
            f'State \'{name}\' has `"type": "choice"` but no `choice` branches. Add a `choice` list '
            '(e.g. `[{"guard": "...", "target": "..."}, {"target": "..."}]`, last branch unguarded), '
            "or remove the type.",
        )
    if not state.choice:
        return
    guarded = all(edge.guarded for edge in doc.edges[name] if edge.kind == "choice")
    if guarded:
        last = len(state.choice) - 1
        doc.add(
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
        doc.add(
            "choice-with-other-exits",
            "error",
            f"{sp}.{key}",
            f"Choice state '{name}' also has `{key}`, but {why}. Put these into the `choice` list, or "
            f"move `{key}` to a separate state that a branch targets.",
        )
    if state.on and not guarded:
        doc.add(
            "choice-with-other-exits",
            "error",
            f"{sp}.on",
            f"Choice state '{name}' also has `on`, but it always leaves through a `choice` branch as "
            f"soon as it is entered, so these events are never handled there. Move `on` to a separate "
            f"state that a branch targets.",
        )


def _shadowed(doc: Document, name: str, state: StateConfig) -> None:
    for group in transition_lists(name, state):
        edges = group.edges
        for i, edge in enumerate(edges):
            if not edge.guarded and i + 1 < len(edges):
                rest = edges[i + 1 :]
                doc.add(
                    "shadowed-transition",
                    "warning",
                    rest[0].path,
                    f"In state '{name}', {relative(edge.path, name)} has no guard, so it is always "
                    f"taken and the {len(rest)} transition(s) after it in {relative(group.path, name)} "
                    f"({', '.join(relative(e.path, name) for e in rest)}) can never be taken. Give "
                    f"{relative(edge.path, name)} a guard, move it last, or delete the ones after it.",
                )
                break


def _final(doc: Document, name: str, state: StateConfig) -> None:
    sp = state_path(name)
    what = "Sentinel" if state.is_sentinel else "Final state"
    for key, present in (
        ("on", bool(state.on)),
        ("always", state.always is not None),
        ("choice", state.choice is not None),
        ("invoke", state.invoke is not None),
    ):
        if present:
            doc.add(
                "final-with-exit",
                "error",
                f"{sp}.{key}",
                f"{what} '{name}' has `{key}`, but a final state ends the run: nothing in it is ever "
                f"taken or invoked. Remove `{key}`, or make '{name}' a non-final state"
                + (" (a sentinel must stay final: it marks an invariant)." if state.is_sentinel else "."),
            )
    if state.output is not None:
        return
    if doc.policy:
        doc.add(
            "final-without-output",
            "error",
            sp,
            f"Policy final state '{name}' has no `output`, but a policy's final output is the "
            'chosen event. Add `"output": "event.output"` (the model\'s answer) or a fixed event '
            'such as `{"type": "\'ESCALATE\'"}`.',
        )
    elif not state.is_sentinel:
        doc.add(
            "final-without-output",
            "warning",
            sp,
            f"Final state '{name}' has no `output`, so a run that ends here reports no outcome. "
            'Add an `output`, e.g. `{"outcome": "\'' + name + "'\"}`.",
        )
