"""The bulk decode path: log entry lines into light msgspec structs, without a pydantic model per entry.

`LogEntry` (entry.py) stays the contract and its documentation; the structs here mirror it field for
field so that readers of many entries (replay, `improve replay --verify`, a store's reads, the
materializer's reads of the warehouse: `convert_entry`) skip pydantic's per-entry model building, which
cost as much as the fold itself. The rule that keeps them
honest: **the bulk path accepts exactly what `LogEntry` accepts, with the same values**, and a line it
refuses is refused with pydantic's own message. msgspec is stricter than pydantic's lax JSON mode
(`"index": 1.0`, `1e400`, nesting past pydantic's depth limit, ...), so any line msgspec or the checks
it cannot express refuse is handed to `LogEntry.model_validate_json`: it either raises the contract's
error or yields the `LogEntry` itself, which serves wherever an `EntryView` is read. The differential
test (tests/test_log_bulk.py) holds the two paths to that over every bundled thread and a fuzzed corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol

import msgspec

from improve.log import strict
from improve.log.entry import MAX_ENTRY_DEPTH, Attempt, FailureKind, LogEntry, Verification


class AttemptView(Protocol):
    """What readers of a refused answer use: `Attempt` and `BulkAttempt` both provide it."""

    @property
    def event(self) -> dict[str, Any] | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def guard(self) -> str | None: ...


class VerificationView(Protocol):
    @property
    def stateHash(self) -> str | None: ...
    @property
    def entryHash(self) -> str | None: ...


class EntryView(Protocol):
    """A log entry as replay and the chain read it: `LogEntry` and `BulkEntry` both provide it."""

    @property
    def schemaVersion(self) -> int: ...
    @property
    def id(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def recordedAt(self) -> str: ...
    @property
    def machineId(self) -> str: ...
    @property
    def machineVersion(self) -> str: ...
    @property
    def event(self) -> dict[str, Any]: ...
    @property
    def causationId(self) -> str | None: ...
    @property
    def attempts(self) -> Sequence[AttemptView] | None: ...
    @property
    def metadata(self) -> dict[str, Any] | None: ...
    @property
    def verification(self) -> VerificationView | None: ...
    @property
    def threadId(self) -> str | None: ...
    @property
    def type(self) -> str: ...


NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


# `omit_defaults`: msgspec writes a struct without the fields that are None (and an entry without
# schemaVersion 1), as the chain's content leaves out absent fields (`content_struct`); nothing else
# writes these structs.


class BulkAttempt(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True, gc=False):
    """`Attempt`, field for field."""

    kind: FailureKind
    reason: str
    event: dict[str, Any] | None = None
    guard: str | None = None


class BulkVerification(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True, gc=False):
    """`Verification`, field for field."""

    stateHash: str | None = None
    entryHash: str | None = None


class BulkEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True, gc=False):
    """`LogEntry`, field for field (see the module docstring for what keeps them equal)."""

    id: NonEmpty
    index: Annotated[int, msgspec.Meta(ge=0)]
    recordedAt: str
    machineId: NonEmpty
    machineVersion: NonEmpty
    event: dict[str, Any]
    schemaVersion: Literal[1, 2] = 1
    causationId: str | None = None
    attempts: list[BulkAttempt] | None = None
    metadata: dict[str, Any] | None = None
    verification: BulkVerification | None = None
    threadId: str | None = None

    @property
    def type(self) -> str:
        return str(self.event["type"])

    def to_log_entry(self) -> LogEntry:
        """The contract's model of this entry (built without validating again: it was checked as
        strictly as `LogEntry` checks it when it was decoded)."""
        return to_log_entry(self)


ENTRY_DECODER = msgspec.json.Decoder(BulkEntry)
"""Reads one line as a `BulkEntry`, with msgspec's checks only (`read_strictly` adds the validators')."""


class ThreadOnly(msgspec.Struct):
    """What the first pass of a multi-thread file reads of a line (`stream`): its thread id only. Defined
    here, not in `stream`: a struct class in a module mypyc compiles decodes nothing."""

    threadId: str | None = None


# A line with fewer brackets than this cannot nest as deep as pydantic's parser refuses; one with more
# goes to pydantic, which refuses it (or reads it) as the contract says.
_BRACKETS = MAX_ENTRY_DEPTH - 10


def decode_entry(line: bytes | str, *, shallow: bool = False) -> BulkEntry | LogEntry:
    """One JSONL line as an entry, as `LogEntry.model_validate_json` would read it.

    Returns a `BulkEntry`, or, for a line only pydantic's lax parsing reads, the `LogEntry` it reads.
    Raises pydantic's `ValidationError` for a line that is not a valid entry (use `entry_problems`).
    `shallow`: the caller has checked that the line nests no deeper than `MAX_JSON_DEPTH`
    (`lines.line_problem`), so the bracket count that guards pydantic's depth limit is skipped."""
    if isinstance(line, str):
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: pydantic's to judge
            return LogEntry.model_validate_json(line)
    else:
        data = line
    # Valid JSON shorter than twice the bound cannot nest that deep (each level opens and closes), and
    # invalid JSON is refused by msgspec and judged by pydantic; bytes.count of an int, not of b"[",
    # because it is about twice as fast. The text is counted, not the decoded entry: a value a duplicate
    # key replaced is gone from what msgspec decoded, yet pydantic's parser still refuses its depth.
    if shallow or len(data) < 2 * _BRACKETS or data.count(91) + data.count(123) < _BRACKETS:
        entry = read_strictly(data)
        if entry is not None:
            return entry
    return LogEntry.model_validate_json(line)


