"""How one round walks its data: one recommended refund-desk round (k = 2) from `improve round` to the
PR body, counted with a profiler hook (`python -m bench.round_walk`, prints JSON).

Counted, while the round runs in this process (the CLI command itself, through typer's test runner):

- `changelog_reads`: opens of the policies' CHANGELOG.md for reading;
- `candidate_validations`: `parse_machine` calls on the candidate's document (a version other than the
  baseline's), and `policy_serializations`: `MachineConfig.model_dump` calls per policy version;
- `jsonl_store_reads`: reads of a thread file through the JSONL store, per thread (ingest's own read of
  each file into the warehouse is not one of them);
- `walk_entries`: for each module of the round's walk (the command, the round, its inputs, evidence,
  diagnosis, probes, CHANGELOG, record, renderers), how many distinct places in other modules of the
  package call into it (`sites`: a call site and the function it enters; a callback a lower layer
  calls back into counts too) and from how many modules (`modules`). The progress channel (`say`, the
  command's output) is left out, and so are the subsystems the round calls through one entry (gates,
  proposers, publish) and `branches.py`, the policy-rule helpers they all share. "No module is entered
  more than twice" reads: no module of the walk has more than two. `--full` adds every module's
  entries with their call sites (`module_entries`).
- the longest functions of the round's modules, by lines and by parameters (static, `ast`).

Not a timing: the hook slows the round down several times. Kept out of `make bench` for that reason.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from bench.corpus import REPO

PACKAGE = str(REPO / "improve") + os.sep
ROUND_MODULES = (
    "improve/cli/loop.py",
    "improve/cli/evals.py",
    "improve/loop/round.py",
    "improve/loop/inputs.py",
    "improve/loop/record.py",
    "improve/loop/changelog.py",
    "improve/loop/heldout.py",
    "improve/loop/history.py",
    "improve/loop/round_record.py",
    "improve/loop/render.py",
    "improve/loop/score.py",
    "improve/loop/evidence.py",
    "improve/loop/diagnose.py",
)
"""Where the static figures look (those that exist)."""

WALK = {
    "improve/cli/loop.py",
    "improve/loop/__init__.py",
    "improve/loop/round.py",
    "improve/loop/inputs.py",
    "improve/loop/evidence.py",
    "improve/loop/diagnose.py",
    "improve/loop/probes.py",
    "improve/loop/changelog.py",
    "improve/loop/heldout.py",
    "improve/loop/history.py",
    "improve/loop/record.py",
    "improve/loop/round_record.py",
    "improve/loop/render.py",
}
"""The modules of the round's walk (those of the code measured)."""


def _workspace(target: Path) -> Path:
    from improve.demo import commit_workspace

    target.mkdir(parents=True)
    shutil.copy(REPO / "improve.toml", target / "improve.toml")
    shutil.copytree(REPO / "scenarios", target / "scenarios")
    shutil.copytree(REPO / "policies", target / "policies")
    commit_workspace(target, user="bench", message="workspace")
    return target


