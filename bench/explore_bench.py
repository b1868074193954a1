"""Exploration: states explored per second, and the time to a complete proof that the refund desk's
sentinel is unreachable under its probe world (boundary payloads, every tool output, failing tools)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from improve.machine.explore import can_reach, explore_paths
from improve.runtime import load_environment


def explore_figures(repeat: int) -> dict[str, Any]:
    env = load_environment("refunds")
    assert env.probe is not None
    proof_times, rates = [], []
    states = transitions = 0
    for _ in range(repeat):
        start = time.perf_counter()
        states = transitions = 0
        for inp in env.probe_inputs:
            result = can_reach(env.machine, "illegallyIssued", inp, env.probe)
            assert result.complete and not result.reachable
            states += result.states
            transitions += result.transitions
        elapsed = time.perf_counter() - start
        proof_times.append(elapsed)
        rates.append(states / elapsed)
    full = explore_paths(env.machine, env.probe_inputs[1], env.probe)
    return {
        "proof": "illegallyIssued unreachable for every probe input, search complete",
        "probe_inputs": len(env.probe_inputs),
        "states": states,
        "transitions": transitions,
        "proof_seconds": round(statistics.median(proof_times), 3),
        "states_per_s": round(statistics.median(rates)),
        "terminals_for_one_input": full.terminals,
    }
