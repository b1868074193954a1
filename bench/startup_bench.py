"""Start-up: `improve --help` and each command's own `--help` against an empty typer app of 20 commands.

A command's `--help` imports that command's module and everything it imports at the top, and does no
work: the time above the empty app is what a user pays before the command starts its own work. The
runs are interleaved (ours, floor, ours, ...) so a noisy neighbour slows both sides alike.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Any

# The floor: typer with 20 commands that import nothing else.
EMPTY_APP = """
import typer
app = typer.Typer(add_completion=False)
for i in range(20):
    def command(x: int = 0) -> None:
        '''A command.'''
    app.command(f"c{i}")(command)
app()
"""
IMPROVE = "from improve.cli.main import app; app(prog_name='improve')"
GOAL_S = 0.25


def _time(code: str, args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], capture_output=True, check=False)
    return time.perf_counter() - start


def _commands() -> list[str]:
    from improve.cli.main import ImproveGroup

    return [command.name for command in ImproveGroup.LAZY]


def startup_figures(repeat: int) -> dict[str, Any]:
    rounds = max(repeat, 5)
    names = _commands()
    # Everything measured in each round, one after the other, so load that comes and goes moves all alike.
    runs: dict[str, list[float]] = {}
    for _ in range(rounds):
        runs.setdefault("help", []).append(_time(IMPROVE, ["--help"]))
        runs.setdefault("floor", []).append(_time(EMPTY_APP, ["--help"]))
        runs.setdefault("floor_command", []).append(_time(EMPTY_APP, ["c1", "--help"]))
        for name in names:
            runs.setdefault(name, []).append(_time(IMPROVE, [name, "--help"]))
    median = {key: statistics.median(times) for key, times in runs.items()}
    floor_s, floor_command_s = median["floor"], median["floor_command"]
    per_command = {name: round(median[name], 3) for name in names}
    worst = max(per_command, key=lambda n: per_command[n])
    return {
        "help_s": round(median["help"], 3),
        "empty_typer_app_20_commands_s": round(floor_s, 3),
        "empty_typer_app_command_help_s": round(floor_command_s, 3),
        "help_over_floor_s": round(median["help"] - floor_s, 3),
        "command_help_s": per_command,
        "slowest_command": worst,
        "slowest_command_over_floor_s": round(per_command[worst] - floor_s, 3),
        "slowest_command_over_empty_command_help_s": round(per_command[worst] - floor_command_s, 3),
        "goal": f"--help <= {GOAL_S} s and each command's --help <= {GOAL_S} s",
        "goal_met": median["help"] <= GOAL_S and per_command[worst] <= GOAL_S,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "note": "wall seconds of a fresh interpreter, medians of rounds that run everything once each; "
        "empty_typer_app_command_help_s is one command's --help of the empty app: typer builds the "
        "command's parameters then (it imports pydantic for them), the floor of any command's own --help",
    }
