"""The triage desk: the support inbox of a software company, triaged ticket by ticket.

A ticket (sender, subject, body, the mail filter's spam score, whether it is an automatic reply) comes
in; the machine (machine.json) looks the sender's account up (plan, locked or not), looks for an open
ticket from the same sender with the same subject, then asks the agent to `triage` it: route it to one
of four queues, escalate it to the shift lead, or close it as spam, a duplicate or an automatic reply.

The hard rules are guards, audited again after the fact: a locked account's ticket is never closed (the
lock may be a takeover in progress; a person must see it), and a duplicate is closed only into an open
ticket it merges with. Everything else is the desk's judgment, in an order its people would state
(models.py, `desk_answer`): security first, the lock before any topic, a follow-up merged into its
open ticket unless that ticket is 48 hours old (then escalated), spam closed but never a paying
customer's, an enterprise customer's billing question to accounts. A policy learns those from the
labels; the audit does not flag them.

This module assembles the environment from its parts: the world and its tools (world.py), the stand-in
models (models.py), and the fact types, rule evals and exploration probe (rules.py).
"""

from __future__ import annotations

from pathlib import Path

from improve.examples.triage.cases import draw
from improve.examples.triage.models import careful, naive, sloppy
from improve.examples.triage.rules import FACT_TYPES, PROBE_INPUTS, RULE_EVALS, probe
from improve.examples.triage.world import ACTORS, InboxWorld, world_from_thread
from improve.runtime import Environment, load_machine, stand_in

HERE = Path(__file__).parent


def environment() -> Environment:
    return Environment(
        home=HERE,
        name="triage",
        config=load_machine(HERE / "machine.json"),
        actors=dict(ACTORS),
        make_world=InboxWorld,
        world_from_thread=world_from_thread,
        models={
            "careful": stand_in("careful", careful),
            "naive": stand_in("naive", naive),
            "sloppy": stand_in("sloppy", sloppy),
        },
        files=[
            HERE / "machine.json",
            Path(__file__),
            HERE / "world.py",
            HERE / "models.py",
            HERE / "rules.py",
            HERE / "cases.py",
        ],
        # A ticket a person holds now (escalated) is safest; one closed unseen is the least safe outcome
        # short of the sentinel. A routed ticket reaches a team; a failed one stays in the inbox for one.
        safety_order={"closedLocked": 0, "closed": 1, "routed": 2, "failed": 2, "escalated": 3},
        fact_types=FACT_TYPES,
        probe=probe(),
        probe_inputs=PROBE_INPUTS,
        rule_evals=RULE_EVALS,
        cases=draw,
    )
