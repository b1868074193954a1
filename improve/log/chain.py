"""The hash chain of a thread (schemaVersion 2): what `verification.entryHash` is, and checking it.

Each entry's `entryHash` is

    sha256( canonical_json([previous, content]) )          (its first 128 bits, 32 lowercase hex digits)

- `previous` is the entryHash of the entry before it; for entry 0 it is the **thread id**.
- `content` is the entry as written (its JSONL object), without `threadId` and without
  `verification.entryHash` (and without `verification` when nothing else is left in it). Fields that
  are absent stay absent (improve never writes `null` for a field of the entry, a verification or an
  attempt; a `null` there is read as absent). Everything else is content: the event, the effects and
  outputs in it, usage counts, attempts, metadata, the ids and `recordedAt`.
- `canonical_json` is `improve.machine.canonical_json`: sorted keys, no whitespace, UTF-8 kept.

So each hash covers the entry and, through `previous`, every entry before it: an edited, removed,
inserted or reordered entry breaks the chain at the first bad one, and `check_chain` names it.

Why the thread id seeds the chain: a thread's id says what it is evidence of (split, policy version,
model, scenario, run: `train:v3:naive:refund-small:r2`), and scorecards count threads by it. With a
fixed seed, a passing thread copied under another id (another run, the held-out split) would still
verify; seeded by its id, it does not. The price: verifying needs the id (the file name, or the
`threadId` the lines carry), and `fork` re-chains the copy it makes for its new id
(`rechain`, after checking the source).

What the chain is not: a signature. It has no key, so someone who rewrites a thread and recomputes
every hash after the change makes a consistent thread. It catches edits made without doing that
(an amount changed by hand, a line deleted, a script that rewrites a field) and names where. To
detect a recomputed rewrite, keep the last entry's hash (the thread's head) somewhere else: it
depends on every entry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import msgspec

from improve.errors import LogError, TamperError
from improve.log.bulk import BulkEntry, EntryView, bulk_content, content_struct
from improve.log.entry import (
    END_EVENT,
    RESUME_KEY,
    SCHEMA_VERSION,
    LogEntry,
    Verification,
    line_tail,
    model_slug,
)
from improve.machine import canonical_bytes, decoded_canonical_bytes, plain_json, sorted_text
from improve.native import digest

HASH_HEX = 32
"""Hex digits of an entryHash: the first 128 bits of the sha256."""

_EXCLUDE: Any = {"threadId": True, "verification": {"entryHash"}}

_FIX = (
    "a chained thread cannot be edited: restore it from where it was recorded (a backup), or, if it is a "
    "scenario's run, run the scenario again"
)


def entry_content(entry: EntryView) -> dict[str, Any]:
    """The part of an entry its entryHash covers (see the module docstring)."""
    if isinstance(entry, BulkEntry):
        return bulk_content(entry)
    assert isinstance(entry, LogEntry)
    data: dict[str, Any] = entry.model_dump(mode="json", exclude_none=True, exclude=_EXCLUDE)
    if data.get("verification") == {}:
        del data["verification"]
    return data


def content_bytes(entry: EntryView) -> bytes:
    """`canonical_json(entry_content(entry))` as UTF-8: what the entry's hash covers, as hashed."""
    if isinstance(entry, BulkEntry):
        # msgspec decoded it: JSON's own values, floats only where the schema says Any.
        return decoded_canonical_bytes(bulk_content(entry), plain=_floats_plain(entry))
    return canonical_bytes(entry_content(entry))


def _floats_plain(entry: BulkEntry) -> bool:
    """`plain_json` of the parts of a decoded entry that can hold a float: its other fields are strings
    and integers by the schema."""
    if not plain_json(entry.event) or (entry.metadata is not None and not plain_json(entry.metadata)):
        return False
    return entry.attempts is None or all(a.event is None or plain_json(a.event) for a in entry.attempts)


_STRING = msgspec.json.Encoder()


def _json_string(text: str) -> bytes:
    """`json.dumps(text, ensure_ascii=False)` as UTF-8 (msgspec escapes a string as json does)."""
    try:
        return _STRING.encode(text)
    except Exception:  # a lone surrogate: the json way raises what it raises
        return json.dumps(text, ensure_ascii=False).encode("utf-8")


def _link(previous: str, content: bytes) -> str:
    # canonical_json([previous, content]) without serialising the content again for every `previous`
    # (the diagnosis tries several).
    text = b"[" + _json_string(previous) + b"," + content + b"]"
    # 128 bits tell any edit apart (the chain has no key: it is evidence, not a signature) and every
    # entry of every thread carries one, so the shorter digest keeps lines and the warehouse smaller.
    return hashlib.sha256(text).hexdigest()[:HASH_HEX]