def convert_entry(fields: dict[str, Any]) -> BulkEntry | LogEntry:
    """An entry's fields (JSON's values, as a warehouse row gives them) as an entry, as
    `LogEntry.model_validate` would read them: a `BulkEntry` where msgspec's strict conversion and the
    validators' checks accept them, else what pydantic makes of them (the `LogEntry`, or its error)."""
    try:
        entry = msgspec.convert(fields, BulkEntry)
    except msgspec.ValidationError:
        return LogEntry.model_validate(fields)
    event_type = entry.event.get("type")
    if isinstance(event_type, str) and event_type and strict.valid_recorded_at(entry.recordedAt):
        return entry
    return LogEntry.model_validate(fields)


def read_strictly(data: bytes) -> BulkEntry | None:
    """The line as msgspec reads it with the validators' checks, or None when it is pydantic's to judge.
    The caller rules out nesting past pydantic's limit first (see `decode_entry`). A line this reads is
    UTF-8 with no raw control character: msgspec refuses both. (`strict.read_strictly`, compiled, which
    the stream reader calls with `ENTRY_DECODER` itself.)"""
    entry: BulkEntry | None = strict.read_strictly(ENTRY_DECODER, data)
    return entry


def to_log_entry(entry: BulkEntry | LogEntry) -> LogEntry:
    """The contract's model of a decoded entry, built without validating it again."""
    if isinstance(entry, LogEntry):
        return entry
    verification = entry.verification
    attempts = entry.attempts
    fields: dict[str, Any] = {
        "schemaVersion": entry.schemaVersion,
        "id": entry.id,
        "index": entry.index,
        "recordedAt": entry.recordedAt,
        "machineId": entry.machineId,
        "machineVersion": entry.machineVersion,
        "event": entry.event,
        "causationId": entry.causationId,
        "attempts": None
        if attempts is None
        else [
            Attempt.model_construct(event=a.event, kind=a.kind, reason=a.reason, guard=a.guard)
            for a in attempts
        ],
        "metadata": entry.metadata,
        "verification": None
        if verification is None
        else Verification.model_construct(stateHash=verification.stateHash, entryHash=verification.entryHash),
        "threadId": entry.threadId,
    }
    return LogEntry.model_construct(**fields)


def bulk_content(entry: BulkEntry) -> dict[str, Any]:
    """What `chain.entry_content` gives for the same entry as a `LogEntry`: the fields that are not
    None, without `threadId` and `verification.entryHash` (and without an empty `verification`)."""
    data: dict[str, Any] = {
        "schemaVersion": entry.schemaVersion,
        "id": entry.id,
        "index": entry.index,
        "recordedAt": entry.recordedAt,
        "machineId": entry.machineId,
        "machineVersion": entry.machineVersion,
        "event": entry.event,
    }
    if entry.causationId is not None:
        data["causationId"] = entry.causationId
    if entry.attempts is not None:
        data["attempts"] = [_attempt_content(a) for a in entry.attempts]
    if entry.metadata is not None:
        data["metadata"] = entry.metadata
    if entry.verification is not None and entry.verification.stateHash is not None:
        data["verification"] = {"stateHash": entry.verification.stateHash}
    return data


def content_struct(entry: BulkEntry) -> BulkEntry:
    """`bulk_content` of a schemaVersion 2 entry as a struct that msgspec, fields and keys sorted, writes
    as it writes that dict: the entry without `threadId` and `verification.entryHash` (and without an
    empty `verification`), absent fields omitted. A copy made in C, where the dict was built in Python:
    the chain's check of a decoded entry hashes this text first (see `chain._links`). Not for version 1,
    whose `schemaVersion` msgspec leaves out as the default."""
    verification = entry.verification
    kept = (
        None
        if verification is None or verification.stateHash is None
        else BulkVerification(verification.stateHash)
    )
    return msgspec.structs.replace(entry, threadId=None, verification=kept)


def _attempt_content(attempt: BulkAttempt) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": attempt.kind, "reason": attempt.reason}
    if attempt.event is not None:
        data["event"] = attempt.event
    if attempt.guard is not None:
        data["guard"] = attempt.guard
    return data
