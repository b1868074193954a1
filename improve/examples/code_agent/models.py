"""Stand-in models for the code agent, with the failure modes the original's authors recorded.

Each is a plain function of the decision request (and a seeded generator), answering every decision
the machine asks (`plan`, `explore`, `evaluate`, `conclude`) and the freeform variant's single one
(`act`). They read the task and the outputs in the request's facts with `reader`, exactly what a
model would have in its prompt: nothing else, never a label.

- `careful` does what the original's prompts asked: views the file the task names (or searches for
  the term it quotes, or lists the directory), views the missing range when an output was cut, keeps
  a partial view it will need again, notes a finding it must compare with another, and answers only
  from evidence.
- `naive` makes the mistakes recorded in the original's logs, systematically:
  1. *answering before seeing the command output*: on a single-file lookup (variants of an enum in a
     named file, the first struct of a file, a default setting, exported functions) its explorer is
     done on its very first turn, without running anything, and its evaluator, shown no output,
     answers from belief (a hallucinated value). A policy can fix this: an evaluator that has seen
     no output continues instead.
  2. *viewing the same file again and again*: it never uses line ranges, so when a long file is cut
     it views the whole file again (the loop guard refuses the third time), and
  3. *hallucinating an answer*: forced to conclude, it reads the cut view as if it were the whole
     file (the last function it saw becomes "the last function").
  4. *never concluding*: it never keeps an output or writes a note, so a question that needs two
     outputs at once is never answerable; even when forced it only asks to continue.
- `sloppy` breaks the rules the machine's guards must catch: it answers in the explorer, repeats a
  command, invents commands that are not on the menu, keeps with nothing pending, and guesses.

On edit tasks (the worker's decisions `work`, `recover`, `blocked`), `careful` reads and pins the file,
makes every edit the change needs, validates and submits, asks when the task leaves the change open,
and moves on from an error; `naive` has the mistakes the worker's parts exist for (concluding without
validating, retrying the same failing command, never asking: see `naive_work`); `sloppy` submits at
once, makes edits that cannot apply and sends events of another state.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from improve.examples.code_agent.edit_tasks import (
    complete_edits,
    file_text,
    first_variant_edit,
    made,
    parse_arm_edit,
    parse_edit_task,
)
from improve.examples.code_agent.reader import (
    Question,
    Seen,
    belief,
    derive,
    findings,
    guess,
    parse_question,
    read,
    value_of,
)
from improve.runtime import DecisionRequest

Event = dict[str, Any]


def _list(request: DecisionRequest, key: str) -> list[Any]:
    value = request.facts.get(key)
    return list(value) if isinstance(value, list) else []


def _number(request: DecisionRequest, key: str) -> int:
    value = request.facts.get(key, 0)
    return int(value) if isinstance(value, int | float) else 0


def _commands(request: DecisionRequest) -> list[str]:
    return [str(o["command"]) for o in request.options if o.get("type") == "RUN" and "command" in o]


def _offered(request: DecisionRequest, event_type: str) -> bool:
    return any(o.get("type") == event_type for o in request.options)


def _run(command: str) -> Event:
    return {"type": "RUN", "command": command}


def _answer(text: str) -> Event:
    return {"type": "ANSWER", "text": text}


def _shown(request: DecisionRequest) -> list[Any]:
    """Outputs the decider is shown: the evaluator's memory and pending outputs, the explorer's last
    outputs, the freeform agent's memory and outputs."""
    return [
        *_list(request, "memory"),
        *_list(request, "pending"),
        *_list(request, "lastOutputs"),
        *_list(request, "outputs"),
    ]


def _question(request: DecisionRequest) -> Question:
    return parse_question(str(request.facts.get("task", "")))


def _ranges(path: str, commands: Sequence[str]) -> list[tuple[int, int, str]]:
    found = []
    for command in commands:
        match = re.fullmatch(rf"view {re.escape(path)}:(\d+)-(\d+)", command)
        if match:
            found.append((int(match.group(1)), int(match.group(2)), command))
    return sorted(found)


def _defining_hit(question: Question, seen: Seen) -> tuple[str, int] | None:
    """The search hit worth viewing around: an enum's definition, else the first hit of the term."""
    if not question.term:
        return None
    definition = (
        re.compile(rf"\benum {re.escape(question.term)}\b") if question.kind == "enum-count" else None
    )
    for path, number, text in seen.hits:
        if definition is None or definition.search(text):
            return path, number
    return None


