"""CEL source to a tree, for the subset the fast path compiles; anything else is `NotInSubset`.

Literals: `.5` and `1e3` are doubles; `1.` and `2.` do not parse; `007` is 7; an int literal beyond
int64 and `1e400` do not parse (left to cel). Reserved words parse as field names (`context.as`) in
cel, but the fast path leaves them alone.

A run of the same unary operator cancels in pairs here, as in cel's parser (see `semantics`).
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

from improve.machine.fastcel.domain import INT_MAX


class NotInSubset(Exception):
    """Raised while compiling: the source is outside the subset (or not valid CEL). It never leaves
    `compile_fast`, which returns None instead."""


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
            raise NotInSubset("comment")
        m = _NUMBER.match(source, i)
        if m:
            text = m.group()
            end = m.end()
            if end < n and (_WORD_CHAR.match(source, end) or source[end] in "'\""):
                raise NotInSubset("uint, hex or malformed number")
            if m.group(1) is not None:
                value: Any = float(text)
                if math.isinf(value):
                    raise NotInSubset("double literal out of range")
            else:
                value = int(text)
                if value > INT_MAX:
                    raise NotInSubset("int literal out of range")
            tokens.append(("num", value))
            i = end
            continue
        m = _IDENT.match(source, i)
        if m:
            word = m.group()
            end = m.end()
            if end < n and source[end] in "'\"":
                raise NotInSubset("raw or bytes string")
            if word in _KEYWORDS:
                tokens.append(("lit", _KEYWORDS[word]))
            elif word == "in":
                tokens.append(("op", "in"))
            elif word in _RESERVED:
                raise NotInSubset("reserved word")
            else:
                tokens.append(("ident", word))
            i = end
            continue
        if c in "'\"":
            if source.startswith(c * 3, i):
                raise NotInSubset("triple-quoted string")
            j = i + 1
            parts: list[str] = []
            while True:
                if j >= n:
                    raise NotInSubset("unterminated string")
                ch = source[j]
                if ch == c:
                    break
                if ch in "\r\n":
                    raise NotInSubset("newline in string")
                if ch == "\\":
                    esc = _ESCAPES.get(source[j + 1 : j + 2])
                    if esc is None:
                        raise NotInSubset("escape")
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
                    raise NotInSubset("lone surrogate") from None
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
        raise NotInSubset(f"character {c!r}")
    tokens.append(("end", None))
    return tokens


# --- parser: source -> tree ----------------------------------------------------------------------
#
# Nodes are tuples: ("lit", v), ("ident", name), ("select", x, name), ("has", x, name),
# ("index", x, i), ("list", [x...]), ("map", [(k, v)...]), ("call", name, target, [args]),
# ("not", x), ("neg", x), ("bin", op, l, r), ("and", l, r), ("or", l, r), ("cond", c, t, f).

Node = tuple[Any, ...]
_RELATIONS = frozenset({"==", "!=", "<", "<=", ">", ">=", "in"})
_METHODS = {"size": 0, "startsWith": 1, "endsWith": 1, "contains": 1, "matches": 1}


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
            raise NotInSubset(f"expected {op!r}")
        self.pos += 1

    def parse(self) -> Node:
        node = self.expr()
        if self.peek()[0] != "end":
            raise NotInSubset("trailing input")
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
                    raise NotInSubset("field name")
                if self.is_op("("):
                    args = self.arguments()
                    if _METHODS.get(name) != len(args):
                        raise NotInSubset(f"method {name}")
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
            raise NotInSubset(f"function {value}")
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
        raise NotInSubset(f"unexpected {value!r}")


def parse(source: str) -> Node:
    """The tree of `source`; `NotInSubset` when it is outside the subset."""
    return _Parser(_tokenize(source)).parse()
