"""Importers of other agents' logs into the warehouse (filled in by the importer modules)."""

from __future__ import annotations

from typing import Protocol

import duckdb


class Importer(Protocol):
    name: str

    def stage(self, con: duckdb.DuckDBPyConnection) -> None:
        """From TEMP TABLE raw_lines(file, line, raw), create TEMP TABLE cand (see ingest.CAND_COLUMNS)."""
        ...


IMPORTERS: dict[str, Importer] = {}
