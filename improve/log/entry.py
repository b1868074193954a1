"""The log entry: one JSON object per line, append-only, one thread per run.

Field names are kept from `@statelyai/agent` so logs stay readable across languages. This is a
versioned contract (`schemaVersion`); a change to a field's meaning bumps the version.

Version 2 (what improve writes) adds the hash chain, `verification.entryHash` (`chain.py`), and
ends a finished run with an `@agent.end` entry. Version 1 threads are still read and replayed; they
verify only as far as their state hashes go.
"""

from __future__ import annotations

import os
import random
import re
from datetime import datetime
from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from improve import clock
from improve.machine import canonical_bytes

SCHEMA_VERSION = 2
"""The version improve writes: 2, the chained form. Version 1 (no `entryHash`, no end entry) is still read."""
UNCHAINED_VERSION = 1
INIT_EVENT = "@agent.init"
USAGE_EVENT = "@agent.usage"
MAX_USAGE_COUNT = 100_000_000
"""The largest count a usage entry may hold (calls, input or output tokens; its cost in USD): no call
comes near it. Replay fails a thread whose usage says more, or less than 0 (the same bound as the
endpoint's `improve.llm.MAX_TOKENS`, which refuses such an answer before it is journaled)."""
END_EVENT = "@agent.end"
"""The last entry of a finished run: `{"type": "@agent.end", "status": ...}` (a `RunStatus` other than
`incomplete`). Replay does not fold it; without it a chained thread is incomplete.

A run that stops in a waiting state ends with a resumable status (`waiting`, `checkpointed`,
`blocked_ask`) and says what it waits for: `"state"` (the waiting state) and `"waitingFor"` (each event
it accepts, `{"type", "payload": <JSON Schema>}`, `improve.machine.waits`). Such an end entry may be
followed by the event that resumed the run (its metadata carries `RESUME_KEY`), and the run goes on in
the same thread to its next end entry."""
RESUME_KEY = "resume"
"""The metadata key of the event that resumed a waiting run: `{"eventId": ID, "maxModelCalls": N}`.
`eventId` names the external event (a second resume with it changes nothing); `maxModelCalls` is the
budget of model calls from this entry on (the environment's `resume_budget`, or what was left)."""
LEGACY_WAIT_STATUS = "idle"
"""What end entries written before resumable runs said for a run stopped in a waiting state; read as
the status the state declares (`waiting` by default)."""
# Used with fullmatch: `$` would also match before a trailing line feed ("t1\n" was a valid id).
THREAD_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,254}")

FailureKind = Literal["unknown-event", "invalid-payload", "rejected-by-guard", "no-answer"]


class Attempt(BaseModel):
    """A decider's answer that the environment refused, fed back to the decider as it retried."""

    model_config = ConfigDict(extra="forbid")

    event: dict[str, Any] | None = Field(
        default=None,
        description="The event the decider answered, as it answered it (absent when it gave none).",
    )
    kind: FailureKind = Field(
        description="Why it was refused, checked in this order: `unknown-event` (not an allowed event), "
        "`invalid-payload` (a payload value outside the enumerated options), `rejected-by-guard` (the "
        "environment's rules refuse it now); `no-answer` when the decider produced nothing."
    )
    reason: str = Field(description="A fixed, human-readable sentence for the refusal, shown to the decider.")
    guard: str | None = Field(
        default=None,
        description="For `rejected-by-guard`: the guard that refused it, as `'state'.on.EVENT[i]: <expression>`.",
    )


class Verification(BaseModel):
    """Evidence to check a replay against: the state reached, and (schemaVersion 2) the entry itself."""

    model_config = ConfigDict(extra="forbid")

    stateHash: str | None = Field(
        default=None,
        description="sha256 of the canonical JSON of the snapshot after this entry. Present on every entry "
        "that moves the machine (and on the end entry: the final snapshot); absent on `@agent.usage` "
        "entries, which do not.",
    )
    entryHash: str | None = Field(
        default=None,
        description="schemaVersion 2: sha256 (hex) of the canonical JSON of `[previous, content]`: "
        "`previous` is the entryHash of the entry before it, or the thread id for entry 0; `content` is "
        "this entry as written, without `threadId` and without this field (and without `verification` "
        "when nothing else is in it). Chains every entry to all before it: an edit, a removal, an "
        "insertion or a reordering breaks it at the first bad entry. See `improve.log.chain`.",
    )


