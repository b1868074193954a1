"""A tree to a closure over the root variables; `compile_fast`, the fast path's entry point.

The closures do what `semantics` says; the common cases (a field path, `==` on two strings, an order
against a number literal) are inlined here, since each call saved is a fraction of a microsecond on
every guard of every step.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, Final

from improve.errors import FastCelError, FastCelFallback
from improve.machine.fastcel.domain import INT_MAX, INT_MIN, NO_CHECK, export, load
from improve.machine.fastcel.messages import (
    bad_index,
    bad_key,
    no_key,
    no_overload,
    repeated_key,
    undefined,
)
from improve.machine.fastcel.semantics import (
    BINARY,
    STRING_METHODS,
    equal,
    index_into,
    logical_not,
    negate,
    select_field,
    size_of,
)
from improve.machine.fastcel.syntax import Node, NotInSubset, parse

Fn = Callable[[Mapping[str, Any]], Any]
"""A compiled expression: the mapping of root variables (`context`, `event`, ...) to the result."""


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
    missing = str(undefined(root))
    if not names:

        def ident(env: Mapping[str, Any]) -> Any:
            try:
                v = env[root]
            except KeyError:
                raise FastCelError(missing) from None
            return load(v)

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
                    raise no_key(name) from None
                t = type(v)
                if t in NO_CHECK or (t is int and INT_MIN <= v <= INT_MAX):
                    return v
                return load(v)
            return select_field(load(v), name)

        return select1

    if len(names) == 2:
        first, second = names

        def select2(env: Mapping[str, Any]) -> Any:
            try:
                v = env[root]
            except KeyError:
                raise FastCelError(missing) from None
            if type(v) is not dict:
                return select_field(load(v), first)
            try:
                v = v[first]
            except KeyError:
                raise no_key(first) from None
            if type(v) is not dict:
                return select_field(load(v), second)
            try:
                v = v[second]
            except KeyError:
                raise no_key(second) from None
            t = type(v)
            if t in NO_CHECK or (t is int and INT_MIN <= v <= INT_MAX):
                return v
            return load(v)

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
                    raise no_key(name) from None
            else:
                return select_field(load(v), name)  # not a map: fails as cel does
        return load(v)

    return select


def _exported_path(root: str, names: list[str]) -> Fn:
    """`root.a` or `root.a.b` as a whole expression: `_compile_path`'s reading, a list or map read copied
    (`export`) in the same closure rather than by a wrapper around it (the commonest expressions of all:
    every guard and assign that reads a field)."""
    missing = str(undefined(root))
    first = names[0]
    second = names[1] if len(names) == 2 else None

    def select_exported(env: Mapping[str, Any]) -> Any:
        try:
            v = env[root]
        except KeyError:
            raise FastCelError(missing) from None
        if type(v) is not dict:
            result = select_field(load(v), first)
        else:
            try:
                v = v[first]
            except KeyError:
                raise no_key(first) from None
            if second is None:
                result = v
            elif type(v) is not dict:
                result = select_field(load(v), second)
            else:
                try:
                    result = v[second]
                except KeyError:
                    raise no_key(second) from None
            t = type(result)
            if t is dict or t is list:
                return export(result)
            if t in NO_CHECK or (t is int and INT_MIN <= result <= INT_MAX):
                return result
            return load(result)
        t = type(result)
        if t is dict or t is list:
            return export(result)
        return result

    return select_exported


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
        return lambda env: select_field(operand(env), name)
    if kind == "has":
        return _compile_has(_compile(node[1]), node[2])
    if kind == "index":
        reached = _reached_by(node[1])
        if len(reached) > 1:
            raise NotInSubset("index of a conditional mixing variables and other values")
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
        return lambda env: logical_not(operand(env))
    if kind == "neg":
        operand = _compile(node[1])
        return lambda env: negate(operand(env))
    if kind == "bin":
        return _compile_binary(node[1], _compile(node[2]), _compile(node[3]), node[3])
    if kind == "and":
        return _compile_and(_compile(node[1]), _compile(node[2]))
    if kind == "or":
        return _compile_or(_compile(node[1]), _compile(node[2]))
    if kind == "cond":
        return _compile_cond(_compile(node[1]), _compile(node[2]), _compile(node[3]))
    raise NotInSubset(kind)  # pragma: no cover


def _compile_index(operand: Fn, index: Fn, borrowed: bool) -> Fn:
    def at(env: Mapping[str, Any]) -> Any:
        a = operand(env)
        if type(a) is not list and type(a) is not dict:
            raise no_overload()  # before the index is evaluated: `1[context.zz]` does not report zz
        return index_into(a, index(env), borrowed)

    return at


def _compile_has(operand: Fn, name: str) -> Fn:
    def has(env: Mapping[str, Any]) -> bool:
        v = operand(env)
        if type(v) is dict:
            return name in v
        if type(v) is list:
            raise bad_index(name)
        raise no_overload()

    return has


def _compile_map(entries: list[tuple[Fn, Fn]]) -> Fn:
    # The keys first, then a repeated key is an error (the specification; cel keeps the last one),
    # then entry by entry the key's type and the value: the order of the cel path's guard
    # (`celfix`: `_improve_keys([k1, ...]) ? {k1: v1, ...} : {}`), so that both report the same error.
    def build(env: Mapping[str, Any]) -> dict[Any, Any]:
        keys = [key_fn(env) for key_fn, _ in entries]
        if len(keys) > 1:
            seen: set[Any] = set()
            for k in keys:
                tk = type(k)
                if tk is str or tk is int:
                    if k in seen:
                        raise repeated_key(k)
                    seen.add(k)
        out: dict[Any, Any] = {}
        for k, (_, value_fn) in zip(keys, entries, strict=True):
            tk = type(k)
            if tk is bool:
                raise FastCelFallback  # a Python dict would merge `true` with `1`
            if tk is not str and tk is not int:
                raise bad_key(k)
            out[k] = value_fn(env)
        return out

    return build


def _compile_call(name: str, target: Fn | None, args: list[Node]) -> Fn:
    if name == "size":
        operand = target if target is not None else _compile(args[0])
        return lambda env: size_of(operand(env))
    assert target is not None
    receiver = target
    method = STRING_METHODS[name]
    argument = _compile(args[0])
    message = str(undefined(name))

    def call(env: Mapping[str, Any]) -> bool:
        arg = argument(env)  # cel reports an error in the argument before one in the receiver
        s = receiver(env)
        if type(s) is str and type(arg) is str:
            return method(s, arg)
        raise FastCelError(message)

    return call


def _compile_binary(op: str, left: Fn, right: Fn, right_node: Node) -> Fn:
    fn = BINARY[op]
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
            return equal(a, b)

        return eq
    if op == "!=":

        def ne(env: Mapping[str, Any]) -> bool:
            a = left(env)
            b = right(env)
            t = type(a)
            if t is type(b) and (t is str or t is int or t is bool):
                return bool(a != b)
            return not equal(a, b)

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
    when `right` is a number literal (`constant`); `compare` does everything else."""
    cmp = _ORDER[op]
    slow = BINARY[op]
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
                raise no_overload()
            first = None
        # The left side failed or is not a bool: only a false right side saves the conjunction.
        b = right(env)  # an error here is the one reported
        if b is False:
            return False
        raise first if first is not None else no_overload()

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
                raise no_overload()
            first = None
        b = right(env)
        if b is True:
            return True
        raise first if first is not None else no_overload()

    return or_


