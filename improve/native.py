"""Which fold modules run: the compiled ones (mypyc, built by setup.py) or the pure-Python reference.

`setup.py` compiles `NATIVE_MODULES` from their source files and records each file's `fingerprint` in
`improve/native.sources`. The compiled modules are used only when that record matches the source files found
beside them: a source edited since the last install, a build without a C compiler (no record), or
`IMPROVE_PURE=1` in the environment load every one of them from its `.py` file instead, all together (the
compiled modules call each other directly). Both are the same code: the compiled modules run it about
twice as fast, and the differential tests hold their answers equal.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import zlib
from collections.abc import Sequence
from types import ModuleType

# Every `improve` command imports this module first: os.path, importlib.machinery and zlib (loaded with
# Python itself), not pathlib, importlib.util/abc, hashlib or json (about 30 ms of imports).

NATIVE_MODULES = (
    "improve.log.chain",
    "improve.log.replay",
    "improve.log.stream",
    "improve.log.strict",
    "improve.machine.fold",
    "improve.machine.fastcel.compiler",
    "improve.machine.fastcel.domain",
    "improve.machine.fastcel.semantics",
)
"""The modules setup.py compiles (it lists them too)."""

PURE_VARIABLE = "IMPROVE_PURE"
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def source_of(name: str) -> str:
    """The `.py` file of one of `NATIVE_MODULES`."""
    return os.path.join(os.path.dirname(_PACKAGE), *name.split(".")) + ".py"


def fingerprint(source: bytes) -> str:
    """What the record keeps of a source file: its CRC-32 and length (it tells an edit, not an attack:
    whoever can write the source files can write the record too)."""
    return f"{zlib.crc32(source):08x}:{len(source)}"


def pure_reason(package: str | os.PathLike[str] = _PACKAGE) -> str | None:
    """Why the pure-Python modules are used (None: the compiled ones are)."""
    if os.environ.get(PURE_VARIABLE, "") not in ("", "0"):
        return f"{PURE_VARIABLE} is set"
    try:
        with open(os.path.join(package, "native.sources"), encoding="utf-8") as record:
            recorded = dict(line.split(" ", 1) for line in record.read().splitlines() if " " in line)
    except OSError:
        return "not compiled (no native.sources: built without a C compiler, or not installed by setup.py)"
    for name in NATIVE_MODULES:
        try:
            with open(source_of(name), "rb") as source:
                found = fingerprint(source.read())
        except OSError:
            return f"{name}: no source file"
        if recorded.get(name) != found:
            return f"{name}: its source changed since it was compiled (reinstall: make, or pip install -e .)"
    return None


class _PureFinder:
    """A meta path finder: `NATIVE_MODULES` as their `.py` files, ahead of the compiled modules beside them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in NATIVE_MODULES:
            return None
        source = source_of(fullname)
        loader = importlib.machinery.SourceFileLoader(fullname, source)
        spec = importlib.machinery.ModuleSpec(fullname, loader, origin=source)
        spec.has_location = True  # __file__ is the source file, and its bytecode is cached as usual
        return spec


REASON: str | None = None
"""Set by `select`: why the pure modules are used, or None when the compiled ones are."""


def select() -> None:
    """Choose, once, before any of `NATIVE_MODULES` is imported (`improve/__init__.py` calls it)."""
    global REASON
    REASON = pure_reason()
    if REASON is not None and not any(isinstance(f, _PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PureFinder())


def compiled() -> bool:
    """Whether the fold modules imported are the compiled ones."""
    module = sys.modules.get(NATIVE_MODULES[0])
    return module is not None and not str(getattr(module, "__file__", "")).endswith(".py")


def described() -> str:
    """Which fold modules run, in words (what `make bench` prints beside its replay figures)."""
    folds = "compiled (mypyc)" if compiled() else f"pure Python: {REASON or 'not imported yet'}"
    return folds + ("; hashing in C (improve._digest)" if digest() is not None else "; hashing in Python")


def digest() -> ModuleType | None:
    """The C module `improve._digest` (the hash chain's fast path and a snapshot's digest check, built by
    setup.py against libcrypto), or None where it was not built or the pure modules are asked for
    (`IMPROVE_PURE`: the reference, which the differential tests compare it with)."""
    if os.environ.get(PURE_VARIABLE, "") not in ("", "0"):
        return None
    try:
        # By name: a C extension, built or not (and importing it from the package would loop back to it).
        return importlib.import_module("improve._digest")
    except ImportError:
        return None
