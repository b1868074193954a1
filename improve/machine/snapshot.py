"""Snapshots: where a machine is, as JSON, with a canonical hash."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

Status = Literal["active", "done", "error"]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace, UTF-8 kept: equal values give equal text."""
    return _CANONICAL.encode(value)


SORTED_ENCODER = msgspec.json.Encoder(order="sorted")
"""msgspec's writer of sorted keys: `sorted_text` and the fold's pieces of a snapshot's text (fold.py)."""


class _NotPythons(Exception):
    """A float msgspec writes otherwise than Python: with an exponent (msgspec 1e16 and 1e-7, Python
    1e+16 and 1e-07), or in the fixed notation msgspec keeps from 1e-4 down to 1e-5 (0.00001 against
    Python's 1e-05)."""


def _float(text: str) -> float:
    if "e" in text or text.startswith(("0.0000", "-0.0000")):
        raise _NotPythons
    return float(text)


# Reads msgspec's text back, seeing every float's text as msgspec wrote it (strings that merely look
# like numbers are not floats to it).
_READ_BACK = msgspec.json.Decoder(float_hook=_float)


_NO_KEY = itertools.repeat("")


def plain_json(value: Any, before: dict[str, Any] | None = None) -> bool:
    """Whether msgspec's sorted text of `value` is `canonical_json`'s, told from the value itself: only
    JSON's own types (dicts with string keys, lists, str, int, bool, None, float: exactly these, no
    subclass), and every float one that both write alike: zero, or a magnitude from 1e-4 up to 1e16
    (outside it, or NaN and the infinities, they differ: see `_NotPythons`). A walk over the value
    costs about half of encoding it again and reading the text back.

    `before`: a dict found plain earlier whose values are never changed in place (a run's last context):
    a list or dict of `value` (a dict) that is the very object `before` holds under its key is plain."""
    t = type(value)
    if t is dict:
        pairs: Iterable[tuple[Any, Any]] = value.items()
    elif t is list:
        pairs = zip(_NO_KEY, value, strict=False)  # the keys never run out
    elif t is float:
        return bool(1e-4 <= abs(value) < 1e16 or value == 0.0)
    else:
        return t is str or t is int or t is bool or value is None
    for key, item in pairs:
        if type(key) is not str:
            return False
        k = type(item)
        if k is str or k is int or k is bool or item is None:
            continue
        if k is float:
            if not (1e-4 <= abs(item) < 1e16 or item == 0.0):
                return False
        elif (before is None or item is not before.get(key)) and not plain_json(item):
            return False
    return True


def canonical_bytes(value: Any) -> bytes:
    """`canonical_json(value)` as UTF-8, and the same errors, several times as fast where it can be.

    msgspec writes the same text as `json.dumps` for JSON's own values (keys sorted by code point, the
    same escapes, the same shortest digits of a float) except some floats' notation (`_NotPythons`) and
    what is not JSON: NaN and infinities (null, where canonical_json raises), and a set, bytes, a date
    or a tuple (written, where it raises or writes a list). A value of JSON's own types whose floats
    both write alike (`plain_json`) is written by msgspec; for any other, msgspec's text is read back, every
    float's notation checked, and must equal the value; anything else goes the `json.dumps` way."""
    try:
        if plain_json(value):
            return SORTED_ENCODER.encode(value)
        text = SORTED_ENCODER.encode(value)
        if _READ_BACK.decode(text) == value:
            return text
    except Exception:  # a lone surrogate, a type msgspec has no encoding for, nesting past the stack
        pass
    return canonical_json(value).encode("utf-8")


def decoded_canonical_bytes(value: Any, *, plain: bool | None = None) -> bytes:
    """`canonical_bytes` of a value msgspec decoded from JSON (a log entry's content): only JSON's own
    types are in it, so only its floats' notation is in question: its text is read back when `plain_json`
    finds a float the two write differently. `plain`: the caller has asked `plain_json` of the parts of
    the value that can hold a float."""
    try:
        text = SORTED_ENCODER.encode(value)
        if not (plain_json(value) if plain is None else plain):
            _READ_BACK.decode(text)
        return text
    except Exception:  # a float written otherwise than Python writes it, or a lone surrogate
        return canonical_json(value).encode("utf-8")


def sorted_text(value: Any) -> bytes | None:
    """msgspec's text of `value`, keys sorted (None where msgspec cannot write it: a lone surrogate,
    nesting past the stack): `canonical_bytes` of a value `plain_json` finds plain, written without the
    walk that finds it so.

    For a caller that compares a hash of the text with a journaled one, made of canonical text: when
    they match, this text is that canonical text (no other text hashes alike), and `plain_json` need not
    be asked. A value it is not the canonical text of (a float msgspec writes otherwise, as `1e16` for
    `1e+16`) hashes otherwise, and the caller compares the canonical text's hash after all; a float both
    write alike is written alike, so a text that matches has every float in Python's notation."""
    try:
        return SORTED_ENCODER.encode(value)
    except Exception:
        return None