def entry_hash(entry: EntryView, previous: str) -> str:
    """The entryHash `entry` has when it follows `previous` (an entryHash, or the thread id for entry 0)."""
    return _link(previous, content_bytes(entry))


def seal(entry: LogEntry, previous: str) -> LogEntry:
    """A copy of `entry` as schemaVersion 2, its `verification.entryHash` chaining it after `previous`."""
    draft = entry if entry.schemaVersion == SCHEMA_VERSION else entry.model_copy(update={"schemaVersion": 2})
    state = entry.verification.stateHash if entry.verification is not None else None
    link = Verification(stateHash=state, entryHash=entry_hash(draft, previous))
    return draft.model_copy(update={"verification": link})


def head(entries: Sequence[EntryView]) -> str | None:
    """The last entry's entryHash: the thread's digest (None for an empty or unchained thread)."""
    if not entries or entries[-1].verification is None:
        return None
    return entries[-1].verification.entryHash


def is_chained(entries: Sequence[EntryView]) -> bool:
    """Whether the thread is of the chained form: any entry of schemaVersion 2 makes it so (a thread
    is never partly chained, so a version-1 entry in it is itself a finding of `check_chain`)."""
    return any(e.schemaVersion == SCHEMA_VERSION for e in entries)


def rechain(entries: Sequence[LogEntry], source_id: str, new_id: str) -> list[LogEntry]:
    """`entries` (a prefix of thread `source_id`) chained again for `new_id`, after checking that they
    chain for `source_id`: a copy never launders a tampered thread. Unchained entries are returned as
    they are."""
    if not is_chained(entries):
        return list(entries)
    check_chain(entries, source_id)
    previous = new_id
    out: list[LogEntry] = []
    for entry in entries:
        sealed = seal(entry, previous)
        out.append(sealed)
        assert sealed.verification is not None and sealed.verification.entryHash is not None
        previous = sealed.verification.entryHash
    return out


def check_chain(
    entries: Sequence[EntryView], thread_id: str | None, lines: Sequence[bytes] | None = None
) -> None:
    """Check every entryHash of a chained thread in order; raise `TamperError` at the first bad entry,
    saying whether its content changed, an entry is missing or was inserted, or the order changed.

    `lines`: the lines the entries were decoded from, one each, when at hand: a line laid out as
    `LogEntry.to_line` writes it is hashed as it is (`line_content`), not written again."""
    checked_chain(entries, thread_id, lines, NATIVE_LINKS)


def checked_chain(
    entries: Sequence[EntryView], thread_id: str | None, lines: Sequence[bytes] | None, native: Any
) -> None:
    """`check_chain`, its fast path over lines taken by `native` (`NATIVE_LINKS`) or, given None, in
    Python: the two are held to the same verdicts by tests."""
    if thread_id is None:
        raise LogError(
            "checking a chained thread needs its thread id (entry 0 is chained to it): pass thread_id=, "
            "or read the entries from a file whose lines carry threadId"
        )
    if lines is not None and len(lines) != len(entries):
        raise LogError(
            f"checking a chain over its lines needs one line per entry: {len(lines)} line(s) for "
            f"{len(entries)} entries (pass the lines the entries were decoded from, or none)"
        )
    # The whole thread in one call into C (improve/_digest.c), with what the loop below makes first; where
    # it stops short (ids it does not write, an entry it cannot verify), the loop judges.
    if (
        native is not None
        and _CHAIN_LINKS is not None
        and type(entries) is list
        and type(lines) is list
        and _CHAIN_LINKS(entries, lines, thread_id, BulkEntry) == len(entries)
    ):
        return
    previous = thread_id
    opening = b"[" + _json_string(thread_id) + b","  # what the hashed text starts with: `previous` as JSON
    thread = entries[0].threadId if entries else None
    tail = line_tail(thread)  # made once for the thread
    sha256 = hashlib.sha256
    if lines is None or type(entries) is not list or type(lines) is not list:
        native = None
    skip = 0  # the entries before it were verified by `native`
    for position, entry in enumerate(entries):
        if position < skip:
            continue
        if native is not None and isinstance(entry, BulkEntry) and entry.threadId == thread:
            # The same fast path in C (improve/_digest.c), from here to the first entry it cannot verify.
            skip = native(entries, lines, position, opening, thread, tail, BulkEntry)
            if skip > position:
                previous = entries[skip - 1].verification.entryHash
                opening = b"".join((b'["', previous.encode("utf-8"), b'",'))
                if skip == len(entries):
                    return
                continue
        verification = entry.verification
        found = verification.entryHash if verification is not None else None
        if entry.schemaVersion != SCHEMA_VERSION or found is None:
            raise _diagnose(entries, position, thread_id)
        if lines is not None and isinstance(entry, BulkEntry):
            assert verification is not None
            if position == 0 or entry.threadId != thread:
                thread, tail = entry.threadId, line_tail(entry.threadId)
            # `_line_cut` inline (this loop is most of `--verify`'s cost): the line's end as
            # `LogEntry.to_line` writes it, and the content the hash covers is what precedes it.
            line = lines[position]
            link = found.encode("utf-8")
            state = verification.stateHash
            if state is None:
                end = b"".join((_NO_STATE, link, b'"}', tail))
                text = (
                    b"".join((opening, line[: len(line) - len(end)], b"}]")) if line.endswith(end) else None
                )
            else:
                hashed = state.encode("utf-8")
                end = b"".join((_WITH_STATE, link, b'","stateHash":"', hashed, b'"}', tail))
                text = (
                    b"".join((opening, line[: len(line) - len(end)], _STATE_ONLY, hashed, b'"}}]'))
                    if line.endswith(end)
                    else None
                )
            if text is not None and sha256(text).hexdigest()[:HASH_HEX] == found:
                previous = found
                opening = b"".join((b'["', link, b'",'))  # an entryHash is hex: its own JSON text, quoted
                continue
        if not _links(entry, previous, found):
            raise _diagnose(entries, position, thread_id)
        previous = found
        if lines is not None:
            opening = b"[" + _json_string(found) + b","


