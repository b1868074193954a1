"""cel 0.10's error messages, word for word: the fast path must fail with exactly cel's text.

Each function builds the `FastCelError` to raise; its text is the first line of what cel says. Where
cel deviates from the CEL specification and `improve` corrects it (`neg_overflow`, `repeated_key`,
and `no_overload` for `-true`), the text is improve's own, and the wrapper around `cel`
(`improve.machine.celfix`) raises the same one.
"""

from __future__ import annotations

from typing import Any, Final

from improve.errors import FastCelError

_NSO: Final = (
    "No such overload: the operation is not defined for the given operand types. CEL does not coerce "
    "between types, so common causes are mixing int with uint or double (1 + 2u, 1 + 2.5), indexing "
    "into a string, or calling a function with the wrong argument types. Convert explicitly with "
    "int(x), uint(x), double(x) or string(x), or check the CEL specification."
)
_NoneType: Final = type(None)
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


def no_overload() -> FastCelError:
    return FastCelError(_NSO)


def unsupported(a: Any, op: str, b: Any) -> FastCelError:
    return FastCelError(
        f"Unsupported operation: {_OP_NAME[type(a)]} {op} {_OP_NAME[type(b)]}. CEL does not coerce "
        "between types — both operands must be the same type. Convert explicitly with int(x), "
        "uint(x), double(x) or string(x) as appropriate."
    )


def undefined(name: str) -> FastCelError:
    return FastCelError(
        f"Undefined variable or function: '{name}'. Check that the variable is defined in the "
        "context or that the function name is spelled correctly."
    )


def overflow(op: str, a: int, b: int) -> FastCelError:
    return FastCelError(f"Arithmetic overflow in '{op}' on {a} and {b}.")


def neg_overflow(a: int) -> FastCelError:
    # cel wraps `-(-9223372036854775808)` around to itself; the specification makes it an error.
    return FastCelError(f"Arithmetic overflow in 'neg' on {a}.")


def repeated_key(k: Any) -> FastCelError:
    # cel keeps the last of two equal keys in a map literal; the specification makes it an error.
    shown = ("true" if k else "false") if type(k) is bool else repr(k) if type(k) is str else str(k)
    return FastCelError(f"Failed with repeated key {shown} in a map literal.")


def no_key(display: str) -> FastCelError:
    return FastCelError(f"no such key {display!r}")


def bad_key(k: Any) -> FastCelError:
    return FastCelError(
        f"Value of type {_OP_NAME[type(k)]} cannot be used as a map key. "
        "Keys must be int, uint, bool or string."
    )


def bad_index(k: Any) -> FastCelError:
    return FastCelError(f"Unexpected type: got '{_INDEX_NAME[type(k)]}', want 'int|uint'.")
