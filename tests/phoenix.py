"""A real Arize Phoenix on 127.0.0.1, for the test that exports threads to it and reads them back through
Phoenix's own REST API. Phoenix lives in a virtualenv of its own (`make phoenix` makes it), so its many
pins never meet the project's; where it is not installed, the test skips and says how to install it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

VENV = Path(os.environ.get("IMPROVE_PHOENIX_VENV") or Path.home() / ".cache" / "improve" / "phoenix-venv")
"""Where `make phoenix` installs it (the Makefile's PHOENIX_VENV, passed on by `make test`)."""

READY_WITHIN = 180.0
"""Seconds a start may take: a first start creates and migrates its database, 20-40 s on a busy
2-core machine."""


@dataclass(frozen=True)
class Phoenix:
    """A running Phoenix: its address, and the few REST calls the test reads through."""

    url: str

    def get(self, path: str, **query: Any) -> Any:
        address = f"{self.url}{path}"
        given = {key: value for key, value in query.items() if value is not None}
        if given:
            address += "?" + urllib.parse.urlencode(given)
        with urllib.request.urlopen(address, timeout=30) as answer:
            return json.loads(answer.read())

    def pages(self, path: str) -> list[dict[str, Any]]:
        """Every item of a paginated list (`data`, `next_cursor`)."""
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = self.get(path, limit=1000, cursor=cursor)
            items += page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                return items

    def spans(self, project: str, expected: int, within: float = 60.0) -> list[dict[str, Any]]:
        """The project's spans once `expected` have landed: Phoenix inserts what it receives in batches,
        a moment after answering the POST. Polled, for at most `within` seconds."""
        deadline = time.monotonic() + within
        path = f"/v1/projects/{urllib.parse.quote(project, safe='')}/spans"
        while True:
            try:
                spans = self.pages(path)
            except urllib.error.HTTPError as error:
                if error.code != 404:  # the project appears with its first span
                    raise
                spans = []
            if len(spans) >= expected or time.monotonic() > deadline:
                return spans
            time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:])


@contextmanager
def running_phoenix(directory: Path) -> Iterator[Phoenix]:
    """Phoenix serving on free ports of 127.0.0.1, its database and log in `directory`; stopped (and
    waited for) on the way out, however the test went."""
    executable = VENV / "bin" / "phoenix"
    if not executable.exists():
        pytest.skip(
            f"Arize Phoenix is not installed in {VENV}: `make phoenix` installs it into a virtualenv of "
            "its own (from PyPI; `make test` tries it first)"
        )
    port = _free_port()
    env = os.environ | {
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_WORKING_DIR": str(directory),
        # Nothing leaves the machine, and nothing starts that the test does not use.
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
        "PHOENIX_ENABLE_MCP_SERVER": "false",
    }
    for name in [n for n in env if n.startswith("OTEL_")]:
        del env[name]  # Phoenix must not trace itself to somewhere this machine's variables name
    log = directory / "phoenix.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [str(executable), "serve"], env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=directory
        )
        try:
            deadline = time.monotonic() + READY_WITHIN
            while True:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"Phoenix exited ({proc.returncode}) before it served:\n{_tail(log)}"
                    )
                try:
                    with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                        if answer.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"Phoenix did not answer {url}/healthz in {READY_WITHIN:.0f}s:\n{_tail(log)}"
                    )
                time.sleep(0.2)
            yield Phoenix(url)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