NATIVE_LINKS: Any = getattr(digest(), "links", None)
"""`links` of improve/_digest.c, or None (`improve.native.digest`): chosen once, at import."""
_CHAIN_LINKS: Any = getattr(digest(), "chain_links", None)
"""`chain_links` of improve/_digest.c, or None: `links` from the first entry, with the opening and tail."""

_NO_STATE = b',"verification":{"entryHash":"'
_WITH_STATE = b'"verification":{"entryHash":"'
_STATE_ONLY = b'"verification":{"stateHash":"'


def line_content(line: bytes, entry: BulkEntry) -> bytes | None:
    """What the entryHash of `entry` covers, cut out of the line it was decoded from, when the line is
    laid out as `LogEntry.to_line` writes it: the canonical text of the content, its last member
    `verification` with `entryHash` put in first, then `threadId`. None for any other layout (the
    caller writes the content again: `content_bytes`).

    Why a match is the entry: the cut-out text hashes to the entryHash only if it is the canonical text
    the writer hashed, so the line is that text with `entryHash` inside its last member and `threadId`
    after it, which is the entry decoded from the line, and nothing else."""
    verification = entry.verification
    if verification is None or verification.entryHash is None:
        return None
    link = verification.entryHash.encode("utf-8")
    cut = _line_cut(line, link, verification.stateHash, line_tail(entry.threadId))
    return None if cut is None else line[: cut[0]] + cut[1]


def _line_cut(line: bytes, link: bytes, state: str | None, tail: bytes) -> tuple[int, bytes] | None:
    """`line_content` as the length of the line's start it keeps and what follows that start in it
    (the `verification` member without `entryHash`, and the closing brace); None for another layout.
    `link`: the entry's entryHash; `state`: its stateHash; `tail`: `line_tail` of its thread."""
    if not line.endswith(tail):
        return None
    end = len(line) - len(tail)
    if state is None:
        written = b',"verification":{"entryHash":"' + link + b'"}'
        return (end - len(written), b"}") if line.endswith(written, 0, end) else None
    hashed = b'"stateHash":"' + state.encode("utf-8") + b'"}'
    written = b'"verification":{"entryHash":"' + link + b'",' + hashed
    if not line.endswith(written, 0, end):
        return None
    return end - len(written), b'"verification":{' + hashed + b"}"


def _links(entry: EntryView, previous: str, found: str) -> bool:
    """Whether `entry` chains after `previous` to its entryHash `found`. A decoded entry's msgspec text is
    hashed first (`sorted_text`): when it chains, it is the canonical text, and the floats in the entry
    need no walk; when it does not, the canonical text decides."""
    if isinstance(entry, BulkEntry):
        # check_chain asks only of schemaVersion 2 entries, whose content `content_struct` writes.
        text = sorted_text(content_struct(entry))
        if text is not None and _link(previous, text) == found:
            return True
    return _link(previous, content_bytes(entry)) == found


def _describe(entries: Sequence[EntryView], position: int) -> str:
    entry = entries[position]
    return f"entry {position} ({entry.type}, id {entry.id})"


def _chains_after(entry: EntryView, content: bytes, previous: str) -> bool:
    found = entry.verification.entryHash if entry.verification is not None else None
    return found is not None and _link(previous, content) == found


