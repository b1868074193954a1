"""Where a command's runs go when they leave this process: an executor of worker processes.

By default a suite's runs are threads of this process (they wait on models, so threads overlap
them). A `Fanout` sends them to an executor instead (a `ProcessPoolExecutor`, or a Dask cluster
through `improve.evals.cluster`) in **batches**: each task runs a batch of runs and returns their
threads, which this process writes to the trace store and the ledger ingests, so the workspace's
warehouse keeps one writer and the workers need no access to it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

ModelGate = Callable[[str, int], AbstractContextManager[Any]]
"""`gate(model, concurrency)`: what a model call holds while it is in flight, so one model's cap
(`[models.NAME] concurrency`) holds across every worker of a cluster (a Dask semaphore named for the
model). Picklable: it travels with each batch. None: each worker process caps its own calls."""

MAX_BATCH = 32
"""Runs per task at most: enough to amortise a task's overhead (a few milliseconds on Dask), few enough
that the last tasks do not leave workers idle."""


@dataclass(frozen=True)
class Fanout:
    """An executor taking a command's runs, and how they are cut into tasks."""

    executor: Executor
    workers: int
    """Tasks the executor runs at once (a Dask cluster's worker threads); sizes the batches."""
    gate: ModelGate | None = None
    where: str = "an executor"
    """For messages: `the Dask cluster at tcp://...`."""

    @classmethod
    def of(cls, executor: Executor | Fanout) -> Fanout:
        """A plain executor (a process pool) as a fanout: as many tasks at once as this host has cores."""
        if isinstance(executor, Fanout):
            return executor
        return cls(executor, workers=os.cpu_count() or 1)

    def batch_size(self, runs: int) -> int:
        """About four tasks per worker, so a slow batch does not hold the rest up, at most `MAX_BATCH`."""
        return max(1, min(MAX_BATCH, math.ceil(runs / (4 * max(1, self.workers)))))

    @property
    def in_flight(self) -> int:
        """Tasks submitted ahead of their results: two per worker keeps every worker busy while the spend
        limit is still checked between batches."""
        return 2 * max(1, self.workers)
