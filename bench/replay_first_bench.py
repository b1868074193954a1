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
from collections.abc import Callable
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
        # Reruns run when the rule asks: the counted stand-in is taken for a model that waits, and a rerun
        # run ahead and dropped would count as a call no thread asked (bench/round_bench.py times them).
        "[objective]\nk = 3\nrun_ahead = false\n",
        encoding="utf-8",
    )
    return Workspace.load(target / "improve.toml")


def thread_calls(traces: Path, k: int, baseline: str = "v0", only: set[str] | None = None) -> dict[str, int]:
    """The calls each side of a round asked its model, read from its threads: baseline (`baseline`, the
    policy version) and candidate on their first k runs, and on the reruns. `only`: the threads to read
    (a round's own, in a workspace holding earlier rounds' too)."""
    store = JsonlDirStore(traces)
    counts = dict.fromkeys(("baseline", "candidate", "baseline_reruns", "candidate_reruns", "reused"), 0)
    for thread_id in store.list_threads(limit=1_000_000).thread_ids:
        parsed = ThreadId.parse(thread_id)
        if parsed is None or (only is not None and thread_id not in only):
            continue
        side = "baseline" if parsed.policy_version == baseline else "candidate"
        if parsed.run > k:
            side += "_reruns"
        for entry in store.read(thread_id):
            if entry.type == USAGE_EVENT:
                counts["reused" if entry.event.get("reused") else side] += 1
    return counts


def _files(traces: Path) -> dict[str, tuple[int, int]]:
    """Each thread file's (size, mtime): what a round wrote is what differs after it."""
    return {p.stem: (p.stat().st_size, p.stat().st_mtime_ns) for p in traces.glob("*.jsonl")}


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
        "branches check's counterfactual runs; reruns run when the rule asks (run_ahead = false)"
    )
    return figures


