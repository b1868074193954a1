"""Wall time of one full round on the refund desk (k=3), and the same round with a model that sleeps
200 ms per call at concurrency 1, 8 and 32: waiting on models must overlap."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from bench import sleepy
from bench.corpus import REPO
from improve.evals.workspace import Workspace
from improve.loop import RoundOptions, run_round

MODULES = {"sleepy": "bench.sleepy:environment"}
"""Environments of the benchmarks' own, registered in the scratch workspace like a user's."""


def _workspace(target: Path, env: str) -> Workspace:
    if target.exists():
        shutil.rmtree(target)
    (target / "scenarios").mkdir(parents=True)
    shutil.copytree(REPO / "policies" / "refunds", target / "policies" / env)
    # The refund desk's scenarios, labelled for whichever variant of the desk runs them.
    scenarios = (REPO / "scenarios" / "refunds.yaml").read_text(encoding="utf-8")
    (target / "scenarios" / f"{env}.yaml").write_text(
        scenarios.replace("\nenvironment: refunds\n", f"\nenvironment: {env}\n"), encoding="utf-8"
    )
    module = f'module = "{MODULES[env]}"\n' if env in MODULES else ""
    (target / "improve.toml").write_text(
        f'[workspace]\nenvironment = "{env}"\n\n[environments.{env}]\n{module}\n[objective]\nk = 3\n',
        encoding="utf-8",
    )
    return Workspace.load(target / "improve.toml")


def _round(target: Path, env: str, model: str, concurrency: int) -> dict[str, Any]:
    space = _workspace(target, env)
    calls = len(sleepy.waits)
    start = time.perf_counter()
    result = run_round(space, RoundOptions(env=env, policy="v0", k=3, model=model, concurrency=concurrency))
    return {
        "seconds": round(time.perf_counter() - start, 2),
        "waited": round(sleepy.waited(calls), 2),
        "calls": len(sleepy.waits) - calls,
        "status": result.status,
        "held_out": held.after if (held := result.scores.get("held-out")) else None,
    }


def round_figures(tmp: Path, concurrencies: tuple[int, ...] = (1, 8, 32)) -> dict[str, Any]:
    plain = _round(tmp / "plain", "refunds", "naive", 8)
    slowed = {c: _round(tmp / f"sleepy-{c}", "sleepy", "sleepy", c) for c in concurrencies}
    base = slowed[concurrencies[0]]["seconds"]
    return {
        "round_k3_seconds": plain["seconds"],
        "round_status": plain["status"],
        "sleepy_200ms": {str(c): r["seconds"] for c, r in slowed.items()},
        "speedup_vs_concurrency_1": {str(c): round(base / r["seconds"], 1) for c, r in slowed.items()},
        # The seconds with at least one call waiting: how well the waits overlap, less bound to the
        # machine's load than the wall time (on a busy machine the CPU work between calls dominates).
        "sleepy_200ms_waited": {str(c): r["waited"] for c, r in slowed.items()},
        "sleepy_200ms_calls": {str(c): r["calls"] for c, r in slowed.items()},
        "waiting_overlap_vs_concurrency_1": {
            str(c): round(slowed[concurrencies[0]]["waited"] / max(r["waited"], 1e-9), 1)
            for c, r in slowed.items()
        },
        "note": "one round = baseline on both splits + candidate on train and held-out, k=3 (about 440 runs, "
        "one model call each at most); the sleepy model waits 200 ms per call; waited: seconds with at least "
        "one call waiting (the union of the sleeps)",
    }
