"""Fixtures every test module can ask for; shared plain functions are in tests/helpers.py."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from improve import clock as product_clock
from tests.helpers import FROZEN_AT, copy_workspace

# The CLI sizes its tables to the terminal (`improve.cli.common`, read when it is imported), and pytest-xdist
# hands its workers the controller's width in COLUMNS: the tests read whole rows, so they pin the width the
# CLI uses for piped output, before any test imports the CLI, for every worker and every subprocess.
os.environ["COLUMNS"] = "140"
os.environ["LINES"] = "40"

# The fake OpenAI-compatible endpoint's `serve` fixture, for every test module.
pytest_plugins = ["tests.fake_openai"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Say which random order ran (pytest-randomly's seed), even under -q, so a failure that depends on
    the order can be run again in that order."""
    seed = config.getoption("randomly_seed", default=None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"random order: run it again with --randomly-seed={seed}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest work first, so the workers finish on short tests instead of one running a minute-long
    test alone at the end while the other idles: modules by how many slow tests they hold, then each
    module's slow tests before its others. Each module stays whole (its fixtures are set up once per
    worker), and every tie keeps pytest-randomly's order."""
    slow: dict[Path, int] = {}
    place: dict[Path, int] = {}  # where pytest-randomly put the module
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
        place.setdefault(item.path, len(place))
    items.sort(key=lambda item: (-slow[item.path], place[item.path], item.get_closest_marker("slow") is None))


# A worker's heap only grows: the modules it imports along the way (scipy and dask among them), the tests,
# the product's caches, up to 380,000 objects by its last test. CPython's full collection walks all of them
# each time the survivors grow by a quarter: 71 s of the workers' 490 s of CPU in a full run (measured with
# gc.callbacks). Once collection is done, and again after each module's tests (its module fixtures torn
# down), the garbage is collected and what is still alive is frozen: later collections skip it. What dies
# later is still freed by its reference count; only a cycle among frozen objects waits for the worker's end.
def _collect_and_freeze() -> None:
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _collect_and_freeze()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None or nextitem.path != item.path:
        _collect_and_freeze()


@pytest.fixture(autouse=True)
def _close_duckdb_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every DuckDB connection a test opens, itself or through the product, is closed when the test
    ends, passed or failed. DuckDB allows one configuration per database file per process, so a
    connection left open (a failure's traceback keeps one alive) would refuse the next test's."""
    opened: list[duckdb.DuckDBPyConnection] = []
    real = duckdb.connect

    def connect(*args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        con = real(*args, **kwargs)
        opened.append(con)
        return con

    monkeypatch.setattr(duckdb, "connect", connect)
    yield
    for con in opened:
        con.close()


@pytest.fixture
def clock() -> Iterator[product_clock.FrozenClock]:
    """The product's clock frozen at `FROZEN_AT` (moving 1 ms a reading): a test that checks a stamp,
    a day or an order of instants takes its expected values from here, not from the day it was written."""
    with product_clock.frozen(FROZEN_AT) as frozen:
        yield frozen


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A scratch copy of the example workspace."""
    return copy_workspace(tmp_path)


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GitHub token in the environment: a round leaves its branch and PR body locally."""
    for name in ("GITHUB_TOKEN", "GH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
