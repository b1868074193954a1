"""code-agent's rule evals and exploration probe: the machine's guards, without a model.

`RULE_EVALS` drive the interpreter through each guarded state with scripted events (every guard of
machine.json is covered by one); `probe()` is what the world may do for exploration proofs, and
`PROBE_INPUTS` the inputs they start from.
"""

from __future__ import annotations

from typing import Any

from improve.machine import ExploreOptions, RuleEval

# --- exploration: the world for proofs -------------------------------------------------------------

ACTOR_NAMES = (
    "repo.open",
    "repo.run",
    "memory.edit",
    "answer.record",
    "workspace.run",
    "workspace.edit",
    "workspace.validate",
    "workspace.rollback",
    "checkpoint.save",
)
PROBE_ITEM = {"command": "view a", "ok": True, "output": "a (1 lines)\n   1| x", "truncated": False}
PROBE_EDIT_OK = {"command": "edit a", "ok": True, "output": "edited a", "truncated": False}
PROBE_EDIT_FAILED = {"command": "edit a", "ok": False, "output": "edit: no such file: a", "truncated": False}
PROBE_VALID = {"command": "validate", "ok": True, "output": "check passed", "truncated": False}
PROBE_INVALID = {"command": "validate", "ok": False, "output": "1 problem(s)", "truncated": False}


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
            "workspace.run": [{"result": PROBE_ITEM, "menu": menu}],
            "workspace.edit": [{"result": PROBE_EDIT_OK}, {"result": PROBE_EDIT_FAILED}],
            "workspace.validate": [{"result": PROBE_VALID}, {"result": PROBE_INVALID}],
            "workspace.rollback": [{"restored": 0}],
            "checkpoint.save": [{"checkpoint": {"kind": "progress"}}],
        },
        payloads={"ANSWER": {"text": ["Cohere"]}, "EDIT": {"new": ["changed"]}},
        errors=set(ACTOR_NAMES),
        max_depth=80,
    )


PROBE_INPUTS: list[dict[str, Any]] = [
    {"task": "How many variants does the `Provider` enum in src/llm.rs have?"},
    {"task": "What is the first struct in src/main.rs?", "planner": True},
    {"task": "Which file defines the function `resolve_fuzzy`?", "maxTurns": 3},
    {"task": "How many Lua scripts are in scripts/?", "maxCycles": 2},
    {
        "task": "Add a `Cohere` variant to the `Provider` enum in src/llm.rs.",
        "mode": "edit",
        "maxTurns": 5,
        "maxCheckpoints": 1,
        "resumeBudget": 1,
        "maxApproaches": 1,
    },
]
"""One input per shape: the defaults (the budget and the cycle limit end together: the fifth evaluator
turn is the tenth turn), a planner (its turn counts, so the budget ends first), a budget of 3 turns,
a cycle limit of 2, and an edit task with 7 turns (enough to climb the whole escalation ladder: a
failing edit, three retries, the rollback and the blocked turn, and to checkpoint and resume)."""

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

# --- rule evals: the edit task's worker, validation and escalation ladder ----------------------------

_EDIT_TASK = {"mode": "edit", "task": "Add a `Cohere` variant to the `Provider` enum in src/llm.rs."}
_EDIT = {
    "type": "EDIT",
    "path": "llm.rs",
    "old": "pub enum Provider {\n",
    "new": "pub enum Provider {\n    Cohere,\n",
}


def _edited(ok: bool) -> dict[str, Any]:
    result = {"command": "edit llm.rs", "ok": ok, "output": "edited" if ok else "edit: no such file: llm.rs"}
    return {"type": "xstate.done.actor", "actorId": "editing", "output": {"result": result}}


def _validated(actor: str, ok: bool) -> dict[str, Any]:
    result = {"command": "validate", "ok": ok, "output": "check passed" if ok else "1 problem(s)"}
    return {"type": "xstate.done.actor", "actorId": actor, "output": {"result": result}}


