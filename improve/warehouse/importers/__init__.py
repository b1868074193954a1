"""Importers of other agents' logs into the warehouse (filled in by the importer modules)."""

from __future__ import annotations

from typing import Protocol

import duckdb

from improve.warehouse.importers.normalize import NormalizeImporter
from improve.warehouse.importers.opencli import OpencliImporter


class Importer(Protocol):
    name: str

    def stage(self, con: duckdb.DuckDBPyConnection) -> None:
        """From TEMP TABLE raw_lines(file, line, raw), create TEMP TABLE cand (see ingest.CAND_COLUMNS)."""
        ...


IMPORTERS: dict[str, Importer] = {
    importer.name: importer for importer in (NormalizeImporter(), OpencliImporter())
}
"""`ingest(..., fmt=name)` stages with IMPORTERS[name]: normalize (the normalize @agent's session logs and
checkpoints), opencli (the opencli agent's session tapes)."""
