"""Extension points: environments, proposers, gates and importers, each found by name in one registry.

An extension is found three ways, and a name may be taken only once across them:

1. **bundled**: registered in code by the package that defines the kind (the eight gates, the `rules`
   and `openai` proposers, the `native`, `normalize` and `opencli` importers);
2. **entry points** in the group `improve.<kind>` (`improve.environments`, `improve.proposers`,
   `improve.gates`, `improve.importers`), so a pip-installed package adds one. The bundled
   environments register this way too, from improve's own `pyproject.toml`, exactly like a user's;
3. **the workspace**: a `module = "package.module:attribute"` line in `improve.toml`
   (`[environments.support-desk]`, `[gates.no-refunds-on-fridays]`, ...), with the workspace root
   importable.

The attribute is the extension itself, or a callable taking no argument that returns it (a function
building an `Environment`, a `Gate` class). Names are slugs (`support-desk`), because they end up in
thread metadata, branch names, report folders and CHANGELOG headings; a `module:function` never does.
Nothing is imported until it is asked for, so listing names costs no import.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Generic, TypeVar

from improve.errors import ConfigError, ImproveError, WorkspaceError, did_you_mean, raised

T = TypeVar("T")

SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")
SLUG_HINT = "lowercase letters, digits, '-' and '_', starting with a letter or digit, at most 63 characters"


def check_slug(name: str, what: str) -> str:
    """`name` when it is a valid slug; otherwise a `ConfigError` that says what a slug is."""
    if not SLUG.match(name):
        raise ConfigError(f"{what} name {name!r} is not a slug ({SLUG_HINT}), e.g. 'support-desk'")
    return name


@dataclass(frozen=True)
class Source:
    """Where a registered name comes from."""

    name: str
    origin: str
    """`bundled`, `entry point <dist>`, or `improve.toml`."""
    spec: str | None = None
    """`package.module:attribute`, or None for an object registered in code."""


Make = Callable[[object, str], T]
"""Turns what a spec names into the extension, or raises `ConfigError` saying what was expected."""


@functools.lru_cache(maxsize=32)
def _installed(group: str, path: tuple[str, ...]) -> tuple[tuple[EntryPoint, str], ...]:
    """The group's entry points with their distributions' names, read once per import path: reading them
    scans every installed distribution (about 7 ms here), and a command looks a registry up many times."""
    del path  # the cache's key only: another import path can hold other distributions
    return tuple(
        (point, point.dist.name if point.dist is not None else "?") for point in entry_points(group=group)
    )


class Registry(Generic[T]):
    """The extensions of one kind, by name."""

    def __init__(self, kind: str, make: Make[T]) -> None:
        self.kind = kind
        self.noun = kind.removesuffix("s")
        """One of them, in messages: `environment`, `gate`, ..."""
        self.group = f"improve.{kind}"
        self._make = make
        self._bundled: dict[str, object] = {}

    def bundle(self, name: str, extension: object) -> None:
        """Register one in code (the package that defines the kind does this for its own)."""
        self._bundled[check_slug(name, self.noun)] = extension

    def sources(self, local: Mapping[str, str] | None = None) -> dict[str, Source]:
        """Every name with its origin, in the order bundled, entry points, workspace."""
        found: dict[str, Source] = {name: Source(name, "bundled") for name in self._bundled}

        def add(source: Source) -> None:
            before = found.get(source.name)
            if before is not None and before.spec != source.spec:
                raise WorkspaceError(
                    f"{self.noun} {source.name!r} is registered twice: by {before.origin} "
                    f"({before.spec or 'in code'}) and by {source.origin} ({source.spec}); rename one"
                )
            found[source.name] = source

        for point, dist in _installed(self.group, tuple(sys.path)):
            add(
                Source(
                    check_slug(point.name, f"entry point {self.group}"), f"entry point {dist}", point.value
                )
            )
        for name, spec in (local or {}).items():
            add(Source(check_slug(name, f"improve.toml [{self.kind}]"), "improve.toml", spec))
        return found

    def names(self, local: Mapping[str, str] | None = None) -> list[str]:
        return sorted(self.sources(local))

    def load(self, name: str, local: Mapping[str, str] | None = None, root: Path | None = None) -> T:
        """The extension registered as `name`; `local` are the workspace's specs, importable from `root`."""
        sources = self.sources(local)
        source = sources.get(name)
        if source is None:
            known = ", ".join(sorted(sources)) or "none"
            # A typo of one registered (`hold_desk` for `hold-desk`) is said before how to add another.
            raise WorkspaceError(
                f"unknown {self.noun} {name!r}{did_you_mean(name, sources)}; registered: {known}. Add it to improve.toml as "
                f'[{self.kind}.{name}] module = "package.module:attribute", or install a package '
                f"with an {self.group!r} entry point"
            )
        where = f"{self.noun} {name!r} ({source.origin}: {source.spec})"
        target = self._bundled[name] if source.spec is None else import_spec(source.spec, where, root)
        return self._make(target, where)


def import_spec(spec: str, where: str, root: Path | None = None) -> object:
    """The object `package.module:attribute` names; `root` (a workspace) is made importable first.

    Environments, gates and proposers are people's code, trusted like a test suite; nothing a model
    wrote is ever imported.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise WorkspaceError(f"{where}: expected 'package.module:attribute', got {spec!r}")
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        missing = error.name is not None and (module_name + ".").startswith(error.name + ".")
        if isinstance(error, ModuleNotFoundError) and missing:
            hint = f" (the workspace root {root} is importable: is the package there?)" if root else ""
            raise WorkspaceError(f"{where}: cannot import {module_name!r}: {error}{hint}") from None
        # The module is there, and an import in it failed: said at its line, not in the module it names.
        raise WorkspaceError(f"{where}: importing {module_name!r} failed: {raised(error, root)}") from None
    except Exception as error:  # people's code: a mistake in it is theirs to fix, said where it is
        raise WorkspaceError(f"{where}: importing {module_name!r} failed: {raised(error, root)}") from None
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise WorkspaceError(f"{where}: module {module_name!r} has no attribute {attribute!r}") from None
    return target


def instance_of(kind: type[T], what: str) -> Make[T]:
    """A `Make` accepting an instance of `kind`, or a callable without arguments returning one."""

    def make(target: object, where: str) -> T:
        # A class is called even when it would pass a Protocol's isinstance check itself.
        if isinstance(target, kind) and not isinstance(target, type):
            return target
        if callable(target):
            try:
                made = target()
            except ImproveError:
                raise
            except Exception as error:  # people's code, as `import_spec` says
                raise WorkspaceError(f"{where}: calling it failed: {raised(error)}") from None
            if isinstance(made, kind):
                return made
            raise WorkspaceError(f"{where}: returned {type(made).__name__}, not {what}")
        raise WorkspaceError(f"{where}: is {type(target).__name__}, not {what} or a function returning one")

    return make