def _recorded_ids(entry: EntryView) -> list[str]:
    """The ids entry 0 says its thread was recorded under: its line's `threadId`, and the run's id its
    metadata makes (`split:vN:model:scenario:rK`, as `ThreadId` writes it). Candidates only: the chain
    tells which, if any, is the one."""
    found: list[str] = [entry.threadId] if entry.threadId else []
    meta = entry.metadata or {}
    policy, models = meta.get("policy"), meta.get("models")
    if isinstance(policy, dict) and isinstance(models, dict) and isinstance(models.get("decider"), str):
        parts = [meta.get("split"), meta.get("scenario"), meta.get("run"), policy.get("version")]
        if all(isinstance(part, (str, int)) for part in parts):
            model = model_slug(models["decider"])
            for version in (f"v{policy['version']}", str(policy["version"])):
                found.append(f"{meta['split']}:{version}:{model}:{meta['scenario']}:r{meta['run']}")
    return found


def _diagnose(entries: Sequence[EntryView], p: int, thread_id: str) -> TamperError:
    """Why entry `p` breaks the chain (all entries before it check). The hash cannot say what changed,
    only that something did; which kind of change it was is read off where the entry does chain."""
    entry = entries[p]
    where = f"thread {thread_id}: {_describe(entries, p)}"

    def tamper(kind: str, what: str, index: int = p) -> TamperError:
        return TamperError(f"{where}: {what}; {_FIX}", thread_id=thread_id, index=index, kind=kind)

    expected = thread_id if p == 0 else entries[p - 1].verification.entryHash  # type: ignore[union-attr]
    assert expected is not None
    content = content_bytes(entry)
    for recorded_as in _recorded_ids(entry) if p == 0 else []:
        if recorded_as != thread_id and _chains_after(entry, content, recorded_as):
            # Unedited, under another name (a file copied as `thread.jsonl` for a bug report): what it
            # says of itself names the id it was recorded under, and it chains to that one.
            return TamperError(
                f"{where}: renamed: it was recorded as thread {recorded_as!r} (entry 0 chains to that id), "
                f"not {thread_id!r}; a thread is chained to its id, so it cannot be read under another: "
                f"name its file {recorded_as}.jsonl again",
                thread_id=thread_id,
                index=p,
                kind="renamed",
            )
    # Where was it written? After the thread's start, or after some other entry of the thread.
    after: int | None = None
    if p > 0 and _chains_after(entry, content, thread_id):
        after = -1
    else:
        for q, other in enumerate(entries):
            other_hash = other.verification.entryHash if other.verification is not None else None
            if q != p - 1 and q != p and other_hash and _chains_after(entry, content, other_hash):
                after = q
                break
    if after is not None and after > p:
        return tamper(
            "reordered",
            f"order changed: it was written right after entry {after} ({entries[after].type}), which now "
            f"stands after it",
        )
    if p + 1 < len(entries):
        nxt = entries[p + 1]
        if _chains_after(nxt, content_bytes(nxt), expected):
            return tamper(
                "inserted",
                "inserted: it is not part of the chain (the entry after it follows the one before it)",
            )
    if after is not None:
        origin = "the thread's first entry" if after == -1 else f"entry {after} ({entries[after].type})"
        return tamper(
            "inserted",
            f"inserted: it is a copy of an entry written right after {origin}, not after entry {p - 1}",
        )
    if p > 0 and entries[p - 1].type == END_EVENT and RESUME_KEY not in (entry.metadata or {}):
        # An entry that resumed a run stopped waiting comes after its end entry by right: its content
        # changed (below), it was not put there.
        return tamper("inserted", f"inserted: it comes after the run's {END_EVENT} entry")
    if entry.index > p:
        gone = f"entry {p}" if entry.index == p + 1 else f"entries {p} to {entry.index - 1}"
        return tamper(
            "missing", f"{gone} missing: the entry at position {p} was written as entry {entry.index}"
        )
    ids = {e.id for e in entries}
    if p > 0 and entry.causationId is not None and entry.causationId not in ids:
        return tamper(
            "missing",
            f"an entry before it is missing: it follows entry id {entry.causationId}, which is not in the "
            "thread",
        )
    if entry.schemaVersion != SCHEMA_VERSION:
        return tamper("changed", f"content changed: schemaVersion {entry.schemaVersion} in a chained thread")
    if entry.verification is None or entry.verification.entryHash is None:
        return tamper(
            "changed",
            "content changed: it has no verification.entryHash (every entry of a chained thread has one)",
        )
    renamed = (
        f", or the thread was recorded under another id than {thread_id!r} (entry 0 is chained to its "
        "thread id: a thread cannot be renamed into another)"
        if p == 0
        else ""
    )
    return tamper(
        "changed",
        "content changed: its entryHash does not match what it holds now (an event field, an output, an "
        f"effect, usage counts, attempts, metadata or ids were edited after it was written{renamed})",
    )
