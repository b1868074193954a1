"""tool-loop's rule evals and exploration probe: the loop's rules and guards, without a model.

`RULE_EVALS` drive the interpreter through each guarded state with scripted events; `probe()` is
what the world may do for exploration proofs, and `PROBE_INPUTS` the inputs they start from.
`bash_call`, `bash_ran` and `tool_output` build the events and actor outputs (the tests use them too).
"""

from __future__ import annotations

from typing import Any

from improve.examples.tool_loop.calls import ToolCall, calls_text, os_error_code, signature
from improve.examples.tool_loop.guards import DEFAULT_MAX_TURNS
from improve.examples.tool_loop.world import RESULT_OVERHEAD_TOKENS
from improve.machine import ExploreOptions, RuleEval

# --- the world for proofs ------------------------------------------------------------------------------

ACTOR_NAMES = ("tools.execute", "guards.check", "session.report")
PROBE_CALL = calls_text([ToolCall("bash", {"command": "ls"})])
_LS = signature([ToolCall("bash", {"command": "ls"})])
_PWD = signature([ToolCall("bash", {"command": "pwd"})])


def tool_output(sig: str, output: str = "file.txt") -> dict[str, Any]:
    """A `tools.execute` output (for proofs and rule evals): one bash result with this signature."""
    return {
        "results": [{"name": "bash", "output": output}],
        "signature": sig,
        "osError": os_error_code(output),
        "tokens": len(output) // 4 + RESULT_OVERHEAD_TOKENS,
    }


def probe() -> ExploreOptions:
    """The world for proofs: one well-formed call (and the malformed probe text), answers with and without
    text, and tools that report a repeated call, another call, or an OS error; every actor may fail. The
    tools' reports do not depend on the call (an over-approximation: every combination is explored)."""
    return ExploreOptions(
        payloads={
            "CALL_TOOLS": {"calls": [PROBE_CALL]},
            "ANSWER": {"text": [""]},
            "PROMPT": {"text": ["list the files"]},
        },
        outputs={
            "tools.execute": [
                tool_output(_LS),
                tool_output(_PWD, "/workspace"),
                tool_output(_LS, "ls: /root: EACCES: permission denied"),
            ],
            "guards.check": [
                {"verdict": "block", "checkpoint": "probe", "guard": "probe", "reason": "probe"}
            ],
            "session.report": [{"reported": True}],
        },
        errors=set(ACTOR_NAMES),
        max_depth=400,
    )


PROBE_INPUTS: list[dict[str, Any]] = [
    {"task": "list the files", "limits": {"maxTurns": 6}},
    {"task": "list the files", "limits": {"maxTurns": 6, "maxTokens": 2000}},
    {"limits": {"maxTurns": 4}},
]
"""Small budgets keep `improve explore` complete in seconds with its default limits; the tests prove
the default 50-turn budget with a projection of the snapshot (tests/test_tool_loop.py)."""


# --- rule evals: the loop's rules and guards, without a model ---------------------------------------------

_TASK = {"task": "list the files"}


def bash_call(command: str) -> dict[str, Any]:
    """A `CALL_TOOLS` answer with one bash call."""
    return {"type": "CALL_TOOLS", "calls": calls_text([ToolCall("bash", {"command": command})])}


def bash_ran(command: str, output: str = "file.txt") -> dict[str, Any]:
    """The `tools.execute` completion of that call."""
    sig = signature([ToolCall("bash", {"command": command})])
    return {"type": "xstate.done.actor", "actorId": "executing_tools", "output": tool_output(sig, output)}


def _turn(command: str, output: str = "file.txt") -> list[dict[str, Any]]:
    return [bash_call(command), bash_ran(command, output)]


_DENIED = "touch: /root/x: EACCES: permission denied"
_EMPTY = {"type": "ANSWER", "text": ""}
_FIFTY_TURNS = [event for n in range(DEFAULT_MAX_TURNS) for event in _turn(f"echo {n}")]

