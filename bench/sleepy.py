"""The refund desk with a stand-in model that waits like a remote one: `naive`, but every call sleeps."""

from __future__ import annotations

import time
from dataclasses import replace

from improve.runtime import Environment, load_environment
from improve.runtime.decision import DecisionRequest
from improve.runtime.models import Model, ModelReply

DELAY_SECONDS = 0.2


class Sleepy:
    def __init__(self, inner: Model, delay: float) -> None:
        self.inner = inner
        self.name = f"sleepy-{inner.name}"
        self.delay = delay

    def answer(self, request: DecisionRequest) -> ModelReply:
        time.sleep(self.delay)  # the network and the model's latency
        return self.inner.answer(request)


def environment() -> Environment:
    env = load_environment("refunds")
    naive = env.models["naive"]
    return replace(
        env,
        name="sleepy",
        models={**env.models, "sleepy": lambda seed: Sleepy(naive(seed), DELAY_SECONDS)},
    )