class LogEntry(BaseModel):
    """One entry of a thread. Only external inputs are journaled: init, decisions, people's answers,
    actor completions (`xstate.done.actor` / `xstate.error.actor`) and `@agent.usage` spend records."""

    model_config = ConfigDict(extra="forbid")

    schemaVersion: Literal[1, 2] = Field(
        default=1,
        description="Version of this format: 2 (chained: every entry carries `verification.entryHash`, a "
        "finished run ends with `@agent.end`), or 1 (unchained, still read). An entry built without it is 1, "
        "so an entry is only chained when its writer says so.",
    )
    id: str = Field(min_length=1, description="Unique id of the entry (a UUID when we write it).")
    index: int = Field(ge=0, description="0-based position in the thread; contiguous, no gaps.")
    recordedAt: str = Field(description="RFC 3339 time it was written. Metadata only: replay ignores it.")
    machineId: str = Field(min_length=1, description="Id of the environment machine that recorded it.")
    machineVersion: str = Field(min_length=1, description="Version of that machine.")
    event: dict[str, Any] = Field(
        description="The event `{type, ...payload}`. Entry 0 is `@agent.init` with `input`; decisions and "
        "people's answers are the events themselves; actors answer `xstate.done.actor` with `actorId` and "
        "`output`, or `xstate.error.actor` with `actorId` and `error`; `@agent.usage` records a model call; "
        "`@agent.end` with `status` closes a finished run (schemaVersion 2); a waiting run's end also carries `state` "
        "and `waitingFor`, and may be followed by the event that resumed it."
    )
    causationId: str | None = Field(default=None, description="Id of the entry that caused this one.")
    attempts: list[Attempt] | None = Field(
        default=None, description="Refused answers that preceded the event that landed, in order."
    )
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="The stamp on entry 0 (policy id and version, model refs, scenario, split, run, budget); "
        "on decisions, `decision` (its name and the options offered) and `source` (who answered); on the "
        "event that resumed a waiting run, `source: resume` and `resume` (`eventId`, `maxModelCalls`).",
    )
    verification: Verification | None = Field(
        default=None,
        description="Hash of the snapshot after it (`stateHash`) and, from schemaVersion 2, the entry's link "
        "in the thread's hash chain (`entryHash`).",
    )
    threadId: str | None = Field(
        default=None, description="The thread, when a file holds many threads (then every line has it)."
    )

    @field_validator("event")
    @classmethod
    def _event_has_type(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("type"), str) or not value["type"]:
            raise ValueError("event needs a non-empty string `type`")
        return value

    @field_validator("recordedAt")
    @classmethod
    def _rfc3339(cls, value: str) -> str:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"recordedAt {value!r} is not an RFC 3339 timestamp") from None
        if parsed.tzinfo is None:
            raise ValueError(f"recordedAt {value!r} has no UTC offset")
        return value

    @property
    def type(self) -> str:
        return str(self.event["type"])

    def to_line(self) -> str:
        """The JSONL form: one line, `None` fields left out; the other fields' keys sorted, compact
        (`canonical_json`), then `threadId`, last.

        Why this layout: a chained entry's hash covers the canonical text of the entry without
        `threadId` and `verification.entryHash` (`chain`), and this line is that text with those two put
        in, so verifying it hashes the line's own bytes with the two cut out (`chain.line_content`),
        without writing the entry again; and a file's first pass finds a line's thread at its end
        (`stream`). Any other layout of the same JSON reads and verifies the same, only slower."""
        data = self.model_dump(mode="json", exclude_none=True)
        thread = data.pop("threadId", None)
        try:
            text = canonical_bytes(data)
        except ValueError:  # NaN or an infinity in an unchained entry: pydantic writes it as null
            return self.model_dump_json(exclude_none=True)
        return (text[:-1] + line_tail(thread)).decode("utf-8")


