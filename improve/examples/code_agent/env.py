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

Guards (CEL in machine.json; every one covered by a rule eval below):

- the turn budget (`maxTurns`, default 10): one model call is one turn, so an explorer/evaluator
  cycle costs two; no decision is asked for with no turn left (the run ends `exhausted`);
- the loop guard: the same command is never run three times in a row (not offered, and refused);
  an explorer that insists exhausts its retries and the evaluator is asked to conclude;
- the evaluator-cycle limit (`maxCycles`, default 5, "forces a conclusion after 5 cycles"): the last
  evaluator turn it allows is the forced conclusion, asked once, where only ANSWER is offered; no
  answer ends the run `unanswered`;
- only the evaluator concludes: `concluding` checks who answered and that the budget held, whatever
  was decided (sentinels `concludedOutsideEvaluator` and `overBudget`, proven unreachable).

World: the fixture repository shipped in `fixture_repo/` (a scenario's `world` may add or replace
`files: {path: text}`, or `remove` paths). Tools are deterministic (`tools.py`); outputs are capped
with a marker. The answer is an effect the world records when the evaluator concludes,
`{kind: answer, text: <normalised answer>}`, and it is compared exactly with the label: a wrong
answer fails, a right one passes; concluding is not being right. Ground truth is the repository,
never a model's claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from improve.examples.code_agent.models import careful, naive, sloppy
from improve.examples.code_agent.tools import Repo, execute, fixture_files, merge, opening_menu
from improve.machine import parse_machine
from improve.machine.explore import ExploreOptions
from improve.machine.rules import RuleEval
from improve.runtime.environment import Environment, World
from improve.runtime.models import stand_in
from improve.runtime.policy import load_json

HERE = Path(__file__).parent
DEFAULT_MAX_TURNS = 10
DEFAULT_MAX_CYCLES = 5
DECISION_STATES = ("planning", "exploring", "evaluating", "forcing")
ACTOR_NAMES = ("repo.open", "repo.run", "memory.edit", "answer.record")


def normalise(text: str) -> str:
    """The answer as it is compared with the label: surrounding whitespace, quotes and backticks, a
    trailing period and a leading `./` removed, inner whitespace collapsed. Case is kept: `Cli` and
    `CLI` are different identifiers."""
    value = " ".join(str(text).split())
    previous = None
    while value != previous:
        previous = value
        value = value.strip().rstrip(".").strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "`'\"":
            value = value[1:-1]
    return value.removeprefix("./")


