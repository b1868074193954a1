"""Models that answer decision requests, and deterministic stand-ins for tests and demos.

A model sees a `DecisionRequest` and answers one event. Real models are reached through an
OpenAI-compatible endpoint (`runtime/chat.py`); stand-ins are plain functions of the request and a
seeded random generator, so a whole evaluation runs offline and reproduces exactly. A fresh model is
made per run, seeded from the scenario id and the run number.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from improve.errors import ActorCrash, ImproveError, raised
from improve.runtime.decision import DecisionRequest


@dataclass(frozen=True)
class ModelReply:
    event: dict[str, Any] | None
    """The answer, parsed (never evaluated); None when the model gave nothing usable (a refusal)."""
    input_tokens: int
    output_tokens: int
    cost_usd: float | None = None
    """What the call cost, from the model's price table; None without one."""
    recorded: bool = False
    """Answered from a recorded response, not by the endpoint."""
    fingerprint: str | None = None
    """The endpoint's `system_fingerprint`, when it reports one."""


class Model(Protocol):
    """Answers decision requests. A model may also have `advance(request, number)`: a call of its run
    was answered from a recording (replay-first), so it moves on as if it had been asked that call,
    and its later answers are the ones a run asking every call would get (a stand-in draws from its
    generator, a model behind an endpoint numbers its next samples after it)."""

    name: str

    def answer(self, request: DecisionRequest) -> ModelReply: ...


Behaviour = Callable[[DecisionRequest, random.Random], dict[str, Any] | None]
"""A stand-in's mind: the request and a seeded generator in, one event (or None) out."""

ModelFactory = Callable[[str], Model]
"""Makes a fresh model instance from a seed string."""


def runs_overlap(models: ModelFactory) -> bool:
    """Whether runs of the stand-in models `models` makes gain from going at once: whether they wait.
    A `StandInModel` answers at once, in Python, so its runs on several threads only take turns holding
    the GIL, and each hand-over costs (the code-agent demo's rounds: 15% more CPU on eight threads than
    on one); those run one at a time, whatever concurrency was asked. Any other model (one that waits
    like a remote one) overlaps. A model behind an endpoint always does: ask this of stand-ins only."""
    return not isinstance(models("concurrency"), StandInModel)


SYSTEM_PROMPT_TOKENS = 180
"""What the instructions around a request cost, so token counts look like a real call's."""


class StandInModel:
    """A deterministic model: `behaviour` decides, token counts follow from the request's size."""

    def __init__(self, name: str, behaviour: Behaviour, seed: str) -> None:
        self.name = name
        self._behaviour = behaviour
        self._rng = random.Random(f"{name}:{seed}")

    def answer(self, request: DecisionRequest) -> ModelReply:
        try:
            event = self._behaviour(request, self._rng)
        except ImproveError:
            raise  # a stand-in may fail as a model does (`ModelCallError`): the policy's onError
        except Exception as err:
            # The environment's own Python, as a tool is: its bug, or a scenario's value it cannot read
            # (an enumerated value misspelt), said with the file and line, never as a traceback.
            raise ActorCrash(
                f"stand-in model '{self.name}' crashed on decision '{request.name}': {raised(err)}"
            ) from err
        size = len(json.dumps(request.to_input(), separators=(",", ":"), default=str))
        input_tokens = SYSTEM_PROMPT_TOKENS + size // 4
        output_tokens = 12 + len(json.dumps(event or {})) // 4 + self._rng.randint(8, 40)
        return ModelReply(event=event, input_tokens=input_tokens, output_tokens=output_tokens)

    def advance(self, request: DecisionRequest, number: int) -> None:
        """A call answered from a recording: draw as answering it would, so the run's later calls draw
        what they would have (the answer is the recording's)."""
        self.answer(request)


def stand_in(name: str, behaviour: Behaviour) -> ModelFactory:
    """A factory of fresh, seeded instances of one stand-in behaviour."""

    def make(seed: str) -> Model:
        return StandInModel(name, behaviour, seed)

    return make


def first_option(request: DecisionRequest) -> dict[str, Any] | None:
    return dict(request.options[0]) if request.options else None


def option(request: DecisionRequest, event_type: str, **payload: Any) -> dict[str, Any] | None:
    """The offered option of this type (matching the payload given), or None when it is not offered."""
    for opt in request.options:
        if opt["type"] == event_type and all(opt.get(k) == v for k, v in payload.items()):
            return dict(opt)
    return None
