"""tool-loop's world: a small fake sandbox, the tools that act on it, and the loop's host functions.

The sandbox is a scenario's `world`:

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

The actors (`tools.execute`, `guards.check`, `session.report`) and the named guards the interpreter
calls (`checkpointBlocks`, `wellFormedCalls`, `hasText`) are here too; the guards they consult are
the registry's (guards.py).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from improve.errors import ActorFailure
from improve.examples.tool_loop.calls import ToolCall, os_error_code, parse_calls, signature
from improve.examples.tool_loop.guards import GuardRegistry, LoopState
from improve.machine import GuardFn
from improve.runtime import Actor, World

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
