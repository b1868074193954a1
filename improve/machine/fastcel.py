"""A fast path for a subset of CEL: compile source text to a Python closure over plain Python values.

Why: the `cel` extension evaluates quickly, but converting Python values into a `cel.Context` costs
~1-2 µs per value: the refund guard over the refunds machine's context takes ~62 µs through `cel`
(51 µs of it conversion, 2.5 µs with a prebuilt context) and ~1 µs here. `compile_fast(source)`
returns a closure that evaluates directly on the dicts, lists, strings, ints, floats, bools and None
already in hand, with the same result as `cel` (0.10), or `None` when the source is outside the
subset below (the caller then uses `cel`). Call it on sources `cel` has compiled (as `compile_expr`
does): it rejects what it does not know, but does not reproduce every limit of cel's parser (such
as its nesting depth).

The closure takes the mapping of root variables (`context`, `event`, ...) and either returns what
`cel` returns, raises `FastCelError` whose text is the first line of `cel`'s error message (a missing
key reads `no such key 'x'`, as `Expr.evaluate` formats cel's `KeyError`), or raises
`FastCelFallback` when it meets a value outside its domain; the caller then asks `cel`.

Subset: int and double literals (decimal), strings in single or double quotes with the escapes
`\\ \' \" \n \t \r`, `true false null`, identifiers, `a.f`, `a[i]`, list and map literals,
`! -` (unary), `* / %`, `+ -`, `== != < <= > >= in`, `&&`, `||`, `?:`, `has(a.f)`, `size(x)`,
`x.size()`, `s.startsWith(t)`, `s.endsWith(t)`, `s.contains(t)`. Anything else (uint, hex, raw,
bytes or triple-quoted strings, other escapes, other functions and macros, optional syntax `?.`,
message construction, a leading `.`, comments, reserved words) gives `None`.

Domain: the data must be what JSON decodes to: dicts with string (or int) keys, lists, str, int in
the signed 64-bit range, float, bool, None. Every value the expression reads is checked
(`_load`), containers are checked element by element when compared or returned, and anything else
(a tuple, an int beyond 64 bits, a bool or float key, a string with a lone surrogate, a subclass)
raises `FastCelFallback`. Values the expression never reads are not inspected: `cel` converts a
whole root up front and fails on any unconvertible value in it, the fast path does not notice one it
never touches. Results that are lists or maps are returned as fresh copies, as `cel` returns them.

Semantics, established by experiment against `cel` 0.10 (see tests/test_fastcel.py):

- Literals: `.5` and `1e3` are doubles; `1.` and `2.` do not parse; `007` is 7; an int literal beyond
  int64 and `1e400` do not parse (left to cel). Reserved words parse as field names (`context.as`) in
  cel, but the fast path leaves them alone.
- Undeclared variable: `Undefined variable or function: 'x'. ...` (a root that is absent or None in
  `Scope.values` is undeclared).
- Equality `== !=` never fails: int and double compare numerically after converting the int to a
  double (`9007199254740993 == 9007199254740992.0` is true); bool equals only bool (`true == 1` is
  false), null only null, string only string, different types are unequal (no error); lists are
  equal element-wise by the same rules (`[1, 2] == [1, 2.0]`), maps when their key sets match and the
  values are equal (`{'a': 1} == {'a': 1.0}`); NaN is unequal to everything, itself too, also
  inside lists and maps and for `in`.
- Ordering `< <= > >=`: int/int, double/double and int/double (int converted to double), string/
  string (code points), bool/bool (false < true). Anything else, and any comparison with NaN, is
  `No such overload`. Relations chain left to right: `1 < 2 == true` is true, `1 < 2 < 3` fails.
- Arithmetic: int op int stays int; `+ - * /` and `%` overflowing int64 fail with `Arithmetic
  overflow in 'add' on a and b.` (`sub`, `mul`, `div` for MIN / -1, `rem` for MIN % -1); `/`
  truncates toward zero, `%` takes the dividend's sign; `/ 0` and `% 0` fail (`division by zero in
  CEL expression`, `modulo by zero in CEL expression`). double op double is IEEE (`1.0 / 0.0` is inf,
  `0.0 / 0.0` NaN) except `%`, which fails. `+` also joins strings and lists. Mixed types fail: with
  an int or list on the left the message is `No such overload`, otherwise `Unsupported operation:
  float + int. ...` naming both types (int, float, string, bool, null, list, map). `list + map`
  succeeds in cel, appending the map's keys in hash order: the fast path falls back.
- Unary: a run of the same operator cancels in pairs when parsed: `!!x` and `--x` are `x`, whatever
  its type (`!!'a'` is `'a'`), while `!(!x)` applies both. `-int` wraps (`-(-9223372036854775807 -
  1)` is itself, no error), `-double` negates, `-bool` is logical not (`-true` is false), otherwise
  `No such overload`; `!` takes only a bool. `-!x` does not parse; `!-1` does (a negative literal).
- `&&` / `||` are commutative over errors: `false && <error>` and `<error> && false` are false;
  `true || <error>` and `<error> || true` are true; a non-bool operand is `No such overload` unless
  the other side decides. When both sides fail the right side's error is reported; a failing side
  wins over a non-bool one. `a && b && c` groups to the left.
- `c ? x : y`: only the chosen branch is evaluated; a non-bool condition is `No such overload`.
- `in`: over a list by equality; over a map by key (a string or int key looks up, a bool key is never
  found, a double, null, list or map key fails: `Value of type float cannot be used as a map key.
  ...`); anything else on the right (a string too) is `No such overload`.
- Indexing: a list takes an int in range (`index out of bounds: 2`, negative too); any other index
  type fails with `Unexpected type: got 'double', want 'int|uint'.` (string, double, bool,
  null_type, list, map). A map looks the key up as `in` does; a missing key raises `no such key '1'`
  (an int key is shown as its digits, a bool as true/false). Indexing anything else is `No such
  overload`. Operand errors are reported before index errors. One quirk: a map reached from a
  variable by indexing alone (`context[1.5]`, `context['l'][0][1.5]`, `(c ? context : 1)[1.5]`)
  rejects a bad key type with `No such overload` instead (cel evaluates such chains by reference);
  a selection or a literal in between (`context.e[1.5]`, `[context][0][1.5]`) gives the map key
  message. An index whose operand is a conditional with one branch of each kind is left to cel.
  Indexing a value that is not a list or map fails before the index is evaluated (so an error in the
  index is not reported).
- Field selection `a.f`: on a map, the key `f` (`no such key 'f'`); on a list it fails as an index with
  a string; on anything else `No such overload`. `has(a.f)` is `f in a` for a map, fails the same way
  otherwise, and propagates an error in `a`.
- Map literals evaluate key, then value, entry by entry; the key's type is checked right after the
  key; a later duplicate key wins. A bool key is left to cel (Python would merge `true` with `1`).
- `size(x)` / `x.size()`: a string's length in UTF-8 bytes (`size('é')` is 2), a list's or map's
  length; anything else fails as `Undefined variable or function: 'size'. ...`. `startsWith`,
  `endsWith`, `contains` take two strings, otherwise `Undefined variable or function: 'startsWith'.
  ...`; their argument is evaluated (and its error reported) before the receiver.
- Binary operands, list elements and call arguments are evaluated left to right, the first error wins.
- Maps come back from cel in hash order; the fast path keeps insertion order (dicts compare equal and
  snapshots hash with sorted keys, so the order is not observable there).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

Fn = Callable[[Mapping[str, Any]], Any]

INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**63 - 1


class FastCelError(Exception):
    """An evaluation error `cel` would also raise; the text is the first line of cel's message."""


