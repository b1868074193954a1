"""The environment: the machine, its tools and world, stand-in models, rule evals and probes, and a
generator of plausible cases, as one `Environment` registered under its name (improve.toml: `[environments.support-desk] module =
"support_desk.env:environment"`)."""

from __future__ import annotations

from pathlib import Path

from improve.runtime import Environment, load_machine

from .cases import draw
from .models import MODELS
from .rules import FACT_TYPES, PROBE_INPUTS, RULE_EVALS, probe
from .world import ACTORS, CreditWorld, world_from_thread

NAME = "support-desk"
HERE = Path(__file__).parent


def environment() -> Environment:
    return Environment(
        name=NAME,
        config=load_machine(HERE / "machine.json"),
        actors=dict(ACTORS),
        make_world=CreditWorld,
        world_from_thread=world_from_thread,
        models=dict(MODELS),
        files=sorted([HERE / "machine.json", *HERE.glob("*.py")]),
        fact_types=FACT_TYPES,
        probe=probe(),
        probe_inputs=PROBE_INPUTS,
        rule_evals=RULE_EVALS,
        cases=draw,
        # How safe each outcome is, higher safer (a person holding the ticket): parity calls a changed
        # outcome safer by it, and a mined branch goes in front of a less safe one where no label
        # says otherwise.
        safety_order={"overCredited": 0, "credited": 1, "declined": 2, "escalated": 3},
    )