RULE_EVALS = [
    RuleEval(
        "a task in the input starts the first turn",
        ("idle", "checking_turn", "starting_turn"),
        _TASK,
        state="streaming",
        accepts=[bash_call("ls"), {"type": "ANSWER", "text": "nothing to do"}, _EMPTY],
        refuses=[{"type": "REPORT_BLOCKED", "reason": "too hard"}],
    ),
    RuleEval(
        "without a task the loop waits for a prompt, and an empty prompt is refused",
        ("idle",),
        {},
        state="idle",
        accepts=[{"type": "PROMPT", "text": "list the files"}],
        refuses=[{"type": "PROMPT", "text": ""}, {"type": "PROMPT"}],
    ),
    RuleEval(
        "malformed tool calls are refused (and fed back to the model)",
        ("streaming",),
        _TASK,
        state="streaming",
        accepts=[
            {
                "type": "CALL_TOOLS",
                "calls": '[{"name": "read", "args": {"file_path": "a.py"}}, {"name": "ls"}]',
            }
        ],
        refuses=[
            {"type": "CALL_TOOLS", "calls": "bash ls"},
            {"type": "CALL_TOOLS", "calls": "[]"},
            {"type": "CALL_TOOLS", "calls": '{"name": "bash", "args": {"command": "ls"}}'},
            {"type": "CALL_TOOLS", "calls": '[{"name": "", "args": {}}]'},
            {"type": "CALL_TOOLS", "calls": '[{"name": "bash", "args": "ls"}]'},
            {"type": "CALL_TOOLS"},
        ],
    ),
    RuleEval(
        "REPORT_BLOCKED is accepted right after a tool turn with an OS error",
        ("streaming",),
        _TASK,
        _turn("touch /root/x", _DENIED),
        "streaming",
        accepts=[{"type": "REPORT_BLOCKED", "reason": "EACCES on /root"}, {"type": "REPORT_BLOCKED"}],
    ),
    RuleEval(
        "REPORT_BLOCKED is refused once a tool turn succeeds again",
        ("streaming",),
        _TASK,
        [*_turn("touch /root/x", _DENIED), *_turn("ls")],
        "streaming",
        refuses=[{"type": "REPORT_BLOCKED", "reason": "EACCES on /root"}],
    ),
    RuleEval(
        "an answer with text ends the loop",
        ("streaming",),
        _TASK,
        [*_turn("ls"), {"type": "ANSWER", "text": "file.txt"}],
        "done",
    ),
    RuleEval(
        "a report ends the loop once the report is made",
        ("streaming",),
        _TASK,
        [
            *_turn("touch /root/x", _DENIED),
            {"type": "REPORT_BLOCKED"},
            {"type": "xstate.done.actor", "actorId": "reporting", "output": {"reported": True}},
        ],
        "done",
    ),
    RuleEval(
        "an empty response is retried once",
        ("streaming", "checking_response"),
        _TASK,
        [_EMPTY],
        "streaming",
    ),
    RuleEval(
        "whitespace is an empty response too, and a second one in a row stops the loop",
        ("checking_response",),
        _TASK,
        [_EMPTY, {"type": "ANSWER", "text": "  \n"}],
        "guard_fired",
    ),
    RuleEval(
        "a tool turn between two empty responses resets the retry",
        ("checking_response",),
        _TASK,
        [_EMPTY, *_turn("ls"), _EMPTY],
        "streaming",
    ),
    RuleEval(
        "two identical tool turns run",
        ("checking_calls",),
        _TASK,
        [*_turn("ls"), bash_call("ls")],
        "executing_tools",
    ),
    RuleEval(
        "the third identical tool turn is stopped before its tools run",
        ("checking_calls",),
        _TASK,
        [*_turn("ls"), *_turn("ls"), bash_call("ls")],
        "guard_fired",
    ),
    RuleEval(
        "another call in between breaks the identical streak",
        ("checking_calls",),
        _TASK,
        [*_turn("ls"), *_turn("pwd"), *_turn("ls"), bash_call("ls")],
        "executing_tools",
    ),
    RuleEval(
        "three tool turns in a row with an OS error stop the loop after the third turn's tools ran",
        ("checking_results",),
        _TASK,
        [
            *_turn("ls /root", "ls: /root: EPERM: permission denied"),
            *_turn("cat /root/secrets", "cat: /root/secrets: EPERM: still no"),
            *_turn("touch /root/x", "touch: /root/x: EPERM: nope"),
        ],
        "guard_fired",
    ),
    RuleEval(
        "a tool turn without an OS error breaks the error streak",
        ("checking_results",),
        _TASK,
        [
            *_turn("ls /root", "ls: /root: EPERM: permission denied"),
            *_turn("cat /root/secrets", "cat: /root/secrets: EPERM: still no"),
            *_turn("ls"),
            *_turn("touch /root/x", "touch: /root/x: EPERM: nope"),
        ],
        "streaming",
    ),
    RuleEval(
        "a missing file (ENOENT) is not an environment error",
        ("checking_results",),
        _TASK,
        [e for n in range(3) for e in _turn(f"cat a{n}.txt", f"cat: a{n}.txt: No such file or directory")],
        "streaming",
    ),
    RuleEval(
        "the 50th model call is the last: the turn budget stops the 51st before it starts",
        ("checking_turn", "starting_turn"),
        _TASK,
        _FIFTY_TURNS,
        "guard_fired",
    ),
    RuleEval(
        "49 turns leave one more model call",
        ("checking_turn", "starting_turn"),
        _TASK,
        _FIFTY_TURNS[:-2],
        "streaming",
    ),
    RuleEval(
        "the cost limit stops the call that would take the spend over it",
        ("checking_turn",),
        {"task": "list the files", "limits": {"maxTokens": 1200}},
        _turn("cat big.log", "x" * 1600),
        "guard_fired",
    ),
    RuleEval(
        "a call within the cost limit starts",
        ("checking_turn",),
        {"task": "list the files", "limits": {"maxTokens": 1600}},
        _turn("cat big.log", "x" * 1600),
        "streaming",
    ),
    RuleEval(
        "a guard's firing ends the loop in error",
        ("guard_fired",),
        _TASK,
        [
            *_turn("ls"),
            *_turn("ls"),
            bash_call("ls"),
            {
                "type": "xstate.done.actor",
                "actorId": "guard_fired",
                "output": {
                    "verdict": "block",
                    "checkpoint": "before-tools",
                    "guard": "stuck-loop",
                    "reason": "r",
                },
            },
        ],
        "error",
    ),
    RuleEval(
        "a guard that passes on a second look is an error too (guards must be pure)",
        ("guard_fired",),
        _TASK,
        [
            *_turn("ls"),
            *_turn("ls"),
            bash_call("ls"),
            {
                "type": "xstate.done.actor",
                "actorId": "guard_fired",
                "output": {"verdict": "pass", "checkpoint": "before-tools", "guard": "", "reason": ""},
            },
        ],
        "error",
    ),
]
