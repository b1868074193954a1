"""Where the `cel` package departs from the CEL specification, a source rewrite that makes it follow it.

CEL's conformance suite (`make conformance`) shows `cel` 0.10 deviating in the core that policies use:

- `size('πέντε')` is 10 (UTF-8 bytes); the specification counts code points (5);
- `-false` is `true` (taken for `!false`); the specification has no `-` on bool: an error;
- `-(-9223372036854775808)` wraps around to itself; the specification makes it an overflow error;
- `{true: 1, false: 2, true: 3}` keeps the last value; the specification makes a repeated key an error;
- numeric map keys compare by type (`{1u: 'a'}[1]`, `{1: 'a'}[1.0]`, `3.0 in {3: 0}` miss or fail);
  the specification compares int, uint and double keys by value, and lets a whole double index a list.

The fast path (`improve.machine.fastcel`) follows the specification directly. For `cel` the expression
is rewritten before it is compiled (the allowlist has already checked the original), calling helpers
registered on every `cel.Context` (`register`):

- `size(x)` and `x.size()` become `_improve_size(x)`: a string's length in code points;
- `-X` (an odd run of `-` before anything but a number literal) becomes `_improve_neg(X, -(X))`:
  cel computes the negation (and fails on types without one), the helper refuses a bool or int64's
  minimum;
- a map literal whose keys are not distinct literals is guarded by `_improve_keys([k1, ...]) ? {...} : {}`,
  which fails on a repeated key (int and uint keys equal by value, a bool never equals an int);
- numeric keys are brought to int: a uint or whole double literal used as a map key, an index or the
  left side of `in` is written as the int it equals, and a computed one goes through `_improve_key`
  (a whole double in range becomes an int; a uint becomes an int on its way through Python); a map
  literal's uint key likewise (`_improve_mkey` for a computed one), its double key stays an error. So
  `{1u: 'a'}[1]`, `{1: 'a'}[1.0]` and `3.0 in {3: 0}` find the key as the specification says.

Known limits, shared by both paths: a non-whole double as a map key fails (`Value of type float
cannot be used as a map key`) where the specification says "no such key" (`3.1 in {1: 1}` is false
there); a uint above int64's maximum stays a uint. A source this module cannot rewrite (it does not
parse) is compiled as it is, and cel reports the syntax error.

Errors raised by a helper reach the caller in cel's wrapping (`Function '_improve_neg' error: Python
function call failed: ...`); `unwrap` restores the helper's own text, which is the fast path's.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Final

from improve.machine.fastcel import INT_MAX, INT_MIN
from improve.machine.fastcel.messages import neg_overflow, no_overload, repeated_key, undefined

PREFIX: Final = "_improve_"

_TOKEN: Final = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>==|!=|<=|>=|&&|\|\||\?\.|.)
    """,
    re.VERBOSE | re.DOTALL,
)
_OPEN: Final = {"(": ")", "[": "]", "{": "}"}
_CLOSE: Final = frozenset(_OPEN.values())
# Tokens after which `-` is binary and `[` indexes (a value ends there).
_VALUE_END: Final = frozenset({")", "]", "}"})
_OPERATOR_WORDS: Final = frozenset({"in"})
# What ends the left side of `in`, scanning back (operators of its precedence or lower).
_BELOW_RELATION: Final = frozenset({"==", "!=", "<", "<=", ">", ">=", "in", "&&", "||", "?", ":", ","})


@dataclass(frozen=True, slots=True)
class Tok:
    kind: str
    text: str


class _Unparsed(Exception):
    """The source is not balanced or not understood: compile it as it is."""


def _tokens(source: str) -> list[Tok]:
    out: list[Tok] = []
    pos = 0
    for m in _TOKEN.finditer(source):
        if m.start() != pos:
            raise _Unparsed
        pos = m.end()
        if m.lastgroup != "space":
            out.append(Tok(m.lastgroup or "punct", m.group()))
    if pos != len(source):
        raise _Unparsed
    return out


def _ends_value(tok: Tok | None) -> bool:
    if tok is None:
        return False
    if tok.kind in ("number", "string"):
        return True
    if tok.kind == "ident":
        return tok.text not in _OPERATOR_WORDS
    return tok.text in _VALUE_END


def _int_literal(text: str) -> str | None:
    """A uint or whole double literal written as the int literal it equals, or None."""
    t = text.lower()
    try:
        if t.startswith("0x"):
            value = int(t.rstrip("u"), 16)
        elif t.endswith("u"):
            value = int(t[:-1])
        elif any(c in t for c in ".e"):
            f = float(t)
            if not f.is_integer():
                return None
            value = int(f)
        else:
            return None
    except ValueError:
        return None
    return str(value) if value <= INT_MAX else None


