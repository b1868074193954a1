"""Running the gates on one candidate, in order, stopping at the first failure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from improve.loop.gates.gate import GateContext, GateResult
from improve.loop.gates.registry import gates_for
from improve.machine import Machine, MachineConfig


@dataclass(frozen=True)
class Gated:
    """One candidate through the gates: each gate's result, and what they made of the candidate (the
    validated policy and the compiled machine, as far as the gates got), handed on to its runs."""

    results: list[GateResult]
    config: MachineConfig | None = None
    machine: Machine | None = None

    @property
    def passed(self) -> bool:
        return passed(self.results)

    @property
    def failed(self) -> GateResult | None:
        return None if self.passed or not self.results else self.results[-1]


def run_gates(document: Any, ctx: GateContext, source: str = "candidate") -> list[GateResult]:
    """Every gate of `ctx.gates` in order until the first failure; the results so far."""
    return gate(document, ctx, source).results


def gate(document: Any, ctx: GateContext, source: str = "candidate") -> Gated:
    """Every gate of `ctx.gates` in order until the first failure: the results so far, and the
    candidate as the gates validated and compiled it."""
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
    return Gated(results, run.config, run.machine)


def passed(results: Sequence[GateResult]) -> bool:
    """Whether every gate passed (`run_gates` stops at the first failure, so a pass is every gate run)."""
    return bool(results) and all(r.ok for r in results)
