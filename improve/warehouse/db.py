"""Opening the warehouse: a DuckDB file (or `:memory:`), migrated, with a bounded wait for its lock.

DuckDB lets one process hold a database file for writing. A second writer (another `improve ingest`),
or a reader (`improve sql`), waits, retrying, up to `lock_timeout` seconds (default:
`IMPROVE_LOCK_TIMEOUT`, else 30), saying once that it waits when told how (`say`), then fails with a
message that says who holds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb

from improve import clock
from improve.errors import (
    ImproveError,
    WarehouseDamagedError,
    WarehouseLockedError,
    WarehouseVersionError,
    WorkspaceError,
)
from improve.files import LOCK_TIMEOUT_ENV, env_seconds, hint_for, locked
from improve.warehouse.readonly import hardening
from improve.warehouse.schema import ensure_views, migrate

DEFAULT_LOCK_TIMEOUT = 30.0
DEFAULT_MEMORY_LIMIT = "1GB"
"""DuckDB's buffer limit for a warehouse connection: a 1M-entry ingest stays near 1 GiB of resident
memory instead of growing to what the machine has (DuckDB spills to disk beyond it)."""


def open_database(
    path: str | Path = ":memory:",
    *,
    read_only: bool = False,
    sandboxed: bool = False,
    lock_timeout: float | None = None,
    memory_limit: str | None = DEFAULT_MEMORY_LIMIT,
    say: Callable[[str], None] | None = None,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to a migrated warehouse. `:memory:` is a fresh in-memory warehouse.

    The library's and the CLI's way in (ingest, outcomes, `improve sql`); analysts use
    `improve.warehouse.connect`, which wraps this in a `Warehouse` that answers in polars DataFrames.
    Read-only on an existing file neither migrates nor recreates views (it cannot write).

    `sandboxed` is `improve sql`'s read-only mode (`improve.warehouse.readonly`): the file opened
    read-only with DuckDB's hardening settings (no file or network access, no extensions, configuration
    locked); run statements through `query_readonly`, which allows only queries. The file must exist.

    `say` is told once when another process holds the file and the connection waits for it (as
    `improve.files.locked` says it of a lock file), so a command never waits in silence.
    """
    target = str(path)
    if sandboxed and target != ":memory:":
        if not Path(target).is_file():
            raise WorkspaceError(f"no warehouse at {target}; create it with `improve ingest traces/`")
        read_only = True
    elif target != ":memory:":
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    # Sandboxed, the settings go in at startup: applied with SET they would also harden another
    # connection of this process to the same file (DuckDB shares one database per file), while a
    # startup config that differs from that database's is refused outright.
    config = hardening(memory_limit) if sandboxed else {}
    if lock_timeout is None:
        lock_timeout = env_seconds(LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT)
    deadline = time.monotonic() + lock_timeout
    delay = 0.05
    while True:
        try:
            fresh = target != ":memory:" and not sandboxed and _absent(Path(target))
            if fresh:
                _create(Path(target))
            con = duckdb.connect(
                target, read_only=read_only and target != ":memory:" and not fresh, config=config
            )
            break
        except duckdb.ConnectionException as err:
            # DuckDB keeps one database per file in a process: a sandboxed connection and a plain one
            # (or the other way round) to the same file cannot be open in one process at once.
            raise ImproveError(
                f"cannot open warehouse {target}{' sandboxed' if sandboxed else ''}: this process already "
                "has it open with other settings, and DuckDB keeps one database per file in a process "
                f"({str(err).splitlines()[0]}); close that connection first, or run `improve sql` in a "
                "process of its own"
            ) from None
        except duckdb.IOException as err:
            if "version number" in str(err) and "can only read" in str(err):
                raise WarehouseVersionError(
                    f"warehouse {target} was written by a newer DuckDB than this one ({duckdb.__version__}): "
                    f"{str(err).splitlines()[0]} Upgrade duckdb (pip install -U duckdb), or rebuild the "
                    "warehouse here from the threads: move it aside and run `improve ingest traces/`"
                ) from None
            # Corruption first: DuckDB 1.x says it "in block at location N", and "block" holds "lock".
            if (problem := damaged(target, err)) is not None:
                raise problem from None
            if "lock" not in str(err).lower():
                raise unwritable(target, err) from None
            # DuckDB names the holder: "Conflicting lock is held in /usr/bin/python3 (PID 4242). See also URL".
            held_in = str(err).split("Conflicting lock is held in")
            holder = held_in[-1].split(". See also")[0].strip() if len(held_in) > 1 else ""
            if time.monotonic() >= deadline:
                raise WarehouseLockedError(
                    f"warehouse {target} is locked by another process{' (' + holder + ')' if holder else ''}; "
                    f"waited {lock_timeout:.0f}s. Wait for it to finish and run the command again, or wait "
                    f"longer: {LOCK_TIMEOUT_ENV}=SECONDS for any command (`improve ingest --lock-timeout "
                    "SECONDS` too)"
                ) from None
            if say is not None:
                say(
                    f"waiting up to {lock_timeout:.0f}s for another process writing the warehouse {target}"
                    f"{'; it is held by ' + holder if holder else ''} ..."
                )
                say = None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        except duckdb.Error as err:  # a damaged file fails here or at its first read, as a bare duckdb.Error
            raise damaged(target, err) or unwritable(target, err) from None
    if memory_limit and not sandboxed:
        con.execute(f"SET memory_limit = '{memory_limit}'")
    if not (read_only and target != ":memory:"):
        try:
            if fresh:  # a copy of the process's template: its schema is this warehouse's from now
                con.execute("UPDATE schema_migrations SET applied_at = ?", [clock.now()])
            migrate(con)
            ensure_views(con)
        except duckdb.Error as err:
            con.close()
            raise damaged(target, err) or unwritable(target, err) from None
    return con


