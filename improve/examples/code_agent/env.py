"""`code-agent`: the normalize `@agent` explorer/evaluator machine as an environment.

The original is a Lua agent that answers questions about a codebase (its v2 "state machine" mode):
an optional planner writes a short plan, an explorer proposes commands and sees only the last turn's
outputs, an evaluator sees the working memory and the new outputs, keeps or drops them, writes notes,
and is the only state that may conclude. The machine (machine.json) keeps that shape; each model
turn is one `agent.decide`:

    plan      PLAN{text}                          (only when the input asks for a planner)
    explore   RUN{command} | DONE                 command: a closed choice of the menu
    evaluate  ANSWER{text} | CONTINUE | KEEP | DROP{item} | NOTE{text} | FORGET{pattern}
    conclude  ANSWER{text}                        (the forced conclusion: nothing else is offered)

`RUN`'s command is chosen from the commands that make sense now (the menu: the root listing, the
paths the task names, a search for each term it quotes, then whatever the outputs suggest: the
entries of a listing, the ranges a cut view left out, the lines around each search hit). `DONE` is
the explorer saying it has enough: it cannot answer (the original ignored `$(done)` in the explorer),
so the turn passes to the evaluator with no new output. Memory commands are the evaluator's events:
`KEEP` moves the pending outputs into the working memory (outputs are otherwise gone after the next
command), `DROP` removes a kept output, `NOTE` records a finding, `FORGET` removes the notes that
contain a pattern. Free-text fields (`text`, `pattern`) are left out of the offered options, so a
policy can answer `CONTINUE`, `KEEP`, `DONE`, `DROP{item}` or `RUN{command}` itself, while an
answer's text needs the model; `NOTE` and `FORGET` need their text, so they are never offered bare.

Guards (CEL in machine.json; every one covered by a rule eval in rules.py):

- the turn budget (`maxTurns`, default 10): one model call is one turn, so an explorer/evaluator
  cycle costs two; no decision is asked for with no turn left (the run ends `exhausted`);
- the loop guard: the same command is never run three times in a row (not offered, and refused);
  an explorer that insists exhausts its retries and the evaluator is asked to conclude;
- the evaluator-cycle limit (`maxCycles`, default 5, "forces a conclusion after 5 cycles"): the last
  evaluator turn it allows is the forced conclusion, asked once, where only ANSWER is offered; no
  answer ends the run `unanswered`;
- only the evaluator concludes: `concluding` checks who answered and that the budget held, whatever
  was decided (sentinels `concludedOutsideEvaluator` and `overBudget`, proven unreachable).

Edit tasks (`input.mode: edit`, with `input.validate` naming a validation command of shadow.py's
allowlist) skip the explorer/evaluator for one worker (`working`, decision `work`):

    work      READ{command} | EDIT{path, old, new} | VALIDATE | SUBMIT{summary} | PIN | ASK{question}
              | CHECKPOINT{kind: progress|questions}
    recover   RETRY | MOVE_ON                     (rung 1 of the escalation ladder)
    blocked   ASK{question} | REPLAN{text} | BLOCKED{reason}   (rung 3)

The worker's events are its own, not the explorer's (`READ` runs the same commands as `RUN`, on the
shadow copy; `SUBMIT` is its "done"; `PIN` its "keep"), so a policy rule learned for one role, which
reads the same facts and checks that its answer is offered, never answers the other role's decision.

- *validated edits*: EDIT writes the run's shadow copy (a temporary directory, never the fixture);
  SUBMIT (done) runs the validation command in it: a pass records the diff (`{kind: diff, path, added,
  removed}`, the effect scored), a failure resets the copy, puts "validation failed: <output>" into
  the working memory and goes back to work, up to `maxValidations` (default 2; then `rejected`);
- *the escalation ladder*: a command or edit that fails is shown with its error and may be retried
  (`maxRetries`, 3); its fourth failure in a row rolls the copy back to the last snapshot (the edits
  of the last passing VALIDATE) and bans it; then the worker asks, takes a new approach (at most
  `maxApproaches`, default 2) or stops BLOCKED. The sentinel `retriedPastLimit` is proven unreachable;
- *checkpoint and ask*: CHECKPOINT saves the checkpoint (task, plan, notes, working memory and the
  state: turns, edits, snapshot, bans, approaches, the last outputs, the menu) as `checkpoint.save`'s
  journaled output and waits in `checkpointed` (`meta.status: checkpointed`); RESUME continues with a
  fresh budget (`resume_budget`, 10 turns, or the event's `budget`), at most `maxCheckpoints` times
  (default 3). ASK waits in `asking` (`meta.status: blocked_ask`) for `ANSWER{text}`, which lands in
  the notes. With nobody to answer, the run ends with that status.

The world (world.py) is the fixture repository in `fixture_repo/`, read by deterministic commands
(repo.py) whose outputs are capped with a marker; the answer is an effect the world records and is
compared exactly with the label. The stand-in models are models.py (reading outputs with reader.py),
the rule evals and exploration probe rules.py; this module assembles the environment.
"""

