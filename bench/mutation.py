"""`python -m bench.mutation`: a bounded mutation run over the core modules, outside `make test`.

Cosmic Ray (pinned in the dev extras) mutates each listed file; this script keeps the run small and
repeatable. For every module it:

1. copies the checkout (tracked and untracked, not ignored files) into a temporary directory, so the
   worktree is never mutated in place and the copy's `improve` shadows the installed one;
2. lets `cosmic-ray init` enumerate every mutant of the module's files;
3. keeps a fixed sample of `--mutants` of them (default 25), seeded (`--seed`, default 14) and drawn
   round-robin across operator families (comparison, boolean, binary operator, number, `not`, ...) so
   the many near-identical binary-operator variants do not crowd out the rest; the others are marked
   skipped in the session database;
4. runs `cosmic-ray exec` with only the test files that cover the module (`pytest -x`, so a killed
   mutant stops at its first failing test);
5. prints JSON: per module, mutants, killed, survived, score (killed / (killed + survived)), and each
   survivor as file:line operator, so it can be judged equivalent or turned into a test.

`--only NAME` runs one module; `--keep DIR` keeps the session databases (for `cosmic-ray dump`);
`--resume DIR` takes the samples kept there and tests only their survivors again (after new tests).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Module:
    name: str
    files: tuple[str, ...]
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()


# The tests listed are the ones that exercise the module; a deselected test is slow for a reason
# unrelated to the module's logic (it waits out a lock timeout), and is still part of `make test`.
MODULES: tuple[Module, ...] = (
    Module("log", ("improve/log/replay.py",), ("tests/test_replay.py",)),
    Module("runtime", ("improve/runtime/decision.py",), ("tests/test_runtime.py",)),
    Module("machine", ("improve/machine/interpreter.py",), ("tests/test_machine.py",)),
    Module(
        "loop.gates",
        ("improve/loop/gates/run.py", "improve/loop/gates/explore.py"),
        ("tests/test_gates.py",),
    ),
    Module(
        "evals",
        ("improve/evals/promotion.py", "improve/evals/scorecards.py"),
        ("tests/test_scorecard.py",),
    ),
    Module(
        "warehouse.ingest",
        ("improve/warehouse/ingest.py",),
        ("tests/test_warehouse.py", "tests/test_importers.py"),
        ("tests/test_warehouse.py::test_a_second_ingest_waits_for_the_lock_then_fails_clearly",),
    ),
)


def _cosmic_ray() -> list[str]:
    exe = Path(sys.executable).with_name("cosmic-ray")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cosmic_ray.cli"]


def _copy_checkout(dest: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():  # policies/<env> link into improve/examples: keep them links
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, target)


def _annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (line, col) spans of type annotations. The modules use `from __future__ import annotations`,
    so a mutated annotation is never evaluated: an equivalent mutant, not sampled."""
    spans = []
    for node in ast.walk(ast.parse(path.read_text())):
        ann: ast.expr | None = None
        if isinstance(node, ast.arg | ast.AnnAssign):
            ann = node.annotation
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            ann = node.returns
        if ann is not None and ann.end_lineno is not None and ann.end_col_offset is not None:
            spans.append(((ann.lineno, ann.col_offset), (ann.end_lineno, ann.end_col_offset)))
    return spans


def _in_annotation(item: Any, spans: dict[str, list[tuple[tuple[int, int], tuple[int, int]]]]) -> bool:
    mutation = item.mutations[0]
    pos = tuple(mutation.start_pos)
    return any(start <= pos < end for start, end in spans[str(mutation.module_path)])


def _family(operator: str) -> str:
    # "core/ReplaceComparisonOperator_Lt_Gt" -> "ReplaceComparisonOperator"
    return operator.split("/")[-1].split("_")[0]


def _sample(items: list[Any], n: int, seed: int) -> list[Any]:
    """A seeded draw of n items, round-robin across operator families in name order."""
    rng = random.Random(seed)
    by_family: dict[str, list[Any]] = defaultdict(list)
    for item in sorted(
        items,
        key=lambda w: (
            str(w.mutations[0].module_path),
            w.mutations[0].operator_name,
            w.mutations[0].occurrence,
        ),
    ):
        by_family[_family(item.mutations[0].operator_name)].append(item)
    for family in by_family.values():
        rng.shuffle(family)
    chosen: list[Any] = []
    families = sorted(by_family)
    while len(chosen) < n and any(by_family[f] for f in families):
        for f in families:
            if by_family[f] and len(chosen) < n:
                chosen.append(by_family[f].pop())
    return chosen


def _digests(checkout: Path, files: tuple[str, ...]) -> dict[str, str]:
    return {f: hashlib.sha256((checkout / f).read_bytes()).hexdigest() for f in files}


def run_module(
    module: Module, work: Path, n: int, seed: int, timeout: float, resume: Path | None = None
) -> dict[str, Any]:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    checkout = work / "checkout"
    if checkout.exists():
        shutil.rmtree(checkout)
    _copy_checkout(checkout)
    deselect = "".join(f" --deselect {d}" for d in module.deselect)
    command = f"{sys.executable} -m pytest -x -q -p no:cacheprovider {' '.join(module.tests)}{deselect}"
    config = work / f"{module.name}.toml"
    session = work / f"{module.name}.sqlite"
    files = ", ".join(json.dumps(f) for f in module.files)
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = [{files}]\n"
        f"timeout = {timeout}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )
    env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONDONTWRITEBYTECODE="1")
    # The unmutated tests must pass in the copy, or every mutant would count as killed.
    baseline = subprocess.run(command.split(), cwd=checkout, env=env, capture_output=True, text=True)
    if baseline.returncode != 0:
        sys.exit(f"mutation: {module.name}: the tests fail unmutated:\n{baseline.stdout[-3000:]}")
    spans = {f: _annotation_spans(checkout / f) for f in module.files}
    if resume is not None:
        # The same sample, its survivors tested again (after tests were added); the module's files must
        # be the ones the session's mutants were placed in.
        kept = json.loads((resume / f"{module.name}.files.json").read_text())
        if kept != _digests(checkout, module.files):
            sys.exit(f"mutation: {module.name}: the files changed since {resume}; run without --resume")
        shutil.copy2(resume / f"{module.name}.sqlite", session)
        with use_db(str(session), WorkDB.Mode.open) as db:
            everything = list(db.work_items)
            items = [w for w in everything if not _in_annotation(w, spans)]
            results = dict(db.results)
        chosen = {j for j, r in results.items() if r.worker_outcome != WorkerOutcome.SKIPPED}
        again = [j for j in chosen if results[j].test_outcome == TestOutcome.SURVIVED]
        with sqlite3.connect(session) as con:
            con.executemany("DELETE FROM work_results WHERE job_id = ?", [(j,) for j in again])
    else:
        subprocess.run([*_cosmic_ray(), "init", str(config), str(session)], cwd=checkout, env=env, check=True)
        with use_db(str(session), WorkDB.Mode.open) as db:
            everything = list(db.work_items)
            items = [w for w in everything if not _in_annotation(w, spans)]
            chosen = {w.job_id for w in _sample(items, n, seed)}
            skipped = [w.job_id for w in everything if w.job_id not in chosen]
            db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    (work / f"{module.name}.files.json").write_text(json.dumps(_digests(checkout, module.files)))
    subprocess.run(
        [*_cosmic_ray(), "exec", str(config), str(session)],
        cwd=checkout,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    killed = survived = incompetent = 0
    survivors: list[str] = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if item.job_id not in chosen:
                continue
            mutation = item.mutations[0]
            if result.test_outcome == TestOutcome.SURVIVED:
                survived += 1
                line = mutation.start_pos[0]
                op = mutation.operator_name.split("/")[-1]
                survivors.append(f"{mutation.module_path}:{line} {op}#{mutation.occurrence}")
            elif result.test_outcome == TestOutcome.INCOMPETENT:
                incompetent += 1
            else:
                killed += 1
    scored = killed + survived
    return {
        "files": list(module.files),
        "tests": list(module.tests),
        "mutants_total": len(items),
        "in_annotations_not_sampled": len(everything) - len(items),
        "mutants": len(chosen),
        "killed": killed,
        "survived": survived,
        "incompetent": incompetent,
        "score": round(killed / scored, 3) if scored else None,
        "survivors": sorted(survivors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mutation", description=__doc__)
    parser.add_argument("--mutants", type=int, default=25, help="sampled mutants per module")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant's test run")
    parser.add_argument("--only", choices=[m.name for m in MODULES], action="append")
    parser.add_argument("--keep", type=Path, help="keep the session databases in this directory")
    parser.add_argument(
        "--resume", type=Path, help="a --keep directory: the same samples, only their survivors tested again"
    )
    args = parser.parse_args()
    figures: dict[str, Any] = {"seed": args.seed, "per_module": args.mutants, "modules": {}}
    with tempfile.TemporaryDirectory(prefix="improve-mutation-") as tmp:
        work = Path(tmp)
        for module in MODULES:
            if args.only and module.name not in args.only:
                continue
            print(f"mutation: {module.name} ({', '.join(module.files)}) ...", file=sys.stderr)
            figures["modules"][module.name] = run_module(
                module, work, args.mutants, args.seed, args.timeout, args.resume
            )
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy2(work / f"{module.name}.sqlite", args.keep)
                shutil.copy2(work / f"{module.name}.files.json", args.keep)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