def _absent(path: Path) -> bool:
    """No warehouse there yet: no file, or an empty one (left by a creation that an older version did not
    finish: it holds nothing, and DuckDB would call it not a database)."""
    try:
        return path.stat().st_size == 0
    except FileNotFoundError:
        return True


def _create(path: Path) -> None:
    """Create a new warehouse file, whole or not at all: made under a temporary name beside it, then
    renamed into place, so a full disk leaves no empty or half-written file behind.

    It is written in the oldest storage format the pins allow, so every DuckDB they allow (and the DuckDB
    CLI of those versions) opens it: a laptop and CI on different versions share it. The format is the
    file's own from then on. It is a copy of the process's `_template`, made by a connection of its own,
    because DuckDB refuses a second connection of this process to the file whose configuration differs
    from the first's (and the option is only needed once)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.creating")
    # Two processes creating the same warehouse take turns (the directory's lock), and the second finds
    # the first's file: replacing it would leave the first writing to a file no longer there.
    with locked(path.parent, f"the new warehouse {path}"):
        if not _absent(path):
            return
        try:
            shutil.copyfile(_template(), temp)
            os.replace(temp, path)
        except BaseException:
            for leftover in (temp, temp.with_name(temp.name + ".wal")):
                with contextlib.suppress(OSError):
                    leftover.unlink()
            raise


_TEMPLATE: tuple[tempfile.TemporaryDirectory[str], Path] | None = None
_TEMPLATE_LOCK = threading.Lock()


def _template() -> Path:
    """A new warehouse, migrated and with its views, made once per process in a directory of its own
    (removed at exit): each new warehouse is a copy of it. Migrating and writing the views' 262
    statements take about ten times as long as copying the file, and a process (a test run, a library
    user's loop) can create many."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        if _TEMPLATE is None:
            folder = tempfile.TemporaryDirectory(prefix="improve-warehouse-")
            made = Path(folder.name) / "new.duckdb"
            con = duckdb.connect(str(made), config={"storage_compatibility_version": STORAGE_COMPATIBILITY})
            try:
                migrate(con)
                ensure_views(con)
            finally:
                con.close()
            _TEMPLATE = (folder, made)
        return _TEMPLATE[1]


def unwritable(target: str | Path, err: BaseException) -> ImproveError:
    """The error to raise when DuckDB could not open or bring up to date the warehouse file: its first
    line, and what to do when the system said why (a full disk, a read-only file)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    hint = hint_for(str(err))
    return ImproveError(f"cannot open warehouse {target}: {text}" + (f"; {hint}" if hint else ""))


def damaged(target: str | Path, err: BaseException) -> WarehouseDamagedError | None:
    """The error to raise when `err` says the warehouse file is corrupted, else None.

    DuckDB reports a block whose checksum does not match as a bare `duckdb.Error` "Corrupt database
    file", at connect or at the first read of that block: a data error (exit 3), not a usage error."""
    text = str(err)
    if "corrupt" not in text.lower() and "checksum" not in text.lower():
        return None
    return WarehouseDamagedError(
        f"warehouse {target} is damaged ({text.splitlines()[0]}); nothing was changed. Restore it from a "
        f"backup, or move it aside (mv {target} {target}.damaged) and rebuild it from the threads with "
        "`improve ingest traces/`"
    )


STORAGE_COMPATIBILITY = "v1.2.0"
"""The storage format new warehouse files are written in: DuckDB 1.2's, which every DuckDB the pins allow
(`duckdb>=1.4.4` in pyproject.toml) and the DuckDB CLIs on PyPI read. DuckDB 2.0 writes a format 1.x cannot
read unless told."""


def insert_rows(
    con: duckdb.DuckDBPyConnection,
    table: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    now: str | None = None,
) -> None:
    """Insert `rows` into `table`'s `columns` in one statement; `now` names a further column set to the
    clock's current time (one instant for the whole call).

    The rows reach DuckDB as one array per column, which it scans as a table: 130 outcome rows of 28
    columns took 43 ms as a multi-row INSERT of 3,640 parameters (binding each one is what costs), and
    4 ms this way (side by side). Values are plain Python ones: str, int, float, bool, None, and lists of them."""
    if not rows:
        return
    import numpy as np  # only a write builds arrays: --help and read-only commands skip the import

    arrays: dict[str, Any] = {}
    selected: list[str] = []
    for i in range(len(columns)):
        values = [row[i] for row in rows]
        if any(isinstance(v, list | tuple) for v in values):
            # A list goes as its JSON text, cast back to the column's list type: DuckDB would guess a
            # list column's item type from the first lists it sees, and an empty one says nothing.
            values = [None if v is None else json.dumps(v) for v in values]
            selected.append(f"CAST(c{i} AS JSON)")
        else:
            selected.append(f"c{i}")
        column = np.empty(len(rows), dtype=object)  # filled, not built from the values: one value each
        column[:] = values
        arrays[f"c{i}"] = column
    scanned = arrays  # noqa: F841 - read by DuckDB's replacement scan below, by this name
    names = [*columns, now] if now else list(columns)
    quoted = ", ".join('"' + name.replace('"', '""') + '"' for name in names)  # `index` is a keyword
    values_sql = ", ".join([*selected, *(["?"] if now else [])])
    con.execute(
        f"INSERT INTO {table} ({quoted}) SELECT {values_sql} FROM scanned", [clock.now()] if now else []
    )