def real_model_figures(
    tmp: Path,
    k: int = 2,
    say: Callable[[str], None] = print,
    recordings: Path | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """Refund-desk rounds with the small real model (SmolLM2-135M behind llama-cpp-python on 127.0.0.1),
    k runs each, replay-first, then the same rounds with every candidate run from scratch, each mode in a
    workspace of its own; `rounds` consecutive rounds as a user runs them (`improve demo`'s reviewer
    merges a recommended candidate, and the next round starts from it), each counted on its own.

    Every round records the model's answers (`cache = "record"`, the default). The full rounds start with
    the replay-first rounds' recordings: a request those asked is answered from its recording, one they
    never asked goes to the server, so the full rounds cost hours less on a busy machine, ask the model
    the very requests rounds of full re-runs ask (each counted in `calls`), and are answered as they
    would have been (temperature 0). `calls`: the requests the round's runs asked the model (live,
    answered from a recording, or a repeat of one); `reused`: answers replay-first runs took from the
    baseline's threads without asking. A round reads the baseline's runs the workspace already recorded
    with the same stamp (the candidate runs of the round before, when it was merged; the baseline's,
    when it was discarded) and asks nothing for them: `baseline` counts only the calls asked now.
    `recordings`: a cache directory the replay-first rounds start with (an interrupted measurement's:
    its answers are counted in `calls` as `recorded`)."""
    from improve.demo import merge_as_reviewer, prepare
    from improve.llm import CACHE_DIR, Meter, local_server

    figures: dict[str, Any] = {}
    with local_server(say=say) as server:
        spec = server.spec()
        section = (
            f'\n[models.local]\nmodel = "{spec.model}"\nbase_url = "{server.url}"\n'
            f'api_key_env = "{spec.api_key_env}"\ncontext_tokens = {spec.context_tokens}\n'
            "timeout_s = 1800\nconcurrency = 1\n"
        )
        records: dict[str, list[dict[str, Any]]] = {}
        for name, replay_first in (("replay_first", True), ("full_runs", False)):
            space = prepare(tmp / f"real-{name}", "refunds", section)
            if not replay_first:
                shutil.copytree(tmp / "real-replay_first" / CACHE_DIR, space.root / CACHE_DIR)
            elif recordings is not None:
                shutil.copytree(recordings, space.root / CACHE_DIR)
            figures[name], records[name] = [], []
            policy = "v0"
            for number in range(1, rounds + 1):
                meter = Meter()
                before = _files(space.traces)
                start = time.perf_counter()
                record = run_round(
                    space,
                    RoundOptions(policy=policy, k=k, model="local", replay_first=replay_first, meter=meter),
                    say=lambda m, n=f"{name} round {number}": say(f"[{n}] {m}"),
                )
                counts = meter.to_json()
                written = {t for t, stat in _files(space.traces).items() if before.get(t) != stat}
                one = {
                    "round": number,
                    "baseline_policy": policy,
                    "seconds": round(time.perf_counter() - start, 1),
                    **{
                        key: counts[key]
                        for key in ("calls", "live", "recorded", "repeated", "reused", "failed")
                    },
                    **thread_calls(space.traces, k, policy, written),
                    "status": record.status,
                }
                figures[name].append(one)
                records[name].append(_decision(record))
                say(f"[{name} round {number}] {json.dumps(one)}")
                if record.status == "recommended" and record.pr and record.candidate_version:
                    merge_as_reviewer(space, str(record.pr.branch), lambda m, n=name: say(f"[{n}] {m}"))
                    policy = record.candidate_version
                elif record.status in ("blocked", "nothing-to-fix", "nothing-left-to-try"):
                    break
    candidate = lambda r: r["candidate"] + r["candidate_reruns"]  # noqa: E731
    by_round = []
    for first, full, decided, decided_full in zip(
        figures["replay_first"],
        figures["full_runs"],
        records["replay_first"],
        records["full_runs"],
        strict=False,
    ):
        by_round.append(
            {
                "round": first["round"],
                "same_decision_and_scores": decided == decided_full,
                "decision": decided,
                "round_calls_ratio": round(first["calls"] / max(1, full["calls"]), 3),
                "candidate_calls_ratio": round(candidate(first) / max(1, candidate(full)), 3),
            }
        )
    figures["by_round"] = by_round
    total = {n: sum(r["calls"] for r in figures[n]) for n in ("replay_first", "full_runs")}
    figures["all_rounds_calls_ratio"] = round(total["replay_first"] / max(1, total["full_runs"]), 3)
    figures["note"] = (
        f"refund desk, k={k}, {rounds} consecutive round(s) per mode in one workspace (a recommended "
        "candidate merged as improve demo's reviewer does, the next round against it), SmolLM2-135M-Instruct "
        "Q4_1 via llama-cpp-python; the full rounds answered from the replay-first rounds' recordings where "
        "they asked what those asked (calls counts every request either way); baseline/candidate(_reruns): "
        "calls asked by each side's threads the round wrote; a round reads the baseline runs its workspace "
        "recorded with the same stamp (the round before's candidate runs, once merged) and asks nothing for "
        "them, in both modes; by_round[0] is the first round, which pays for its baseline"
    )
    return figures


if __name__ == "__main__":
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m bench.replay_first_bench", description=__doc__)
    parser.add_argument("--real-model", action="store_true", help="the refund desk with the small real model")
    parser.add_argument("--k", type=int, default=2, help="with --real-model: runs per scenario")
    parser.add_argument("--recordings", type=Path, help="with --real-model: a cache to start from")
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --real-model: consecutive rounds per mode"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="improve-bench-replay-first-") as tmp:
        if args.real_model:
            found = real_model_figures(
                Path(tmp),
                args.k,
                lambda m: print(m, file=sys.stderr, flush=True),
                args.recordings,
                args.rounds,
            )
        else:
            found = replay_first_figures(Path(tmp))
        print(json.dumps(found, indent=2))
