"""Load a local page in headless Chromium over the DevTools protocol: its console errors, uncaught
exceptions, the requests it made and a screenshot. The protocol's websocket is spoken here with the
standard library (a handshake and unfragmented text frames are all it takes), so the tests need no
websocket package. Only 127.0.0.1 is ever contacted."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WAIT_S = 300
"""How long a silent browser is waited for before the test fails instead of hanging: a bound for a broken
browser, not a measure of speed. Every step waits for the browser's own word (its DevTools address on
stderr, the page's load event, a command's reply), never for time to pass."""


FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


@dataclass
class PageLoad:
    errors: list[str] = field(default_factory=list)
    """console.error / console.assert calls, uncaught exceptions and browser log entries at error level."""
    requests: list[str] = field(default_factory=list)
    """Every URL the page asked for, the page itself included."""
    screenshot: bytes = b""


class _Socket:
    def __init__(self, url: str) -> None:
        match = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        assert match, url
        host, port, path = match[1], int(match[2]), match[3]
        self.url = url
        self.sock = socket.create_connection((host, port), timeout=WAIT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.next_id = 0

    def close(self) -> None:
        self.sock.close()

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            data += chunk
        return data

    def send(self, method: str, **params: Any) -> int:
        self.next_id += 1
        payload = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        size = len(payload)
        head = bytes([0x81]) + (
            bytes([0x80 | size])
            if size < 126
            else bytes([0x80 | 126]) + struct.pack(">H", size)
            if size < 65536
            else bytes([0x80 | 127]) + struct.pack(">Q", size)
        )
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        return self.next_id

    def receive(self) -> dict[str, Any]:
        message = b""
        while True:
            first, second = self._exact(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack(">H", self._exact(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self._exact(8))[0]
            message += self._exact(size)
            if first & 0x80:  # FIN
                result: dict[str, Any] = json.loads(message)
                return result


def _devtools_address(proc: subprocess.Popen[str]) -> str:
    """The browser's DevTools websocket, as Chromium prints it on stderr once it listens; the rest of
    stderr (D-Bus complaints) is drained on a thread so the browser never blocks on a full pipe."""
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r"DevTools listening on (ws://\S+)", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return found[1]
    raise AssertionError(f"Chromium exited ({proc.wait()}) without opening its DevTools endpoint")


def load_page(chromium: str, page: Path, *, width: int = 1200, height: int = 2000) -> PageLoad:
    """Open `page` in a fresh headless Chromium, wait for its load event, and report what its console
    said, what it requested, and a PNG screenshot of `width` x `height`."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    proc = subprocess.Popen(
        [
            chromium,
            *FLAGS,
            "--remote-debugging-port=0",  # the browser picks a free port and says which
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    sockets: list[_Socket] = []
    try:
        browser = _Socket(_devtools_address(proc))
        sockets.append(browser)
        created = browser.send("Target.createTarget", url="about:blank")
        target = _reply(browser, created)["targetId"]
        host = browser.url.split("/devtools/", 1)[0]
        ws = _Socket(f"{host}/devtools/page/{target}")
        sockets.append(ws)
        for method in ("Runtime.enable", "Log.enable", "Network.enable", "Page.enable"):
            ws.send(method)
        ws.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        url = page.resolve().as_uri()
        ws.send("Page.navigate", url=url)
        result = PageLoad()
        # Loaded: a promise evaluated in the page resolves once its document is ours and complete. Sent
        # to the first about:blank, the navigation destroys its context and the reply is an error: then
        # it is sent again, to the new document. No event order across the browser's processes matters.
        loaded = (
            "new Promise(done => { const ours = () => document.readyState === 'complete' && "
            f"location.href === {json.dumps(url)}; if (ours()) done(true); "
            "else addEventListener('load', () => done(ours())); })"
        )
        probe = ws.send("Runtime.evaluate", expression=loaded, awaitPromise=True)
        shot: int | None = None
        while True:
            message = ws.receive()
            method = message.get("method")
            params = message.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                result.errors.append(
                    " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
                )
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                result.errors.append(
                    details.get("exception", {}).get("description") or details.get("text", "")
                )
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                result.errors.append(params["entry"].get("text", ""))
            elif method == "Network.requestWillBeSent":
                result.requests.append(params["request"]["url"])
            elif message.get("id") == probe:
                if message.get("result", {}).get("result", {}).get("value") is True:
                    shot = ws.send("Page.captureScreenshot", format="png")
                else:  # the context went away with the navigation: ask the new document
                    probe = ws.send("Runtime.evaluate", expression=loaded, awaitPromise=True)
            elif shot is not None and message.get("id") == shot:
                result.screenshot = base64.b64decode(message["result"]["data"])
                return result
    finally:
        for sock in sockets:
            sock.close()
        # The whole process group: Chromium's renderer and GPU children outlive a killed parent and
        # keep writing to the profile, which then could not be removed.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _reply(ws: _Socket, id_: int) -> dict[str, Any]:
    """The result of command `id_` (events before it are dropped: nothing is listening yet)."""
    while True:
        message = ws.receive()
        if message.get("id") == id_:
            result: dict[str, Any] = message["result"]
            return result


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height