def careful_command(question: Question, seen: Seen, commands: Sequence[str], last: str) -> str | None:
    """The next command a careful explorer runs, given what it was last shown (and its notes)."""

    def first(*candidates: str) -> str | None:
        return next((c for c in candidates if c in commands), None)

    kind = question.kind
    if kind in ("last-fn", "fn-count") and question.files:
        path = question.files[0]
        if path not in seen.lines:
            return first(f"view {path}")
        shown, total = max(seen.lines[path]), seen.totals.get(path, 0)
        ranges = _ranges(path, commands)
        if kind == "last-fn":
            ending = [c for a, b, c in ranges if b == total]
            return ending[0] if ending else first(f"view {path}")
        following = [c for a, _, c in ranges if a == shown + 1]
        return following[0] if following else first(f"view {path}")
    if kind == "cross-check":
        for path, name in zip(question.files, question.names, strict=True):
            if value_of(seen, path, name) is None:
                return first(f"view {path}")
        return None
    if question.files:
        return first(f"view {question.files[0]}")
    if kind == "file-count" and question.directory:
        return first(f"view {question.directory.rstrip('/')}", f"run ls {question.directory.rstrip('/')}")
    if question.term:
        search = f'text-search "{question.term}"'
        hit = _defining_hit(question, seen)
        if hit is None:
            return first(search)
        path, number = hit
        around = [c for a, b, c in _ranges(path, commands) if a <= number <= b]
        return around[0] if around else first(f"view {path}")
    if kind == "manifest":
        return first("view Cargo.toml", "view .")
    return next((c for c in commands if c != last and c not in seen.commands), None)


def naive_command(question: Question, seen: Seen, commands: Sequence[str], last: str) -> str | None:
    """The next command a naive explorer runs: the file the task names (whole, every time), else a
    search and then the whole file of its first hit, else the next entry of the menu."""
    if question.files:
        if len(question.files) > 1 and last == f"view {question.files[0]}":
            return f"view {question.files[1]}"
        return f"view {question.files[0]}"
    if question.directory:
        return f"view {question.directory.rstrip('/')}"
    if question.term:
        search = f'text-search "{question.term}"'
        if last != search:
            return search
        if seen.hits:
            return f"view {seen.hits[0][0]}"
    if not last or last not in commands:
        return commands[0] if commands else None
    index = commands.index(last)
    return commands[index + 1] if index + 1 < len(commands) else commands[0]


def _plan(question: Question) -> str:
    if question.files:
        return (
            f"1. View {', '.join(question.files)}. 2. Find what the task asks. 3. Answer with the value only."
        )
    if question.term:
        return f"1. Search for {question.term}. 2. View the lines around the definition. 3. Answer."
    return "1. List the repository. 2. View the likely file. 3. Answer with the value only."


def _keep_worthy(question: Question, pending: Sequence[Any]) -> bool:
    """A cut view of a file the question needs whole: worth keeping for the next turn."""
    if question.kind != "fn-count" or not question.files:
        return False
    return any(str(item.get("command", "")).startswith(f"view {question.files[0]}") for item in pending)


def careful(request: DecisionRequest, rng: random.Random) -> Event | None:
    """Explores with intent, keeps and notes what it needs, answers only from evidence."""
    if request.name in EDIT_DECISIONS:
        return careful_work(request)
    question = _question(request)
    notes = _list(request, "notes")
    if request.name == "plan":
        return {"type": "PLAN", "text": _plan(question)}
    if request.name == "explore":
        seen = read(_list(request, "lastOutputs"), notes)
        command = careful_command(
            question, seen, _commands(request), str(request.facts.get("lastCommand", ""))
        )
        return _run(command) if command else {"type": "DONE"}
    seen = read(_shown(request), notes)
    answer = derive(question, seen)
    if answer is not None:
        return _answer(answer)
    if request.name == "conclude":
        return _answer(derive(question, seen, lenient=True) or guess(question))
    found = findings(question, seen)
    if found:
        return {"type": "NOTE", "text": found[0]}
    current = _list(request, "pending") or _list(request, "outputs")
    if _keep_worthy(question, current) and _offered(request, "KEEP"):
        return {"type": "KEEP"}
    if request.name == "act":
        seen_now = read([*_list(request, "memory"), *_list(request, "outputs")], notes)
        command = careful_command(
            question, seen_now, _commands(request), str(request.facts.get("lastCommand", ""))
        )
        return _run(command) if command else _answer(guess(question))
    return {"type": "CONTINUE"}


