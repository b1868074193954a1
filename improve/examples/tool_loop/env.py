"""tool-loop: the guarded agent loop of opencli issue #60, as a machine.

The original is a TypeScript coding agent whose loop was a single `while (true)` with its safety
checks inline. Here the loop is machine.json: `idle` (waiting for a prompt), `streaming` (the model's
turn: tool calls, an answer, or a report that the environment blocks the task), `executing_tools`,
`feeding_results` (the results join the conversation), and the finals `done` and `error`. Between them
sit four *checkpoints* where every guard registered for that checkpoint runs (guards.py): guards are
objects on a registry, never written into the loop, so adding one changes no state of the machine.

A checkpoint state routes with the named guard `checkpointBlocks` (the interpreter evaluates it, so
exploration proves properties of the real guards, not of a stub). When a guard blocks, `guard_fired`
runs the guards once more in the `guards.check` actor: its output, the guard's name and reason, is
journaled with the actor's completion, so every firing is an entry in the log and a replay reads it
without running anything.

The invariant is the sentinel `overBudget`: `starting_turn`, the last state before a model call,
checks the turn budget with its own expression (not through the registry), so a registry that lost its
max-turns guard would reach it. The tests prove it unreachable with the built-in guards, and reachable
without max-turns.

The decision, `nextStep` (in `streaming`), offers `CALL_TOOLS{calls, text}` (calls: a JSON array of
`{name, args}`), `ANSWER{text}` and, only right after a tool turn whose results hold an OS error,
`REPORT_BLOCKED{reason}`. Every field is free text, which options leave out: the closed options are
`ANSWER` (without text: an empty response) and `REPORT_BLOCKED`, what a policy can answer without a
model. Its numeric facts are what a rule can key on: `loop.errorTurns` and `loop.identicalCalls` (the
streaks the guards count), `loop.emptyResponses`, `loop.toolTurns`, `turn.used`/`turn.max`,
`tokens.used`/`tokens.max`/`tokens.context`.

A scenario's input holds the `task` (the prompt), its `plan` (the steps the task's author suggests,
one tool turn each; the stand-in models follow it, a real model may read it like a checklist) and
optional `limits` (`maxTurns`, default 50; `maxTokens`, default 1,000,000).

This module assembles the environment; its parts are the sandbox world, its tools and the named
guards (world.py), the guard registry (guards.py), the tool-call observations they share (calls.py),
the stand-in models (models.py), and the rule evals and exploration probe (rules.py).
"""

from __future__ import annotations

from pathlib import Path

from improve.examples.tool_loop.cases import draw
from improve.examples.tool_loop.guards import GuardRegistry
from improve.examples.tool_loop.models import careful, naive, sloppy
from improve.examples.tool_loop.rules import PROBE_INPUTS, RULE_EVALS, probe
from improve.examples.tool_loop.world import (
    SandboxWorld,
    checkpoint_blocks,
    execute_tools,
    guard_checker,
    has_text,
    report_blocked,
    well_formed_calls,
)
from improve.machine import parse_machine
from improve.runtime import Environment, load_json, stand_in

HERE = Path(__file__).parent
NAME = "tool-loop"

FACT_TYPES = {
    "nextStep": {
        "task": "string",
        "plan": "list",
        "turn.used": "int",
        "turn.max": "int",
        "tokens.used": "int",
        "tokens.max": "int",
        "tokens.context": "int",
        "loop.identicalCalls": "int",
        "loop.errorTurns": "int",
        "loop.emptyResponses": "int",
        "loop.toolTurns": "int",
        "last.calls": "string",
        "last.text": "string",
        "last.results": "list",
        "last.error": "string",
    }
}
"""What a policy's guards may read in the one decision, `nextStep`: its facts and their types."""


def environment(guards: GuardRegistry | None = None) -> Environment:
    """The tool loop with the built-in guards, or with `guards` (a registry with guards added or removed).

    A registry other than the built-in one changes behaviour, so the machine's version carries its
    fingerprint (`1+guards.<hash>`): threads recorded with other guards are never replayed against it.
    """
    registry = guards if guards is not None else GuardRegistry.default()
    config = parse_machine(load_json(HERE / "machine.json"), source=str(HERE / "machine.json"))
    if registry.fingerprint() != GuardRegistry.default().fingerprint():
        config = config.model_copy(update={"version": f"{config.version}+guards.{registry.fingerprint()}"})
    return Environment(
        home=HERE,
        name=NAME,
        config=config,
        actors={
            "tools.execute": execute_tools,
            "guards.check": guard_checker(registry),
            "session.report": report_blocked,
        },
        guards={
            "checkpointBlocks": checkpoint_blocks(registry),
            "wellFormedCalls": well_formed_calls,
            "hasText": has_text,
        },
        make_world=SandboxWorld,
        models={
            "careful": stand_in("careful", careful),
            "naive": stand_in("naive", naive),
            "sloppy": stand_in("sloppy", sloppy),
        },
        files=[
            HERE / "machine.json",
            Path(__file__),
            HERE / "world.py",
            HERE / "guards.py",
            HERE / "calls.py",
            HERE / "models.py",
            HERE / "rules.py",
            HERE / "cases.py",
        ],
        fact_types=FACT_TYPES,
        probe=probe(),
        probe_inputs=PROBE_INPUTS,
        rule_evals=RULE_EVALS,
        cases=draw,
    )
