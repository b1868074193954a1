"""What runs inside the workers of a Dask cluster: the plugin that makes the workspace importable, and
the semaphores that cap each model's calls across the whole cluster.

Imported only by `cluster.open_fanout` (and by the workers, when they unpickle a batch), so nothing
else loads dask.
"""

from __future__ import annotations

import functools
import sys
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from distributed import Semaphore, WorkerPlugin


class WorkspaceOnPath(WorkerPlugin):
    """Puts the workspace root first on each worker's `sys.path`, as the command's own process has it:
    a `module = "desk.env:environment"` of improve.toml (or a parity runner `desk.legacy:run`) imports
    in the worker. The path must exist there: the same directory on a shared file system."""

    def __init__(self, root: str) -> None:
        self.root = root

    def setup(self, worker: Any) -> None:
        if self.root not in sys.path:
            sys.path.insert(0, self.root)


@functools.lru_cache(maxsize=64)
def _semaphore(name: str, leases: int) -> Semaphore:
    # One object per worker process and model: each keeps a lease-refresh callback on the worker's loop.
    return Semaphore(max_leases=leases, name=name)


@dataclass(frozen=True)
class ModelSemaphores:
    """A `ModelGate`: the Dask semaphore named for a model and its cap. The cap is part of the name, since
    the scheduler refuses one name with two caps (a changed improve.toml, a scheduler kept running)."""

    prefix: str = "improve-model"

    def __call__(self, model: str, concurrency: int) -> AbstractContextManager[Any]:
        gate: AbstractContextManager[Any] = _semaphore(f"{self.prefix}:{model}:{concurrency}", concurrency)
        return gate
