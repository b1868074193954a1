"""The demo behind `make demo`: a bundled desk (the refund desk unless told) improved round by round, in
a scratch copy.

It writes the desk's workspace into a scratch directory (a git repository of its own, as
`improve init --from refunds` would), then runs improvement rounds with the `naive` stand-in model
(or `--model local`: SmolLM2-135M on this machine, its server started for the demo and stopped after,
`improve.llm.local`) and the `rules` proposer. Between rounds it plays the reviewer:
the person's step, printed as such, merges the recommended branch; the next round starts from the
merged version. The tool itself never merges.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

from improve.evals import Workspace, p_value
from improve.llm import OPENAI_PREFIX, CacheMode, Meter, local_server
from improve.loop import MAX_DISCARDED_IN_A_ROW, Counterfactuals, RoundOptions, RoundRecord, run_round
from improve.runtime import load_environment
from improve.scaffold import write_desk

DESK = "refunds"
LOCAL = "local"
"""`--model local`: the small real model, served on this machine for the demo."""


@dataclass
class DemoSummary:
    rounds: list[RoundRecord]
    start_version: str
    final_version: str
    start_held_out: float | None
    final_held_out: float | None
    workspace: Path
    seconds: float = 0.0
    model_calls: str = ""
    """The model's calls over every round (`Meter.summary`), for a model behind an endpoint."""


def prepare(target: Path, env: str = DESK, models: str = "") -> Workspace:
    """A fresh scratch workspace written from the bundled desk `env` (as `improve init --from NAME`
    does), with `models` (improve.toml sections) added, under git, with generated files ignored."""
    if target.exists():
        shutil.rmtree(target)
    write_desk(load_environment(env), target)
    if models:
        config = target / "improve.toml"
        config.write_text(config.read_text(encoding="utf-8") + models, encoding="utf-8")
    commit_workspace(target, user="improve demo", message="The example workspace")
    return Workspace.load(target / "improve.toml")


def commit_workspace(root: Path, *, user: str, message: str) -> git.Repo:
    """Make `root` a git repository on `main` whose first commit holds the workspace (improve.toml,
    scenarios/, policies/), with generated files ignored: where a round's branches go."""
    (root / ".gitignore").write_text("traces/\nreports/\n.improve/\n", encoding="utf-8")
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", user)
        config.set_value("user", "email", "improve@example.invalid")
    repo.index.add([".gitignore", "improve.toml", "scenarios", "policies"])
    repo.index.commit(message)
    return repo


def merge_as_reviewer(space: Workspace, branch: str, say: Callable[[str], None]) -> None:
    """The person's step: review and merge the branch (the tool never does this itself)."""
    repo = git.Repo(space.root)
    say(f"[person] reviews {branch} and merges it: git merge --no-ff {branch}")
    repo.git.merge("--no-ff", branch, "-m", f"Merge {branch} (reviewed)")


def run_demo(
    target: Path,
    rounds: int = 6,
    k: int = 3,
    say: Callable[[str], None] = print,
    model: str = "naive",
    cache: CacheMode = "record",
    env: str = DESK,
) -> DemoSummary:
    started = time.monotonic()
    with _served(model, say) as models:
        summary = demo_rounds(prepare(target, env, models), rounds, k, say, model, cache)
    summary.seconds = time.monotonic() - started
    return summary


@contextmanager
def _served(model: str, say: Callable[[str], None]) -> Iterator[str]:
    """The improve.toml section of the demo's model: `[models.local]`, its server running for the block,
    for `--model local`; nothing for a stand-in."""
    if model != LOCAL:
        yield ""
        return
    with local_server(say=say) as server:
        spec = server.spec()
        yield (
            f"\n# The small real model of `improve demo --model local`, served for the demo on this machine.\n"
            f'[models.{LOCAL}]\nmodel = "{spec.model}"\nbase_url = "{server.url}"\napi_key_env = "{spec.api_key_env}"\n'
            f"context_tokens = {spec.context_tokens}\ntimeout_s = {spec.timeout_s:g}\nconcurrency = 1\n"
        )


