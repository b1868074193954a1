"""What each CEL operation does to plain values, as `cel` 0.10 does it: the result, or the error text.

Except where cel departs from the CEL specification: there both paths follow the specification
(`improve.machine.celfix` corrects cel): string size in code points, no `-` on bool, `-INT64_MIN`
overflows, a repeated map-literal key fails, a whole double key or index is the int it equals.

The semantics, established by experiment against `cel` 0.10 (see tests/test_fastcel.py); the
operations are here, the order of evaluation (operands, `&&`, `?:`, map literals) is the compiler's:

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
  1)` overflows: `Arithmetic overflow in 'neg' on ...`; cel itself wraps), `-double` negates,
  otherwise (`-true` too; cel itself takes it for `!`) `No such overload`; `!` takes only a bool. `-!x` does not parse; `!-1` does (a negative literal).
- `&&` / `||` are commutative over errors: `false && <error>` and `<error> && false` are false;
  `true || <error>` and `<error> || true` are true; a non-bool operand is `No such overload` unless
  the other side decides. When both sides fail the right side's error is reported; a failing side
  wins over a non-bool one. `a && b && c` groups to the left.
- `c ? x : y`: only the chosen branch is evaluated; a non-bool condition is `No such overload`.
- `in`: over a list by equality; over a map by key (a string or int key looks up, a bool key is never
  found, a whole double looks up the int it equals, any other double, null, list or map key fails:
  `Value of type float cannot be used as a map key.
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
- Map literals evaluate every key first, then fail on a repeated key (`Failed with repeated key 'a' in
  a map literal.`; cel itself keeps the last), then entry by entry check the key's type and evaluate
  the value (the order of celfix's guard on the cel path). A bool key is left to cel (Python would merge `true` with `1`).
- `size(x)` / `x.size()`: a string's length in code points (`size('é')` is 1; cel itself counts
  UTF-8 bytes), a list's or map's
  length; anything else fails as `Undefined variable or function: 'size'. ...`. `startsWith`,
  `endsWith`, `contains` take two strings, otherwise `Undefined variable or function: 'startsWith'.
  ...`; their argument is evaluated (and its error reported) before the receiver.
- `s.matches(p)` is a string method as those three are (the same errors, in the same order); the
  match itself is asked of `cel` on the two strings alone (`regex_matches`): its regular expressions
  are Rust's, which Python's `re` does not reproduce. A pattern cel refuses is left to cel with the
  whole expression.
- Binary operands, list elements and call arguments are evaluated left to right, the first error wins.
- Maps come back from cel in hash order; the fast path keeps insertion order (dicts compare equal and
  snapshots hash with sorted keys, so the order is not observable there).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Final

from improve.errors import FastCelError, FastCelFallback
from improve.machine import cel_library
from improve.machine.fastcel.domain import INT_MAX, INT_MIN, check_key, check_keys, load
from improve.machine.fastcel.messages import (
    bad_index,
    bad_key,
    neg_overflow,
    no_key,
    no_overload,
    overflow,
    undefined,
    unsupported,
)


def equal(a: Any, b: Any) -> bool:
    ta = type(a)
    tb = type(b)
    if ta is tb:
        if ta is list:
            if len(a) != len(b):
                return False
            return all(equal(load(x), load(y)) for x, y in zip(a, b, strict=True))
        if ta is dict:
            if len(a) != len(b):
                return False
            check_keys(b)
            for k, x in a.items():
                check_key(k)
                if k not in b or not equal(load(x), load(b[k])):
                    return False
            return True
        return bool(a == b)  # NaN != NaN, as in cel
    if ta is int and tb is float:
        return bool(float(a) == b)
    if ta is float and tb is int:
        return bool(a == float(b))
    return False


def compare(a: Any, b: Any) -> int:
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
        raise no_overload()  # NaN has no order
    if ta is tb and (ta is str or ta is bool):
        return int(a > b) - int(a < b)
    raise no_overload()


def _add(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is int:
        if tb is int:
            r = a + b
            if INT_MIN <= r <= INT_MAX:
                return r
            raise overflow("add", a, b)
        raise no_overload()
    if ta is float or ta is str:
        if tb is ta:
            return a + b
    elif ta is list:
        if tb is list:
            return a + b
        if tb is dict:
            raise FastCelFallback  # cel appends the map's keys, in hash order
        raise no_overload()
    raise unsupported(a, "+", b)


def _sub(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is int:
        if tb is int:
            r = a - b
            if INT_MIN <= r <= INT_MAX:
                return r
            raise overflow("sub", a, b)
        raise no_overload()
    if ta is float and tb is float:
        return a - b
    raise unsupported(a, "-", b)


def _mul(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is int:
        if tb is int:
            r = a * b
            if INT_MIN <= r <= INT_MAX:
                return r
            raise overflow("mul", a, b)
        raise no_overload()
    if ta is float and tb is float:
        return a * b
    raise unsupported(a, "*", b)


def _div(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is int:
        if tb is int:
            if b == 0:
                raise FastCelError("division by zero in CEL expression")
            if a == INT_MIN and b == -1:
                raise overflow("div", a, b)
            q = abs(a) // abs(b)
            return -q if (a < 0) != (b < 0) else q
        raise no_overload()
    if ta is float and tb is float:
        if b != 0.0:
            return a / b
        if a != a or a == 0.0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    raise unsupported(a, "/", b)


def _mod(a: Any, b: Any) -> Any:
    if type(a) is int:
        if type(b) is int:
            if b == 0:
                raise FastCelError("modulo by zero in CEL expression")
            if a == INT_MIN and b == -1:
                raise overflow("rem", a, b)
            r = abs(a) % abs(b)
            return -r if a < 0 else r
        raise no_overload()
    raise unsupported(a, "%", b)


def integral_key(k: float) -> int | None:
    """A double used as a map key or list index: the int it equals (CEL compares numeric keys by
    value, `{1: 'a'}[1.0]` is 'a'), or None when it is not a whole number in the int64 range."""
    if k.is_integer() and INT_MIN <= k <= INT_MAX:
        return int(k)
    return None


def _lookup(m: dict[Any, Any], k: Any, borrowed: bool = False) -> Any:
    tk = type(k)
    if tk is str:
        try:
            return m[k]
        except KeyError:
            raise no_key(k) from None
    if tk is float and (whole := integral_key(k)) is not None:
        k, tk = whole, int
    if tk is int:
        check_keys(m)  # so that 1 cannot find a key True or 1.0
        try:
            return m[k]
        except KeyError:
            raise no_key(str(k)) from None
    if tk is bool:
        raise no_key("true" if k else "false")
    raise no_overload() if borrowed else bad_key(k)


def index_into(a: Any, k: Any, borrowed: bool) -> Any:
    ta = type(a)
    if ta is list:
        if type(k) is float and (whole := integral_key(k)) is not None:
            k = whole  # a whole double indexes as the int it equals
        if type(k) is int:
            if 0 <= k < len(a):
                return load(a[k])
            raise FastCelError(f"index out of bounds: {k}")
        raise bad_index(k)
    if ta is dict:
        return load(_lookup(a, k, borrowed))
    raise no_overload()


def select_field(a: Any, name: str) -> Any:
    ta = type(a)
    if ta is dict:
        try:
            return load(a[name])
        except KeyError:
            raise no_key(name) from None
    if ta is list:
        raise bad_index(name)
    raise no_overload()


def _contains(container: Any, k: Any) -> bool:
    tc = type(container)
    if tc is list:
        return any(equal(k, load(x)) for x in container)
    if tc is dict:
        tk = type(k)
        if tk is str:
            return k in container
        if tk is float and (whole := integral_key(k)) is not None:
            k, tk = whole, int
        if tk is int:
            check_keys(container)
            return k in container
        if tk is bool:
            return False
        raise bad_key(k)
    raise no_overload()


def size_of(a: Any) -> int:
    ta = type(a)
    if ta is str:
        return len(a)  # code points, as the specification says (cel counts UTF-8 bytes)
    if ta is list or ta is dict:
        return len(a)
    raise undefined("size")


def negate(a: Any) -> Any:
    ta = type(a)
    if ta is int:
        if a == INT_MIN:
            raise neg_overflow(a)  # cel wraps around; the specification makes it an error
        return -a
    if ta is float:
        return -a
    raise no_overload()  # `-true` too: cel takes it for `!true`, the specification has no such overload


def logical_not(a: Any) -> bool:
    if type(a) is bool:
        return not a
    raise no_overload()


@functools.cache
def _matches_program() -> Any:
    return cel_library.cel().compile("s.matches(p)")  # imported here: only a `matches` pays for it


@functools.lru_cache(maxsize=4096)
def regex_matches(s: str, pattern: str) -> bool:
    """`s.matches(pattern)` as `cel` answers it, converting two strings rather than the whole scope (a
    guard's `facts` can be large); raises `FastCelFallback` where cel fails. A pure function of its two
    strings, so the answers are kept (bounded): guards ask the same few patterns of the same texts."""
    ctx = cel_library.cel().Context()
    try:
        ctx.add_variable("s", s)
        ctx.add_variable("p", pattern)
        result = _matches_program().execute(ctx)
    except Exception:  # an invalid pattern, a string cel cannot hold: cel reads the whole expression
        raise FastCelFallback from None
    if type(result) is not bool:  # pragma: no cover - cel's matches answers a bool or fails
        raise FastCelFallback
    return result


BINARY: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+": _add,
    "-": _sub,
    "*": _mul,
    "/": _div,
    "%": _mod,
    "==": equal,
    "!=": lambda a, b: not equal(a, b),
    "<": lambda a, b: compare(a, b) < 0,
    "<=": lambda a, b: compare(a, b) <= 0,
    ">": lambda a, b: compare(a, b) > 0,
    ">=": lambda a, b: compare(a, b) >= 0,
    "in": lambda a, b: _contains(b, a),
}

STRING_METHODS: Final[dict[str, Callable[[str, str], bool]]] = {
    "startsWith": str.startswith,
    "endsWith": str.endswith,
    "contains": str.__contains__,
    "matches": regex_matches,
}
