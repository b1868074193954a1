"""XState v5 in Node, for the side-by-side bench and the conformance check.

The host (`improve/machine/xstate_host/host.mjs`) and its pinned dependencies (`package.json` next to
it: `xstate` and `@marcbachmann/cel-js`) are installed with npm into a cache directory outside the
repository, keyed by the pinned versions: `$XDG_CACHE_HOME/improve/xstate/<pins>/` (`~/.cache` when
unset). `install()` runs npm once; `installed()` only looks, so tests never touch the network. A run
copies the host and a driver script into a temporary folder whose `node_modules` points at the cache
(Node resolves an ES module's bare imports from the folder it lives in, not from the working
directory), feeds the driver one JSON document on stdin and reads one from stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from improve.errors import ImproveError

HOST_DIR = Path(__file__).resolve().parents[1] / "improve" / "machine" / "xstate_host"
DRIVER = Path(__file__).resolve().parent / "xstate_driver.mjs"
STAMP = ".installed"


class NodeUnavailable(ImproveError):
    """Node, npm or the pinned install is missing; the message says which and how to get it."""


class DriverFailed(ImproveError):
    """The driver script exited non-zero (a bug in the host or driver, not a difference found)."""


def pins() -> dict[str, str]:
    """The pinned npm dependencies of the host, from its package.json."""
    deps: dict[str, str] = json.loads((HOST_DIR / "package.json").read_text(encoding="utf-8"))["dependencies"]
    return deps


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = "+".join(f"{name.rsplit('/', 1)[-1]}-{version}" for name, version in sorted(pins().items()))
    return root / "improve" / "xstate" / key


def node() -> str:
    found = shutil.which("node")
    if found is None:
        raise NodeUnavailable("node is not on PATH: install Node 18 or later to run the XState peer")
    return found


def installed() -> Path | None:
    """The cache directory when the pinned install is complete there, else None (never downloads)."""
    folder = cache_dir()
    return folder if (folder / STAMP).exists() else None


def install() -> Path:
    """The pinned install, made with npm on first use (network); raises `NodeUnavailable` on failure."""
    node()
    folder = installed()
    if folder is not None:
        return folder
    npm = shutil.which("npm")
    if npm is None:
        raise NodeUnavailable("npm is not on PATH: it installs the pinned xstate and cel-js packages")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text(
        json.dumps({"private": True, "dependencies": pins()}, indent=2) + "\n", encoding="utf-8"
    )
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--no-package-lock"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise NodeUnavailable(f"npm install into {folder} failed: {' / '.join(tail)}")
    (folder / STAMP).write_text(json.dumps(pins()) + "\n", encoding="utf-8")
    return folder


class Peer:
    """XState in a Node process that stays up (the driver's "serve" mode): `timed_pass` folds every thread
    once more and returns the seconds Node measured, so a caller can time its own side in between."""

    def __init__(self, process: subprocess.Popen[str], events: int) -> None:
        self._process = process
        self.events = events

    def timed_pass(self) -> float:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        stdin.write("pass\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise DriverFailed(f"the XState driver stopped (exit {self._process.wait()})")
        seconds: float = json.loads(line)["seconds"]
        return seconds


@contextmanager
def serve_driver(folder: Path, payload: dict[str, Any]) -> Iterator[Peer]:
    """The driver in "serve" mode with `payload` (a "bench" payload): warmed up, ready for passes; closed
    (stdin shut, the process waited for) when the block ends."""
    with tempfile.TemporaryDirectory(prefix="improve-xstate-") as tmp:
        work = Path(tmp)
        shutil.copy(HOST_DIR / "host.mjs", work / "host.mjs")
        shutil.copy(DRIVER, work / "driver.mjs")
        (work / "node_modules").symlink_to(folder / "node_modules", target_is_directory=True)
        with subprocess.Popen(
            [node(), str(work / "driver.mjs"), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as process:
            assert process.stdin is not None and process.stdout is not None and process.stderr is not None
            try:
                process.stdin.write(json.dumps(payload) + "\n")
                process.stdin.flush()
                ready = process.stdout.readline()
                if not ready:
                    raise DriverFailed(f"the XState driver failed to start: {process.stderr.read()[-2000:]}")
                yield Peer(process, json.loads(ready)["events"])
            except BaseException:
                process.kill()
                raise
            process.stdin.close()
            if process.wait(timeout=60) != 0:
                raise DriverFailed(f"the XState driver failed: {process.stderr.read()[-2000:]}")


def run_driver(folder: Path, payload: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Run the driver under Node with `payload` on stdin; its JSON answer."""
    with tempfile.TemporaryDirectory(prefix="improve-xstate-") as tmp:
        work = Path(tmp)
        shutil.copy(HOST_DIR / "host.mjs", work / "host.mjs")
        shutil.copy(DRIVER, work / "driver.mjs")
        (work / "node_modules").symlink_to(folder / "node_modules", target_is_directory=True)
        done = subprocess.run(
            [node(), str(work / "driver.mjs")],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    if done.returncode != 0:
        raise DriverFailed(
            f"the XState driver failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer
