"""Out of sample: each desk's demo, then its first and its final policy on generated cases.

For every bundled desk (and, with `--fixtures`, the fifteen desks of other domains under tests/fixtures/desks,
which no part of the miner was shaped by), the demo's rounds run from `v0` with the `naive` stand-in
(k = 3, as `improve demo --env NAME`), then `v0` and the final policy each run once on the same N
cases drawn from the desk's generator (`Environment.cases`, `improve.evals.out_of_sample`), with
`careful` and with `naive`. A bundled desk's cases are labelled by `careful`'s run of `v0`; a fixture
desk's by its own handbook.

Reported per desk: the versions and held-out pass rates of the demo, the agreement of each policy with
each model, the naive margin (final minus v0, with naive), the cases where a branch of the final policy
answered and the label says otherwise, and the first of them.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.corpus import REPO
from improve.demo import commit_workspace, demo_rounds, prepare
from improve.evals import Workspace
from improve.evals.out_of_sample import CASES, out_of_sample
from improve.loop.proposers import generalize as reach
from improve.loop.proposers.generalize import Generalization

DESKS = ("refunds", "refund-approval", "triage", "tool-loop", "code-agent")
FIXTURES = REPO / "tests" / "fixtures" / "desks"
FIXTURE_DESKS = (
    "access-request",
    "cancellation",
    "library-loans",
    "expense-claims",
    "late-checkout",
    "refill-desk",
    "parcel-desk",
    "incident-desk",
    "warranty-desk",
    "card-disputes",
    "repair-desk",
    "moderation-desk",
    "grocery-subs",
    "dental-claims",
    "wire-desk",
)


def _fixture(target: Path, env: str) -> Workspace:
    """A scratch copy of the fixture workspace, aimed at `env`, under git."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(
        FIXTURES, target, ignore=shutil.ignore_patterns("__pycache__", ".improve", "traces", "reports")
    )
    config = target / "improve.toml"
    text = config.read_text(encoding="utf-8")
    config.write_text(
        text.replace('environment = "access-request"', f'environment = "{env}"'), encoding="utf-8"
    )
    commit_workspace(target, user="improve bench", message="The fixture workspace")
    return Workspace.load(config)


def desk_figures(target: Path, env: str, cases: int, rounds: int = 6) -> dict[str, Any]:
    """The demo on one desk, then v0 and its final policy out of sample."""
    space = _fixture(target, env) if env in FIXTURE_DESKS else prepare(target, env)
    started = time.perf_counter()
    summary = demo_rounds(space, rounds, 3, lambda m: None, "naive", "record")
    demo_s = time.perf_counter() - started
    environment = space.environment(env)
    versions = list(dict.fromkeys(["v0", summary.final_version]))
    policies = [space.load_policy(env, v) for v in versions]
    started = time.perf_counter()
    models = {name: environment.models[name] for name in ("careful", "naive")}
    found = {(a.policy, a.model): a for a in out_of_sample(environment, policies, models, n=cases)}
    check_s = time.perf_counter() - started
    final = summary.final_version
    return {
        "versions": [summary.start_version, *(r.candidate_version for r in summary.rounds if r.recommended)],
        "held_out": {"v0": summary.start_held_out, final: summary.final_held_out},
        "branches": [f"{b.guard} -> {b.answer}" for r in summary.rounds if r.recommended for b in r.branches],
        "cases": cases,
        "agreement": {f"{p} {m}": round(a.rate, 4) for (p, m), a in found.items()},
        "naive_margin": round(found[(final, "naive")].rate - found[("v0", "naive")].rate, 4),
        "overridden_by_a_branch": found[(final, "careful")].by_rule,
        "disagreements": [d.to_json() for d in found[(final, "careful")].shown[:3]],
        "demo_s": round(demo_s, 1),
        "check_s": round(check_s, 1),
    }


def generalize_figures(
    root: Path,
    cases: int = CASES,
    desks: tuple[str, ...] = DESKS,
    rounds: int = 6,
    design: Generalization | None = None,
) -> dict[str, Any]:
    """Every desk's figures; `design` the miner's (`generalize.DESIGNS`; default its default)."""
    if design is not None:
        reach.GENERALIZE = design
    figures: dict[str, Any] = {"design": reach.GENERALIZE}
    for env in desks:
        print(f"bench: {env}: the demo's rounds, then {cases} generated cases ...", file=sys.stderr)
        figures[env] = desk_figures(root / env, env, cases, rounds)
    return figures