def demo_rounds(
    space: Workspace, rounds: int, k: int, say: Callable[[str], None], model: str, cache: CacheMode
) -> DemoSummary:
    meter = Meter(say=lambda m: say(f"   {m}"))
    counterfactuals = Counterfactuals()  # a round against the same policy as the last asks the same runs
    # A stand-in's runs take a moment; a real model's take minutes, and their progress is worth seeing.
    quiet = model not in space.config.models and not model.startswith(OPENAI_PREFIX)
    current = "v0"
    results: list[RoundRecord] = []
    discarded_in_a_row = 0
    for number in range(1, rounds + 1):
        say(f"\n== round {number}: improve round --policy {current} --k {k} --proposer rules ==")
        options = RoundOptions(
            policy=current,
            k=k,
            model=model,
            proposer="rules",
            cache=cache,
            meter=meter,
            counterfactuals=counterfactuals,
        )
        result = run_round(
            space, options, say=lambda m: None if quiet and _is_progress(m) else say(f"   {m}")
        )
        results.append(result)
        say(line(result))
        if result.status == "recommended" and result.pr and result.candidate_version:
            merge_as_reviewer(space, str(result.pr.branch), say)
            current, discarded_in_a_row = result.candidate_version, 0
            continue
        if result.status != "discarded" and not result.nothing_new:
            break
        # Where the next round aims after a discarded candidate (a narrower or broader rule for its
        # cluster, or the next cluster) is the workspace's memory of discarded candidates, as for any
        # `improve round`.
        discarded_in_a_row += 1
        if discarded_in_a_row >= MAX_DISCARDED_IN_A_ROW:
            say(f"{MAX_DISCARDED_IN_A_ROW} rounds in a row recommended nothing against {current}: stopping")
            break
    held = [r.scores["held-out"] for r in results if r.scores.get("held-out")]
    promoted = [r for r in results if r.status == "recommended"]
    # A first round that never replayed a candidate still scored its baseline on held-out.
    cards = [c for c in results[0].scorecards if c.split == "held-out"] if results else []
    start = held[0].before if held else (cards[0].pass_rate if cards else None)
    final = promoted[-1].scores["held-out"].after if promoted else start
    calls = meter.summary() if meter.calls else ""
    return DemoSummary(results, "v0", current, start, final, space.root, model_calls=calls)


def _is_progress(message: str) -> bool:
    """Per-run counters ('  train: 25/141 runs') are noise in the demo's narrative."""
    return message.startswith("  ") and message.endswith(" runs")


def line(r: RoundRecord) -> str:
    held = r.scores.get("held-out")
    cause = r.hypothesis.cause if r.hypothesis else None
    hypothesis = (r.rationale or cause or r.decision_detail or "").split(" without")[0]
    if r.behind is not None and r.rationale:
        hypothesis += f", with candidate {r.behind.candidate}'s branches"
    if held:
        return (
            f"-> {r.candidate_version}: {r.status.upper()} | {hypothesis} | held-out {held.before:.3f} -> "
            f"{held.after:.3f}{decided_by(r)} | violations {held.violations_after} | model calls/run "
            f"{held.cost_before:.2f} -> {held.cost_after:.2f}"
        )
    return f"-> {r.candidate_version or '-'}: {r.status.upper()} | {hypothesis[:160]}"


def decided_by(r: RoundRecord) -> str:
    """The test that decided, beside the status: ", exact stratified test p = 0.012 <= alpha 0.05", and
    the checks that failed when the test alone would have promoted (a status never sits next to figures
    that seem to say otherwise)."""
    held = r.scores.get("held-out")
    if held is None or held.p is None or held.alpha is None:
        return ""
    p, alpha = held.p, held.alpha
    phrase = f", {held.test} p = {p_value(p)} {'<=' if p <= alpha else '>'} alpha {alpha:g}"
    failed = re.findall(r"(?:^|; )([a-z -]+): FAIL \(", r.decision_detail)
    if r.status != "recommended" and p <= alpha and failed:
        phrase += f" but {', '.join(failed)} failed"
    return phrase
