"""Rules for policies only: a policy answers one decision request with an offered event, and that is all.

Codes: policy-on-event, decide-in-policy, decide-without-events (`model.decide`), policy-output-not-event
"""

from __future__ import annotations

import json
import re
from typing import Any

from improve.machine.config import DECIDE_SRC, MODEL_DECIDE, StateConfig
from improve.machine.lint.document import Document
from improve.machine.walk import state_path

_CEL_STRING = re.compile(r"""^\s*[rR]?('[^']*'|"[^"]*")\s*$""")


def check(doc: Document) -> None:
    if not doc.policy:
        return
    for name, state in doc.config.states.items():
        src = state.invoke.src if state.invoke is not None else None
        if src == DECIDE_SRC:
            _decide_in_policy(doc, name)
        elif src == MODEL_DECIDE:
            _model_answers(doc, name, state)
        if state.is_final:
            if state.output is not None:
                _output(doc, name, state.output)
        elif state.on and src != DECIDE_SRC:
            # An agent.decide state's `on` is covered by decide-in-policy, not reported twice.
            doc.add(
                "policy-on-event",
                "error",
                f"{state_path(name)}.on",
                f"Policy state '{name}' has `on` transitions ({', '.join(state.on)}), but a policy "
                "receives no events: it only sees the results of the actors it invokes. Branch on the "
                "request with a `choice` state, or move these transitions to `invoke.onDone` / "
                "`invoke.onError`, and remove `on`.",
            )


def _decide_in_policy(doc: Document, name: str) -> None:
    doc.add(
        "decide-in-policy",
        "error",
        f"{state_path(name)}.invoke.src",
        f"Policy state '{name}' invokes `{DECIDE_SRC}`, the environment's decision request; a "
        f'policy cannot send one. Ask a model instead: `"src": "{MODEL_DECIDE}", "input": '
        f'{{"model": "\'decider\'"}}`, with `onDone` leading to a final state whose output '
        'is `"event.output"`, and remove this state\'s `on` (a policy receives no events).',
    )


def _model_answers(doc: Document, name: str, state: StateConfig) -> None:
    """A `model.decide` whose answer can reach a final state (where the policy outputs it)."""
    assert state.invoke is not None
    ip = f"{state_path(name)}.invoke"
    # Any final counts here: one without an output is reported once, as final-without-output.
    answers = {n for n, s in doc.config.states.items() if s.is_final}
    starts = [e.target for e in doc.edges[name] if e.kind == "onDone" and e.target is not None]
    if doc.reachable_from(starts) & answers:
        return
    if state.invoke.onDone is None:
        what = "has no `invoke.onDone`, so the model's answer is dropped"
        path = ip
    else:
        what = "has an `invoke.onDone` that never leads to a final state"
        path = f"{ip}.onDone"
    doc.add(
        "decide-without-events",
        "error",
        path,
        f"Policy state '{name}' asks a model (`{MODEL_DECIDE}`) but {what}: the policy can never answer "
        'with the chosen event. Add `"onDone": {"target": "answer"}` with a final state `"answer": '
        '{"type": "final", "output": "event.output"}`.',
    )


def _output(doc: Document, name: str, output: Any) -> None:
    op = f"{state_path(name)}.output"
    fix = 'Write the chosen event as an object with a `type`, e.g. `{"type": "\'ESCALATE\'"}`, or '
    fix += '`"event.output"` for a model\'s answer.'
    if isinstance(output, dict):
        if "type" not in output:
            doc.add(
                "policy-output-not-event",
                "error",
                op,
                f"Policy final state '{name}' outputs an object without `type`, so it is not an "
                f"event and the environment cannot take it. Add `type` with the event name quoted "
                'inside the CEL, e.g. `"type": "\'ESCALATE\'"`.',
            )
        elif not isinstance(output["type"], str):
            doc.add(
                "policy-output-not-event",
                "error",
                f"{op}.type",
                f"Policy final state '{name}' outputs an event whose `type` is "
                f"{json.dumps(output['type'])}, not an event name. Write it as a quoted CEL string, e.g. "
                '`"type": "\'ESCALATE\'"`.',
            )
    elif isinstance(output, str):
        if _CEL_STRING.match(output):
            doc.add(
                "policy-output-not-event",
                "error",
                op,
                f"Policy final state '{name}' outputs the string {output.strip()}, not an event. "
                f'Write `{{"type": "{output.strip()}"}}` instead.',
            )
    else:
        doc.add(
            "policy-output-not-event",
            "error",
            op,
            f"Policy final state '{name}' outputs {json.dumps(output)}, which is not an event. {fix}",
        )
