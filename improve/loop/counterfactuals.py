"""What counterfactual runs found, remembered across the rounds of a loop (`improve.loop.evidence`).

A counterfactual run with a stand-in model is a function of what it is run from, and a loop of rounds
asks many of the same runs again: each round against the same policy diagnoses the same baseline.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Counterfactuals:
    """How far from its labels each counterfactual run ended (0: it passed; `evidence._apart`), by a digest of everything the run is a function of: the
    environment (its name, machine and files' hashes: its tools, world and stand-ins are code in those
    files), the stand-in model's name, the scenario, the decision and the option that answers
    it, the policy, the run's seed and the recorded run it starts from. Only a run whose every answer
    comes from that (a stand-in model, seeded) is kept: a model behind an endpoint samples, and asking
    it again is what a run does. Kept by a loop of rounds (`run_rounds`, the demo) across its rounds,
    the most recent `limit` answers."""

    def __init__(self, limit: int = 50_000) -> None:
        self.limit = limit
        self._found: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()  # counterfactual runs are checked from a pool of threads

    def get(self, key: str) -> float | None:
        with self._lock:
            found = self._found.get(key)
            if found is not None:
                self._found.move_to_end(key)
            return found

    def put(self, key: str, distance: float) -> None:
        with self._lock:
            self._found[key] = distance
            self._found.move_to_end(key)
            while len(self._found) > self.limit:
                self._found.popitem(last=False)


@dataclass(frozen=True)
class StandIn:
    """What makes a counterfactual run's answers reproducible: the environment's files and the name of
    the stand-in model it was run with (`Counterfactuals`)."""

    env_hashes: Mapping[str, str]
    model: str


_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str | None:
    """A digest of JSON-like data; None for anything else (a value whose text may not say all of it:
    such a run is not remembered)."""
    try:
        return hashlib.sha256(_JSON.encode(value).encode()).hexdigest()
    except (TypeError, ValueError):
        return None
