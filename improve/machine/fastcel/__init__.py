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
`x.size()`, `s.startsWith(t)`, `s.endsWith(t)`, `s.contains(t)`, `s.matches(p)` (cel itself matches the two
strings: its regular expressions are not Python's). Anything else (uint, hex, raw,
bytes or triple-quoted strings, other escapes, other functions and macros, optional syntax `?.`,
message construction, a leading `.`, comments, reserved words) gives `None`.

Domain: the data must be what JSON decodes to (dicts with string or int keys, lists, str, int in the
signed 64-bit range, float, bool, None); a value read outside it raises `FastCelFallback` (see `domain`).

The modules, by concern: `syntax` (tokenizer and parser: source to tree, or "not in the subset"),
`compiler` (tree to closure, and `compile_fast`), `semantics` (cel's rules for each operation, as
established by experiment: its docstring lists them), `domain` (which Python values are in, and the
copies results are returned as), `messages` (cel's error texts, word for word). `FastCelError` and
`FastCelFallback` are in `improve.errors`.
"""

from __future__ import annotations

from improve.errors import FastCelError, FastCelFallback
from improve.machine.fastcel.compiler import Fn, compile_fast
from improve.machine.fastcel.domain import INT_MAX, INT_MIN

__all__ = ["INT_MAX", "INT_MIN", "FastCelError", "FastCelFallback", "Fn", "compile_fast"]