def _compile_cond(cond: Fn, then: Fn, otherwise: Fn) -> Fn:
    def choose(env: Mapping[str, Any]) -> Any:
        c = cond(env)
        if c is True:
            return then(env)
        if c is False:
            return otherwise(env)
        raise no_overload()

    return choose


_MAY_BE_CONTAINER: Final = frozenset({"ident", "select", "index", "list", "map", "cond"})


def compile_fast(source: str) -> Fn | None:
    """A closure evaluating `source` on plain Python values exactly as `cel` does, or None.

    None means the source is outside the supported subset (or is not valid CEL); use `cel` then.
    The closure raises `FastCelError` where cel fails, and `FastCelFallback` for data outside its
    domain (then use `cel`).
    """
    try:
        tree = parse(source)
        body = _compile(tree)
    except (NotInSubset, RecursionError):
        return None
    if tree[0] not in _MAY_BE_CONTAINER and not (tree[0] == "bin" and tree[1] == "+"):
        return body  # a scalar result needs no copy
    path = _path(tree)
    if path is not None and len(path[1]) in (1, 2):
        return _exported_path(*path)

    def evaluate(env: Mapping[str, Any]) -> Any:
        result = body(env)
        t = type(result)
        if t is dict or t is list:
            return export(result)
        return result

    return evaluate