class CodeWorld(World):
    """The repository the tools read, and the answers recorded."""

    def __init__(self, fixture: Mapping[str, Any] | None = None) -> None:
        super().__init__(fixture)
        files = dict(fixture_files()) if self.fixture.get("repo", "fixture") == "fixture" else {}
        files.update({str(k): str(v) for k, v in (self.fixture.get("files") or {}).items()})
        for path in self.fixture.get("remove") or []:
            files.pop(str(path), None)
        self.repo = Repo(files)

    def audit(self, effects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """A question has one answer: a second recorded answer is a violation."""
        effects = self.effects if effects is None else effects
        answers = [e for e in effects if e.get("kind") == "answer"]
        return [{"rule": "one-answer", "answers": len(answers)}] if len(answers) > 1 else []


# --- tools (actors) --------------------------------------------------------------------------------


def _repo(world: World) -> Repo:
    if not isinstance(world, CodeWorld):
        raise TypeError(f"the code agent needs a CodeWorld, not {type(world).__name__}")
    return world.repo


def open_repo(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """The first menu: computed by the host because it reads the repository and the task's words."""
    return {"menu": opening_menu(_repo(world), str(input.get("task", "")))}


def run_command(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """Run one command; the output and the grown menu travel in the journal, so replay needs no repo."""
    result = execute(_repo(world), str(input["command"]))
    return {"result": result.item(), "menu": merge(input.get("menu") or [], result.suggestions)}


def edit_memory(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """DROP removes the kept output of a command; FORGET removes the notes containing a pattern
    (case-insensitive). Pure: the output depends on the input only, and it is journaled."""
    edit = input.get("edit") or {}
    memory = list(input.get("memory") or [])
    kept = list(input.get("kept") or [])
    notes = list(input.get("notes") or [])
    if edit.get("op") == "drop":
        item = edit.get("item")
        memory = [m for m in memory if m.get("command") != item]
        kept = [k for k in kept if k != item]
    elif edit.get("op") == "forget":
        pattern = str(edit.get("pattern") or "").lower()
        notes = [n for n in notes if not pattern or pattern not in str(n).lower()]
    return {"memory": memory, "kept": kept, "notes": notes}


def record_answer(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """The world's receipt of the answer: the effect scored against the label (normalised here, so
    the comparison is exact and a right answer in quotes or with a period still passes)."""
    effect = world.record("answer", text=normalise(str(input.get("text", ""))))
    return {"recorded": True, "text": effect["text"]}


ACTORS = {
    "repo.open": open_repo,
    "repo.run": run_command,
    "memory.edit": edit_memory,
    "answer.record": record_answer,
}


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
)
"""Numeric facts every decision carries (so a policy's guard reads the same facts whichever decision
it answers, and the gates can type-check it against each): turns used and left, turns per role,
evaluator cycles left, commands run, outputs seen (successful) and failed, outputs pending, items in
the working memory, notes, how many times in a row the last command ran, and 1 in a forced
conclusion."""

_COUNTER_TYPES = dict.fromkeys(COUNTERS, "int")
FACT_TYPES: dict[str, dict[str, str]] = {
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
}


# --- exploration: the world for proofs -------------------------------------------------------------

PROBE_ITEM = {"command": "view a", "ok": True, "output": "a (1 lines)\n   1| x", "truncated": False}


def probe() -> ExploreOptions:
    """What the world may do, for proofs: a menu of two commands (so "the same command again" and
    "another command" are both explored), one output, memory edits that empty the memory, and every
    tool may fail. The guards read counters, the last command and whether outputs, memory and notes
    are empty; the probe covers every combination of those the machine can reach. Decisions branch on
    every allowed event with a probe text for free-text fields."""
    menu = ["view a", "view b"]
    return ExploreOptions(
        outputs={
            "repo.open": [{"menu": menu}],
            "repo.run": [{"result": PROBE_ITEM, "menu": menu}],
            "memory.edit": [{"memory": [], "kept": [], "notes": []}],
            "answer.record": [{"recorded": True, "text": "probe"}],
        },
        errors=set(ACTOR_NAMES),
        max_depth=80,
    )


PROBE_INPUTS: list[dict[str, Any]] = [
    {"task": "How many variants does the `Provider` enum in src/llm.rs have?"},
    {"task": "What is the first struct in src/main.rs?", "planner": True},
    {"task": "Which file defines the function `resolve_fuzzy`?", "maxTurns": 3},
    {"task": "How many Lua scripts are in scripts/?", "maxCycles": 2},
]
"""One input per shape: the defaults (the budget and the cycle limit end together: the fifth evaluator
turn is the tenth turn), a planner (its turn counts, so the budget ends first), a budget of 3 turns,
and a cycle limit of 2."""


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
            HERE / "tools.py",
            HERE / "reader.py",
            HERE / "models.py",
            *sorted(p for p in (HERE / "fixture_repo").rglob("*") if p.is_file()),
        ],
        effect_text_fields=(),
        fact_types=FACT_TYPES,
        probe=probe(),
        probe_inputs=PROBE_INPUTS,
        rule_evals=RULE_EVALS,
    )


# --- rule evals: the guards, on the interpreter ----------------------------------------------------

_TASK = {"task": "How many variants does the `Provider` enum in src/llm.rs have?"}
_MENU = ["view .", "view src/llm.rs", 'text-search "Provider"']
_OPENED = {"type": "xstate.done.actor", "actorId": "opening", "output": {"menu": _MENU}}


def _ran(command: str, ok: bool = True) -> dict[str, Any]:
    item = {"command": command, "ok": ok, "output": f"{command} output", "truncated": False}
    return {"type": "xstate.done.actor", "actorId": "running", "output": {"result": item, "menu": _MENU}}


def _cycle(command: str, verdict: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [{"type": "RUN", "command": command}, _ran(command), verdict or {"type": "CONTINUE"}]


_ANSWER = {"type": "ANSWER", "text": "6"}

RULE_EVALS = [
    RuleEval(
        "the planner runs first when the input asks for it",
        ("starting",),
        {**_TASK, "planner": True},
        [_OPENED],
        "planning",
    ),
    RuleEval("without a planner the explorer starts", ("starting",), _TASK, [_OPENED], "exploring"),
    RuleEval(
        "a command runs, then the evaluator judges its output",
        ("exploring", "toEvaluator"),
        _TASK,
        [_OPENED, {"type": "RUN", "command": "view src/llm.rs"}, _ran("view src/llm.rs")],
        "evaluating",
        accepts=[{"type": "KEEP"}, {"type": "CONTINUE"}, _ANSWER],
    ),
    RuleEval(
        "the same command is refused the third time in a row; another one is not",
        ("exploring",),
        _TASK,
        [_OPENED, *_cycle("view src/llm.rs"), *_cycle("view src/llm.rs")],
        "exploring",
        accepts=[{"type": "RUN", "command": "view ."}, {"type": "DONE"}],
        refuses=[{"type": "RUN", "command": "view src/llm.rs"}],
    ),
    RuleEval(
        "only the evaluator concludes: the explorer cannot answer, its DONE hands over",
        ("exploring", "toEvaluator"),
        _TASK,
        [_OPENED],
        "exploring",
        accepts=[{"type": "DONE"}],
        refuses=[_ANSWER, {"type": "CONTINUE"}],
    ),
    RuleEval(
        "KEEP needs a pending output (none after the explorer's DONE)",
        ("evaluating",),
        _TASK,
        [_OPENED, {"type": "DONE"}],
        "evaluating",
        accepts=[{"type": "CONTINUE"}, _ANSWER],
        refuses=[{"type": "KEEP"}, {"type": "DROP", "item": "view ."}],
    ),
    RuleEval(
        "a note must say something; FORGET needs notes and a pattern",
        ("evaluating",),
        _TASK,
        [_OPENED, *_cycle("view .", {"type": "NOTE", "text": "Provider is in src/llm.rs"})],
        "exploring",
    ),
    RuleEval(
        "an empty note and a pattern-less or note-less FORGET are refused",
        ("evaluating",),
        _TASK,
        [_OPENED, {"type": "RUN", "command": "view ."}, _ran("view .")],
        "evaluating",
        accepts=[{"type": "NOTE", "text": "x"}],
        refuses=[{"type": "NOTE", "text": ""}, {"type": "NOTE"}, {"type": "FORGET", "pattern": "x"}],
    ),
    RuleEval(
        "a kept output can be dropped",
        ("evaluating", "editingMemory"),
        _TASK,
        [
            _OPENED,
            *_cycle("view .", {"type": "KEEP"}),
            {"type": "RUN", "command": "view src/llm.rs"},
            _ran("view src/llm.rs"),
        ],
        "evaluating",
        accepts=[{"type": "DROP", "item": "view ."}],
    ),
    RuleEval(
        "a cycle costs two turns: with 3 turns the second evaluator turn is never asked",
        ("toExplorer", "toEvaluator"),
        {**_TASK, "maxTurns": 3},
        [_OPENED, *_cycle("view ."), {"type": "RUN", "command": "view src/llm.rs"}, _ran("view src/llm.rs")],
        "exhausted",
    ),
    RuleEval(
        "the turn budget ends the run before the explorer is asked with no turn left",
        ("toExplorer",),
        {**_TASK, "maxTurns": 2},
        [_OPENED, *_cycle("view .")],
        "exhausted",
    ),
    RuleEval(
        "the evaluator-cycle limit: its last evaluator turn is a forced conclusion offering only ANSWER",
        ("toEvaluator", "forcing"),
        {**_TASK, "maxCycles": 2},
        [_OPENED, *_cycle("view ."), {"type": "RUN", "command": "view src/llm.rs"}, _ran("view src/llm.rs")],
        "forcing",
        accepts=[_ANSWER],
        refuses=[{"type": "CONTINUE"}, {"type": "KEEP"}],
    ),
    RuleEval(
        "an explorer that cannot propose an acceptable command is followed by the forced conclusion",
        ("exploring", "toForcing"),
        _TASK,
        [
            _OPENED,
            {"type": "xstate.error.actor", "actorId": "exploring", "error": {"kind": "decision-exhausted"}},
        ],
        "forcing",
    ),
    RuleEval(
        "the budget is checked before the forced conclusion too",
        ("toForcing",),
        {**_TASK, "maxTurns": 1},
        [
            _OPENED,
            {"type": "xstate.error.actor", "actorId": "exploring", "error": {"kind": "decision-exhausted"}},
        ],
        "exhausted",
    ),
    RuleEval(
        "the evaluator's answer is checked, then recorded",
        ("evaluating", "concluding"),
        _TASK,
        [_OPENED, *_cycle("view src/llm.rs", _ANSWER)],
        "recording",
    ),
]
