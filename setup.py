"""The build's one step beyond pyproject.toml: the fold's hot modules compiled with mypyc.

Replay folds every event through `improve.machine.fold` and the CEL closures of `improve.machine.fastcel`;
compiled, they run about twice as fast. The compiled modules are built from the same source files, which
stay the reference: `improve.native` loads the pure-Python modules instead when the compiled ones are
missing, were built from other sources (an edit since the last install), or `IMPROVE_PURE=1` asks for them.
A build without a C compiler, or with `IMPROVE_NATIVE_BUILD=0`, installs the pure modules only.
"""

from __future__ import annotations

import os
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The modules compiled, as improve/native.py lists them (a test holds the two lists equal).
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
ROOT = Path(__file__).resolve().parent


class BuildNative(build_ext):
    """build_ext, then `improve/native.sources` beside the compiled modules: the fingerprint of each source
    file a module was compiled from (as `improve.native.fingerprint` makes it), which `improve.native`
    compares with the source files it finds."""

    def build_extensions(self) -> None:
        # mypyc writes one C file per module (`multi_file`): they compile side by side, one per core,
        # where the one file of them all took a core for half a minute while the other idled.
        compile_one = self.compiler.compile

        def compile_all(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            if len(sources) < 2:
                return compile_one(sources, *args, **kwargs)
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                done = pool.map(lambda source: compile_one([source], *args, **kwargs), sources)
                return [obj for objects in done for obj in objects]

        self.compiler.compile = compile_all
        super().build_extensions()

    def run(self) -> None:
        record = Path(self.get_ext_fullpath(NATIVE_MODULES[0])).parents[1] / "native.sources"
        record.unlink(missing_ok=True)  # a failed build leaves none: the pure modules are used
        super().run()
        compiled = [e for e in self.extensions if e.name in NATIVE_MODULES or "improve_native" in e.name]
        if not compiled or not all(Path(self.get_ext_fullpath(e.name)).is_file() for e in compiled):
            return
        lines = [
            f"{name} {fingerprint((ROOT / (name.replace('.', '/') + '.py')).read_bytes())}\n"
            for name in NATIVE_MODULES
        ]
        record.write_text("".join(lines))


def fingerprint(source: bytes) -> str:
    """`improve.native.fingerprint` (setup.py runs before improve is importable)."""
    return f"{zlib.crc32(source):08x}:{len(source)}"


# What pip runs setup.py for before it builds: the build's requirements (egg_info) and the metadata
# (dist_info). Neither needs the compiled modules, whose analysis by mypy takes seconds every time.
METADATA_COMMANDS = {"egg_info", "dist_info"}
BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install", "sdist"}


def native_extensions() -> list[object]:
    if os.environ.get("IMPROVE_NATIVE_BUILD", "1") == "0":
        return []
    if METADATA_COMMANDS & set(sys.argv) and not BUILD_COMMANDS & set(sys.argv):
        return [digest_extension()]
    from mypyc.build import mypycify

    # The build environment has mypy and setuptools only: not the project's mypy settings (their pydantic
    # plugin), and the modules' imports outside those compiled are read as far as they resolve.
    options = ["--config-file=", "--ignore-missing-imports", "--follow-imports=silent"]
    sources = [name.replace(".", "/") + ".py" for name in NATIVE_MODULES]
    extensions = mypycify([*options, *sources], opt_level="3", group_name="improve_native", multi_file=True)
    for extension in extensions:
        extension.optional = True  # no C compiler: a warning, and the pure modules
    return [*extensions, digest_extension()]


def digest_extension() -> Extension:
    """improve/_digest.c: the hash chain's fast path, against OpenSSL's libcrypto (what hashlib uses).
    Optional apart from the fold's modules: without libcrypto's headers, chain.py does the same in Python."""
    return Extension("improve._digest", ["improve/_digest.c"], libraries=["crypto"], optional=True)


setup(ext_modules=native_extensions(), cmdclass={"build_ext": BuildNative})
