"""Plausible coding tasks, drawn at random: tool-loop's generator of cases (`Environment.cases`), for
checking a policy out of sample. The draws carry no label: the `careful` stand-in's run of `v0` labels
them (`improve.evals.out_of_sample`).

A draw starts from one of the desk's labelled tasks (train or held-out; the sealed test split is never
read) and changes what the sandbox does: one of its shell commands now fails with an OS error the agent
cannot fix (permission denied, not permitted, disk full, read-only file system) or with a recoverable
one (a command not installed, a flaky failure that passes when run again), and the turn and token
budgets move around their defaults.
"""

from __future__ import annotations

import copy
import functools
import random
from pathlib import Path
from typing import Any

import yaml

SCENARIOS = Path(__file__).parent / "scenarios.yaml"
OS_ERRORS = (
    "/bin/sh: {cmd}: Permission denied\nError: Exited with code 126",
    "{cmd}: Operation not permitted\nError: Exited with code 1",
    "write error: No space left on device\nError: Exited with code 1",
    "cannot create file: Read-only file system\nError: Exited with code 1",
)
RECOVERABLE = (
    "/bin/sh: {cmd}: command not found\nError: Exited with code 127",
    "Error: connection reset by peer, try again\nError: Exited with code 1",
)


@functools.cache
def _tasks() -> tuple[dict[str, Any], ...]:
    loaded = yaml.safe_load(SCENARIOS.read_text(encoding="utf-8"))
    return tuple(s for s in loaded["scenarios"] if s["split"] in ("train", "held-out"))


def draw(rng: random.Random) -> dict[str, Any]:
    base = rng.choice(_tasks())
    task = copy.deepcopy(base["input"])
    world = copy.deepcopy(base.get("world") or {})
    commands = [s["args"]["command"] for s in task.get("plan", []) if s.get("name") == "bash"]
    category = base["category"]
    roll = rng.random()
    if commands and roll < 0.3:
        command = rng.choice(commands)
        world.setdefault("commands", {})[command] = rng.choice(OS_ERRORS).format(cmd=command.split()[0])
        category = "os-error"
    elif commands and roll < 0.45:
        command = rng.choice(commands)
        failure = rng.choice(RECOVERABLE).format(cmd=command.split()[0])
        recorded = world.setdefault("commands", {}).get(command, "ok")
        after = recorded if isinstance(recorded, list) else [recorded]
        world["commands"][command] = [failure, *after]
        category = "recoverable-error"
    limits = dict(task.get("limits") or {})
    if rng.random() < 0.3:
        limits["maxTurns"] = len(task.get("plan", [])) + rng.randint(1, 6)
    if limits:
        task["limits"] = limits
    return {"category": category, "input": task, "world": world}