class Walk:
    """The profiler hook and what it counted."""

    def __init__(self) -> None:
        self.changelog_reads = 0
        self.changelog_writes = 0
        self.validations: Counter[str] = Counter()
        self.dumps: Counter[str] = Counter()
        self.dumped_by: Counter[str] = Counter()
        self.hashes: Counter[str] = Counter()
        self.store_reads: Counter[str] = Counter()
        self.edges: Counter[tuple[str, str, int, str, str]] = Counter()
        self.handlers: dict[CodeType, Callable[[FrameType], None]] = {}

    def watch(self, function: Any, handler: Callable[[FrameType], None]) -> None:
        self.handlers[function.__code__] = handler

    def install(self) -> None:
        from pydantic import BaseModel

        from improve.log.store import JsonlDirStore

        workspace = importlib.import_module("improve.evals.workspace")
        from improve.machine import MachineConfig, config

        def opened(frame: FrameType) -> None:
            path, mode = frame.f_locals.get("self"), frame.f_locals.get("mode", "r")
            if isinstance(path, pathlib.PurePath) and path.name == "CHANGELOG.md":
                if "r" in str(mode):
                    self.changelog_reads += 1
                else:
                    self.changelog_writes += 1

        def parsed(frame: FrameType) -> None:
            data = frame.f_locals.get("data")
            if isinstance(data, dict):
                self.validations[f"{data.get('id')}@{data.get('version')}"] += 1

        def dumped(frame: FrameType) -> None:
            model = frame.f_locals.get("self")
            if isinstance(model, MachineConfig):
                self.dumps[f"{model.id}@{model.version}"] += 1
                caller = frame.f_back
                if caller is not None:
                    where = f"{_module(caller.f_code.co_filename)}:{caller.f_code.co_qualname}"
                    self.dumped_by[f"{model.id}@{model.version} by {where}"] += 1

        def hashed(frame: FrameType) -> None:
            policy = frame.f_locals.get("policy")
            if isinstance(policy, MachineConfig):
                self.hashes[f"{policy.id}@{policy.version}"] += 1

        def read(frame: FrameType) -> None:
            store, thread = frame.f_locals.get("self"), frame.f_locals.get("thread_id")
            if isinstance(store, JsonlDirStore) and isinstance(thread, str) and store.path(thread).is_file():
                self.store_reads[thread] += 1

        self.watch(pathlib.Path.open, opened)
        self.watch(config.parse_machine, parsed)
        self.watch(BaseModel.model_dump, dumped)
        self.watch(workspace.policy_hash, hashed)
        self.watch(JsonlDirStore._lines, read)
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        handler = self.handlers.get(code)
        if handler is not None:
            handler(frame)
        file = code.co_filename
        if not file.startswith(PACKAGE):
            return
        back = frame.f_back
        if back is None:
            return
        caller = back.f_code.co_filename
        if caller != file and caller.startswith(PACKAGE):
            self.edges[(caller, back.f_code.co_qualname, back.f_lineno, file, code.co_qualname)] += 1

    def stop(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _module(path: str) -> str:
    return os.path.relpath(path, REPO)


def module_entries(edges: Counter[tuple[str, str, int, str, str]]) -> dict[str, Any]:
    """Per module: the distinct call sites in other modules that enter it, and which ones."""
    sites: dict[str, set[tuple[str, str, int, str]]] = defaultdict(set)
    for caller, function, line, callee, entered in edges:
        sites[_module(callee)].add((_module(caller), function, line, entered))
    return {
        module: {
            "entries": len(found),
            "from": sorted(f"{m}:{line} {fn} -> {entered}" for m, fn, line, entered in found),
        }
        for module, found in sorted(sites.items())
    }


def longest_functions(paths: tuple[str, ...] = ROUND_MODULES, top: int = 6) -> list[dict[str, Any]]:
    """The longest functions (and methods) of the round's modules, with their parameter counts (`self`
    not counted): `lines` from `def` to the end, `body_lines` from the first statement after the
    docstring (a command's options and help text are its signature and docstring)."""
    found = []
    for rel in paths:
        path = REPO / rel
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                named = [a.arg for a in params if a.arg not in ("self", "cls")]
                body = (
                    node.body[1:] if ast.get_docstring(node) is not None and len(node.body) > 1 else node.body
                )
                end = node.end_lineno or node.lineno
                found.append(
                    {
                        "function": f"{rel}:{node.name}",
                        "lines": end - node.lineno + 1,
                        "body_lines": end - body[0].lineno + 1,
                        "parameters": len(named) + bool(args.vararg) + bool(args.kwarg),
                    }
                )
    by_lines = sorted(found, key=lambda f: -f["lines"])[:top]
    by_params = sorted(found, key=lambda f: -f["parameters"])[:top]
    return [*by_lines, *(f for f in by_params if f not in by_lines)]


def walk(tmp: Path, k: int = 2) -> dict[str, Any]:
    from typer.testing import CliRunner

    from improve.cli.main import app

    root = _workspace(tmp / "ws")
    for name in ("GITHUB_TOKEN", "GH_TOKEN", "GITHUB_ACTIONS"):
        os.environ.pop(name, None)
    counted = Walk()
    counted.install()
    try:
        done = CliRunner().invoke(app, ["round", "-w", str(root), "--policy", "v0", "--k", str(k), "--json"])
    finally:
        counted.stop()
    if done.exit_code != 0:
        raise SystemExit(f"the round failed ({done.exit_code}): {done.output[-2000:]}")
    (result,) = json.loads(done.stdout)["rounds"]
    baseline = "refunds-policy@0"
    reads = counted.store_reads
    threads = len(list((root / "traces").glob("*.jsonl")))
    entries = module_entries(counted.edges)
    walk = {}
    for module, found in entries.items():
        sites = [s for s in found["from"] if not s.endswith(("-> say", "<lambda>"))]
        if module in WALK and sites:
            walk[module] = {"sites": len(sites), "modules": len({s.split(":")[0] for s in sites})}
    return {
        "round": {"status": result["status"], "candidate": result.get("candidate_version"), "k": k},
        "threads": threads,
        "changelog_reads": counted.changelog_reads,
        "changelog_writes": counted.changelog_writes,
        "candidate_validations": sum(
            n for v, n in counted.validations.items() if v.startswith("refunds-policy@") and v != baseline
        ),
        "validations_by_version": dict(counted.validations),
        "policy_serializations": dict(counted.dumps),
        "policy_serialized_by": dict(counted.dumped_by),
        "policy_hash_calls": dict(counted.hashes),
        "jsonl_store_reads": {
            "reads": sum(reads.values()),
            "threads_read": len(reads),
            "threads_read_more_than_once": sum(1 for n in reads.values() if n > 1),
            "most_reads_of_one_thread": max(reads.values(), default=0),
        },
        "walk_entries": dict(sorted(walk.items(), key=lambda kv: -kv[1]["sites"])),
        "module_entries": entries,
        "longest_functions": longest_functions(),
    }


def main() -> None:
    full = "--full" in sys.argv
    with tempfile.TemporaryDirectory(prefix="improve-round-walk-") as tmp:
        figures = walk(Path(tmp))
    if not full:
        figures.pop("module_entries")
    json.dump(figures, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