class FastCelFallback(Exception):
    """The expression met a value outside the fast path's domain: evaluate it with `cel` instead."""


class _NotInSubset(Exception):
    """Raised while compiling: the source is outside the subset (or not valid CEL)."""


# --- messages, as cel 0.10 words them -----------------------------------------------------------

_NSO: Final = (
    "No such overload: the operation is not defined for the given operand types. CEL does not coerce "
    "between types, so common causes are mixing int with uint or double (1 + 2u, 1 + 2.5), indexing "
    "into a string, or calling a function with the wrong argument types. Convert explicitly with "
    "int(x), uint(x), double(x) or string(x), or check the CEL specification."
)
_NoneType: Final = type(None)
_PLAIN: Final = frozenset({int, float, str, bool, _NoneType, list, dict})
_NO_CHECK: Final = frozenset({float, bool, _NoneType, list, dict})  # in the domain as they are
# Type names in "Unsupported operation" and "cannot be used as a map key" messages.
_OP_NAME: Final[dict[type, str]] = {
    int: "int",
    float: "float",
    str: "string",
    bool: "bool",
    _NoneType: "null",
    list: "list",
    dict: "map",
}
# Type names in "Unexpected type" messages (a list indexed by something other than an int).
_INDEX_NAME: Final[dict[type, str]] = {
    int: "int",
    float: "double",
    str: "string",
    bool: "bool",
    _NoneType: "null_type",
    list: "list",
    dict: "map",
}


