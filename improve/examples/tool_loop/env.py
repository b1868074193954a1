"""tool-loop: the guarded agent loop of opencli issue #60, as a machine.

The original is a TypeScript coding agent whose loop was a single `while (true)` with its safety
checks inline. Here the loop is machine.json: `idle` (waiting for a prompt), `streaming` (the model's
turn: tool calls, an answer, or a report that the environment blocks the task), `executing_tools`,
`feeding_results` (the results join the conversation), and the finals `done` and `error`. Between them
sit four *checkpoints* where every guard registered for that checkpoint runs (guards.py): guards are
objects on a registry, never written into the loop, so adding one changes no state of the machine.

A checkpoint state routes with the named guard `checkpointBlocks` (the interpreter evaluates it, so
exploration proves properties of the real guards, not of a stub). When a guard blocks, `guard_fired`
runs the guards once more in the `guards.check` actor: its output, the guard's name and reason, is
journaled with the actor's completion, so every firing is an entry in the log and a replay reads it
without running anything.

The invariant is the sentinel `overBudget`: `starting_turn`, the last state before a model call,
checks the turn budget with its own expression (not through the registry), so a registry that lost its
max-turns guard would reach it. The tests prove it unreachable with the built-in guards, and reachable
without max-turns.

The world is a small fake sandbox (a scenario's `world`):

    files:      {src/app.py: "...", ...}           # what `read`, `edit` and `cat` see
    readonly:   [/etc/, vendor/]                    # writes and edits there fail with EACCES
    unreadable: [/root/]                            # reads there fail with EACCES
    diskFull: true                                  # every write fails with ENOSPC
    readOnlyFs: true                                # every write fails with EROFS
    commands:                                       # bash: scripted outputs, used in order (the last repeats)
      "pytest -q": ["1 failed ...", {output: "3 passed", effect: {kind: ...}}]

A long text can be written `{repeat: "one line\\n", times: 400}` (a file's content or a command's output).

Tools: `read {file_path}`, `write {file_path, content}`, `edit {file_path, old_string, new_string}`,
`bash {command}` (scripted commands, then `ls`, `cat`, `pwd`). Effects recorded: `write`, `edit`
(with the path), a scripted command's `effect`, and `blocked-report` (with the OS error) when the agent
reports that the environment blocks the task. Ground truth is read from these, never from the answer.

The decision, `nextStep` (in `streaming`), offers `CALL_TOOLS{calls, text}` (calls: a JSON array of
`{name, args}`), `ANSWER{text}` and, only right after a tool turn whose results hold an OS error,
`REPORT_BLOCKED{reason}`. Every field is free text, which options leave out: the closed options are
`ANSWER` (without text: an empty response) and `REPORT_BLOCKED`, what a policy can answer without a
model. Its numeric facts are what a rule can key on: `loop.errorTurns` and `loop.identicalCalls` (the
streaks the guards count), `loop.emptyResponses`, `loop.toolTurns`, `turn.used`/`turn.max`,
`tokens.used`/`tokens.max`/`tokens.context`.

A scenario's input holds the `task` (the prompt), its `plan` (the steps the task's author suggests,
one tool turn each; the stand-in models follow it, a real model may read it like a checklist) and
optional `limits` (`maxTurns`, default 50; `maxTokens`, default 1,000,000).
"""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from improve.examples.tool_loop.guards import (
    DEFAULT_MAX_TURNS,
    GuardRegistry,
    LoopState,
    ToolCall,
    calls_text,
    os_error_code,
    parse_calls,
    signature,
)
from improve.machine import GuardFn, parse_machine
from improve.machine.explore import ExploreOptions
from improve.machine.rules import RuleEval
from improve.runtime.decision import DecisionRequest
from improve.runtime.environment import Actor, ActorFailure, Environment, World
from improve.runtime.models import first_option, stand_in
from improve.runtime.policy import load_json

HERE = Path(__file__).parent
NAME = "tool-loop"
TOOLS = ("read", "write", "edit", "bash")
RESULT_OVERHEAD_TOKENS = 10
"""What wrapping one tool result into the conversation costs, so an empty result is not free."""


# --- the world ---------------------------------------------------------------------------------------


class ToolWorld(World):
    """A world the loop's tools act on: one call in, the text the tool printed out."""

    def execute(self, call: ToolCall) -> str:
        raise NotImplementedError(f"{type(self).__name__} cannot run tools")


def _under(path: str, prefixes: Any) -> bool:
    return isinstance(prefixes, list) and any(
        isinstance(p, str) and (path == p.rstrip("/") or path.startswith(p if p.endswith("/") else p + "/"))
        for p in prefixes
    )


def _content(value: Any) -> str:
    """A file's (or a command output's) text; `{repeat: "line\\n", times: 400}` stands for a long one, so a
    scenario can hold a 20 kB log without spelling it out."""
    if isinstance(value, dict) and isinstance(value.get("repeat"), str):
        return str(value["repeat"]) * int(value.get("times", 1))
    return value if isinstance(value, str) else json.dumps(value)


