"""The refund desk with a stand-in model that costs CPU like a local model or a heavy tool would: `naive`,
but every call first spends `BUSY_SECONDS` of CPU in Python (holding the GIL, as such work does)."""

from __future__ import annotations

import time
from dataclasses import replace

from improve.runtime import Environment, load_environment
from improve.runtime.decision import DecisionRequest
from improve.runtime.models import Model, ModelReply

BUSY_SECONDS = 0.02


class Busy:
    def __init__(self, inner: Model, seconds: float) -> None:
        self.inner = inner
        self.name = f"busy-{inner.name}"
        self.seconds = seconds

    def answer(self, request: DecisionRequest) -> ModelReply:
        end = time.thread_time() + self.seconds
        spins = 0
        while time.thread_time() < end:  # CPU, not a wait: threads of one process cannot overlap it
            spins += 1
        return self.inner.answer(request)


def environment() -> Environment:
    env = load_environment("refunds")
    naive = env.models["naive"]
    return replace(
        env,
        name="busy",
        models={**env.models, "busy": lambda seed: Busy(naive(seed), BUSY_SECONDS)},
    )