def _nso() -> FastCelError:
    return FastCelError(_NSO)


def _unsupported(a: Any, op: str, b: Any) -> FastCelError:
    return FastCelError(
        f"Unsupported operation: {_OP_NAME[type(a)]} {op} {_OP_NAME[type(b)]}. CEL does not coerce "
        "between types — both operands must be the same type. Convert explicitly with int(x), "
        "uint(x), double(x) or string(x) as appropriate."
    )


def _undefined(name: str) -> FastCelError:
    return FastCelError(
        f"Undefined variable or function: '{name}'. Check that the variable is defined in the "
        "context or that the function name is spelled correctly."
    )


def _overflow(op: str, a: int, b: int) -> FastCelError:
    return FastCelError(f"Arithmetic overflow in '{op}' on {a} and {b}.")


def _no_key(display: str) -> FastCelError:
    return FastCelError(f"no such key {display!r}")


def _bad_key(k: Any) -> FastCelError:
    return FastCelError(
        f"Value of type {_OP_NAME[type(k)]} cannot be used as a map key. "
        "Keys must be int, uint, bool or string."
    )


def _bad_index(k: Any) -> FastCelError:
    return FastCelError(f"Unexpected type: got '{_INDEX_NAME[type(k)]}', want 'int|uint'.")


# --- the domain -----------------------------------------------------------------------------------


