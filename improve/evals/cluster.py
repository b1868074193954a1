"""`--executor`: where a command's runs go. `local` (threads of this process, the default) or
`dask://HOST:PORT`, a Dask distributed scheduler whose workers take the runs in batches.

    [workspace]
    executor = "dask://10.0.0.5:8786"     # the default --executor of run, score, round, parity compare

dask is an optional extra (`pip install 'improve-agents[cluster]'`) and is imported only when a command is
given a `dask://` executor. What a worker needs (docs/scale-out.md): improve and the environment's
package installed, the workspace at the same path (its root is put on the workers' `sys.path`, so an
environment module of the workspace imports), and the model cache directory reachable when a model
behind an endpoint records its calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from improve.errors import ClusterError, WorkspaceError
from improve.evals.fanout import Fanout

LOCAL = "local"
DASK_SCHEME = "dask://"
CONNECT_TIMEOUT_S = 10.0
"""Seconds to reach the scheduler, and then to see at least one worker."""

_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})\Z")


@dataclass(frozen=True)
class ExecutorChoice:
    """A parsed `--executor`: `local`, or a Dask scheduler's address."""

    kind: Literal["local", "dask"]
    address: str | None = None
    """The scheduler as distributed spells it: `tcp://HOST:PORT`."""

    def __str__(self) -> str:
        return LOCAL if self.address is None else f"{DASK_SCHEME}{self.address.removeprefix('tcp://')}"


def parse_executor(text: str, where: str = "--executor") -> ExecutorChoice:
    """`local` or `dask://HOST:PORT`; anything else is refused, saying what is expected."""
    value = text.strip()
    if value == LOCAL:
        return ExecutorChoice("local")
    if value.startswith(DASK_SCHEME):
        address = value[len(DASK_SCHEME) :]
        match = _ADDRESS.match(address)
        if match and 0 < int(match["port"]) < 65536:
            return ExecutorChoice("dask", f"tcp://{address}")
    raise WorkspaceError(
        f"{where}: {text!r} is not an executor; expected `local` or `dask://HOST:PORT` (a Dask scheduler, "
        "e.g. dask://127.0.0.1:8786, as `dask scheduler` prints it)"
    )


@contextmanager
def open_fanout(choice: ExecutorChoice, root: Path, timeout: float | None = None) -> Iterator[Fanout | None]:
    """Connect to the chosen executor for one command: None for `local`; for a Dask scheduler, a
    `Fanout` onto its workers, with the workspace root on their `sys.path` and each model's
    concurrency cap held by a semaphore the whole cluster shares. The client is closed on the way out.
    `timeout`: seconds to reach the scheduler and see a worker (default `CONNECT_TIMEOUT_S`)."""
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    if choice.kind == LOCAL or choice.address is None:
        yield None
        return
    try:
        import distributed
    except ImportError:
        raise ClusterError(
            f"--executor {choice} needs dask's distributed scheduler, which is not installed: "
            "pip install 'improve-agents[cluster]' (or run with --executor local)"
        ) from None
    from improve.evals.dask_worker import ModelSemaphores, WorkspaceOnPath

    how = (
        "start one with `dask scheduler` and at least one `dask worker "
        f"{choice.address}`, check the address and that its port is reachable from here, or run with "
        "--executor local"
    )
    try:
        client = distributed.Client(choice.address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as error:
        raise ClusterError(
            f"--executor {choice}: no Dask scheduler answered at {choice.address} within {timeout:g} s "
            f"({error}); {how}"
        ) from None
    try:
        try:
            client.wait_for_workers(1, timeout=timeout)
        except (OSError, TimeoutError):
            raise ClusterError(
                f"--executor {choice}: the scheduler at {choice.address} has no worker after {timeout:g} s; {how}"
            ) from None
        # Plugins reach the workers that join later too; the same name replaces an earlier command's.
        client.register_plugin(WorkspaceOnPath(str(root)), name=f"improve-workspace:{root}")
        workers = sum(client.nthreads().values())
        yield Fanout(
            client.get_executor(pure=False),
            workers=workers,
            gate=ModelSemaphores(),
            where=f"the Dask cluster at {choice.address} ({workers} worker threads)",
        )
    finally:
        client.close()
