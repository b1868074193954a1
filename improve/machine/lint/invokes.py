"""Invokes and their failures: an actor's result is used, its error handled, a decision request valid.

Codes: invoke-without-on-done, invoke-without-on-error, decide-without-events (`agent.decide`),
decide-event-unhandled, invalid-decide-input
"""

from __future__ import annotations

from pydantic import ValidationError

from improve.machine.config import DECIDE_SRC, MODEL_DECIDE, DecideInputConfig, StateConfig
from improve.machine.lint.document import Document, relative
from improve.machine.walk import child_path, state_path


def check(doc: Document) -> None:
    for name, state in doc.config.states.items():
        if state.invoke is None:
            continue
        if state.invoke.src == DECIDE_SRC:
            _decide(doc, name, state)
        elif not (doc.policy and state.invoke.src == MODEL_DECIDE):
            # A policy's model.decide without onDone is decide-without-events (see policy.py).
            _on_done(doc, name, state)
        _on_error(doc, name, state)


def _on_done(doc: Document, name: str, state: StateConfig) -> None:
    assert state.invoke is not None
    if state.invoke.onDone is not None:
        return
    doc.add(
        "invoke-without-on-done",
        "error",
        f"{state_path(name)}.invoke",
        f"State '{name}' invokes '{state.invoke.src}' but has no `invoke.onDone`, so the actor's result is "
        "dropped and the run stays in this state forever. Add "
        '`"onDone": {"target": "..."}` (read the result as `event.output`).',
    )


def _on_error(doc: Document, name: str, state: StateConfig) -> None:
    assert state.invoke is not None
    src = state.invoke.src
    if state.invoke.onError is not None:
        return
    what = (
        "a decision can be exhausted (every answer refused)"
        if src == DECIDE_SRC
        else "a model call can fail"
        if src == MODEL_DECIDE
        else f"the actor '{src}' can fail"
    )
    then = (
        "the policy gives no answer"
        if doc.policy
        else "the run stops with status 'error' instead of reaching a final state"
    )
    doc.add(
        "invoke-without-on-error",
        doc.soft(),
        f"{state_path(name)}.invoke",
        f"State '{name}' invokes '{src}' without `invoke.onError`: {what}, and then {then}. "
        'Add `"onError": {"target": "..."}` leading to a state that handles the failure'
        + (' (e.g. a final whose output is `{"type": "\'ESCALATE\'"}`).' if doc.policy else "."),
    )


def _decide(doc: Document, name: str, state: StateConfig) -> None:
    """The decision request of an `agent.decide` invoke: valid, offering events, each one handled."""
    assert state.invoke is not None
    inp = f"{state_path(name)}.invoke.input"
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
                path = f"{path}[{part}]" if isinstance(part, int) else child_path(path, str(part))
            doc.add(
                "invalid-decide-input",
                "error",
                path,
                f"State '{name}' invokes `{DECIDE_SRC}` with an invalid decision request: "
                f"{relative(path, name)}: {problem['msg']}. A decision request has `name` (CEL, e.g. "
                "\"'classify'\"), `allowedEvents` (a list of event names, not CEL), and optional "
                "`payloads` (event -> field -> CEL list of options, or \"'text'\"), `facts` and `prompt`.",
            )
    events = raw.get("allowedEvents") if isinstance(raw, dict) else None
    if events is None or events == []:
        doc.add(
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
            doc.add(
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
            doc.add(
                "invalid-decide-input",
                "error",
                child_path(f"{inp}.payloads", event),
                f"State '{name}' describes payloads for '{event}', which is not in allowedEvents "
                f"{spec.allowedEvents}. Add '{event}' to allowedEvents or remove its payloads.",
            )