def naive(request: DecisionRequest, rng: random.Random) -> Event | None:
    """The recorded failure modes, systematically (see the module docstring)."""
    if request.name in EDIT_DECISIONS:
        return naive_work(request)
    question = _question(request)
    notes = _list(request, "notes")
    prior = belief(question)
    # Its first explorer turn (the freeform loop's first turn): a planner's turn does not cure it.
    first = "explorerTurns" if "explorerTurns" in request.facts else "turnsUsed"
    eager = question.lookup and _number(request, first) == 0
    last = str(request.facts.get("lastCommand", ""))
    if request.name == "plan":
        return {"type": "PLAN", "text": "1. Look at the file. 2. Answer."}
    if request.name == "explore":
        if eager:
            return {"type": "DONE"}
        command = naive_command(
            question, read(_list(request, "lastOutputs"), notes), _commands(request), last
        )
        return _run(command) if command else {"type": "DONE"}
    if request.name == "act" and eager and prior is not None:
        return _answer(prior)
    shown = _shown(request)
    seen = read(shown, notes)
    answer = derive(question, seen)
    if answer is not None:
        return _answer(answer)
    if request.name == "conclude":
        lenient = derive(question, seen, lenient=True)
        return _answer(lenient) if lenient is not None else {"type": "CONTINUE"}
    if request.name == "evaluate":
        return _answer(prior) if not shown and prior is not None else {"type": "CONTINUE"}
    command = naive_command(question, read(_list(request, "outputs"), notes), _commands(request), last)
    return _run(command) if command else _answer(guess(question))


def sloppy(request: DecisionRequest, rng: random.Random) -> Event | None:
    """Breaks rules the guards must catch; the machine refuses each break and feeds it back."""
    if request.name in EDIT_DECISIONS:
        return sloppy_work(request, rng)
    question = _question(request)
    commands = _commands(request)
    last = str(request.facts.get("lastCommand", ""))
    roll = rng.random()
    if request.name == "plan":
        return {"type": "PLAN", "text": "Answer."}
    if request.name == "explore":
        if roll < 0.25:
            return _answer(guess(question))  # only the evaluator concludes: unknown-event here
        if roll < 0.45 and last:
            return _run(last)  # the same command again: the loop guard refuses the third
        if roll < 0.6:
            return _run("run rm -rf target")  # not on the menu: invalid-payload
        return _run(rng.choice(commands)) if commands else {"type": "DONE"}
    seen = read(_shown(request), _list(request, "notes"))
    if request.name in ("evaluate", "act") and roll < 0.3:
        return {"type": "KEEP"}  # refused when nothing is pending
    if roll < 0.6:
        return _answer(guess(question))
    answer = derive(question, seen, lenient=True)
    if answer is not None:
        return _answer(answer)
    if request.name == "act" and commands:
        return _run(rng.choice(commands))
    return {"type": "CONTINUE"}


# --- edit tasks: the worker's decisions (`work`, `recover`, `blocked`) -------------------------------

_UNHANDLED = re.compile(r"(\S+): parse_\w+ does not handle `(\w+)::(\w+)`")
_UNKNOWN_VARIANT = re.compile(r"(\S+): no variant `(\w+)` in enum `(\w+)`")


def _read(command: str) -> Event:
    return {"type": "READ", "command": command}


def _view_command(request: DecisionRequest, file: str) -> str | None:
    menu = [str(o["command"]) for o in request.options if o.get("type") == "READ" and "command" in o]
    return next((c for c in menu if c == f"view {file}" or c.endswith(f"/{file}")), None)


def _last_validation(request: DecisionRequest) -> dict[str, Any] | None:
    last = _list(request, "lastOutputs")
    return last[-1] if last and last[-1].get("command") == "validate" else None


def careful_work(request: DecisionRequest) -> Event | None:
    """Reads the file first (and pins it), makes every edit the change needs, validates, then is done;
    asks when the task leaves the change unclear, and moves on from an error instead of repeating it."""
    if request.name == "recover":
        error = str(request.facts.get("lastError", ""))
        return {"type": "RETRY"} if "timed out" in error else {"type": "MOVE_ON"}
    if request.name == "blocked":
        if _number(request, "asked") == 0:
            return {"type": "ASK", "question": f"This keeps failing: {request.facts.get('lastError', '')}"}
        return {"type": "BLOCKED", "reason": str(request.facts.get("lastError", "the change cannot be made"))}
    notes = _list(request, "notes")
    task = parse_edit_task(str(request.facts.get("task", "")), notes)
    if task is None:
        return {"type": "SUBMIT", "summary": "not an edit this agent can make"}
    if not task.name:
        if _number(request, "asked") == 0:
            return {"type": "ASK", "question": f"Which {task.enum} variant should be added?"}
        return {"type": "SUBMIT", "summary": "nobody said which variant to add"}
    last = _list(request, "lastOutputs")
    seen = read([*_list(request, "memory"), *last], notes)
    found = file_text(seen, task)
    if found is None:
        command = _view_command(request, task.file)
        return _read(command) if command else {"type": "ASK", "question": f"Where is {task.file}?"}
    path, text = found
    memory = [m.get("command") for m in _list(request, "memory")]
    viewed = next((o for o in last if str(o.get("command", "")).startswith("view ")), None)
    if viewed is not None and viewed.get("command") not in memory and _offered(request, "PIN"):
        return {"type": "PIN"}
    edits = _list(request, "edits")
    pending = [e for e in complete_edits(task, path, text) if not made(edits, e)]
    if pending:
        return {"type": "EDIT", **pending[0]}
    if _number(request, "unvalidatedEdits") > 0:
        return {"type": "VALIDATE"}
    return {"type": "SUBMIT", "summary": f"{task.kind} {task.name} in {path}: validated"}


