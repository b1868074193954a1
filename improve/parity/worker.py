"""Each side's runner runs in a worker process of its own, with a time limit on every run.

A runner is people's code (an old agent loop imported as `module:function`) or a policy run that may
call a model endpoint. In the comparing process it could hang the comparison forever, or end it with
`sys.exit(0)` so that CI sees a green exit and an empty report. In a worker, whatever the runner does
reaches the comparison as a result or as a `RunError` naming the side, the scenario and the model:

- a run that takes longer than the time limit: the worker is killed;
- `SystemExit`, `KeyboardInterrupt` (raised by the runner, not typed by a person) or any exception;
- a worker that dies (`os._exit`, a crash, the out-of-memory killer).

One worker serves every run of its side, in order, for the whole comparison: a runner that keeps
state between calls (a counter, a cache) behaves as it would in-process, so the determinism check
still sees that state. The worker is forked, so the runner, its environment and its imports are
inherited rather than pickled; only scenarios go in and `ParityRun`s come out. Where `fork` is not
available (Windows), or when no time limit is asked for, runs stay in-process (`InProcess`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from improve.errors import ConfigError, ImproveError, RunError
from improve.evals import Scenario
from improve.parity.runners import ParityRun, Runner, Side

DEFAULT_RUN_TIMEOUT = 300.0
"""Seconds one run (one scenario with one model, on one side) may take. Stand-in models finish in
milliseconds and a policy calling a hosted model in seconds to a minute; five minutes is a hang."""

_STOP_GRACE = 2.0
"""Seconds a worker gets to exit after being asked to, before it is killed."""


class SideRunner(Protocol):
    def run(self, scenario: Scenario, model: str) -> ParityRun: ...

    def close(self) -> None: ...


def _where(side: Side, scenario: Scenario, model: str) -> str:
    return f"{side.kind} {side.ref} on scenario {scenario.id} with model {model}"


def _checked(side: Side, scenario: Scenario, model: str, result: Any) -> ParityRun:
    if not isinstance(result, ParityRun):
        raise RunError(
            f"{side.kind} {side.ref} returned {type(result).__name__} for scenario {scenario.id}; "
            "a runner returns improve.parity.ParityRun"
        )
    return result


def _escaped(side: Side, scenario: Scenario, model: str, what: str) -> RunError:
    """The runner ended its run with SystemExit or KeyboardInterrupt instead of returning."""
    return RunError(
        f"{_where(side, scenario, model)} raised {what} instead of returning a ParityRun: a runner must "
        "return its result, never exit; nothing was compared"
    )


@dataclass
class InProcess:
    """Runs the side's runner in this process: no time limit, but the same errors as the worker."""

    side: Side
    env_name: str

    def run(self, scenario: Scenario, model: str) -> ParityRun:
        try:
            result = self.side.runner(self.env_name, scenario, model)
        except ImproveError:
            raise
        except (SystemExit, KeyboardInterrupt) as exc:
            raise _escaped(self.side, scenario, model, repr(exc)) from None
        except Exception as exc:
            raise RunError(
                f"{self.side.kind} {self.side.ref} could not complete scenario {scenario.id} with model "
                f"{model}: {exc!r}"
            ) from exc
        return _checked(self.side, scenario, model, result)

    def close(self) -> None:
        pass


def _serve(runner: Runner, env_name: str, conn: Connection) -> None:
    """The worker's loop: one (scenario, model) in, one (kind, value) out, until told to stop."""
    # Ctrl-C at the terminal reaches the whole process group: the comparing process handles it (and
    # stops this worker); a KeyboardInterrupt the runner raises itself is still caught below.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        scenario, model = task
        reply: tuple[str, Any]
        try:
            reply = ("ok", runner(env_name, scenario, model))
        except ImproveError as exc:
            reply = ("improve", exc)
        except Exception as exc:
            reply = ("exception", repr(exc))
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: the runner tried to end the run
            reply = ("escaped", repr(exc))
        try:
            conn.send(reply)  # pickled whole before anything is written: a failure leaves the pipe clean
        except Exception as exc:
            conn.send(("exception", f"its result could not be sent back ({type(reply[1]).__name__}: {exc})"))


@dataclass
class Worker:
    """The side's runner in a forked process of its own; `run` waits at most `timeout` seconds."""

    side: Side
    env_name: str
    timeout: float
    _conn: Connection | None = field(default=None, init=False)
    _process: BaseProcess | None = field(default=None, init=False)

    def _start(self) -> Connection:
        context = multiprocessing.get_context("fork")
        parent, child = context.Pipe()
        process = context.Process(
            target=_serve,
            args=(self.side.runner, self.env_name, child),
            name=f"parity {self.side.ref}",
            daemon=True,
        )
        process.start()
        child.close()
        self._conn, self._process = parent, process
        return parent

    def run(self, scenario: Scenario, model: str) -> ParityRun:
        conn = self._conn or self._start()
        where = _where(self.side, scenario, model)
        try:
            conn.send((scenario, model))
            ready = conn.poll(self.timeout)
        except (BrokenPipeError, EOFError, OSError):
            ready = True  # the worker is gone: recv below says how it ended
        if not ready:
            self.close()
            raise RunError(
                f"{where} did not finish within {self.timeout:g} s, so the comparison stopped: a runner "
                "that waits on something that never comes hangs here; fix it, or give more time with "
                "--timeout SECONDS"
            )
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            code = self._exit_code()
            self.close()
            raise RunError(
                f"{where}: the runner's worker process ended (exit code {code}) before returning a result: "
                "a runner must return a ParityRun, not exit the process (os._exit) or crash it"
            ) from None
        if kind == "ok":
            return _checked(self.side, scenario, model, value)
        if kind == "improve":
            assert isinstance(value, ImproveError)
            raise value
        if kind == "escaped":
            raise _escaped(self.side, scenario, model, value)
        raise RunError(
            f"{self.side.kind} {self.side.ref} could not complete scenario {scenario.id} with model {model}: {value}"
        )

    def _exit_code(self) -> int | None:
        if self._process is None:
            return None
        self._process.join(_STOP_GRACE)
        return self._process.exitcode

    def close(self) -> None:
        """Ask the worker to stop; kill it if it does not (it may be stuck in a hanging run)."""
        conn, process = self._conn, self._process
        self._conn = self._process = None
        if conn is not None:
            with contextlib.suppress(OSError):  # a worker that already died cannot be asked
                conn.send(None)
            conn.close()
        if process is not None:
            process.join(0.2 if process.is_alive() else 0)
            if process.is_alive():
                process.terminate()
                process.join(_STOP_GRACE)
            if process.is_alive():
                process.kill()
                process.join()
            process.close()


def side_runner(side: Side, env_name: str, timeout: float | None) -> SideRunner:
    """A worker with a time limit; in-process when `timeout` is None or this platform cannot fork."""
    if timeout is None or "fork" not in multiprocessing.get_all_start_methods():
        return InProcess(side, env_name)
    if timeout <= 0:
        raise ConfigError(f"--timeout {timeout:g}: a run's time limit must be more than 0 seconds")
    return Worker(side, env_name, timeout)