def _check_str(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: cel cannot convert it
        raise FastCelFallback from None


def _load(v: Any) -> Any:
    """A value read from the data: return it if it is in the domain, else fall back to cel."""
    t = type(v)
    if t is int:
        if INT_MIN <= v <= INT_MAX:
            return v
        raise FastCelFallback  # cel reads it as a uint or a double
    if t is str:
        if not v.isascii():
            _check_str(v)
        return v
    if t in _PLAIN:
        return v
    raise FastCelFallback


def _check_key(k: Any) -> None:
    t = type(k)
    if t is str:
        if not k.isascii():
            _check_str(k)
    elif t is not int or not INT_MIN <= k <= INT_MAX:
        raise FastCelFallback  # cel turns a bool key into an int and rejects float or None keys


def _check_keys(m: dict[Any, Any]) -> None:
    for k in m:
        _check_key(k)


def _export(v: Any) -> Any:
    """A result: a fresh, checked copy of a list or map, as cel returns it."""
    t = type(v)
    if t is dict:
        out = {}
        for k, x in v.items():
            _check_key(k)
            out[k] = _export(x)
        return out
    if t is list:
        return [_export(x) for x in v]
    return _load(v)


# --- operations -----------------------------------------------------------------------------------


def _eq(a: Any, b: Any) -> bool:
    ta = type(a)
    tb = type(b)
    if ta is tb:
        if ta is list:
            if len(a) != len(b):
                return False
            return all(_eq(_load(x), _load(y)) for x, y in zip(a, b, strict=True))
        if ta is dict:
            if len(a) != len(b):
                return False
            _check_keys(b)
            for k, x in a.items():
                _check_key(k)
                if k not in b or not _eq(_load(x), _load(b[k])):
                    return False
            return True
        return bool(a == b)  # NaN != NaN, as in cel
    if ta is int and tb is float:
        return bool(float(a) == b)
    if ta is float and tb is int:
        return bool(a == float(b))
    return False


def _compare(a: Any, b: Any) -> int:
    ta = type(a)
    tb = type(b)
    if (ta is int or ta is float) and (tb is int or tb is float):
        if ta is not tb:
            if ta is int:
                a = float(a)
            else:
                b = float(b)
        if a < b:
            return -1
        if a > b:
            return 1
        if a == b:
            return 0
        raise _nso()  # NaN has no order
    if ta is tb and (ta is str or ta is bool):
        return int(a > b) - int(a < b)
    raise _nso()


def _add(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is int:
        if tb is int:
            r = a + b
            if INT_MIN <= r <= INT_MAX:
                return r
            raise _overflow("add", a, b)
        raise _nso()
    if ta is float or ta is str:
        if tb is ta:
            return a + b
    elif ta is list:
        if tb is list:
            return a + b
        if tb is dict:
            raise FastCelFallback  # cel appends the map's keys, in hash order
        raise _nso()
    raise _unsupported(a, "+", b)


def _sub(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is int:
        if tb is int:
            r = a - b
            if INT_MIN <= r <= INT_MAX:
                return r
            raise _overflow("sub", a, b)
        raise _nso()
    if ta is float and tb is float:
        return a - b
    raise _unsupported(a, "-", b)


def _mul(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is int:
        if tb is int:
            r = a * b
            if INT_MIN <= r <= INT_MAX:
                return r
            raise _overflow("mul", a, b)
        raise _nso()
    if ta is float and tb is float:
        return a * b
    raise _unsupported(a, "*", b)


def _div(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is int:
        if tb is int:
            if b == 0:
                raise FastCelError("division by zero in CEL expression")
            if a == INT_MIN and b == -1:
                raise _overflow("div", a, b)
            q = abs(a) // abs(b)
            return -q if (a < 0) != (b < 0) else q
        raise _nso()
    if ta is float and tb is float:
        if b != 0.0:
            return a / b
        if a != a or a == 0.0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    raise _unsupported(a, "/", b)


def _mod(a: Any, b: Any) -> Any:
    if type(a) is int:
        if type(b) is int:
            if b == 0:
                raise FastCelError("modulo by zero in CEL expression")
            if a == INT_MIN and b == -1:
                raise _overflow("rem", a, b)
            r = abs(a) % abs(b)
            return -r if a < 0 else r
        raise _nso()
    raise _unsupported(a, "%", b)


def _lookup(m: dict[Any, Any], k: Any, borrowed: bool = False) -> Any:
    tk = type(k)
    if tk is str:
        try:
            return m[k]
        except KeyError:
            raise _no_key(k) from None
    if tk is int:
        _check_keys(m)  # so that 1 cannot find a key True or 1.0
        try:
            return m[k]
        except KeyError:
            raise _no_key(str(k)) from None
    if tk is bool:
        raise _no_key("true" if k else "false")
    raise _nso() if borrowed else _bad_key(k)


def _index(a: Any, k: Any, borrowed: bool) -> Any:
    ta = type(a)
    if ta is list:
        if type(k) is int:
            if 0 <= k < len(a):
                return _load(a[k])
            raise FastCelError(f"index out of bounds: {k}")
        raise _bad_index(k)
    if ta is dict:
        return _load(_lookup(a, k, borrowed))
    raise _nso()


def _select(a: Any, name: str) -> Any:
    ta = type(a)
    if ta is dict:
        try:
            return _load(a[name])
        except KeyError:
            raise _no_key(name) from None
    if ta is list:
        raise _bad_index(name)
    raise _nso()


def _contains(container: Any, k: Any) -> bool:
    tc = type(container)
    if tc is list:
        return any(_eq(k, _load(x)) for x in container)
    if tc is dict:
        tk = type(k)
        if tk is str:
            return k in container
        if tk is int:
            _check_keys(container)
            return k in container
        if tk is bool:
            return False
        raise _bad_key(k)
    raise _nso()


def _size(a: Any) -> int:
    ta = type(a)
    if ta is str:
        return len(a) if a.isascii() else len(a.encode("utf-8"))
    if ta is list or ta is dict:
        return len(a)
    raise _undefined("size")


def _neg(a: Any) -> Any:
    ta = type(a)
    if ta is int:
        return a if a == INT_MIN else -a  # cel wraps
    if ta is float:
        return -a
    if ta is bool:
        return not a  # cel: -true is false
    raise _nso()


def _not(a: Any) -> bool:
    if type(a) is bool:
        return not a
    raise _nso()


_BINARY: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+": _add,
    "-": _sub,
    "*": _mul,
    "/": _div,
    "%": _mod,
    "==": _eq,
    "!=": lambda a, b: not _eq(a, b),
    "<": lambda a, b: _compare(a, b) < 0,
    "<=": lambda a, b: _compare(a, b) <= 0,
    ">": lambda a, b: _compare(a, b) > 0,
    ">=": lambda a, b: _compare(a, b) >= 0,
    "in": lambda a, b: _contains(b, a),
}

_STRING_METHODS: Final[dict[str, Callable[[str, str], bool]]] = {
    "startsWith": str.startswith,
    "endsWith": str.endswith,
    "contains": str.__contains__,
}

# --- tokenizer ------------------------------------------------------------------------------------

_NUMBER = re.compile(
    r"([0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|\.[0-9]+(?:[eE][+-]?[0-9]+)?)|([0-9]+)"
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORD_CHAR = re.compile(r"[A-Za-z0-9_]")
_PUNCT2 = frozenset({"==", "!=", "<=", ">=", "&&", "||"})
_PUNCT1 = frozenset("<>!-+*/%?:.,[]{}()")
_WHITESPACE = frozenset(" \t\n\r\f")
_ESCAPES: Final = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_KEYWORDS: Final = {"true": True, "false": False, "null": None}
_RESERVED: Final = frozenset(
    {"as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop"}
    | {"package", "namespace", "return", "var", "void", "while", "in"}
)

# A token: (kind, value); kinds "num" (value int or float), "str", "ident", "lit" (true/false/null),
# "op" (punctuation or `in`), "end".
Token = tuple[str, Any]


def _tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    i = 0
    n = len(source)
    while i < n:
        c = source[i]
        if c in _WHITESPACE:
            i += 1
            continue
        if c == "/" and source.startswith("//", i):
            raise _NotInSubset("comment")
        m = _NUMBER.match(source, i)
        if m:
            text = m.group()
            end = m.end()
            if end < n and (_WORD_CHAR.match(source, end) or source[end] in "'\""):
                raise _NotInSubset("uint, hex or malformed number")
            if m.group(1) is not None:
                value: Any = float(text)
                if math.isinf(value):
                    raise _NotInSubset("double literal out of range")
            else:
                value = int(text)
                if value > INT_MAX:
                    raise _NotInSubset("int literal out of range")
            tokens.append(("num", value))
            i = end
            continue
        m = _IDENT.match(source, i)
        if m:
            word = m.group()
            end = m.end()
            if end < n and source[end] in "'\"":
                raise _NotInSubset("raw or bytes string")
            if word in _KEYWORDS:
                tokens.append(("lit", _KEYWORDS[word]))
            elif word == "in":
                tokens.append(("op", "in"))
            elif word in _RESERVED:
                raise _NotInSubset("reserved word")
            else:
                tokens.append(("ident", word))
            i = end
            continue
        if c in "'\"":
            if source.startswith(c * 3, i):
                raise _NotInSubset("triple-quoted string")
            j = i + 1
            parts: list[str] = []
            while True:
                if j >= n:
                    raise _NotInSubset("unterminated string")
                ch = source[j]
                if ch == c:
                    break
                if ch in "\r\n":
                    raise _NotInSubset("newline in string")
                if ch == "\\":
                    esc = _ESCAPES.get(source[j + 1 : j + 2])
                    if esc is None:
                        raise _NotInSubset("escape")
                    parts.append(esc)
                    j += 2
                    continue
                parts.append(ch)
                j += 1
            text = "".join(parts)
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise _NotInSubset("lone surrogate") from None
            tokens.append(("str", text))
            i = j + 1
            continue
        two = source[i : i + 2]
        if two in _PUNCT2:
            tokens.append(("op", two))
            i += 2
            continue
        if c in _PUNCT1:
            tokens.append(("op", c))
            i += 1
            continue
        raise _NotInSubset(f"character {c!r}")
    tokens.append(("end", None))
    return tokens


# --- parser: source -> tree ----------------------------------------------------------------------
#
# Nodes are tuples: ("lit", v), ("ident", name), ("select", x, name), ("has", x, name),
# ("index", x, i), ("list", [x...]), ("map", [(k, v)...]), ("call", name, target, [args]),
# ("not", x), ("neg", x), ("bin", op, l, r), ("and", l, r), ("or", l, r), ("cond", c, t, f).

Node = tuple[Any, ...]
_RELATIONS = frozenset({"==", "!=", "<", "<=", ">", ">=", "in"})
_METHODS = {"size": 0, "startsWith": 1, "endsWith": 1, "contains": 1}


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def is_op(self, *ops: str) -> bool:
        kind, value = self.tokens[self.pos]
        return kind == "op" and value in ops

    def take(self) -> Token:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def expect(self, op: str) -> None:
        if not self.is_op(op):
            raise _NotInSubset(f"expected {op!r}")
        self.pos += 1

    def parse(self) -> Node:
        node = self.expr()
        if self.peek()[0] != "end":
            raise _NotInSubset("trailing input")
        return node

    def expr(self) -> Node:
        cond = self.disjunction()
        if self.is_op("?"):
            self.pos += 1
            then = self.disjunction()
            self.expect(":")
            return ("cond", cond, then, self.expr())
        return cond

    def disjunction(self) -> Node:
        node = self.conjunction()
        while self.is_op("||"):
            self.pos += 1
            node = ("or", node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.relation()
        while self.is_op("&&"):
            self.pos += 1
            node = ("and", node, self.relation())
        return node

    def relation(self) -> Node:
        node = self.addition()
        while self.peek()[0] == "op" and self.peek()[1] in _RELATIONS:
            op = self.take()[1]
            node = ("bin", op, node, self.addition())
        return node

    def addition(self) -> Node:
        node = self.multiplication()
        while self.is_op("+", "-"):
            op = self.take()[1]
            node = ("bin", op, node, self.multiplication())
        return node

    def multiplication(self) -> Node:
        node = self.unary()
        while self.is_op("*", "/", "%"):
            op = self.take()[1]
            node = ("bin", op, node, self.unary())
        return node

    def unary(self) -> Node:
        # CEL: '!'+ member | '-'+ member | member (no mixing: `-!x` does not parse; `!-1` is a literal)
        for op, kind in (("!", "not"), ("-", "neg")):
            if self.is_op(op):
                count = 0
                while self.is_op(op):
                    self.pos += 1
                    count += 1
                node = self.member()
                # cel's parser cancels pairs: `!!x` is `x` itself (no bool check), `--x` is `x`
                return (kind, node) if count % 2 else node
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.is_op("."):
                self.pos += 1
                kind, name = self.take()
                if kind != "ident":
                    raise _NotInSubset("field name")
                if self.is_op("("):
                    args = self.arguments()
                    if _METHODS.get(name) != len(args):
                        raise _NotInSubset(f"method {name}")
                    node = ("call", name, node, args)
                else:
                    node = ("select", node, name)
            elif self.is_op("["):
                self.pos += 1
                index = self.expr()
                self.expect("]")
                node = ("index", node, index)
            else:
                return node

    def arguments(self) -> list[Node]:
        self.expect("(")
        args: list[Node] = []
        if self.is_op(")"):
            self.pos += 1
            return args
        while True:
            args.append(self.expr())
            if self.is_op(")"):
                self.pos += 1
                return args
            self.expect(",")

    def primary(self) -> Node:
        kind, value = self.take()
        if kind in ("num", "str", "lit"):
            return ("lit", value)
        if kind == "ident":
            if not self.is_op("("):
                return ("ident", value)
            args = self.arguments()
            if value == "has" and len(args) == 1 and args[0][0] == "select":
                return ("has", args[0][1], args[0][2])
            if value == "size" and len(args) == 1:
                return ("call", "size", None, args)
            raise _NotInSubset(f"function {value}")
        if kind == "op":
            if value == "-" and self.peek()[0] == "num":  # a negative literal, as in `!-1`
                return ("lit", -self.take()[1])
            if value == "(":
                node = self.expr()
                self.expect(")")
                return node
            if value == "[":
                items: list[Node] = []
                while not self.is_op("]"):
                    items.append(self.expr())
                    if not self.is_op("]"):
                        self.expect(",")
                self.pos += 1
                return ("list", items)
            if value == "{":
                entries: list[tuple[Node, Node]] = []
                while not self.is_op("}"):
                    key = self.expr()
                    self.expect(":")
                    entries.append((key, self.expr()))
                    if not self.is_op("}"):
                        self.expect(",")
                self.pos += 1
                return ("map", entries)
        raise _NotInSubset(f"unexpected {value!r}")


# --- compiler: tree -> closure --------------------------------------------------------------------


def _path(node: Node) -> tuple[str, list[str]] | None:
    """`root.a.b` as ("root", ["a", "b"]), or None if the node is not such a chain."""
    names: list[str] = []
    while node[0] == "select":
        names.append(node[2])
        node = node[1]
    if node[0] != "ident":
        return None
    names.reverse()
    return node[1], names


def _compile_path(root: str, names: list[str]) -> Fn:
    missing = str(_undefined(root))
    if not names:

        def ident(env: Mapping[str, Any]) -> Any:
            try:
                v = env[root]
            except KeyError:
                raise FastCelError(missing) from None
            return _load(v)

        return ident

    if len(names) == 1:
        (name,) = names

        def select1(env: Mapping[str, Any]) -> Any:
            try:
                v = env[root]
            except KeyError:
                raise FastCelError(missing) from None
            if type(v) is dict:
                try:
                    v = v[name]
                except KeyError:
                    raise _no_key(name) from None
                t = type(v)
                if t in _NO_CHECK or (t is int and INT_MIN <= v <= INT_MAX):
                    return v
                return _load(v)
            return _select(_load(v), name)

        return select1

    if len(names) == 2:
        first, second = names

        def select2(env: Mapping[str, Any]) -> Any:
            try:
                v = env[root]
            except KeyError:
                raise FastCelError(missing) from None
            if type(v) is not dict:
                return _select(_load(v), first)
            try:
                v = v[first]
            except KeyError:
                raise _no_key(first) from None
            if type(v) is not dict:
                return _select(_load(v), second)
            try:
                v = v[second]
            except KeyError:
                raise _no_key(second) from None
            t = type(v)
            if t in _NO_CHECK or (t is int and INT_MIN <= v <= INT_MAX):
                return v
            return _load(v)

        return select2

    steps = tuple(names)

    def select(env: Mapping[str, Any]) -> Any:
        try:
            v = env[root]
        except KeyError:
            raise FastCelError(missing) from None
        for name in steps:
            if type(v) is dict:
                try:
                    v = v[name]
                except KeyError:
                    raise _no_key(name) from None
            else:
                return _select(_load(v), name)  # not a map: fails as cel does
        return _load(v)

    return select


def _reached_by(node: Node) -> set[bool]:
    """How cel holds the maps `node` can evaluate to (or index into): True by reference, False not.

    The two differ in one message: a map indexed by a double, null, list or map key fails with
    `No such overload` when the map was reached from a variable by indexing alone (`context[1.5]`,
    `context['e'][1.5]`, `(c ? context : x)[1.5]`), and with `Value of type float cannot be used as
    a map key` otherwise (`context.e[1.5]`, `[context][0][1.5]`). Empty: never a map or list.
    """
    kind = node[0]
    if kind == "ident":
        return {True}
    if kind == "index":
        return _reached_by(node[1])
    if kind == "cond":
        return _reached_by(node[2]) | _reached_by(node[3])
    if kind in ("select", "map", "list") or (kind == "bin" and node[1] == "+"):
        return {False}
    return set()  # literals, logic, comparisons, arithmetic, size(), has(), string methods


def _compile(node: Node) -> Fn:
    kind = node[0]
    if kind == "lit":
        value = node[1]
        return lambda env: value
    if kind in ("ident", "select"):
        path = _path(node)
        if path is not None:
            return _compile_path(*path)
        operand = _compile(node[1])
        name = node[2]
        return lambda env: _select(operand(env), name)
    if kind == "has":
        return _compile_has(_compile(node[1]), node[2])
    if kind == "index":
        reached = _reached_by(node[1])
        if len(reached) > 1:
            raise _NotInSubset("index of a conditional mixing variables and other values")
        return _compile_index(_compile(node[1]), _compile(node[2]), True in reached)
    if kind == "list":
        items = [_compile(item) for item in node[1]]
        return lambda env: [item(env) for item in items]
    if kind == "map":
        return _compile_map([(_compile(k), _compile(v)) for k, v in node[1]])
    if kind == "call":
        return _compile_call(node[1], None if node[2] is None else _compile(node[2]), node[3])
    if kind == "not":
        operand = _compile(node[1])
        return lambda env: _not(operand(env))
    if kind == "neg":
        operand = _compile(node[1])
        return lambda env: _neg(operand(env))
    if kind == "bin":
        return _compile_binary(node[1], _compile(node[2]), _compile(node[3]), node[3])
    if kind == "and":
        return _compile_and(_compile(node[1]), _compile(node[2]))
    if kind == "or":
        return _compile_or(_compile(node[1]), _compile(node[2]))
    if kind == "cond":
        return _compile_cond(_compile(node[1]), _compile(node[2]), _compile(node[3]))
    raise _NotInSubset(kind)  # pragma: no cover


def _compile_index(operand: Fn, index: Fn, borrowed: bool) -> Fn:
    def at(env: Mapping[str, Any]) -> Any:
        a = operand(env)
        if type(a) is not list and type(a) is not dict:
            raise _nso()  # before the index is evaluated: `1[context.zz]` does not report zz
        return _index(a, index(env), borrowed)

    return at


def _compile_has(operand: Fn, name: str) -> Fn:
    def has(env: Mapping[str, Any]) -> bool:
        v = operand(env)
        if type(v) is dict:
            return name in v
        if type(v) is list:
            raise _bad_index(name)
        raise _nso()

    return has


def _compile_map(entries: list[tuple[Fn, Fn]]) -> Fn:
    def build(env: Mapping[str, Any]) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_fn, value_fn in entries:
            k = key_fn(env)
            tk = type(k)
            if tk is bool:
                raise FastCelFallback  # a Python dict would merge `true` with `1`
            if tk is not str and tk is not int:
                raise _bad_key(k)
            out[k] = value_fn(env)
        return out

    return build


def _compile_call(name: str, target: Fn | None, args: list[Node]) -> Fn:
    if name == "size":
        operand = target if target is not None else _compile(args[0])
        return lambda env: _size(operand(env))
    assert target is not None
    receiver = target
    method = _STRING_METHODS[name]
    argument = _compile(args[0])
    undefined = str(_undefined(name))

    def call(env: Mapping[str, Any]) -> bool:
        arg = argument(env)  # cel reports an error in the argument before one in the receiver
        s = receiver(env)
        if type(s) is str and type(arg) is str:
            return method(s, arg)
        raise FastCelError(undefined)

    return call


def _compile_binary(op: str, left: Fn, right: Fn, right_node: Node) -> Fn:
    fn = _BINARY[op]
    if op in _ORDER:
        number = right_node[0] == "lit" and type(right_node[1]) in (int, float)
        return _compile_order(op, left, right, right_node if number else None)
    if op == "==":

        def eq(env: Mapping[str, Any]) -> bool:
            a = left(env)
            b = right(env)
            t = type(a)
            if t is type(b) and (t is str or t is int or t is bool):
                return bool(a == b)
            return _eq(a, b)

        return eq
    if op == "!=":

        def ne(env: Mapping[str, Any]) -> bool:
            a = left(env)
            b = right(env)
            t = type(a)
            if t is type(b) and (t is str or t is int or t is bool):
                return bool(a != b)
            return not _eq(a, b)

        return ne
    return lambda env: fn(left(env), right(env))


_ORDER: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _compile_order(op: str, left: Fn, right: Fn, constant: Node | None) -> Fn:
    """`left op right`, quick when both are ints, strings, bools or non-NaN doubles of one type, or
    when `right` is a number literal (`constant`); `_compare` does everything else."""
    cmp = _ORDER[op]
    slow = _BINARY[op]
    if constant is not None:
        c = constant[1]
        fc = float(c)
        int_constant = type(c) is int

        def order_constant(env: Mapping[str, Any]) -> bool:
            a = left(env)
            t = type(a)
            if t is float:
                if a == a:  # not NaN
                    return cmp(a, fc)
            elif t is int:
                return cmp(a, c) if int_constant else cmp(float(a), c)
            return bool(slow(a, c))

        return order_constant

    def order(env: Mapping[str, Any]) -> bool:
        a = left(env)
        b = right(env)
        t = type(a)
        if t is type(b) and (t is int or t is str or (t is float and a == a and b == b)):
            return cmp(a, b)
        return bool(slow(a, b))

    return order


def _compile_and(left: Fn, right: Fn) -> Fn:
    def and_(env: Mapping[str, Any]) -> bool:
        try:
            a = left(env)
        except FastCelError as err:
            first: FastCelError | None = err
        else:
            if a is False:
                return False
            if a is True:
                b = right(env)
                if type(b) is bool:
                    return bool(b)
                raise _nso()
            first = None
        # The left side failed or is not a bool: only a false right side saves the conjunction.
        b = right(env)  # an error here is the one reported
        if b is False:
            return False
        raise first if first is not None else _nso()

    return and_


def _compile_or(left: Fn, right: Fn) -> Fn:
    def or_(env: Mapping[str, Any]) -> bool:
        try:
            a = left(env)
        except FastCelError as err:
            first: FastCelError | None = err
        else:
            if a is True:
                return True
            if a is False:
                b = right(env)
                if type(b) is bool:
                    return bool(b)
                raise _nso()
            first = None
        b = right(env)
        if b is True:
            return True
        raise first if first is not None else _nso()

    return or_


def _compile_cond(cond: Fn, then: Fn, otherwise: Fn) -> Fn:
    def choose(env: Mapping[str, Any]) -> Any:
        c = cond(env)
        if c is True:
            return then(env)
        if c is False:
            return otherwise(env)
        raise _nso()

    return choose


_MAY_BE_CONTAINER: Final = frozenset({"ident", "select", "index", "list", "map", "cond"})


def compile_fast(source: str) -> Fn | None:
    """A closure evaluating `source` on plain Python values exactly as `cel` does, or None.

    None means the source is outside the supported subset (or is not valid CEL); use `cel` then.
    The closure raises `FastCelError` where cel fails, and `FastCelFallback` for data outside its
    domain (then use `cel`).
    """
    try:
        tree = _Parser(_tokenize(source)).parse()
        body = _compile(tree)
    except (_NotInSubset, RecursionError):
        return None
    if tree[0] not in _MAY_BE_CONTAINER and not (tree[0] == "bin" and tree[1] == "+"):
        return body  # a scalar result needs no copy

    def evaluate(env: Mapping[str, Any]) -> Any:
        result = body(env)
        t = type(result)
        if t is dict or t is list:
            return _export(result)
        return result

    return evaluate