def line_tail(thread: str | None) -> bytes:
    """How `LogEntry.to_line` ends a line after the entry's other fields: `threadId`, when the line
    carries one, and the closing brace (what `chain` cuts off a line to find the hashed content)."""
    if thread is None:
        return b"}"
    if type(thread) is str:
        # What `canonical_bytes` writes of a str (msgspec's text), without its two calls: a verified
        # replay asks this once a thread, and the calls cost a twentieth of verifying a short one.
        try:
            return b',"threadId":' + _STRING.encode(thread) + b"}"
        except Exception:  # a lone surrogate: as canonical_bytes says it
            pass
    return b',"threadId":' + canonical_bytes(thread) + b"}"


_STRING = msgspec.json.Encoder()


MAX_ENTRY_DEPTH = 200
"""How deeply a log entry may nest objects and arrays: the limit of pydantic's JSON parser, which every
reader of a thread uses (`LogEntry.model_validate_json`). Stated here so a refusal can say it."""


def entry_problems(error: ValidationError) -> str:
    """A validation error of one entry line as `where: what; ...`, with the parser's "recursion limit
    exceeded" said as what it means for the line."""
    problems = []
    for problem in error.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "(line)"
        message = problem["msg"]
        if "recursion limit exceeded" in message:
            message = f"nested deeper than {MAX_ENTRY_DEPTH} levels of objects and arrays"
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


def now_rfc3339() -> str:
    """The clock's now as a `recordedAt` value (`improve.clock`: the one seam tests freeze)."""
    return clock.rfc3339()


_ids = random.Random()  # seeded from os.urandom; again in a forked child, so no two processes share ids
os.register_at_fork(after_in_child=_ids.seed)


def new_entry_id() -> str:
    """A random (version 4) UUID. Drawn from a generator seeded once from the system's randomness rather
    than asking the system each time as `uuid.uuid4` does: that call lets go of the GIL, and with runs on
    eight threads an entry waited about 0.4 ms to get it back (5,288 ids: 1.9 s of waiting in a round). An
    entry id names an entry uniquely; it is no secret."""
    # `uuid.UUID(int=..., version=4)`, spelled out: the version and variant bits set, then the text.
    bits = (_ids.getrandbits(128) & _KEEP) | _V4
    h = f"{bits:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_KEEP = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_V4 = (0x4000 << 64) | (0x8000 << 48)


def check_thread_id(thread_id: str) -> str:
    """Thread ids become file names and SQL keys: letters, digits and `._:@+=-` only."""
    if not isinstance(thread_id, str) or not THREAD_ID_PATTERN.fullmatch(thread_id):
        raise ValueError(
            f"thread id {thread_id!r} is not valid: use letters, digits and . _ : @ + = - "
            "(at most 255 characters), e.g. 'train:v3:naive:refund-small:r1'"
        )
    return thread_id


class ThreadId(BaseModel):
    """A thread id parsed: `split:policyVersion:model:scenario:rK`, e.g. `train:v3:naive:refund-small:r1`.

    The model is part of the identity, so runs of two models of one policy version coexist. Ids of
    the older form `split:policyVersion:scenario:rK` still parse, with `model` None.
    """

    split: str
    policy_version: str
    model: str | None = None
    scenario: str
    run: int

    def __str__(self) -> str:
        model = f"{self.model}:" if self.model is not None else ""
        return f"{self.split}:{self.policy_version}:{model}{self.scenario}:r{self.run}"

    @classmethod
    def parse(cls, thread_id: str) -> ThreadId | None:
        parts = thread_id.split(":")
        if len(parts) not in (4, 5) or not re.fullmatch(r"r\d+", parts[-1]):
            return None
        model = parts[2] if len(parts) == 5 else None
        return cls(
            split=parts[0], policy_version=parts[1], model=model, scenario=parts[-2], run=int(parts[-1][1:])
        )


def model_slug(model: str) -> str:
    """A model's name as it appears in thread ids: characters other than letters, digits, `.`, `_`
    and `-` become `-` (`openai:gpt-4.1-mini` -> `openai-gpt-4.1-mini`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", model)