def naive_work(request: DecisionRequest) -> Event | None:
    """The edit task's recorded mistakes, systematically:

    - *concluding without validating*: it makes the one edit the task names (not the second the
      change needs) and submits; the environment's validation fails, resets the copy and puts the
      failure in the working memory, which it never reads, so it makes the same edit again. Shown a
      failed validation as its last output (a VALIDATE), it does fix what the output names.
    - *retrying the same failing command*: it edits from the task's words before looking, so a file
      named without its directory fails; asked, it always retries as it is.
    - *never asking*: when the task leaves the name open it concludes there is nothing to do, and
      blocked it gives up.
    """
    if request.name == "recover":
        return {"type": "RETRY"}
    if request.name == "blocked":
        return {"type": "BLOCKED", "reason": "the edit does not apply"}
    notes = _list(request, "notes")
    task = parse_edit_task(str(request.facts.get("task", "")), notes)
    if task is None:
        return {"type": "SUBMIT"}
    if task.kind == "add-variant" and not task.name:
        return {"type": "SUBMIT", "summary": "the task does not say which variant to add"}
    last = _list(request, "lastOutputs")
    edits = _list(request, "edits")
    found = file_text(read(last, notes), task)
    path = found[0] if found else task.file
    validation = _last_validation(request)
    if validation is not None:
        if validation.get("ok"):
            return {"type": "SUBMIT", "summary": "done"}
        output = str(validation.get("output", ""))
        if match := _UNHANDLED.search(output):
            fix = parse_arm_edit(replace(task, enum=match.group(2), name=match.group(3)), match.group(1))
            if not made(edits, fix):
                return {"type": "EDIT", **fix}
        if match := _UNKNOWN_VARIANT.search(output):
            arm = f'        "{match.group(2).lower()}" => Some({match.group(3)}::{match.group(2)}),\n'
            fix = {"path": match.group(1), "old": arm, "new": ""}
            if not made(edits, fix):
                return {"type": "EDIT", **fix}
        return {"type": "SUBMIT", "summary": "done"}
    if "no such file" in str(request.facts.get("lastError", "")) and found is None:
        command = _view_command(request, task.file)
        if command:
            return _read(command)
    if edits:
        return {"type": "SUBMIT", "summary": "done"}
    if task.kind == "add-variant":
        return {"type": "EDIT", **first_variant_edit(task, path)}
    if task.kind == "remove-variant":
        return {"type": "EDIT", "path": path, "old": f"    {task.name},\n", "new": ""}
    if found is None:
        command = _view_command(request, task.file)
        return _read(command) if command else {"type": "SUBMIT"}
    change = complete_edits(task, *found)
    return {"type": "EDIT", **change[0]} if change else {"type": "SUBMIT"}


def sloppy_work(request: DecisionRequest, rng: random.Random) -> Event | None:
    """Breaks the edit task's rules: done at once, edits that cannot apply, events of another state."""
    roll = rng.random()
    if request.name in ("recover", "blocked"):
        return {"type": "RETRY"} if roll < 0.7 else {"type": "BLOCKED", "reason": "stuck"}
    task = parse_edit_task(str(request.facts.get("task", "")))
    if roll < 0.25:
        return {"type": "SUBMIT"}
    if roll < 0.45 and task is not None:
        return {"type": "EDIT", "path": task.file, "old": "fn main() {}", "new": "fn main() { todo!() }"}
    if roll < 0.55:
        return {"type": "RETRY"}  # not an event of the worker: unknown-event
    return careful_work(request)


EDIT_DECISIONS = ("work", "recover", "blocked")