_FAILED_EDIT = [_EDIT, _edited(False)]
_RETRIED = [{"type": "RETRY"}, _edited(False)]
_ROLLED_BACK = {"type": "xstate.done.actor", "actorId": "rollingBack", "output": {"restored": 0}}
_LADDER_TOP = [_OPENED, *_FAILED_EDIT, *_RETRIED, *_RETRIED, *_RETRIED, _ROLLED_BACK]

RULE_EVALS += [
    RuleEval(
        "an edit task goes to the worker, who may edit, validate only after a change, and checkpoint",
        ("starting", "working"),
        _EDIT_TASK,
        [_OPENED],
        "working",
        accepts=[_EDIT, {"type": "SUBMIT"}, {"type": "CHECKPOINT", "kind": "progress"}, {"type": "ASK"}],
        refuses=[
            {"type": "VALIDATE"},
            {"type": "PIN"},
            {"type": "EDIT", "path": "src/llm.rs", "old": "x", "new": "x"},
            {"type": "RUN", "command": "view ."},
        ],
    ),
    RuleEval(
        "a failed edit is shown and may be retried; a successful one goes back to work, validate offered",
        ("acted", "recovering", "retrying"),
        _EDIT_TASK,
        [_OPENED, *_FAILED_EDIT, *_RETRIED, {"type": "RETRY"}, _edited(True)],
        "working",
        accepts=[{"type": "VALIDATE"}],
    ),
    RuleEval(
        "the fourth failure of one command rolls the workspace back: no fourth retry",
        ("acted", "recovering"),
        _EDIT_TASK,
        [_OPENED, *_FAILED_EDIT, *_RETRIED, *_RETRIED, *_RETRIED],
        "rollingBack",
    ),
    RuleEval(
        "after the rollback: ask, a new approach or BLOCKED; the edit that kept failing is banned",
        ("toBlocked", "blocked", "working"),
        _EDIT_TASK,
        [*_LADDER_TOP, {"type": "REPLAN", "text": "look first"}],
        "working",
        accepts=[{"type": "READ", "command": "view src/llm.rs"}],
        refuses=[_EDIT],
    ),
    RuleEval(
        "new approaches are capped",
        ("blocked",),
        {**_EDIT_TASK, "maxApproaches": 0, "maxTurns": 20},
        _LADDER_TOP,
        "blocked",
        accepts=[{"type": "BLOCKED", "reason": "stuck"}, {"type": "ASK", "question": "?"}],
        refuses=[{"type": "REPLAN"}, {"type": "RETRY"}],
    ),
    RuleEval(
        "SUBMIT is validated; a failure goes back to work with the copy reset",
        ("finishing", "submitting", "validationFailed"),
        _EDIT_TASK,
        [_OPENED, {"type": "SUBMIT"}, _validated("submitting", False)],
        "working",
        refuses=[{"type": "VALIDATE"}],
    ),
    RuleEval(
        "the validation retry limit ends the run rejected",
        ("submitting", "validationFailed"),
        {**_EDIT_TASK, "maxValidations": 1},
        [_OPENED, {"type": "SUBMIT"}, _validated("submitting", False)],
        "rejected",
    ),
    RuleEval(
        "a validated SUBMIT completes",
        ("finishing", "submitting"),
        _EDIT_TASK,
        [_OPENED, {"type": "SUBMIT"}, _validated("submitting", True)],
        "completed",
    ),
    RuleEval(
        "ask waits for an answer that says something",
        ("asking",),
        _EDIT_TASK,
        [_OPENED, {"type": "ASK", "question": "Which provider?"}],
        "asking",
        accepts=[{"type": "ANSWER", "text": "Cohere"}],
        refuses=[{"type": "ANSWER", "text": ""}, {"type": "ANSWER"}, {"type": "RESUME"}],
    ),
    RuleEval(
        "a checkpoint waits for RESUME; checkpoints are capped",
        ("checkpointed", "working"),
        {**_EDIT_TASK, "maxCheckpoints": 1},
        [
            _OPENED,
            {"type": "CHECKPOINT", "kind": "progress"},
            {"type": "xstate.done.actor", "actorId": "checkpointing", "output": {"checkpoint": {}}},
            {"type": "RESUME"},
        ],
        "working",
        refuses=[{"type": "CHECKPOINT", "kind": "questions"}],
    ),
]
