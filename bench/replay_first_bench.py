"""Model calls per round, replay-first against full re-runs, side by side in one run (`make bench`).

One k = 3 round of a bundled desk with its `naive` stand-in, twice in fresh scratch workspaces: once
with replay-first candidate runs (the default), once with every candidate run from scratch
(`replay_first = false`). The stand-in is wrapped so every call it answers is counted, whoever asks
(the suites, the counterfactual runs of the diagnosis and of the branches check); the calls of each
side are read back from the round's threads (a usage entry not marked `reused` is a call the model
answered). The two rounds must decide the same with the same scores: the figures say whether they do.

Desks: the refund desk (one decision per ticket) and the code agent (several decisions per run).
"""

from __future__ import annotations

import importlib
import json
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.corpus import REPO
from improve.evals.workspace import Workspace
from improve.log import USAGE_EVENT, JsonlDirStore, ThreadId
from improve.loop import RoundOptions, RoundRecord, run_round
from improve.runtime import Environment, load_environment
from improve.runtime.decision import DecisionRequest
from improve.runtime.models import Model, ModelReply

DESKS = ("refunds", "code-agent")
_lock = threading.Lock()
answered: dict[str, int] = {}
"""Calls each counted desk's stand-in answered, by desk."""


class Counted:
    """`inner`, counting every call it answers (`advance`, a call answered from a recording, is not one)."""

    def __init__(self, inner: Model, desk: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.desk = desk

    def answer(self, request: DecisionRequest) -> ModelReply:
        with _lock:
            answered[self.desk] = answered.get(self.desk, 0) + 1
        return self.inner.answer(request)

    def advance(self, request: DecisionRequest, number: int) -> None:
        advance = getattr(self.inner, "advance", None)
        if advance is not None:
            advance(request, number)


def counted(desk: str) -> Environment:
    """The desk named `counted-<desk>`, its `naive` stand-in counted."""
    env = load_environment(desk)
    naive = env.models["naive"]
    return replace(
        env, name=f"counted-{desk}", models={**env.models, "naive": lambda seed: Counted(naive(seed), desk)}
    )


def refunds() -> Environment:
    return counted("refunds")


def code_agent() -> Environment:
    return counted("code-agent")


MODULES = {"refunds": "bench.replay_first_bench:refunds", "code-agent": "bench.replay_first_bench:code_agent"}


def _workspace(target: Path, desk: str) -> Workspace:
    name = f"counted-{desk}"
    if target.exists():
        shutil.rmtree(target)
    (target / "scenarios").mkdir(parents=True)
    shutil.copytree(REPO / "policies" / desk, target / "policies" / name)
    scenarios = (REPO / "scenarios" / f"{desk}.yaml").read_text(encoding="utf-8")
    (target / "scenarios" / f"{name}.yaml").write_text(
        scenarios.replace(f"\nenvironment: {desk}\n", f"\nenvironment: {name}\n"), encoding="utf-8"
    )
    (target / "improve.toml").write_text(
        f'[workspace]\nenvironment = "{name}"\n\n[environments.{name}]\nmodule = "{MODULES[desk]}"\n\n'
        "[objective]\nk = 3\n",
        encoding="utf-8",
    )
    return Workspace.load(target / "improve.toml")


def thread_calls(traces: Path, k: int) -> dict[str, int]:
    """The calls each side of a round asked its model, read from its threads: baseline and candidate on
    their first k runs, and on the reruns."""
    store = JsonlDirStore(traces)
    counts = dict.fromkeys(("baseline", "candidate", "baseline_reruns", "candidate_reruns", "reused"), 0)
    for thread_id in store.list_threads(limit=1_000_000).thread_ids:
        parsed = ThreadId.parse(thread_id)
        if parsed is None:
            continue
        side = "baseline" if parsed.policy_version == "v0" else "candidate"
        if parsed.run > k:
            side += "_reruns"
        for entry in store.read(thread_id):
            if entry.type == USAGE_EVENT:
                counts["reused" if entry.event.get("reused") else side] += 1
    return counts


def _answered(desk: str) -> int:
    # The counter of the module the workspace loaded the environment from (this file may run as __main__).
    module = importlib.import_module(__name__ if __name__ != "__main__" else "bench.replay_first_bench")
    return int(module.answered.get(desk, 0))


def one_round(target: Path, desk: str, replay_first: bool) -> dict[str, Any]:
    space = _workspace(target, desk)
    before = _answered(desk)
    start = time.perf_counter()
    record = run_round(
        space,
        RoundOptions(env=f"counted-{desk}", policy="v0", k=3, model="naive", replay_first=replay_first),
    )
    seconds = time.perf_counter() - start
    calls = thread_calls(space.traces, 3)
    total = _answered(desk) - before
    in_threads = sum(v for key, v in calls.items() if key != "reused")
    return {
        "seconds": round(seconds, 2),
        "model_calls": total,
        **calls,
        "counterfactual": total - in_threads,
        "decision": _decision(record),
    }


def _decision(record: RoundRecord) -> dict[str, Any]:
    return {
        "status": record.status,
        "scores": {
            split: {"before": s.before, "after": s.after, "p": s.p, "extra_runs": s.extra_runs}
            for split, s in record.scores.items()
        },
    }


def replay_first_figures(tmp: Path, desks: tuple[str, ...] = DESKS) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for desk in desks:
        full = one_round(tmp / f"{desk}-full", desk, replay_first=False)
        first = one_round(tmp / f"{desk}-replay-first", desk, replay_first=True)
        same = full.pop("decision") == first.pop("decision")
        candidate = lambda r: r["candidate"] + r["candidate_reruns"]  # noqa: E731
        figures[desk] = {
            "full_runs": full,
            "replay_first": first,
            "same_decision_and_scores": same,
            "round_calls_ratio": round(first["model_calls"] / max(1, full["model_calls"]), 3),
            "candidate_calls_ratio": round(candidate(first) / max(1, candidate(full)), 3),
        }
    figures["note"] = (
        "one k=3 round per desk and mode with the naive stand-in; model_calls: every call the stand-in "
        "answered in the round; baseline/candidate(_reruns): calls asked by each side's threads; reused: "
        "answers replay-first took from the baseline's runs; counterfactual: the diagnosis's and the "
        "branches check's counterfactual runs"
    )
    return figures


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="improve-bench-replay-first-") as tmp:
        print(json.dumps(replay_first_figures(Path(tmp)), indent=2))
