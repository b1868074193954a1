"""`improve demo`: a bundled desk improved round by round in a scratch workspace (what `make demo` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from improve.cli.common import CacheMode, CacheOption, JsonOption, emit_json, err, handled, out


def demo_command(
    directory: Annotated[Path, typer.Option("--dir", help="Scratch workspace (replaced).")] = Path(
        "build/demo"
    ),
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Rounds to run at most.")] = 6,
    k: Annotated[int, typer.Option("--k", min=1, help="Runs per scenario.")] = 3,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="The decider: a stand-in of the desk (naive by default), `local` (SmolLM2-135M on this machine: "
            "its server is started for the demo and stopped after; needs the local extra), or any model --model "
            "takes elsewhere.",
        ),
    ] = "naive",
    cache: Annotated[CacheMode, CacheOption] = CacheMode.record,
    env: Annotated[
        str,
        typer.Option(
            "--env",
            "-e",
            help="The desk to improve: refunds, code-agent, tool-loop, triage, or any registered environment.",
        ),
    ] = "refunds",
    as_json: Annotated[bool, JsonOption] = False,
) -> None:
    """Improve a bundled desk from v0, round by round, in a scratch git workspace (refunds by default).

    Between rounds the demo plays the reviewer and merges the recommended branch (printed as the
    person's step); the tool itself never merges. The repo's own policies/ are not touched.

    Example:

        improve demo --dir build/demo --rounds 6

        improve demo --env tool-loop --dir build/demo-tool-loop

        improve demo --model local --rounds 3   # a real small model, here
    """
    from improve.demo import run_demo

    with handled():
        summary = run_demo(
            directory,
            rounds=rounds,
            k=k,
            say=lambda m: err.print(m, markup=False),
            model=model,
            cache=cache.value,
            env=env,
        )
        promoted = [r for r in summary.rounds if r.status == "recommended"]
        if as_json:  # each round's record as `improve round --json` prints it, and where the demo ended
            emit_json(
                {
                    "workspace": str(summary.workspace),
                    "environment": env,
                    "model": model,
                    "start_version": summary.start_version,
                    "final_version": summary.final_version,
                    "start_held_out": summary.start_held_out,
                    "final_held_out": summary.final_held_out,
                    "promoted": len(promoted),
                    "seconds": round(summary.seconds, 3),
                    "rounds": [r.to_json() for r in summary.rounds],
                }
            )
            return
        out.print("\nround summary:", markup=False)
        from improve.demo import line

        for r in summary.rounds:
            out.print(f"  {r.round_id}: " + line(r).removeprefix("-> "), markup=False)
        start = f"{summary.start_held_out:.3f}" if summary.start_held_out is not None else "-"
        final = f"{summary.final_held_out:.3f}" if summary.final_held_out is not None else "-"
        out.print(
            f"\n{len(promoted)} round(s) promoted: {summary.start_version} -> {summary.final_version}; held-out pass rate "
            f"{start} -> {final}; violations 0 in every replay: "
            f"{all(held.violations_after == 0 for r in summary.rounds if (held := r.scores.get('held-out')))}",
            markup=False,
        )
        out.print(
            f"workspace: {summary.workspace} (git log --graph --oneline; reports/*/pr.md; "
            f"policies/{env}/CHANGELOG.md)",
            markup=False,
        )
        out.print(f"the latest round as a page: improve report --html -w {summary.workspace}", markup=False)
        if summary.model_calls:
            out.print(f"model {model}: {summary.model_calls}", markup=False)
        out.print(f"wall time {summary.seconds:.0f} s", markup=False)
