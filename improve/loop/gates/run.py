"""Running the gates on one candidate, in order, stopping at the first failure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from improve.loop.gates.gate import GateContext, GateResult
from improve.loop.gates.registry import gates_for


def run_gates(document: Any, ctx: GateContext, source: str = "candidate") -> list[GateResult]:
    """Every gate of `ctx.gates` in order until the first failure; the results so far."""
    # A fresh copy per candidate: what the gates make of it (config, machine) never leaks into the next.
    gates = ctx.gates or gates_for()
    run = replace(ctx, document=document, source=source, config=None, machine=None, gates=gates)
    results: list[GateResult] = []
    for gate in gates:
        try:
            result = gate.run(run)
        except Exception as err:  # a gate must never crash on a candidate: that is a failure too
            result = GateResult(
                gate.name,
                False,
                f"the {gate.name} gate could not check this document ({type(err).__name__}: {err})",
            )
        if not isinstance(result, GateResult) or result.name != gate.name:
            result = GateResult(
                gate.name,
                False,
                f"the {gate.name} gate returned {result!r}; a gate returns GateResult({gate.name!r}, ok, detail)",
            )
        results.append(result)
        if not result.ok:
            break
    ctx.words = run.words  # the vocabulary is the environment's, the same for every candidate
    return results


def passed(results: Sequence[GateResult]) -> bool:
    """Whether every gate passed (`run_gates` stops at the first failure, so a pass is every gate run)."""
    return bool(results) and all(r.ok for r in results)
