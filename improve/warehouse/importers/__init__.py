"""The log formats `ingest` reads, by name: `IMPORTERS`.

Bundled: `native` (improve's own threads, the default), `normalize` (the normalize @agent's session logs
and checkpoints) and `opencli` (the opencli agent's session tapes). A package adds one with an
`improve.importers` entry point, a workspace with `[importers.NAME] module = "package.module:Attribute"`
in improve.toml; `improve.warehouse.staging.Importer` says what an importer must do.
"""

from __future__ import annotations

from improve.registry import Registry, instance_of
from improve.warehouse.importers.native import NativeImporter
from improve.warehouse.importers.normalize import NormalizeImporter
from improve.warehouse.importers.opencli import OpencliImporter
from improve.warehouse.staging import Importer

# mypy refuses a Protocol where `type[T]` is expected (python/mypy#4717); isinstance accepts it, Importer
# being runtime_checkable.
IMPORTERS: Registry[Importer] = Registry(
    "importers",
    instance_of(Importer, "an importer (an object with a stage(con) method)"),  # type: ignore[type-abstract]
)
IMPORTERS.bundle("native", NativeImporter())
IMPORTERS.bundle("normalize", NormalizeImporter())
IMPORTERS.bundle("opencli", OpencliImporter())

__all__ = ["IMPORTERS", "Importer"]