def _top(path: str) -> str:
    """The first component of a path, as `ls` at the root lists it (`/root` for `/root/.ssh/config`)."""
    return "/" + path.split("/")[1] if path.startswith("/") else path.split("/")[0]


def _arg(call: ToolCall, name: str) -> str:
    value = call.args.get(name, "")
    return value if isinstance(value, str) else json.dumps(value)


class SandboxWorld(ToolWorld):
    """The scenario's fake sandbox: files, permissions, a disk, and scripted commands (module docstring)."""

    def __init__(self, fixture: Mapping[str, Any] | None = None) -> None:
        super().__init__(fixture)
        self.files: dict[str, str] = {
            str(k): _content(v) for k, v in (self.fixture.get("files") or {}).items()
        }
        self._ran: dict[str, int] = {}

    def _write_error(self, tool: str, path: str) -> str | None:
        if self.fixture.get("readOnlyFs"):
            return f"{tool}: {path}: EROFS: read-only file system, open '{path}'"
        if _under(path, self.fixture.get("readonly")):
            return f"{tool}: {path}: EACCES: permission denied, open '{path}'"
        if self.fixture.get("diskFull"):
            return f"{tool}: {path}: ENOSPC: no space left on device, write"
        return None

    def _read(self, tool: str, path: str) -> tuple[str | None, str]:
        if _under(path, self.fixture.get("unreadable")):
            return None, f"{tool}: {path}: EACCES: permission denied"
        if path not in self.files:
            return None, f"{tool}: {path}: ENOENT: no such file or directory"
        return self.files[path], ""

    def execute(self, call: ToolCall) -> str:
        if call.name == "read":
            path = _arg(call, "file_path")
            content, error = self._read("read", path)
            if content is None:
                return error
            return "\n".join(f"{n}\t{line}" for n, line in enumerate(content.splitlines(), start=1))
        if call.name == "write":
            path = _arg(call, "file_path")
            refused = self._write_error("write", path)
            if refused:
                return refused
            self.files[path] = _arg(call, "content")
            self.record("write", path=path)
            return f"Written to {path}"
        if call.name == "edit":
            path = _arg(call, "file_path")
            content, error = self._read("edit", path)
            if content is None:
                return error
            refused = self._write_error("edit", path)
            if refused:
                return refused
            old, new = _arg(call, "old_string"), _arg(call, "new_string")
            if not old or old not in content:
                return f"Error: old_string not found in {path}"
            self.files[path] = content.replace(old, new, 1)
            self.record("edit", path=path)
            return f"Edited {path}"
        if call.name == "bash":
            return self._bash(_arg(call, "command"))
        return f"Error: unknown tool '{call.name}'; the tools are {', '.join(TOOLS)}"

    def _bash(self, command: str) -> str:
        scripted = (self.fixture.get("commands") or {}).get(command)
        if scripted is not None:
            outputs = scripted if isinstance(scripted, list) else [scripted]
            n = self._ran.get(command, 0)
            self._ran[command] = n + 1
            item = outputs[min(n, len(outputs) - 1)] if outputs else ""
            if isinstance(item, dict) and "output" in item:
                effect = item.get("effect")
                if isinstance(effect, dict) and "kind" in effect:
                    self.record(str(effect["kind"]), **{k: v for k, v in effect.items() if k != "kind"})
                return _content(item["output"]) or "(no output)"
            return _content(item) or "(no output)"
        try:
            words = shlex.split(command)
        except ValueError as err:
            return f"/bin/sh: syntax error: {err}\nError: Exited with code 2"
        if not words:
            return "(no output)"
        if words[0] == "pwd":
            return "/workspace"
        if words[0] == "ls":
            where = next((w for w in words[1:] if not w.startswith("-")), "").rstrip("/")
            if where and _under(where, self.fixture.get("unreadable")):
                return f"ls: {where}: EACCES: permission denied\nError: Exited with code 1"
            names = sorted(
                {
                    p[len(where) + 1 :].split("/")[0] if where else _top(p)
                    for p in self.files
                    if not where or p.startswith(where + "/")
                }
            )
            if where and not names:
                return f"ls: {where}: No such file or directory\nError: Exited with code 1"
            return "\n".join(names) or "(no output)"
        if words[0] == "cat" and len(words) > 1:
            content, error = self._read("cat", words[1])
            return content if content is not None else f"{error}\nError: Exited with code 1"
        return f"/bin/sh: {words[0]}: command not found\nError: Exited with code 127"

    def audit(self, effects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Writes the sandbox must refuse, found in the effects whatever the loop said: a change under a
        read-only path, on a read-only file system, or to a full disk."""
        effects = self.effects if effects is None else effects
        violations = []
        for effect in effects:
            if effect.get("kind") not in ("write", "edit"):
                continue
            path = str(effect.get("path", ""))
            if (
                self.fixture.get("readOnlyFs")
                or self.fixture.get("diskFull")
                or _under(path, self.fixture.get("readonly"))
            ):
                violations.append({"rule": "write-refused-by-sandbox", "path": path})
        return violations


# --- the actors --------------------------------------------------------------------------------------


def execute_tools(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """Run one turn's tool calls; report each output, the turn's signature and the OS error seen.

    The observations (signature, OS error) are computed here with guards.py's functions, once, and
    journaled with the completion: the stuck-loop and environment-error guards read them from there.
    """
    if not isinstance(world, ToolWorld):
        raise ActorFailure(f"the world is a {type(world).__name__}, which has no tools", code="no-tools")
    calls = parse_calls(input.get("calls"))
    if calls is None:
        raise ActorFailure("the turn's tool calls are not a well-formed call list", code="malformed-calls")
    results = []
    error = ""
    for call in calls:
        output = world.execute(call)
        results.append({"name": call.name, "output": output})
        error = error or os_error_code(output)
    tokens = sum(len(r["output"]) // 4 + RESULT_OVERHEAD_TOKENS for r in results)
    return {"results": results, "signature": signature(calls), "osError": error, "tokens": tokens}


def report_blocked(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """Tell the user the environment blocks the task; the report names the OS error seen."""
    world.record("blocked-report", error=str(input.get("error", "")))
    return {"reported": True}


def guard_checker(registry: GuardRegistry) -> Actor:
    """The `guards.check` actor: every guard registered at the checkpoint, on the loop's state."""

    def check(world: World, input: dict[str, Any]) -> dict[str, Any]:
        checkpoint = str(input.get("checkpoint", ""))
        firing = registry.check(checkpoint, LoopState.of(input.get("loop") or {}))
        if firing is None:
            return {"verdict": "pass", "checkpoint": checkpoint, "guard": "", "reason": ""}
        return firing.to_output()

    return check


# --- named guards (host functions the interpreter calls; pure) ------------------------------------------


def checkpoint_blocks(registry: GuardRegistry) -> GuardFn:
    """`checkpointBlocks`: does a guard registered at `params.checkpoint` block the loop's state?"""

    def blocks(context: Mapping[str, Any], event: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
        return registry.check(str(params.get("checkpoint", "")), LoopState.of(context)) is not None

    return blocks


def well_formed_calls(
    context: Mapping[str, Any], event: Mapping[str, Any], params: Mapping[str, Any]
) -> bool:
    """`wellFormedCalls`: the answer's `calls` text is a JSON array of {name, args} (guards.parse_calls)."""
    return parse_calls(event.get("calls")) is not None


def has_text(context: Mapping[str, Any], event: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """`hasText`: the answer says something; whitespace alone is an empty response."""
    text = event.get("text")
    return isinstance(text, str) and bool(text.strip())


# --- stand-in models ---------------------------------------------------------------------------------

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


# --- what policies may use, and what the world may do (for proofs) --------------------------------------

FACT_TYPES = {
    "nextStep": {
        "task": "string",
        "plan": "list",
        "turn.used": "int",
        "turn.max": "int",
        "tokens.used": "int",
        "tokens.max": "int",
        "tokens.context": "int",
        "loop.identicalCalls": "int",
        "loop.errorTurns": "int",
        "loop.emptyResponses": "int",
        "loop.toolTurns": "int",
        "last.calls": "string",
        "last.text": "string",
        "last.results": "list",
        "last.error": "string",
    }
}

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


def environment(guards: GuardRegistry | None = None) -> Environment:
    """The tool loop with the built-in guards, or with `guards` (a registry with guards added or removed).

    A registry other than the built-in one changes behaviour, so the machine's version carries its
    fingerprint (`1+guards.<hash>`): threads recorded with other guards are never replayed against it.
    """
    registry = guards if guards is not None else GuardRegistry.default()
    config = parse_machine(load_json(HERE / "machine.json"), source=str(HERE / "machine.json"))
    if registry.fingerprint() != GuardRegistry.default().fingerprint():
        config = config.model_copy(update={"version": f"{config.version}+guards.{registry.fingerprint()}"})
    return Environment(
        home=HERE,
        name=NAME,
        config=config,
        actors={
            "tools.execute": execute_tools,
            "guards.check": guard_checker(registry),
            "session.report": report_blocked,
        },
        guards={
            "checkpointBlocks": checkpoint_blocks(registry),
            "wellFormedCalls": well_formed_calls,
            "hasText": has_text,
        },
        make_world=SandboxWorld,
        models={
            "careful": stand_in("careful", careful),
            "naive": stand_in("naive", naive),
            "sloppy": stand_in("sloppy", sloppy),
        },
        files=[HERE / "machine.json", Path(__file__), HERE / "guards.py"],
        fact_types=FACT_TYPES,
        probe=probe(),
        probe_inputs=PROBE_INPUTS,
        rule_evals=RULE_EVALS,
    )


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
