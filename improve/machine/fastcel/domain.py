"""The fast path's domain: which Python values it evaluates on, and the copies it returns.

The data must be what JSON decodes to: dicts with string (or int) keys, lists, str, int in
the signed 64-bit range, float, bool, None. Every value the expression reads is checked
(`load`), containers are checked element by element when compared or returned, and anything else
(a tuple, an int beyond 64 bits, a bool or float key, a string with a lone surrogate, a subclass)
raises `FastCelFallback`. Values the expression never reads are not inspected: `cel` converts a
whole root up front and fails on any unconvertible value in it, the fast path does not notice one it
never touches. Results that are lists or maps are returned as fresh copies, as `cel` returns them.
"""

from __future__ import annotations

from typing import Any, Final

from improve.errors import FastCelFallback

INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**63 - 1

_NoneType: Final = type(None)
_PLAIN: Final = frozenset({int, float, str, bool, _NoneType, list, dict})
NO_CHECK: Final = frozenset({float, bool, _NoneType, list, dict})  # in the domain as they are


def _check_str(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: cel cannot convert it
        raise FastCelFallback from None


def load(v: Any) -> Any:
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


def check_key(k: Any) -> None:
    t = type(k)
    if t is str:
        if not k.isascii():
            _check_str(k)
    elif t is not int or not INT_MIN <= k <= INT_MAX:
        raise FastCelFallback  # cel turns a bool key into an int and rejects float or None keys


def check_keys(m: dict[Any, Any]) -> None:
    for k in m:
        check_key(k)


def export(v: Any) -> Any:
    """A result: a fresh, checked copy of a list or map, as cel returns it."""
    t = type(v)
    if t is dict:
        out = {}
        for k, x in v.items():
            if type(k) is not str or not k.isascii():
                check_key(k)
            # `_export_item`, its commonest leaves inline: a map copied into the context (a tool's output)
            # is mostly strings and numbers, and a call per member was a third of copying it.
            tx = type(x)
            if tx is str:
                if not x.isascii():
                    _check_str(x)
                out[k] = x
            elif tx is float or tx is bool or tx is _NoneType or (tx is int and INT_MIN <= x <= INT_MAX):
                out[k] = x
            else:
                out[k] = export(x)
        return out
    if t is list:
        return [_export_item(x) for x in v]
    return load(v)


def _export_item(x: Any) -> Any:
    """`export` of a member: the common leaves (ASCII strings, floats, bools, None) kept without a
    call of `load` each, which was most of the cost of copying a tool's output into the context."""
    t = type(x)
    if t is str:
        if not x.isascii():
            _check_str(x)
        return x
    if t is float or t is bool or t is _NoneType:
        return x
    return export(x)
