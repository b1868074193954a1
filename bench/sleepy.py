"""The refund desk with a stand-in model that waits like a remote one: `naive`, but every call sleeps.

`slowed_refunds` is shared with bench/busy.py, whose stand-in spends CPU instead of waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from improve.runtime import Environment, load_environment
from improve.runtime.decision import DecisionRequest
from improve.runtime.models import Model, ModelReply

DELAY_SECONDS = 0.2


class Slowed:
    """`inner`, with `pause()` before every answer."""

    def __init__(self, inner: Model, name: str, pause: Callable[[], None]) -> None:
        self.inner = inner
        self.name = f"{name}-{inner.name}"
        self.pause = pause

    def answer(self, request: DecisionRequest) -> ModelReply:
        self.pause()
        return self.inner.answer(request)


def slowed_refunds(name: str, pause: Callable[[], None]) -> Environment:
    """The refund desk named `name`, with a stand-in `name`: its `naive` model, slowed by `pause`."""
    env = load_environment("refunds")
    naive = env.models["naive"]
    return replace(env, name=name, models={**env.models, name: lambda seed: Slowed(naive(seed), name, pause)})


waits: list[tuple[float, float]] = []
"""Every sleep's (start, end) on the monotonic clock: `waited` tells how much of a round was spent with
at least one call waiting, whatever else the machine was doing."""


def _sleep() -> None:
    start = time.perf_counter()
    time.sleep(DELAY_SECONDS)  # the network and the model's latency
    waits.append((start, time.perf_counter()))


def waited(since: int = 0) -> float:
    """Seconds during which at least one call (of `waits[since:]`) was waiting: the union of the sleeps."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(waits[since:]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def environment() -> Environment:
    return slowed_refunds("sleepy", _sleep)