from __future__ import annotations

from pathlib import Path

from improve.examples.code_agent.cases import draw
from improve.examples.code_agent.models import careful, naive, sloppy
from improve.examples.code_agent.rules import PROBE_INPUTS, RULE_EVALS, probe
from improve.examples.code_agent.world import ACTORS, CodeWorld
from improve.machine import parse_machine
from improve.runtime import Environment, FactType, load_json, stand_in

HERE = Path(__file__).parent
DEFAULT_MAX_TURNS = 10
DEFAULT_MAX_CYCLES = 5
RESUME_BUDGET = 10
"""Turns a checkpointed edit task gets when it is resumed (the machine's `resumeBudget` default)."""
DECISION_STATES = ("planning", "exploring", "evaluating", "forcing", "working", "recovering", "blocked")


# --- what policies may read ------------------------------------------------------------------------

COUNTERS = (
    "turnsUsed",
    "turnsLeft",
    "explorerTurns",
    "evaluatorTurns",
    "cyclesLeft",
    "commandsRun",
    "outputsSeen",
    "failedCommands",
    "pendingOutputs",
    "memoryCount",
    "notesCount",
    "repeats",
    "forced",
    "editsMade",
    "unvalidatedEdits",
    "failedValidations",
    "failCount",
    "retriesLeft",
    "approachesLeft",
    "asked",
    "checkpoints",
)
"""Numeric facts every decision carries (so a policy's guard reads the same facts whichever decision
it answers, and the gates can type-check it against each): turns used and left, turns per role,
evaluator cycles left, commands run, outputs seen (successful) and failed, outputs pending, items in
the working memory, notes, how many times in a row the last command ran, and 1 in a forced
conclusion; for edit tasks, edits made and not yet validated, failed validations on SUBMIT, failures of
the last command in a row, retries and new approaches left, questions asked and checkpoints saved."""

MODES = ("answer", "edit")
"""What the task asks for: an answer to a question, or a change to the repository (`input.mode`)."""
_COUNTER_TYPES: dict[str, FactType] = {"mode": MODES, **dict.fromkeys(COUNTERS, "int")}
FACT_TYPES: dict[str, dict[str, FactType]] = {
    "plan": {"task": "string", **_COUNTER_TYPES},
    "explore": {
        "task": "string",
        "plan": "string",
        "notes": "any",
        "lastOutputs": "any",
        "lastCommand": "string",
        **_COUNTER_TYPES,
    },
    "evaluate": {"task": "string", "notes": "any", "memory": "any", "pending": "any", **_COUNTER_TYPES},
    "conclude": {"task": "string", "notes": "any", "memory": "any", "pending": "any", **_COUNTER_TYPES},
    "work": {
        "task": "string",
        "plan": "string",
        "notes": "any",
        "memory": "any",
        "lastOutputs": "any",
        "lastCommand": "string",
        "lastError": "string",
        "edits": "any",
        **_COUNTER_TYPES,
    },
}
_LADDER_FACTS: dict[str, FactType] = {
    "task": "string",
    "notes": "any",
    "memory": "any",
    "lastOutputs": "any",
    "lastCommand": "string",
    "lastError": "string",
    **_COUNTER_TYPES,
}
FACT_TYPES["recover"] = _LADDER_FACTS
FACT_TYPES["blocked"] = dict(_LADDER_FACTS)


def environment() -> Environment:
    config = parse_machine(load_json(HERE / "machine.json"), source=str(HERE / "machine.json"))
    return Environment(
        home=HERE,
        name="code-agent",
        config=config,
        actors=dict(ACTORS),
        make_world=CodeWorld,
        models={
            "careful": stand_in("careful", careful),
            "naive": stand_in("naive", naive),
            "sloppy": stand_in("sloppy", sloppy),
        },
        files=[
            HERE / "machine.json",
            Path(__file__),
            HERE / "world.py",
            HERE / "repo.py",
            HERE / "models.py",
            HERE / "reader.py",
            HERE / "rules.py",
            HERE / "shadow.py",
            HERE / "checks.py",
            HERE / "edit_tasks.py",
            HERE / "cases.py",
            *sorted(p for p in (HERE / "fixture_repo").rglob("*") if p.is_file()),
        ],
        effect_text_fields=(),
        fact_types=FACT_TYPES,
        probe=probe(),
        probe_inputs=PROBE_INPUTS,
        rule_evals=RULE_EVALS,
        resume_budget=RESUME_BUDGET,
        cases=draw,
    )
