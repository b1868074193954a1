"""Guards as objects: the safety checks of the tool loop, registered on the machine, never written into it.

The opencli agent's loop was one `while (true)` with its safety checks inline: adding a check meant
editing the loop. Here a check is a `TransitionGuard`: a name, the *checkpoint* it runs at, and a pure
`check(state) -> Verdict` (pass, or block with a reason). The machine (machine.json) has one state per
checkpoint; each asks the registry "does any guard registered here block?" through the named guard
`checkpointBlocks`, so a new guard is added by registering it, with no change to the machine.

Checkpoints (where in a turn the loop stops to ask):

    before-turn      before each model call          max-turns, cost-limit
    before-tools     after the model asked for tools, before they run    stuck-loop
    after-tools      after the tools ran, before their results are fed back    environment-error-loop
    after-response   after an empty model response (no text, no tool calls)    empty-response

Guards read a `LoopState`: the loop's counters as the machine keeps them in its context. Every guard
must be a pure function of it (no clock, no I/O, no randomness): the interpreter evaluates guards
again when a thread is replayed, and exploration evaluates them on every path, so a guard that
answered differently twice would make replays and proofs disagree with the runs they describe.

This module imports nothing of the runtime: the observations the guards read (the canonical signature
of a turn's tool calls, the OS error code in its results) are computed by calls.py, so the tools actor
that records them and the guards that read them agree by construction.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, is_dataclass
from typing import Any, Literal, Protocol, get_args

from improve.errors import ConfigError
from improve.examples.tool_loop.calls import ToolCall, parse_calls, signature

Checkpoint = Literal["before-turn", "before-tools", "after-tools", "after-response"]
CHECKPOINTS: tuple[Checkpoint, ...] = get_args(Checkpoint)

DEFAULT_MAX_TURNS = 50
"""The opencli loop's turn budget; the machine's context default (machine.json) is the same number."""


# --- the loop's state, as guards see it --------------------------------------------------------------


def _int(mapping: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = mapping.get(key, default)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _str(mapping: Mapping[str, Any], key: str) -> str:
    value = mapping.get(key, "")
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class LoopState:
    """The loop's counters at a checkpoint (read from the machine's context; key names in brackets).

    `turns` counts model calls started, the one in flight included; the streaks count *tool turns*
    (turns that ran tools): an empty response in between neither extends nor breaks them.
    """

    turns: int = 0
    """[turns] model calls started."""
    max_turns: int = DEFAULT_MAX_TURNS
    """[maxTurns] the turn budget."""
    tokens: int = 0
    """[tokens] estimated tokens spent so far (every call's input and output)."""
    max_tokens: int = 1_000_000
    """[maxTokens] the cost limit."""
    context_tokens: int = 0
    """[contextTokens] the conversation's estimated size: what the next model call sends."""
    calls_text: str = ""
    """[calls] the tool calls of the current (or last) turn, as the model wrote them."""
    last_signature: str = ""
    """[signature] the signature of the last tool turn that ran."""
    identical_turns: int = 0
    """[identicalTurns] consecutive tool turns, up to the last one, with that same signature."""
    error_turns: int = 0
    """[errorTurns] consecutive tool turns, up to the last one, whose results held an OS error."""
    last_error: str = ""
    """[lastError] the OS error code of the last tool turn ('' when it had none)."""
    tool_turns: int = 0
    """[toolTurns] tool turns that ran."""
    tool_calls: int = 0
    """[toolCalls] tool calls that ran."""
    empty_responses: int = 0
    """[emptyResponses] consecutive empty model responses, up to the current one."""

    @classmethod
    def of(cls, context: Mapping[str, Any]) -> LoopState:
        """The state from the machine's context (or the same keys journaled in an actor's input)."""
        return cls(
            turns=_int(context, "turns"),
            max_turns=_int(context, "maxTurns", DEFAULT_MAX_TURNS),
            tokens=_int(context, "tokens"),
            max_tokens=_int(context, "maxTokens", 1_000_000),
            context_tokens=_int(context, "contextTokens"),
            calls_text=_str(context, "calls"),
            last_signature=_str(context, "signature"),
            identical_turns=_int(context, "identicalTurns"),
            error_turns=_int(context, "errorTurns"),
            last_error=_str(context, "lastError"),
            tool_turns=_int(context, "toolTurns"),
            tool_calls=_int(context, "toolCalls"),
            empty_responses=_int(context, "emptyResponses"),
        )

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The current turn's tool calls (none when the text is not a well-formed call list)."""
        return parse_calls(self.calls_text) or ()

    @property
    def call_signature(self) -> str:
        """The current turn's signature, comparable with `last_signature`."""
        return signature(self.calls)


# --- the protocol -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A guard's answer: pass, or block with a reason a person can act on."""

    blocked: bool
    reason: str = ""


PASS = Verdict(False)


def block(reason: str) -> Verdict:
    return Verdict(True, reason)


class TransitionGuard(Protocol):
    """A safety check of the loop. Register it on a `GuardRegistry`; the loop itself never changes."""

    @property
    def name(self) -> str:
        """A stable, unique name: journaled with every firing (`stuck-loop`)."""
        ...

    @property
    def checkpoint(self) -> Checkpoint:
        """Where in the turn it runs."""
        ...

    def check(self, state: LoopState) -> Verdict:
        """Pass, or block with a reason. Must be a pure function of `state`."""
        ...


@dataclass(frozen=True)
class Firing:
    """A guard that blocked: what the `guards.check` actor returns and the journal keeps."""

    guard: str
    checkpoint: Checkpoint
    reason: str

    def to_output(self) -> dict[str, Any]:
        return {"verdict": "block", "checkpoint": self.checkpoint, "guard": self.guard, "reason": self.reason}


# --- the built-in guards -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MaxTurns:
    """At most `maxTurns` (50) model calls per prompt: the budget is checked before each call."""

    name: str = "max-turns"
    checkpoint: Checkpoint = "before-turn"

    def check(self, state: LoopState) -> Verdict:
        if state.turns >= state.max_turns:
            return block(f"{state.turns} of {state.max_turns} turns used: the turn budget is spent")
        return PASS


@dataclass(frozen=True)
class CostLimit:
    """No model call that would take the estimated spend over `maxTokens`: checked before the call, from
    what it would send (the whole conversation), so the limit is never crossed by a call's input."""

    name: str = "cost-limit"
    checkpoint: Checkpoint = "before-turn"

    def check(self, state: LoopState) -> Verdict:
        after = state.tokens + state.context_tokens
        if after > state.max_tokens:
            return block(
                f"the next model call would bring the spend to {after} tokens, over the cost limit of "
                f"{state.max_tokens}"
            )
        return PASS


@dataclass(frozen=True)
class StuckLoop:
    """`repeats` (3) consecutive tool turns with identical calls (names and arguments) are a stuck loop.
    Checked before the tools run, so the repeating turn's tools never execute."""

    repeats: int = 3
    name: str = "stuck-loop"
    checkpoint: Checkpoint = "before-tools"

    def check(self, state: LoopState) -> Verdict:
        current = state.call_signature
        if not current or current != state.last_signature:
            return PASS
        streak = state.identical_turns + 1
        if streak >= self.repeats:
            return block(f"{streak} consecutive turns with identical tool calls: {current}")
        return PASS


@dataclass(frozen=True)
class EnvironmentErrorLoop:
    """`turns` (3) consecutive tool turns whose results hold an OS error (EPERM, EACCES, ENOSPC, EROFS,
    'permission denied', ...): the environment blocks the task, and retrying cannot help. Checked after
    the tools ran, on their results."""

    turns: int = 3
    name: str = "environment-error-loop"
    checkpoint: Checkpoint = "after-tools"

    def check(self, state: LoopState) -> Verdict:
        if state.error_turns >= self.turns:
            return block(
                f"{state.error_turns} consecutive turns whose tool results contain an OS error "
                f"(last: {state.last_error})"
            )
        return PASS


@dataclass(frozen=True)
class EmptyResponse:
    """An empty model response (no text, no tool calls) is retried `retries` (1) time(s); the next empty
    response in a row stops the loop."""

    retries: int = 1
    name: str = "empty-response"
    checkpoint: Checkpoint = "after-response"

    def check(self, state: LoopState) -> Verdict:
        if state.empty_responses > self.retries:
            return block(
                f"{state.empty_responses} empty model responses in a row ({self.retries} retry allowed)"
            )
        return PASS


def built_in_guards() -> list[TransitionGuard]:
    """The opencli loop's checks, in the order they run at each checkpoint."""
    return [MaxTurns(), CostLimit(), StuckLoop(), EnvironmentErrorLoop(), EmptyResponse()]


def _settings(guard: TransitionGuard) -> str:
    # A dataclass's repr is its settings; any other object's repr may hold a memory address, which would
    # make the fingerprint differ from one process to the next.
    return repr(guard) if is_dataclass(guard) else ""


# --- the registry -------------------------------------------------------------------------------------


class GuardRegistry:
    """The guards registered on the loop, by checkpoint, in registration order (the first block wins)."""

    def __init__(self, guards: Iterable[TransitionGuard] = ()) -> None:
        self._guards: list[TransitionGuard] = []
        for guard in guards:
            self.register(guard)

    @classmethod
    def default(cls) -> GuardRegistry:
        return cls(built_in_guards())

    def register(self, guard: TransitionGuard) -> GuardRegistry:
        """Add a guard; the loop runs it at its checkpoint from now on. Returns the registry."""
        if guard.checkpoint not in CHECKPOINTS:
            raise ConfigError(
                f"guard {guard.name!r} runs at checkpoint {guard.checkpoint!r}, which the loop does not have; "
                f"use one of {list(CHECKPOINTS)}"
            )
        if any(g.name == guard.name for g in self._guards):
            raise ConfigError(
                f"a guard named {guard.name!r} is already registered; give the new one another name "
                "(names are journaled with every firing, so they must be unique)"
            )
        self._guards.append(guard)
        return self

    def without(self, name: str) -> GuardRegistry:
        """A copy without the guard `name` (to show what a proof owes to it)."""
        if not any(g.name == name for g in self._guards):
            raise ConfigError(f"no guard named {name!r} is registered; registered: {self.names}")
        return GuardRegistry(g for g in self._guards if g.name != name)

    @property
    def names(self) -> list[str]:
        return [g.name for g in self._guards]

    def at(self, checkpoint: Checkpoint) -> list[TransitionGuard]:
        return [g for g in self._guards if g.checkpoint == checkpoint]

    def check(self, checkpoint: str, state: LoopState) -> Firing | None:
        """The first guard at `checkpoint` that blocks `state`, or None when every one passes."""
        if checkpoint not in CHECKPOINTS:
            raise ConfigError(
                f"unknown checkpoint {checkpoint!r}; the loop's checkpoints are {list(CHECKPOINTS)}"
            )
        for guard in self._guards:
            if guard.checkpoint != checkpoint:
                continue
            verdict = guard.check(state)
            if verdict.blocked:
                return Firing(guard.name, guard.checkpoint, verdict.reason or f"{guard.name} blocked")
        return None

    def fingerprint(self) -> str:
        """Names, checkpoints and settings of every guard, hashed: part of the machine's version when the
        registry is not the built-in one, so a thread is never replayed against other guards."""
        described = [
            [g.checkpoint, g.name, f"{type(g).__module__}.{type(g).__qualname__}", _settings(g)]
            for g in self._guards
        ]
        return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:10]
