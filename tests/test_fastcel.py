"""The CEL fast path agrees with the `cel` module: differentially on random expressions and data, on a
table of tricky cases, on every expression of the shipped machines and policies, and by giving up
(None, or a fallback to cel) rather than answering wrongly."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import struct
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import cel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from improve.errors import EvaluationError
from improve.machine import celfix, compile_expr, compile_machine, parse_machine
from improve.machine.config import DECIDE_SRC
from improve.machine.expr import Scope, cel_error_detail, compile_cel
from improve.machine.fastcel import INT_MAX, INT_MIN, FastCelError, FastCelFallback, compile_fast
from tests.helpers import examples

REPO = Path(__file__).resolve().parents[1]

Outcome = tuple[str, Any]


def cel_outcome(src: str, data: Mapping[str, Any]) -> Outcome:
    """What the `cel` path gives (`cel` with improve's corrections, `celfix`), with the error detail
    formatted as `Expr.evaluate` formats it."""
    try:
        program = compile_cel(src)
        ctx = cel.Context()
        celfix.register(ctx)
        ctx.update(dict(data))
        return ("ok", program.execute(ctx))
    except Exception as err:
        return ("error", cel_error_detail(err))


def fast_outcome(fn: Callable[[Mapping[str, Any]], Any], data: Mapping[str, Any]) -> Outcome:
    try:
        return ("ok", fn(data))
    except FastCelError as err:
        return ("error", str(err))
    except FastCelFallback:
        return ("fallback", None)


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types all the way down (an int is not a float or a bool; -0.0 is not
    0.0; NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(
            type(k) is type(next(j for j in b if j == k)) and same(a[k], b[k]) for k in a
        )
    return bool(a == b)


def agree(src: str, data: Mapping[str, Any]) -> tuple[Outcome, Outcome]:
    fn = compile_fast(src)
    assert fn is not None, f"`{src}` is not covered by the fast path"
    want = cel_outcome(src, data)
    got = fast_outcome(fn, data)
    if got[0] != "fallback":
        assert got[0] == want[0], f"`{src}` on {data!r}: cel {want!r}, fast {got!r}"
        if want[0] == "ok":
            assert same(got[1], want[1]), f"`{src}` on {data!r}: cel {want!r}, fast {got!r}"
        else:
            assert got[1] == want[1], f"`{src}` on {data!r}: messages differ\ncel  {want[1]}\nfast {got[1]}"
    return want, got


# --- 1. differential property test -------------------------------------------------------------
#
# Data: `context` (and usually `event`) hold fields of known types (so that well-typed expressions
# get past the type checks and exercise the arithmetic and comparisons) and random extra fields of
# random JSON-like values, nested. Expressions come from two generators: `expressions()` composes the
# whole subset grammar at random (mostly ill-typed: error parity), `typed()` builds mostly well-typed
# expressions (value parity).

ALPHABET = ["a", "b", "é", "😀", " ", "\n", "'", '"', "\\", "A"]
EXTRA_FIELDS = ["a", "b", "x", "zz"]
SPECIAL_INTS = [INT_MAX, INT_MIN, 2**62, -(2**62), 9007199254740993, 0, 1, -1]
SPECIAL_FLOATS = [0.0, -0.0, 0.5, 1.5, 2.5, -3.0, 10.0, 9007199254740992.0, 2.0**63, math.nan, math.inf]


class DataGen:
    """Random JSON-like data, drawn from one `random.Random` (hypothesis's `st.randoms()`): far cheaper
    per example than composing hypothesis strategies, which matters at thousands of examples."""

    def __init__(self, rnd: random.Random) -> None:
        self.r = rnd

    def int(self) -> int:
        k = self.r.random()
        if k < 0.6:
            return self.r.randint(-20, 20)
        if k < 0.8:
            return self.r.choice(SPECIAL_INTS)
        return self.r.randint(INT_MIN, INT_MAX)

    def float(self) -> float:
        k = self.r.random()
        if k < 0.3:
            return self.r.choice(SPECIAL_FLOATS)
        if k < 0.8:
            return round(self.r.uniform(-100, 100), self.r.randint(0, 3))
        return float(struct.unpack("<d", self.r.randbytes(8))[0])  # any double: NaN, inf, subnormal...

    def text(self) -> str:
        return "".join(self.r.choice(ALPHABET) for _ in range(self.r.randint(0, 4)))

    def scalar(self) -> Any:
        return self.r.choice([self.int, self.float, self.text, lambda: self.r.random() < 0.5, lambda: None])()

    def value(self, depth: int = 2) -> Any:
        k = self.r.random()
        if depth <= 0 or k < 0.6:
            return self.scalar()
        if k < 0.8:
            return [self.value(depth - 1) for _ in range(self.r.randint(0, 3))]
        keys = [*EXTRA_FIELDS, 0, 1, 2]
        return {self.r.choice(keys): self.value(depth - 1) for _ in range(self.r.randint(0, 3))}

    def record(self) -> dict[str, Any]:
        """The typed fields `typed()` reads (usually all present), and a few random ones."""
        full = self.r.random() < 0.8
        fields: dict[str, Callable[[], Any]] = {
            "i": self.int,
            "j": self.int,
            "f": self.float,
            "g": self.float,
            "s": self.text,
            "t": lambda: self.r.random() < 0.5,
            "n": lambda: None,
            "li": lambda: [self.int() for _ in range(self.r.randint(0, 3))],
            "lf": lambda: [self.float() for _ in range(self.r.randint(0, 3))],
            "ls": lambda: [self.text() for _ in range(self.r.randint(0, 3))],
            "m": lambda: {
                k: self.r.choice([self.int, self.float])() for k in self.r.sample(["i", "f", "s", "x"], 2)
            },
            "o": lambda: (
                {"i": self.int(), "f": self.float(), "s": self.text()}
                | ({"m": {"i": self.int(), "s": self.text()}} if self.r.random() < 0.5 else {})
            ),
        }
        out = {name: make() for name, make in fields.items() if full or self.r.random() < 0.5}
        for name in EXTRA_FIELDS:
            if self.r.random() < 0.3:
                out[name] = self.value()
        return out

    def roots(self) -> dict[str, Any]:
        data: dict[str, Any] = {"context": self.record()}
        if self.r.random() < 0.85:
            data["event"] = self.record() if self.r.random() < 0.8 else self.value()
        if self.r.random() < 0.2:
            data["input"] = self.value()
        return data


FIELDS = ["i", "j", "f", "g", "s", "t", "n", "li", "lf", "ls", "m", "o", *EXTRA_FIELDS]
roots = st.randoms(use_true_random=True).map(lambda rnd: DataGen(rnd).roots())

INT_LITERALS = ["0", "1", "2", "3", "7", "10", "100", "9223372036854775807", "4611686018427387904", "007"]
DOUBLE_LITERALS = ["0.0", "0.5", "1.5", "2.5", "100.0", "1e3", ".5", "1e308", "9007199254740992.0", "1E-3"]
ESCAPES = {"\n": "\\n", "\\": "\\\\", "\t": "\\t"}
BINARY = ["+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "in", "&&", "||"]
TYPED_ATOMS = {
    "int": [
        "context.i",
        "context.j",
        "event.i",
        "context.o.i",
        "context.li[0]",
        "context.m.i",
        *INT_LITERALS,
    ],
    "double": ["context.f", "context.g", "event.f", "context.o.f", "context.lf[0]", *DOUBLE_LITERALS],
    "string": ["context.s", "event.s", "context.o.s", "context.ls[0]", "'a'", "''", "'é'", '"b"'],
    "bool": ["context.t", "event.t", "true", "false", "has(context.o.m)", "has(event.zz)"],
    "list": ["context.li", "context.lf", "context.ls", "event.li", "[]"],
    "map": ["context.m", "context.o", "event.m", "context.o.m", "{}"],
    "null": ["context.n", "null"],
}
TYPES = list(TYPED_ATOMS)
T = TypeVar("T")


class ExprGen:
    """Expressions of the subset, built from a tape of choice bytes drawn by hypothesis.

    One `st.binary()` draw per expression keeps generation cheap (composing a strategy per node costs
    milliseconds per example), and hypothesis still shrinks the tape: shorter and smaller bytes give
    smaller expressions (an exhausted tape reads as zeros, which choose leaves).
    """

    def __init__(self, tape: bytes) -> None:
        self.tape = tape
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.tape):
            return 0
        self.pos += 1
        return self.tape[self.pos - 1]

    def pick(self, options: Sequence[T]) -> T:
        return options[self.byte() % len(options)]

    def string_literal(self) -> str:
        text = "".join(self.pick([*ALPHABET, "\t"]) for _ in range(self.byte() % 4))
        quote = self.pick(["'", '"'])
        body = "".join(ESCAPES.get(c, "\\" + c if c == quote else c) for c in text)
        return f"{quote}{body}{quote}"

    def atom(self) -> str:
        kind = self.pick(["path", "path", "path", "int", "double", "string", "word"])
        if kind == "path":
            root = self.pick(["context", "context", "event", "input"])
            return ".".join([root, *(self.pick(FIELDS) for _ in range(self.byte() % 4))])
        if kind == "int":
            return self.pick(INT_LITERALS)
        if kind == "double":
            return self.pick(DOUBLE_LITERALS)
        if kind == "string":
            return self.string_literal()
        return self.pick(["true", "false", "null"])

    def any(self, depth: int = 3) -> str:
        """Any expression of the subset grammar, types at random (mostly ill-typed: error parity)."""
        if depth <= 0 or self.byte() % 4 == 0:
            return self.atom()

        def sub() -> str:
            return self.any(depth - 1)

        def operand() -> str:
            text = sub()
            return f"({text})" if self.byte() % 2 else text

        def member() -> str:  # something `.f`, `[i]` or `.size()` can follow
            text = sub()
            plain = text.replace("_", "").replace(".", "").isalnum() and not text[0].isdigit()
            return text if plain else f"({text})"

        kind = self.pick(
            ["binary"] * 6 + ["unary", "cond", "index", "select", "has", "size", "method", "list", "map"]
        )
        if kind == "binary":
            left = operand()
            return f"{left} {self.pick(BINARY)} {operand()}"
        if kind == "unary":
            return self.pick(["!", "-", "!!", "--"]) + operand()
        if kind == "cond":
            return f"{operand()} ? {operand()} : {operand()}"
        if kind == "index":
            return f"{member()}[{sub()}]"
        if kind == "select":
            return f"{member()}.{self.pick(FIELDS)}"
        if kind == "has":
            return f"has({member()}.{self.pick(FIELDS)})"
        if kind == "size":
            return f"size({sub()})" if self.byte() % 2 else f"{member()}.size()"
        if kind == "method":
            return f"{member()}.{self.pick(['startsWith', 'endsWith', 'contains', 'matches'])}({sub()})"
        if kind == "list":
            return "[" + ", ".join(sub() for _ in range(self.byte() % 4)) + "]"
        keys = [self.pick([self.string_literal, self.atom, sub])() for _ in range(self.byte() % 4)]
        return "{" + ", ".join(f"{k}: {sub()}" for k in keys) + "}"

    def typed(self, kind: str, depth: int = 3) -> str:
        """A mostly well-typed expression of `kind` (a key of TYPED_ATOMS): value parity."""
        if depth <= 0 or self.byte() % 4 == 0:
            return self.pick(TYPED_ATOMS[kind])

        def sub(k: str) -> str:
            return "(" + self.typed(k, depth - 1) + ")"

        choice = self.byte() % 10
        if choice == 0:
            return f"{sub('bool')} ? {sub(kind)} : {sub(kind)}"
        if kind in ("int", "double"):
            if choice <= 5:
                ops = ["+", "-", "*", "/", "%"] if kind == "int" else ["+", "-", "*", "/"]
                left = sub(kind)
                return f"{left} {self.pick(ops)} {sub(kind)}"
            if choice <= 7:
                return f"-{sub(kind)}"
            if kind == "int":
                return f"size({sub(self.pick(['string', 'list', 'map']))})"
            return f"[{sub(kind)}, {sub(kind)}][{self.pick(['0', '1'])}]"
        if kind == "string":
            if choice <= 6:
                return f"{sub('string')} + {sub('string')}"
            return f"{sub('map')}[{sub('string')}]"
        if kind == "bool":
            if choice <= 4:
                pairs = [("int", "int"), ("int", "double"), ("double", "int"), ("double", "double")]
                pairs += [("string", "string"), ("bool", "bool")]
                left_kind, right_kind = (
                    self.pick(pairs) if self.byte() % 4 else (self.pick(TYPES), self.pick(TYPES))
                )
                left = sub(left_kind)
                return f"{left} {self.pick(['==', '!=', '<', '<=', '>', '>='])} {sub(right_kind)}"
            if choice == 5:
                left = sub("bool")
                return f"{left} {self.pick(['&&', '||'])} {sub('bool')}"
            if choice == 6:
                return f"!{sub('bool')}"
            if choice == 7:
                left = sub(self.pick(TYPES))
                return f"{left} in {sub(self.pick(['list', 'map']))}"
            if choice == 8:
                left = sub("string")
                return (
                    f"{left}.{self.pick(['startsWith', 'endsWith', 'contains', 'matches'])}({sub('string')})"
                )
            return f"has({sub('map')}.{self.pick(['i', 'f', 's', 'm', 'x'])})"
        if kind == "list":
            if choice <= 5:
                return f"{sub('list')} + {sub('list')}"
            return (
                "[" + ", ".join(self.typed(self.pick(TYPES), depth - 1) for _ in range(self.byte() % 4)) + "]"
            )
        if kind == "map":
            keys = [self.pick(["'i'", "'s'", "'x'", "1", "2"]) for _ in range(self.byte() % 4)]
            return "{" + ", ".join(f"{k}: {self.typed(self.pick(TYPES), depth - 1)}" for k in keys) + "}"
        return self.pick(TYPED_ATOMS[kind])

    def expression(self) -> str:
        return self.any() if self.byte() % 2 else self.typed(self.pick(TYPES))


any_expression = st.binary(min_size=4, max_size=96).map(lambda tape: ExprGen(tape).expression())

# A deeper run: FASTCEL_EXAMPLES=200000 pytest tests/test_fastcel.py -k differential -s
EXAMPLES_RUN = int(os.environ.get("FASTCEL_EXAMPLES", examples(2000)))


@pytest.mark.slow
def test_differential_against_cel() -> None:
    stats: Counter[str] = Counter()

    @settings(
        max_examples=EXAMPLES_RUN,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(src=any_expression, data=roots)
    def check(src: str, data: dict[str, Any]) -> None:
        stats["cases"] += 1
        try:
            cel.compile(src)
        except Exception:
            stats["not CEL"] += 1
            assert compile_fast(src) is None, f"`{src}` does not parse in cel but the fast path took it"
            return
        if compile_fast(src) is None:  # only an index of a conditional mixing variables and values
            stats["outside subset"] += 1
            return
        want, got = agree(src, data)
        stats["fallback" if got[0] == "fallback" else f"cel {want[0]}"] += 1

    check()
    print(f"\ndifferential: {dict(stats)}")
    assert stats["cases"] >= EXAMPLES_RUN // 2
    # both outcomes well exercised
    assert stats["cel ok"] >= stats["cases"] // 6 and stats["cel error"] >= stats["cases"] // 6
    assert stats["fallback"] + stats["outside subset"] <= stats["cases"] // 50


# --- hand-picked cases --------------------------------------------------------------------------

DATA: dict[str, Any] = {
    "context": {
        "a": 1,
        "b": 2.5,
        "s": "hi",
        "u": "héllo",
        "t": True,
        "n": None,
        "l": [1, 2],
        "m": {"x": 1, "y": [1.0, {"z": None}]},
        "im": {1: "one", 2: "two"},
        "nan": math.nan,
        "big": INT_MAX,
        "small": INT_MIN,
        "order": {"refundable": 120.0, "deliveredDaysAgo": 12, "customerId": "c1"},
    },
    "event": {"amount": 40.0, "type": "REFUND"},
}

ERROR = object()  # the case must fail, with cel's message

TABLE: list[tuple[str, Any]] = [
    # literals
    ("1", 1),
    ("1.5", 1.5),
    ("1e3", 1000.0),
    (".5", 0.5),
    ("007", 7),
    ("'it\\'s'", "it's"),
    ('"a\\"b\\n\\t\\r\\\\"', 'a"b\n\t\r\\'),
    ("-9223372036854775807 - 1", INT_MIN),
    # variables and selection
    ("context.a", 1),
    ("context.zz", ERROR),  # no such key 'zz'
    ("input.x", ERROR),  # undeclared variable
    ("context.a.b", ERROR),  # select on an int
    ("context.l.b", ERROR),  # select on a list: "Unexpected type: got 'string'"
    ("context.n.x", ERROR),
    ("context.m.y[1].z", None),
    ("context.order.refundable", 120.0),
    # has()
    ("has(context.m.x)", True),
    ("has(context.m.q)", False),
    ("has(context.zz.x)", ERROR),
    ("has(context.a.x)", ERROR),
    ("has(context.l.x)", ERROR),
    ("has(event.amount) ? event.amount : 0.0", 40.0),
    # indexing
    ("context.l[0]", 1),
    ("context.l[2]", ERROR),
    ("context.l[-1]", ERROR),
    ("context.l[0.0]", 1),  # a whole double indexes as the int it equals (the specification)
    ("context.l[true]", ERROR),
    ("context.m['x']", 1),
    ("context.m['q']", ERROR),
    ("context.m[1]", ERROR),
    ("context.im[1]", "one"),
    ("context.im[true]", ERROR),
    ("context.m[1.0]", ERROR),
    ("context.m[null]", ERROR),
    ("context[1.5]", ERROR),  # a variable indexed directly: No such overload, not the map key message
    ("context['m'][null]", ERROR),
    ("(true ? context : 1)[[]]", ERROR),
    ("[context][0][1.5]", ERROR),
    ("context.s[0]", ERROR),
    ("context.a[context.zz]", ERROR),  # No such overload: the index is not evaluated
    ("context.l[context.zz]", ERROR),  # no such key 'zz'
    ("{1: 'a'}[1]", "a"),
    ("{'a': 1}.a", 1),
    # equality
    ("100 == 100.0", True),
    ("1 == true", False),
    ("true == 1", False),
    ("1 == '1'", False),
    ("null == null", True),
    ("null == 0", False),
    ("null != 0", True),
    ("[1, 2] == [1, 2.0]", True),
    ("[1] == [true]", False),
    ("{'a': 1} == {'a': 1.0}", True),
    ("{1: 1} == {'1': 1}", False),
    ("{'a': 1, 'b': 2} == {'b': 2, 'a': 1}", True),
    ("context.nan == context.nan", False),
    ("context.nan != context.nan", True),
    ("[context.nan] == [context.nan]", False),
    ("context.m == context.m", True),
    ("9007199254740993 == 9007199254740992.0", True),
    ("[] == {}", False),
    # ordering
    ("1.5 > 100", False),
    ("1 < 2.5", True),
    ("'a' < 'b'", True),
    ("'B' < 'a'", True),
    ("'z' < 'é'", True),
    ("false < true", True),
    ("1 < true", ERROR),
    ("'a' < 1", ERROR),
    ("null < null", ERROR),
    ("[1] < [2]", ERROR),
    ("context.nan < 1.0", ERROR),
    ("context.nan >= 1", ERROR),  # compared with a literal (a quicker code path)
    ("context.a > 0.5", True),
    ("context.b <= 2", False),
    ("context.s < 1", ERROR),
    ("context.t > 0", ERROR),
    ("context.big > 9223372036854775806", True),
    ("9007199254740993 > 9007199254740992.0", False),  # the int is converted to a double
    ("1 < 2 == true", True),
    ("1 < 2 < 3", ERROR),
    # arithmetic
    ("1 + 1", 2),
    ("1.0 + 1.0", 2.0),
    ("1 + 1.0", ERROR),  # No such overload
    ("1.0 + 1", ERROR),  # Unsupported operation: float + int
    ("'a' + 'b'", "ab"),
    ("'a' + 1", ERROR),
    ("[1] + ['a']", [1, "a"]),
    ("{'a': 1} + {'b': 2}", ERROR),
    ("-7 / 2", -3),
    ("7 / -2", -3),
    ("-7 % 2", -1),
    ("7 % -2", 1),
    ("1 / 0", ERROR),
    ("1 % 0", ERROR),
    ("7.0 / 2.0", 3.5),
    ("1.0 / 0.0", math.inf),
    ("1.0 / -0.0", -math.inf),
    ("7.0 % 2.0", ERROR),
    ("context.big + 1", ERROR),  # Arithmetic overflow in 'add'
    ("context.small - 1", ERROR),
    ("context.big * 2", ERROR),
    ("context.small / -1", ERROR),
    ("context.small % -1", ERROR),
    ("-context.small", ERROR),  # overflows (cel itself wraps around)
    ("-(-9223372036854775807 - 1)", ERROR),
    ("-(-9223372036854775807)", INT_MAX),
    ("-context.b", -2.5),
    ("-true", ERROR),  # no `-` on bool (cel itself takes it for `!`)
    ("-context.t", ERROR),
    ("- - -false", ERROR),
    ("--true", True),  # the parser cancels pairs
    ("-'a'", ERROR),
    ("!1", ERROR),
    ("!-1", ERROR),
    ("--1", 1),
    ("!!context.s", "hi"),  # the parser cancels pairs of the same unary operator
    ("--context.s", "hi"),
    ("!!!context.s", ERROR),
    ("!(!context.s)", ERROR),
    ("1 + 2 * 3", 7),
    ("10 - 2 - 3", 5),
    ("100 / 10 / 5", 2),
    ("1--1", 2),
    # logic
    ("false && context.zz", False),
    ("context.zz && false", False),
    ("true || context.zz", True),
    ("context.zz || true", True),
    ("context.zz && true", ERROR),
    ("context.zz && context.yy", ERROR),  # the right side's error
    ("1 && false", False),
    ("1 && true", ERROR),
    ("true && 1", ERROR),
    ("false || 1", ERROR),
    ("1 || true", True),
    ("context.zz && context.yy && context.xx", ERROR),
    ("true ? 1 : 1 / 0", 1),
    ("false ? 1 / 0 : 2", 2),
    ("1 ? 1 : 2", ERROR),
    ("null ? 1 : 2", ERROR),
    # in
    ("1 in [1.0]", True),
    ("true in [1]", False),
    ("'x' in context.m", True),
    ("1 in context.im", True),
    ("true in context.im", False),
    ("1.0 in context.im", True),  # numeric keys compare by value (the specification)
    ("1.5 in context.im", ERROR),
    ("'a' in 'abc'", ERROR),
    ("context.nan in [context.nan]", False),
    # size and string methods
    ("size(context.s)", 2),
    ("size(context.u)", 5),  # code points (cel itself counts UTF-8 bytes)
    ("context.u.size()", 5),
    ("size('πέντε')", 5),
    ("'πέντε'.size()", 5),
    ("size('😀')", 1),
    ("context.l.size()", 2),
    ("size(context.m)", 2),
    ("size(context.a)", ERROR),
    ("context.s.startsWith('h')", True),
    ("context.s.endsWith('i')", True),
    ("context.u.contains('é')", True),
    ("context.s.contains('')", True),
    ("context.a.startsWith('h')", ERROR),
    ("context.s.startsWith(1)", ERROR),
    ("context.zz.startsWith(context.yy)", ERROR),  # the argument's error
    ("context.s.matches('h.*')", True),  # a match anywhere, as RE2 and Rust's regex search
    ("context.u.matches('^h.llo$')", True),  # `.` is a code point
    ("context.s.matches('(?i)\\\\bHI\\\\b')", True),
    ("'hi agent'.matches('\\\\bage\\\\b')", False),
    ("context.a.matches('h')", ERROR),
    ("context.s.matches(1)", ERROR),
    ("context.zz.matches(context.yy)", ERROR),  # the argument's error
    # literals with errors inside
    ("[context.zz, context.yy]", ERROR),
    ("{context.zz: context.yy}", ERROR),
    ("{'a': context.yy, [1]: 1}", ERROR),
    ("{1.5: context.zz}", ERROR),
    ("{null: 1}", ERROR),
    ("{'a': 1, 'a': 2}", ERROR),  # a repeated key (cel itself keeps the last)
    ("{1: 'a', 1: 'b'}", ERROR),
    ("{context.s: 1, 'hi': 2}", ERROR),
    ("{context.s: 1, 'ho': 2}", {"hi": 1, "ho": 2}),
    # numeric keys compare by value across int and double
    ("{1: 'a', 2: 'b'}[2.0]", "b"),
    ("{1: 'a'}[1.5]", ERROR),
    ("context.l[1.0]", 2),  # a whole double indexes a list
    ("context.l[0.5]", ERROR),
    ("2.0 in {1: 'a', 2: 'b'}", True),
    ("3.0 in {1: 'a', 2: 'b'}", False),
    ("context.b in {1: 'a'}", ERROR),  # not a whole number: no key type (the spec says false)
    # the refund guard
    (
        "event.amount > 0 && event.amount <= context.order.refundable "
        "&& context.order.deliveredDaysAgo <= 30",
        True,
    ),
    ("[context.a, context.order.refundable]", [1, 120.0]),
    ("context.m", {"x": 1, "y": [1.0, {"z": None}]}),
]


@pytest.mark.parametrize(("src", "expected"), TABLE)
def test_table(src: str, expected: Any) -> None:
    want, got = agree(src, DATA)
    assert got[0] != "fallback"
    if expected is ERROR:
        assert want[0] == "error", want
    else:
        assert want[0] == "ok" and same(want[1], expected), f"cel gave {want!r}, the table says {expected!r}"


def test_results_are_fresh_copies() -> None:
    fn = compile_fast("context.m")
    assert fn is not None
    result = fn(DATA)
    assert result == DATA["context"]["m"] and result is not DATA["context"]["m"]
    assert result["y"] is not DATA["context"]["m"]["y"]


# --- 2. every shipped expression is covered -----------------------------------------------------


def document_expressions(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, source) of every CEL string in a machine document, by walking the JSON."""
    found: list[tuple[str, str]] = []

    def tree(node: Any, where: str) -> None:
        if isinstance(node, str):
            found.append((where, node))
        elif isinstance(node, dict):
            for key, value in node.items():
                tree(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                tree(value, f"{where}[{i}]")

    def transitions(spec: Any, where: str) -> None:
        for i, t in enumerate(spec if isinstance(spec, list) else [spec] if spec else []):
            if isinstance(t, str):
                continue  # a bare target
            if isinstance(t.get("guard"), str):
                found.append((f"{where}[{i}].guard", t["guard"]))
            tree(t.get("assign") or {}, f"{where}[{i}].assign")

    tree(doc.get("context") or {}, "context")
    for name, state in doc["states"].items():
        where = f"states.{name}"
        invoke = state.get("invoke")
        if invoke:
            given_input = invoke.get("input") or {}
            if invoke["src"] == DECIDE_SRC:
                found.append((f"{where}.invoke.input.name", given_input["name"]))
                if given_input.get("prompt"):
                    found.append((f"{where}.invoke.input.prompt", given_input["prompt"]))
                for event, fields in (given_input.get("payloads") or {}).items():
                    for field, src in fields.items():
                        found.append((f"{where}.invoke.input.payloads.{event}.{field}", src))
                tree(given_input.get("facts"), f"{where}.invoke.input.facts")
            else:
                tree(given_input, f"{where}.invoke.input")
            transitions(invoke.get("onDone"), f"{where}.invoke.onDone")
            transitions(invoke.get("onError"), f"{where}.invoke.onError")
        for event, spec in (state.get("on") or {}).items():
            transitions(spec, f"{where}.on.{event}")
        transitions(state.get("always"), f"{where}.always")
        transitions(state.get("choice"), f"{where}.choice")
        if state.get("output") is not None:
            tree(state["output"], f"{where}.output")
    return found


DOCUMENTS = sorted([*REPO.glob("improve/examples/*/machine.json"), *REPO.glob("policies/*/*.json")])


def named_guards(node: Any) -> set[str]:
    if isinstance(node, dict):
        own = {node["guard"]["type"]} if isinstance(node.get("guard"), dict) else set()
        return own.union(*(named_guards(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(named_guards(v) for v in node))
    return set()


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_expressions_are_covered(path: Path) -> None:
    doc = json.loads(path.read_text())
    found = document_expressions(doc)
    # The walk finds exactly what the compiler compiles, so nothing escapes the check below.
    machine = compile_machine(
        parse_machine(doc), guards={name: lambda c, e, p: False for name in named_guards(doc)}
    )
    assert sorted(src for _, src in found) == sorted(e.source for e in machine.expressions())
    assert all(e.fast is not None for e in machine.expressions())
    uncovered = [f"{where}: {src}" for where, src in found if compile_fast(src) is None]
    assert not uncovered, "not covered by the fast path:\n" + "\n".join(uncovered)


def test_documents_were_found() -> None:
    assert len(DOCUMENTS) >= 4


# --- 3. outside the subset: None, never a wrong answer ---------------------------------------------

UNSUPPORTED = [
    "1u",
    "0x10",
    "1.",
    "1e400",
    "9223372036854775808",
    "-9223372036854775808",  # valid in cel, but the literal alone is out of range
    "r'a'",
    "b'a'",
    "'''a'''",
    '"""a"""',
    "'\\x41'",
    "'\\u0041'",
    "'\\101'",
    "'\\a'",
    "int(1)",
    "double(1)",
    "string(1)",
    "uint(1)",
    "type(1)",
    "dyn(1)",
    "max(1, 2)",
    "context.l.all(x, x > 0)",
    "context.l.exists(x, x > 0)",
    "context.l.exists_one(x, x > 0)",
    "context.l.map(x, x * 2)",
    "context.l.filter(x, x > 0)",
    "timestamp('2020-01-01T00:00:00Z')",
    "duration('1s')",
    "context.?a",
    "context.a.?b",
    "[?context.a]",
    "{?'a': context.a}",
    ".context",
    "context // comment",
    "Foo{a: 1}",
    "context.if",
    "has(context)",
    "has(context.m['x'])",
    "size(1, 2)",
    "size()",
    "'a'.size(1)",
    "startsWith('a', 'b')",
    "context.s.startsWith()",
    "context.a = 1",
    "context.a & 1",
    "1 +",
    "(1",
    "'abc",
    "-!true",
    "!-context.a",
    "a ? b ? c : d : e",
    "(context.t ? context : context.m)[1.5]",  # the message depends on the branch taken
    "",
]


@pytest.mark.parametrize("src", UNSUPPORTED)
def test_outside_the_subset_gives_none(src: str) -> None:
    assert compile_fast(src) is None


class Opaque:
    pass


OUT_OF_DOMAIN: list[tuple[str, dict[str, Any]]] = [
    ("context.x", {"context": {"x": (1, 2)}}),
    ("context.x == [1, 2]", {"context": {"x": (1, 2)}}),
    ("context.x", {"context": {"x": 2**63}}),
    ("context.x > 0", {"context": {"x": 2**64}}),
    ("context.l == [1]", {"context": {"l": [2**63]}}),
    ("context.x[1]", {"context": {"x": {True: "yes"}}}),
    ("context.x[1]", {"context": {"x": {1.0: "yes"}}}),
    ("context.x", {"context": {"x": {True: "yes"}}}),
    ("context.x", {"context": {"x": "\ud800"}}),
    ("context.x", {"context": {"x": Opaque()}}),
    ("context.x", {"context": {"x": b"ab"}}),
    ("[1] + context.m", {"context": {"m": {"a": 1}}}),
    ("{true: 1}", {}),
    # a pattern cel refuses: the whole expression is cel's (`regex_matches`)
    ("context.s.matches('(')", {"context": {"s": "hi"}}),
    ("context.s.matches('[') || true", {"context": {"s": "hi"}}),
]


@pytest.mark.parametrize(("src", "data"), OUT_OF_DOMAIN)
def test_values_outside_the_domain_fall_back(src: str, data: dict[str, Any]) -> None:
    fn = compile_fast(src)
    assert fn is not None
    with pytest.raises(FastCelFallback):
        fn(data)
    # ... and `Expr.evaluate` then gives cel's answer.
    expr = compile_expr(src, "test")
    slow = dataclasses.replace(expr, fast=None)
    assert expr.fast is not None and slow.fast is None
    outcomes = []
    for e in (expr, slow):
        try:
            outcomes.append(("ok", e.evaluate(Scope(**data))))
        except EvaluationError as err:
            outcomes.append(("error", str(err)))
    assert outcomes[0] == outcomes[1]


# --- the edit to Expr.evaluate -------------------------------------------------------------------


@pytest.mark.parametrize(
    "src",
    [
        "context.order.refundable",
        "context.zz",
        "event.amount > 0 && event.amount <= context.order.refundable",
        "input.x",
        "facts.y",
        "1 / 0",
        "context.l[5]",
        "has(event.reason) ? event.reason : ''",
        "[context.a, context.b]",
    ],
)
def test_expr_evaluate_fast_and_slow_agree(src: str) -> None:
    expr = compile_expr(src, "state 'x'.guard")
    assert expr.fast is not None
    slow = dataclasses.replace(expr, fast=None)
    scope_values = {"context": DATA["context"], "event": DATA["event"], "input": None}
    outcomes = []
    for e in (expr, slow):
        try:
            outcomes.append(("ok", e.evaluate(Scope(**scope_values))))
        except EvaluationError as err:
            outcomes.append(("error", str(err)))
    assert outcomes[0][0] == outcomes[1][0]
    if outcomes[0][0] == "ok":
        assert same(outcomes[0][1], outcomes[1][1])
    else:
        assert outcomes[0][1] == outcomes[1][1]


# --- the specification where `cel` itself departs from it (`make conformance`) -----------

SPEC: list[tuple[str, Any]] = [
    ("size('πέντε')", 5),
    ("'πέντε'.size()", 5),
    ("size(b'\\xff\\x00')", 2),
    ("-false", ERROR),
    ("-(-9223372036854775808)", ERROR),
    ("-(-9223372036854775807)", INT_MAX),
    ("9223372036854775807 + 1", ERROR),
    ("-9223372036854775808 - 1", ERROR),
    ("4611686018427387904 * 2", ERROR),
    ("{true: 1, false: 2, true: 3}[true]", ERROR),
    ("{true: 1, false: 2}[true]", 1),
    ("{1: 'a', 1u: 'b'}", ERROR),  # int and uint keys are equal by value
    ("{true: 'a', 1: 'b'}[1]", "b"),  # a bool never equals an int
    ("{1u: 1.0, 2: 2.0, 3u: 3.0}[3.0]", 3.0),
    ("{1u: 1.0, 2: 2.0, 3u: 3.0}[2u]", 2.0),
    ("{1u: 1.0, 2: 2.0, 3u: 3.0}[1]", 1.0),
    ("3.0 in {1: 1, 2: 2, 3u: 3} && 2u in {1u: 1, 2: 2} && 1 in {1u: 1, 2: 2}", True),
    ("{1: 1.0, 2u: 3u} == {1u: 1, 2: 3.0}", True),
    ("{1.0: 'a'}", ERROR),  # a double is no map key
    ("{dyn(1.0): 'a'}", ERROR),
    ("[7, 8, 9][dyn(0.0)]", 7),
    ("-(1u)", ERROR),
    ("--false", False),
    ("1 - -2", 3),
]


@pytest.mark.parametrize(("src", "expected"), SPEC)
def test_both_paths_follow_the_specification(src: str, expected: Any) -> None:
    """Both evaluation paths give the specification's answer, where `cel` itself does not (or is the
    fast path's only peer); the errors read the same on both."""
    expr = compile_expr(src, "guard")
    outcomes = []
    for e in (expr, dataclasses.replace(expr, fast=None)):
        try:
            outcomes.append(("ok", e.evaluate(Scope())))
        except EvaluationError as err:
            outcomes.append(("error", str(err)))
    assert outcomes[0][0] == outcomes[1][0], outcomes
    if expected is ERROR:
        assert outcomes[0][0] == "error", outcomes
        assert outcomes[0][1] == outcomes[1][1]
    else:
        assert outcomes[0][0] == "ok" and same(outcomes[0][1], expected), outcomes
        assert same(outcomes[1][1], expected), outcomes


def test_raw_cel_still_deviates() -> None:
    """The corrections are needed: the `cel` package alone gets these wrong (if this fails, cel was
    fixed upstream and `celfix` can shrink)."""
    assert cel.evaluate("size('πέντε')", {}) == 10
    assert cel.evaluate("-false", {}) is True
    assert cel.evaluate("{true: 1, false: 2, true: 3}[true]", {}) == 3


@pytest.mark.parametrize(
    ("src", "fixed"),
    [
        ("size(context.s)", "_improve_size ( context . s )"),
        ("-context.a", "_improve_neg(context . a, -(context . a))"),
        ("-1", "- 1"),  # a literal stays a literal (-9223372036854775808 would not fit otherwise)
        ("context.m[context.k]", "context . m [_improve_key(context . k)]"),
        ("{'a': 1, 'b': 2}", "{'a': 1, 'b': 2}"),
        ("{'a': 1, 'a': 2}", "(_improve_keys(['a', 'a']) ? {'a': 1, 'a': 2} : {})"),
        ("context.a == 1", "context.a == 1"),
        ("{0.0: 1, 1u: 2}", "(_improve_keys([0.0, 1]) ? {0.0: 1, 1: 2} : {})"),  # a double key stays
        ("{context.k: 1}", "{_improve_mkey(context . k): 1}"),
        ("'unbalanced(", "'unbalanced("),
    ],
)
def test_celfix_rewrites(src: str, fixed: str) -> None:
    assert celfix.rewrite(src).strip() == fixed


def test_cel_is_imported_without_its_command_line_and_its_command_line_still_imports() -> None:
    """A fresh interpreter compiling and evaluating a guard leaves `cel`'s REPL (prompt_toolkit,
    pygments) unimported; someone's own `import cel.cli` after that gets the real one."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from improve.machine.expr import compile_cel, Scope\n"
        "assert compile_cel('a.matches(\"x\") && b > 1').execute(Scope(a='xy', b=2).cel_context(frozenset('ab')))\n"
        "print(','.join(m for m in ('prompt_toolkit', 'pygments', 'cel.cli') if m in sys.modules))\n"
        "import cel.cli\n"
        "print(cel.cli.__file__.endswith('cli.py'), callable(cel.cli.main), hasattr(sys.modules['cel'], 'cli'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["", "True True True"]
