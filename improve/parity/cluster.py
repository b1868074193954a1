"""Parity's runs on an executor (`parity compare --executor dask://HOST:PORT`).

Each task runs a batch of (model, scenario) pairs of one side, each pair twice in a row (the
determinism check), and sends back the `ParityRun`s; the comparison itself stays in this process. A
side's runner travels to the workers: a policy by its environment's registered name, a
`module:function` by reference (the workspace root is on the workers' `sys.path`). A runner that
keeps state between calls sees only its batch's calls, not the whole side's as with the local worker.

The time limit applies per batch (`timeout` x its runs): a batch over it stops the comparison
(`RunError`), but a thread of a Dask worker cannot be killed, so a hung runner keeps its worker
thread busy until the worker is restarted.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from improve.errors import ImproveError, RunError
from improve.evals import Fanout, ModelGate, Scenario
from improve.parity.runners import ParityRun, PolicyRunner, Side
from improve.parity.worker import InProcess
from improve.runtime import Environment

Pair = tuple[str, Scenario]
"""(model, scenario): one row of the comparison."""


@dataclass(frozen=True)
class RunTwice:
    """A pair's two fresh runs on one side."""

    first: ParityRun
    second: ParityRun


@dataclass(frozen=True)
class PairBatch:
    """One task: pairs of one side, each run twice. Picklable."""

    side: Side
    env_name: str
    pairs: tuple[Pair, ...]
    gate: ModelGate | None = None


def run_pairs(batch: PairBatch) -> list[RunTwice]:
    """Run a batch in this process (a worker): the same errors as a run in the comparing process."""
    runner = batch.side.runner
    if isinstance(runner, PolicyRunner):
        runner.gate = batch.gate
    side = InProcess(batch.side, batch.env_name)
    return [RunTwice(side.run(scenario, model), side.run(scenario, model)) for model, scenario in batch.pairs]


def run_sides_on(
    fanout: Fanout,
    env: Environment,
    sides: dict[str, Side],
    pairs: Sequence[Pair],
    timeout: float | None,
) -> dict[str, list[RunTwice]]:
    """Every pair twice on each side, on the executor; per side, in the order of `pairs`."""
    size = fanout.batch_size(2 * len(pairs))
    submitted: list[tuple[str, PairBatch, Future[list[RunTwice]]]] = []
    for name, side in sides.items():
        for start in range(0, len(pairs), size):
            batch = PairBatch(side, env.name, tuple(pairs[start : start + size]), fanout.gate)
            submitted.append((name, batch, fanout.executor.submit(run_pairs, batch)))
    results: dict[str, list[RunTwice]] = {name: [] for name in sides}
    try:
        for name, batch, future in submitted:
            limit = None if timeout is None else timeout * 2 * len(batch.pairs)
            try:
                results[name] += future.result(timeout=limit)
            except ImproveError:
                raise
            except FutureTimeout:
                first_model, first_scenario = batch.pairs[0]
                raise RunError(
                    f"{batch.side.kind} {batch.side.ref}: a batch of {len(batch.pairs)} scenario/model pair(s) "
                    f"from {first_scenario.id} with model {first_model} did not finish within {limit:g} s on "
                    f"{fanout.where}, so the comparison stopped: a runner that waits on something that never "
                    "comes hangs there (its worker thread stays busy until the worker restarts); fix it, or "
                    "give more time with --timeout SECONDS"
                ) from None
            except (
                Exception
            ) as error:  # the executor's failure, not a run's: a worker killed, the scheduler gone
                raise RunError(
                    f"{batch.side.kind} {batch.side.ref}: a batch of runs failed on {fanout.where}: "
                    f"{type(error).__name__}: {error}; nothing was compared"
                ) from error
    finally:
        for _, _, future in submitted:
            future.cancel()
    return results