def plain_hash(value: Any) -> str:
    """`canonical_hash` of a value the caller has found `plain_json`."""
    try:
        return hashlib.sha256(SORTED_ENCODER.encode(value)).hexdigest()
    except Exception:  # a lone surrogate, nesting past the stack: the json way raises what it raises
        return canonical_hash(value)


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


_UNSET: Any = object()
_KEY_ENCODER = msgspec.json.Encoder(order="sorted")


class Invocation:
    """The actor a snapshot is waiting on: its invoke id, its source and its evaluated input.

    The input is a pure function of the snapshot's context, so it is evaluated on first use: a replay
    that only folds entries never pays for it.
    """

    __slots__ = ("_input", "_thunk", "id", "src")

    def __init__(
        self, id: str, src: str, input: Any = _UNSET, thunk: Callable[[], Any] | None = None
    ) -> None:
        self.id = id
        self.src = src
        self._input = input
        self._thunk = thunk

    @property
    def input(self) -> Any:
        if self._input is _UNSET:
            assert self._thunk is not None
            self._input = self._thunk()
            self._thunk = None
        return self._input

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "src": self.src, "input": self.input}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Invocation):
            return NotImplemented
        return (self.id, self.src, self.input) == (other.id, other.src, other.input)

    def __hash__(self) -> int:
        return hash((self.id, self.src))

    def __repr__(self) -> str:
        return f"Invocation(id={self.id!r}, src={self.src!r}, input={self.input!r})"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable picture of a machine between events.

    `value` is the current state; `status` is `active`, `done` (a final state, with `output`) or
    `error` (an actor failed where no `onError` was given, with `error`). `invoke` names the actor the
    machine waits for, if any; a state with neither `invoke` nor `final` waits for a person.
    """

    value: str
    context: dict[str, Any]
    status: Status = "active"
    input: Any = None
    output: Any = None
    error: Any = None
    invoke: Invocation | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "context": self.context,
            "status": self.status,
            "input": self.input,
            "output": self.output,
            "error": self.error,
            "invoke": self.invoke.to_json() if self.invoke else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        inv = data.get("invoke")
        return cls(
            value=data["value"],
            context=dict(data.get("context") or {}),
            status=data.get("status", "active"),
            input=data.get("input"),
            output=data.get("output"),
            error=data.get("error"),
            invoke=Invocation(inv["id"], inv["src"], inv.get("input")) if inv else None,
        )

    def hash(self) -> str:
        """sha256 of the canonical JSON of the snapshot, without the owed actor's input (a function
        of the context, so it adds nothing and would cost an evaluation)."""
        data = self.to_json_shallow()
        return canonical_hash(data)

    def key(self) -> bytes:
        """What tells this snapshot from every other, for a search's visited set: its canonical content
        (the fields `hash` covers, keys sorted) encoded by msgspec, not hashed. Equal where `hash` is
        equal and far cheaper: the search of the code agent's machine spent a third of its time on
        `json.dumps` for the hash."""
        return _KEY_ENCODER.encode(self.to_json_shallow())

    def to_json_shallow(self) -> dict[str, Any]:
        return shallow_json(
            self.value,
            self.context,
            self.status,
            self.input,
            self.output,
            self.error,
            (self.invoke.id, self.invoke.src) if self.invoke else None,
        )

    @property
    def done(self) -> bool:
        return self.status == "done"


_FIELDS = ("value", "context", "status", "input", "output", "error", "invoke")
_NEW = object.__new__
_SET_VALUE, _SET_CONTEXT, _SET_STATUS, _SET_INPUT, _SET_OUTPUT, _SET_ERROR, _SET_INVOKE = (
    Snapshot.__dict__[name].__set__ for name in _FIELDS
)


def snapshot_of(
    value: str,
    context: dict[str, Any],
    status: Status,
    input: Any,
    output: Any,
    error: Any,
    invoke: Invocation | None,
) -> Snapshot:
    """`Snapshot(value, context, ...)`, every field given, built without the frozen dataclass's `__init__`
    (keywords, then an `object.__setattr__` a field: 1.4 µs, a tenth of replaying a short thread): each
    slot is set through its descriptor."""
    snapshot = _NEW(Snapshot)
    _SET_VALUE(snapshot, value)
    _SET_CONTEXT(snapshot, context)
    _SET_STATUS(snapshot, status)
    _SET_INPUT(snapshot, input)
    _SET_OUTPUT(snapshot, output)
    _SET_ERROR(snapshot, error)
    _SET_INVOKE(snapshot, invoke)
    return snapshot


def shallow_json(
    value: str,
    context: dict[str, Any],
    status: Status,
    input: Any,
    output: Any,
    error: Any,
    invoke: tuple[str, str] | None,
) -> dict[str, Any]:
    """What `Snapshot.hash` covers: the snapshot's JSON with its owed actor's id and source only (`invoke`)."""
    return {
        "value": value,
        "context": context,
        "status": status,
        "input": input,
        "output": output,
        "error": error,
        "invoke": {"id": invoke[0], "src": invoke[1]} if invoke else None,
    }


def dumps(snapshot: Snapshot, indent: int | None = None) -> str:
    return json.dumps(snapshot.to_json(), indent=indent, ensure_ascii=False)
