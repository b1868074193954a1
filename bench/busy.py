"""The refund desk with a stand-in model that costs CPU like a local model or a heavy tool would: `naive`,
but every call first spends `BUSY_SECONDS` of CPU in Python (holding the GIL, as such work does)."""

from __future__ import annotations

import time

from bench.sleepy import slowed_refunds
from improve.runtime import Environment

BUSY_SECONDS = 0.02


def _spin() -> None:
    end = time.thread_time() + BUSY_SECONDS
    while time.thread_time() < end:  # CPU, not a wait: threads of one process cannot overlap it
        pass


def environment() -> Environment:
    return slowed_refunds("busy", _spin)
