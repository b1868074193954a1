"""tool-loop's stand-in models: plain functions of the decision request that follow the task's plan.

Each answers `nextStep` with one tool turn per step of the scenario's `plan`, then a final answer.
They differ in what they do when a tool turn fails: `careful` reports an OS error at once, `naive`
retries or ignores it, and `sloppy` breaks the rules and guards the loop must catch.
"""

from __future__ import annotations

import random
from typing import Any

from improve.examples.tool_loop.calls import ToolCall, calls_text, os_error_code
from improve.runtime import DecisionRequest, first_option

_RETRIED_ERRORS = ("EACCES", "EPERM")


def _loop(request: DecisionRequest) -> dict[str, Any]:
    loop = request.facts.get("loop")
    return loop if isinstance(loop, dict) else {}


def _last(request: DecisionRequest) -> dict[str, Any]:
    last = request.facts.get("last")
    return last if isinstance(last, dict) else {}


def _next_step(request: DecisionRequest) -> str | None:
    """The calls text of the plan's next step (one tool turn per step), or None when the plan is done."""
    plan = request.facts.get("plan") or []
    index = int(_loop(request).get("toolTurns", 0))
    if not isinstance(plan, list) or index >= len(plan):
        return None
    step = plan[index]
    items = step if isinstance(step, list) else [step]
    return calls_text(ToolCall(str(i.get("name", "")), dict(i.get("args") or {})) for i in items)


def _call(calls: str) -> dict[str, Any]:
    return {"type": "CALL_TOOLS", "calls": calls}


def _done(request: DecisionRequest) -> dict[str, Any]:
    return {"type": "ANSWER", "text": f"Done: {request.facts.get('task', '')}"}


def careful(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Follows the plan; reports the first OS error at once instead of retrying what cannot work."""
    if request.attempts:
        return first_option(request)
    if int(_loop(request).get("errorTurns", 0)) > 0:
        return {
            "type": "REPORT_BLOCKED",
            "reason": f"The sandbox refuses this task ({_last(request).get('error', '')}); it needs a person.",
        }
    step = _next_step(request)
    return _call(step) if step is not None else _done(request)


def naive(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """A plausible model with one systematic mistake: it never reports an OS error. Permission denied
    (EACCES, EPERM) it takes for a glitch and repeats the same call; any other (disk full, read-only
    file system) it ignores and carries on with the plan."""
    if request.attempts:
        return first_option(request)
    if int(_loop(request).get("errorTurns", 0)) > 0 and _last(request).get("error") in _RETRIED_ERRORS:
        return _call(str(_last(request).get("calls", "")))
    step = _next_step(request)
    return _call(step) if step is not None else _done(request)


def sloppy(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Breaks what the loop's rules and guards must catch: empty responses, malformed tool calls, claims of
    being blocked without evidence, and retrying whatever failed, word for word."""
    roll = rng.random()
    if request.attempts:
        return rng.choice(request.options) if request.options and roll < 0.5 else _done(request)
    if roll < 0.12:
        return {"type": "ANSWER", "text": ""}
    step = _next_step(request)
    if roll < 0.2 and step is not None:
        return _call("bash " + step)  # shell syntax, not a call list: refused, fed back
    if roll < 0.26:
        return {"type": "REPORT_BLOCKED", "reason": "this looks too hard"}
    results = _last(request).get("results") or []
    failed = any(
        "Error" in str(r.get("output", "")) or os_error_code(str(r.get("output", ""))) for r in results
    )
    if failed and _last(request).get("calls"):
        return _call(str(_last(request)["calls"]))
    return _call(step) if step is not None else _done(request)
