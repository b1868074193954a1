"""refund-approval: a port of the public `@statelyai/agent` verification example.

The agent classifies a refund request (`ISSUE`, `ESCALATE`, `REFUSE{reasoning}`); `ISSUE` is refused
by a guard while the amount is over 100 and unapproved; `ESCALATE` waits for a person (`APPROVE` or
`REJECT`). `issuing` moves at once to the sentinel `illegallyIssued` for an unapproved amount over 100.
It has no tools, so its world records nothing: the outcome is the final state.

This module assembles the environment from its stand-in models (models.py) and its rule evals and
exploration probe (rules.py); it has no world module of its own.
"""

from __future__ import annotations

from pathlib import Path

from improve.examples.refund_approval.cases import draw
from improve.examples.refund_approval.models import careful, naive, sloppy
from improve.examples.refund_approval.rules import PROBE_INPUTS, RULE_EVALS, probe
from improve.machine import parse_machine
from improve.runtime import Environment, World, load_json, stand_in

HERE = Path(__file__).parent


def environment() -> Environment:
    config = parse_machine(load_json(HERE / "machine.json"), source=str(HERE / "machine.json"))
    return Environment(
        home=HERE,
        name="refund-approval",
        config=config,
        actors={},
        make_world=World,
        models={
            "careful": stand_in("careful", careful),
            "naive": stand_in("naive", naive),
            "sloppy": stand_in("sloppy", sloppy),
        },
        files=[
            HERE / "machine.json",
            Path(__file__),
            HERE / "models.py",
            HERE / "rules.py",
            HERE / "cases.py",
        ],
        safety_order={"illegallyIssued": 0, "issued": 1, "refused": 2, "rejected": 3, "approving": 4},
        fact_types={"classify": {"amount": "number", "reason": "string"}},
        probe=probe(),
        probe_inputs=PROBE_INPUTS,
        rule_evals=RULE_EVALS,
        cases=draw,
    )
