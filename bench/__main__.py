"""`python -m bench`: print benchmark figures as one JSON document on stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from bench.chat_bench import chat_figures
from bench.cluster_bench import cluster_figures
from bench.explore_bench import explore_figures
from bench.replay_bench import replay_figures
from bench.replay_first_bench import replay_first_figures
from bench.round_bench import round_figures
from bench.startup_bench import startup_figures
from bench.warehouse_bench import warehouse_figures
from bench.xstate_bench import xstate_figures
from improve.loop.proposers.generalize import Generalization


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--threads", type=int, default=20_000, help="threads in the replay corpus")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (medians reported)")
    parser.add_argument("--ingest-threads", type=int, default=20_000, help="threads in the ingest corpus")
    parser.add_argument(
        "--only",
        choices=[
            "startup",
            "replay",
            "xstate",
            "warehouse",
            "explore",
            "round",
            "replay-first",
            "cluster",
            "chat",
        ],
        help="run one section",
    )
    parser.add_argument(
        "--xstate-threads", type=int, default=2_000, help="refund-approval threads run through XState"
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="growth instead: replay, ingest and a round at 10k, 100k and 1M entries (see bench/scale_bench.py)",
    )
    parser.add_argument(
        "--sizes", default="10000,100000,1000000", help="with --scale: entry counts, comma-separated"
    )
    parser.add_argument(
        "--round-sizes",
        help="with --scale: the round's entry counts, or none (default: --sizes; a 1M-entry round is long)",
    )
    parser.add_argument(
        "--generalize",
        action="store_true",
        help="out of sample instead: each bundled desk's demo, then v0 and its final policy on generated "
        "cases with careful and naive (see bench/generalize_bench.py)",
    )
    parser.add_argument("--cases", type=int, default=400, help="with --generalize: generated cases per desk")
    parser.add_argument(
        "--fixtures",
        action="store_true",
        help="with --generalize: the fifteen desks of other domains in tests/fixtures/desks too",
    )
    parser.add_argument(
        "--design",
        choices=list(get_args(Generalization)),
        help="with --generalize: the rule miner's design (default: its default; see "
        "improve/loop/proposers/generalize.py)",
    )
    parser.add_argument(
        "--desks", help="with --generalize: the desks to run, comma-separated (default: every bundled desk)"
    )
    args = parser.parse_args()
    if args.generalize:
        from bench.generalize_bench import DESKS, FIXTURE_DESKS, generalize_figures

        desks = (*DESKS, *FIXTURE_DESKS) if args.fixtures else DESKS
        if args.desks:
            desks = tuple(args.desks.split(","))
        with tempfile.TemporaryDirectory(prefix="improve-bench-generalize-") as tmp:
            figures = generalize_figures(Path(tmp), args.cases, desks, design=args.design)
            json.dump({"generalize": figures}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if args.scale:
        from bench.scale_bench import scale_figures

        with tempfile.TemporaryDirectory(prefix="improve-bench-scale-") as tmp:
            sizes = tuple(int(size) for size in args.sizes.split(","))
            rounds = (
                None
                if not args.round_sizes
                else ()
                if args.round_sizes == "none"
                else tuple(int(size) for size in args.round_sizes.split(","))
            )
            json.dump({"scale": scale_figures(Path(tmp), sizes, rounds)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    figures: dict[str, object] = {"machine": {"cores": os.cpu_count()}}
    sections: list[Section] = [
        (
            "startup",
            "start-up of improve --help and each command's --help",
            lambda tmp: startup_figures(args.repeat),
        ),
        (
            "replay",
            f"replay over {args.threads} threads",
            lambda tmp: replay_figures(tmp, args.threads, args.repeat),
        ),
        (
            "xstate",
            f"{args.xstate_threads} refund-approval threads through XState v5 (Node), the interpreter and replay",
            lambda tmp: xstate_figures(tmp, args.xstate_threads, args.repeat),
        ),
        ("explore", "exploration proof", lambda tmp: explore_figures(args.repeat)),
        (
            "round",
            "one improvement round, then with a 200 ms model at concurrency 1, 8, 32",
            lambda tmp: round_figures(tmp),
        ),
        (
            "replay-first",
            "model calls per round, replay-first against full re-runs, on the refund desk and the code agent (k=3)",
            lambda tmp: replay_first_figures(tmp),
        ),
        (
            "cluster",
            "one round (k=3) and 10 runs per scenario, locally and on a Dask LocalCluster of 1 and 2 worker "
            "processes",
            lambda tmp: cluster_figures(tmp, args.repeat),
        ),
        (
            "chat",
            "the chat adapter per decision against a bare post, then a 200 ms endpoint at concurrency 1, 8, 32",
            lambda tmp: chat_figures(args.repeat),
        ),
        (
            "warehouse",
            f"ingest of {args.ingest_threads} threads",
            lambda tmp: warehouse_figures(tmp, args.ingest_threads, args.repeat),
        ),
    ]
    failed = run_sections(figures, sections, args.only)
    json.dump(figures, sys.stdout, indent=2)
    sys.stdout.write("\n")
    if failed:
        sys.exit(f"bench: failed sections: {', '.join(failed)} (their errors are in the JSON)")


Section = tuple[str, str, Callable[[Path], Any]]
"""A section of `make bench`: its name, what it measures, and the run that returns its figures."""


def run_sections(figures: dict[str, object], sections: list[Section], only: str | None = None) -> list[str]:
    """Run the sections (or the one named `only`) into `figures`, each in a temporary folder of its own;
    the names of those that failed. A section that fails, or exits, is reported in `figures` with its
    error, and the sections before and after it still run and print; an interrupt (Ctrl-C) stops the run
    there, and the sections finished before it still print."""
    failed = []
    for name, what, run in sections:
        if only not in (None, name):
            continue
        print(f"bench: {what} ...", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix=f"improve-bench-{name}-") as tmp:
            try:
                figures[name] = run(Path(tmp))
            except KeyboardInterrupt:
                failed.append(name)
                figures[name] = {"error": "interrupted"}
                break
            except (Exception, SystemExit) as error:
                failed.append(name)
                trace = traceback.format_exception(error)
                figures[name] = {"error": f"{type(error).__name__}: {error}", "traceback": trace[-3:]}
                print(f"bench: {name} failed: {type(error).__name__}: {error}", file=sys.stderr)
    return failed


if __name__ == "__main__":
    main()