class _Rewriter:
    def __init__(self, toks: list[Tok]) -> None:
        self.t = toks
        self.match: dict[int, int] = {}
        stack: list[int] = []
        for i, tok in enumerate(toks):
            if tok.kind == "punct" and tok.text in _OPEN:
                stack.append(i)
            elif tok.kind == "punct" and tok.text in _CLOSE:
                if not stack or _OPEN[toks[stack[-1]].text] != tok.text:
                    raise _Unparsed
                self.match[stack.pop()] = i
        if stack:
            raise _Unparsed
        # The left side of each `in`: where it starts, and the `in` it belongs to.
        self.in_lhs: dict[int, int] = {}
        for i, tok in enumerate(toks):
            if tok.kind == "ident" and tok.text == "in" and i > 0:
                start = self._relation_start(i)
                self.in_lhs.setdefault(start, i)

    def _relation_start(self, i: int) -> int:
        j = i - 1
        while j >= 0:
            tok = self.t[j]
            if tok.kind == "punct" and tok.text in _CLOSE:
                j = next(o for o, c in self.match.items() if c == j) - 1
                continue
            if tok.kind == "punct" and tok.text in _OPEN:
                break
            if tok.text in _BELOW_RELATION and tok.kind != "string":
                break
            j -= 1
        return j + 1

    def _operand_end(self, i: int) -> int:
        """Where the member expression starting at token i ends (exclusive)."""
        t = self.t
        if i >= len(t):
            raise _Unparsed
        tok = t[i]
        if tok.kind == "punct" and tok.text in _OPEN:
            j = self.match[i] + 1
        elif tok.kind == "punct" and tok.text == "." and i + 1 < len(t) and t[i + 1].kind == "ident":
            j = i + 2
        elif tok.kind in ("ident", "number", "string"):
            j = i + 1
        else:
            raise _Unparsed  # `-!x` and the like: cel says what is wrong
        while j < len(t):
            nxt = t[j]
            if nxt.text in (".", "?.") and j + 1 < len(t) and t[j + 1].kind == "ident":
                j += 2
            elif nxt.text in ("(", "[") or (nxt.text == "{" and t[j - 1].kind == "ident"):
                j = self.match[j] + 1
            else:
                break
        return j

    def emit(self, lo: int, hi: int) -> str:
        t = self.t
        out: list[str] = []
        i = lo
        while i < hi:
            tok = t[i]
            prev = t[i - 1] if i > 0 else None
            if i in self.in_lhs and self.in_lhs[i] < hi:
                end = self.in_lhs.pop(i)
                out.append(self._key(i, end))
                i = end
                continue
            if tok.kind == "ident" and tok.text == "size" and i + 1 < hi and t[i + 1].text == "(":
                out.append(f"{PREFIX}size")  # `size(x)` and, after a `.`, `x.size()`
                i += 1
                continue
            if tok.text == "-" and tok.kind == "punct" and not _ends_value(prev):
                run = i
                while run < hi and t[run].text == "-":
                    run += 1
                end = self._operand_end(run)
                if (run - i) % 2 == 0 or (end == run + 1 and t[run].kind == "number"):
                    out.append(" ".join(x.text for x in t[i:run]))  # cel cancels pairs; literals
                    i = run
                    continue
                operand = self.emit(run, end)  # an odd run is one `-`: cel cancels pairs
                out.append(f" {PREFIX}neg({operand}, -({operand}))")
                i = end
                continue
            if tok.text == "[" and tok.kind == "punct" and _ends_value(prev):
                close = self.match[i]
                if close == i + 1 or t[i + 1].text == "?":  # `[]` is invalid; `[?` is optional syntax
                    out.append(self.emit_raw(i, close + 1))
                else:
                    out.append("[" + self._key(i + 1, close) + "]")
                i = close + 1
                continue
            if (
                tok.text == "{"
                and tok.kind == "punct"
                and not (prev is not None and prev.kind == "ident" and prev.text not in _OPERATOR_WORDS)
            ):  # after a name, `{` builds a message
                close = self.match[i]
                out.append(self._map(i + 1, close))
                i = close + 1
                continue
            out.append(tok.text)
            i += 1
        return " ".join(out)

    def emit_raw(self, lo: int, hi: int) -> str:
        return " ".join(x.text for x in self.t[lo:hi])

    def _key(self, lo: int, hi: int, literal: bool = False) -> str:
        """An index or left side of `in` with numeric values brought to int; with `literal`, a key of
        a map literal, where only a uint becomes an int (a double key stays an error)."""
        if hi == lo + 1:
            tok = self.t[lo]
            if tok.kind == "number":
                if literal and tok.text[-1] not in "uU":
                    return tok.text
                return _int_literal(tok.text) or tok.text
            if tok.kind == "string" or tok.text in ("true", "false", "null"):
                return tok.text
        return f"{PREFIX}{'mkey' if literal else 'key'}({self.emit(lo, hi)})"

    def _split(self, lo: int, hi: int, sep: str) -> list[tuple[int, int]]:
        parts: list[tuple[int, int]] = []
        start = i = lo
        while i < hi:
            tok = self.t[i]
            if tok.kind == "punct" and tok.text in _OPEN:
                i = self.match[i] + 1
                continue
            if tok.kind == "punct" and tok.text == sep:
                parts.append((start, i))
                start = i + 1
            i += 1
        if start < hi:
            parts.append((start, hi))
        return parts

    def _entry_colon(self, lo: int, hi: int) -> int:
        pending = 0  # `?` of conditionals inside the key
        i = lo
        while i < hi:
            tok = self.t[i]
            if tok.kind == "punct" and tok.text in _OPEN:
                i = self.match[i] + 1
                continue
            if tok.text == "?" and tok.kind == "punct":
                pending += 1
            elif tok.text == ":" and tok.kind == "punct":
                if pending == 0:
                    return i
                pending -= 1
            i += 1
        raise _Unparsed

    def _map(self, lo: int, hi: int) -> str:
        entries = self._split(lo, hi, ",")
        if any(self.t[a].text == "?" for a, _ in entries):
            return "{" + self.emit(lo, hi) + "}"  # optional entries: left as they are
        keys: list[str] = []
        values: list[str] = []
        literal: list[str] = []
        for a, b in entries:
            colon = self._entry_colon(a, b)
            keys.append(self._key(a, colon, literal=True))
            values.append(self.emit(colon + 1, b))
            if colon == a + 1 and self.t[a].kind in ("number", "string"):
                literal.append(keys[-1])
            elif colon == a + 1 and self.t[a].text in ("true", "false"):
                literal.append(self.t[a].text)
        body = "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, values, strict=True)) + "}"
        simple = all(re.fullmatch(r"'[\w ]*'|\"[\w ]*\"|\d+|true|false", k) for k in literal)
        distinct = {k.strip("'\"") if k[0] in "'\"" else f"#{k}" for k in literal}
        if len(entries) < 2 or (len(literal) == len(keys) and simple and len(distinct) == len(keys)):
            return body
        return f"({PREFIX}keys([{', '.join(keys)}]) ? {body} : {{}})"


