"""Wall time of one round on the refund desk (k=3) with the local executor, then on a Dask `LocalCluster`
of 1 and 2 single-threaded worker processes; and of the runs alone (`write_threads` over every open
scenario), where the cluster's share of the work is all of it: with the cheap `sloppy` stand-in, and
with `busy` (bench/busy.py), a stand-in that spends CPU on every call as a local model or a heavy tool
would.

A round sends only its suites to the cluster: diagnosis, the gates, the counterfactual runs and the
warehouse stay in the command's process, so the round gains less than its runs do. The figures are
for this machine: on a host whose cores are busy with other work, two workers gain little.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.corpus import REPO
from bench.round_bench import _workspace
from improve.evals import Fanout, SuiteSpec, load_scenarios, open_fanout, parse_executor, write_threads
from improve.log import JsonlDirStore
from improve.loop import RoundOptions, run_round
from improve.runtime import load_environment, load_policy


@contextmanager
def _executor(workers: int, root: Path) -> Iterator[Fanout | None]:
    """None for the local executor; else a fresh LocalCluster of `workers` processes, one thread each."""
    if workers == 0:
        yield None
        return
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=workers,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=None,
        worker_dashboard_address=None,
    ) as cluster:
        address = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
        with open_fanout(parse_executor(address), root) as fanout:
            yield fanout


def _round(target: Path, workers: int) -> dict[str, Any]:
    space = _workspace(target, "refunds")
    with _executor(workers, space.root) as fanout:
        if fanout is not None:  # the workers' first imports are the cluster's start-up, not the round's
            _runs(target / "warm", fanout, k=1)
        start = time.perf_counter()
        result = run_round(
            space, RoundOptions(env="refunds", policy="v0", k=3, model="naive", executor=fanout)
        )
        seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 2), "status": result.status, "decision": result.decision_detail}


def _runs(target: Path, fanout: Fanout | None, k: int, busy: bool = False) -> tuple[float, int]:
    """The refund desk's open scenarios x k with `sloppy`, or with the CPU-bound `busy` stand-in."""
    env = (
        load_environment("busy", {"busy": "bench.busy:environment"}, REPO)
        if busy
        else load_environment("refunds")
    )
    scenarios = [
        s.model_copy(update={"environment": env.name})
        for s in load_scenarios(REPO / "scenarios" / "refunds.yaml").open_scenarios
    ]
    spec = SuiteSpec(load_policy(REPO / "policies" / "refunds" / "v0.json"), "busy" if busy else "sloppy", k)
    start = time.perf_counter()
    plan = write_threads(
        env, scenarios, spec, JsonlDirStore(target), fresh=True, concurrency=8, executor=fanout
    )
    return time.perf_counter() - start, len(plan)


def _runs_alone(target: Path, workers: int, repeat: int) -> dict[str, Any]:
    with _executor(workers, target) as fanout:
        if fanout is not None:
            _runs(target / "warm", fanout, k=1)
            _runs(target / "warm-busy", fanout, k=1, busy=True)
        cheap = [_runs(target / f"runs-{i}", fanout, k=10) for i in range(repeat)]
        busy = [_runs(target / f"busy-{i}", fanout, k=2, busy=True) for i in range(repeat)]
    return {
        "seconds": round(statistics.median(t[0] for t in cheap), 2),
        "runs": cheap[0][1],
        "busy_seconds": round(statistics.median(t[0] for t in busy), 2),
        "busy_runs": busy[0][1],
    }


def cluster_figures(tmp: Path, repeat: int = 3, workers: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    def label(n: int) -> str:
        return "local" if n == 0 else f"dask_{n}_worker{'s' if n > 1 else ''}"

    rounds = {label(n): _round(tmp / f"cluster-round-{n}", n) for n in workers}
    decisions = {r["decision"] for r in rounds.values()}
    runs = {label(n): _runs_alone(tmp / f"cluster-runs-{n}", n, repeat) for n in workers}
    return {
        "round_k3_seconds": {name: r["seconds"] for name, r in rounds.items()},
        "round_status": sorted({r["status"] for r in rounds.values()}),
        "same_decision": len(decisions) == 1,
        "runs_k10_seconds": {name: r["seconds"] for name, r in runs.items()},
        "runs": next(iter(runs.values()))["runs"],
        "busy_runs_k2_seconds": {name: r["busy_seconds"] for name, r in runs.items()},
        "busy_runs": next(iter(runs.values()))["busy_runs"],
        # The host's other work takes cores from the workers: a figure under load says little.
        "load_average_1min": round(os.getloadavg()[0], 2),
        "note": "one round = baseline on both splits + candidate on train and held-out, k=3, with reruns; only "
        "its suites go to the cluster. runs_k10 = the refund desk's open scenarios x 10 with the sloppy "
        "stand-in, written to a JSONL directory (median of the repeats): about a millisecond of CPU per run, less "
        "than shipping its thread back costs. busy_runs_k2 = the same scenarios x 2 with a stand-in that spends 20 ms "
        "of CPU per call (bench/busy.py), where workers add cores. Dask workers are processes with one thread each, started "
        "and warmed before timing.",
    }
