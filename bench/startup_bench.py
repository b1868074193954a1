"""Start-up: `improve --help` and each command's own `--help` against an empty typer app of 20 commands.

A command's `--help` imports that command's module and everything it imports at the top, and does no
work: the time above the empty app is what a user pays before the command starts its own work. The
runs are interleaved (ours, floor, ours, ...) so a noisy neighbour slows both sides alike.
"""

from __future__ import annotations

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


def _time(code: str, args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], capture_output=True, check=False)
    return time.perf_counter() - start


def _commands() -> list[str]:
    from improve.cli.main import ImproveGroup

    return [command.name for command in ImproveGroup.LAZY]


def startup_figures(repeat: int) -> dict[str, Any]:
    rounds = max(repeat, 5)
    floor: list[float] = []
    ours: list[float] = []
    for _ in range(rounds):
        ours.append(_time(IMPROVE, ["--help"]))
        floor.append(_time(EMPTY_APP, ["--help"]))
    floor_s = statistics.median(floor)
    per_command: dict[str, float] = {}
    for name in _commands():
        runs = [_time(IMPROVE, [name, "--help"]) for _ in range(rounds)]
        per_command[name] = round(statistics.median(runs), 3)
    worst = max(per_command, key=lambda n: per_command[n])
    return {
        "help_s": round(statistics.median(ours), 3),
        "empty_typer_app_20_commands_s": round(floor_s, 3),
        "help_over_floor_s": round(statistics.median(ours) - floor_s, 3),
        "command_help_s": per_command,
        "slowest_command": worst,
        "slowest_command_over_floor_s": round(per_command[worst] - floor_s, 3),
        "goal": "--help <= 0.25 s; each command's --help <= 0.1 s above the empty app",
    }