def rewrite(source: str) -> str:
    """`source` rewritten to call the helpers where `cel` departs from the specification; the source as
    it is when nothing needs rewriting or it cannot be parsed."""
    try:
        toks = _tokens(source)
        if not any(
            (k.text in ("-", "{", "[", "size", "in")) or (k.kind == "number" and k.text[-1] in "uU")
            for k in toks
        ):
            return source
        return _Rewriter(toks).emit(0, len(toks))
    except (_Unparsed, KeyError, StopIteration, RecursionError):
        return source


# --- the helpers ----------------------------------------------------------------------------------


def _size(x: Any) -> int:
    if isinstance(x, str | bytes | list | dict):
        return len(x)  # a str: code points
    raise undefined("size")


def _neg(x: Any, negated: Any) -> Any:
    # cel has computed `negated` (and failed on a string, a uint, ...); it only gets bool and the
    # minimum int wrong.
    if type(x) is bool:
        raise no_overload()
    if type(x) is int and x == INT_MIN:
        raise neg_overflow(x)
    return negated


def _keys(keys: list[Any]) -> bool:
    seen: set[tuple[bool, Any]] = set()
    for k in keys:
        if type(k) not in (str, int, bool):
            continue  # not a key type: cel's map literal reports it
        marker = (type(k) is bool, k)
        if marker in seen:
            raise repeated_key(k)
        seen.add(marker)
    return True


def _key(k: Any) -> Any:
    if type(k) is float and k.is_integer() and INT_MIN <= k <= INT_MAX:
        return int(k)
    return k


def _mkey(k: Any) -> Any:
    return k  # on its way through Python a uint becomes an int: int and uint keys are one key


HELPERS: Final = {
    f"{PREFIX}mkey": _mkey,
    f"{PREFIX}size": _size,
    f"{PREFIX}neg": _neg,
    f"{PREFIX}keys": _keys,
    f"{PREFIX}key": _key,
}


def register(ctx: Any) -> None:
    """Add the helpers to a `cel.Context`."""
    for name, fn in HELPERS.items():
        ctx.add_function(name, fn)


_WRAPPED: Final = re.compile(
    rf"^Function '{PREFIX}\w+' error: Python function call failed: \w+: (.*)\. "
    r"Check function arguments and their types\.$"
)


def unwrap(detail: str) -> str:
    """A helper's error as the helper said it (cel wraps it in its own sentence)."""
    m = _WRAPPED.match(detail)
    return m.group(1) if m else detail


class _QuietHelpers(logging.Filter):
    """cel logs each failing Python function as a warning (printed on stderr when logging is not
    configured); a helper's failure is an ordinary evaluation error, reported by the caller."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"Python function '{PREFIX}" not in record.getMessage()


logging.getLogger("cel").addFilter(_QuietHelpers())
