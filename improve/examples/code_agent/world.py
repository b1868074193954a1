"""code-agent's world: the repository the tools read, the answers recorded, and the tools (actors).

The repository is the fixture shipped in `fixture_repo/` (a scenario's `world` may add or replace
`files: {path: text}`, or `remove` paths); the commands that read it are repo.py's. The answer is an
effect the world records when the evaluator concludes, `{kind: answer, text: <normalised answer>}`,
compared exactly with the label: a wrong answer fails, a right one passes; concluding is not being
right. Ground truth is the repository, never a model's claim.

An edit task works in the world's shadow copy (shadow.py): `workspace.run` reads it, `workspace.edit`
writes it, `workspace.validate` runs the validation command in it and, on SUBMIT, records the diff as
the effects scored (`{kind: diff, path, added, removed}`), `workspace.rollback` returns it to the
last snapshot. `checkpoint.save` returns the checkpoint, which the journal keeps as its output.

The freeform variant (freeform.py) uses the same world and tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from improve.examples.code_agent.repo import Repo, execute, fixture_files, merge, opening_menu
from improve.examples.code_agent.shadow import Edit, EditRefused, Shadow
from improve.runtime import World


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
        self.shadow = Shadow(self.repo.files)

    def audit(self, effects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """A question has one answer: a second recorded answer is a violation; an edit task's diff
        is recorded once, so a file changed twice is one too."""
        effects = self.effects if effects is None else effects
        answers = [e for e in effects if e.get("kind") == "answer"]
        found = [{"rule": "one-answer", "answers": len(answers)}] if len(answers) > 1 else []
        paths = [e.get("path") for e in effects if e.get("kind") == "diff"]
        if len(paths) != len(set(paths)):
            found.append({"rule": "one-diff", "diffs": len(paths)})
        return found


# --- the tools (actors) ----------------------------------------------------------------------------


def _world(world: World) -> CodeWorld:
    if not isinstance(world, CodeWorld):
        raise TypeError(f"the code agent needs a CodeWorld, not {type(world).__name__}")
    return world


def _repo(world: World) -> Repo:
    return _world(world).repo


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


# --- the edit task's tools: the shadow copy --------------------------------------------------------


def _edits(input: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(e) for e in input.get("edits") or []]


def workspace_run(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """A command read against the shadow copy: the repository with the edits made so far."""
    shadow = _world(world).shadow
    shadow.sync(_edits(input))
    result = execute(Repo(shadow.files), str(input["command"]))
    return {"result": result.item(), "menu": merge(input.get("menu") or [], result.suggestions)}


def workspace_edit(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """One edit of the shadow copy. An edit that cannot be made is a failed result the agent sees
    (the escalation ladder counts it), never an exception."""
    edit = Edit.of(input.get("edit") or {})
    command = f"edit {edit.path}"
    try:
        change = _world(world).shadow.edit(_edits(input), edit)
    except EditRefused as refused:
        return {"result": {"command": command, "ok": False, "output": str(refused), "truncated": False}}
    shown = [
        f"edited {edit.path}",
        *(f"- {t}" for t in change["removed"]),
        *(f"+ {t}" for t in change["added"]),
    ]
    return {"result": {"command": command, "ok": True, "output": "\n".join(shown), "truncated": False}}


def workspace_validate(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """Run the validation command in the shadow copy. On SUBMIT (`final`): a pass records the diff, the
    ground truth scored; a failure resets the copy to the repository."""
    code_world = _world(world)
    shadow = code_world.shadow
    shadow.sync(_edits(input))
    checked = shadow.validate(str(input.get("validation", "check")))
    if input.get("final"):
        if checked.ok:
            for change in shadow.changes():
                code_world.record("diff", **{k: v for k, v in change.items() if k != "kind"})
        else:
            shadow.sync([])
    result = {"command": "validate", "ok": checked.ok, "output": checked.output, "truncated": False}
    return {"result": result}


def workspace_rollback(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """Return the shadow copy to the last snapshot (the edits of the last passing validation)."""
    edits = _edits(input)
    _world(world).shadow.sync(edits)
    return {"restored": len(edits)}


def save_checkpoint(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint: everything a resume needs (working memory, notes, plan, state), returned so
    the journal keeps it in the thread. Pure: the output is the input, stamped."""
    return {
        "checkpoint": {
            "kind": str(input.get("kind", "progress")),
            "task": input.get("task", ""),
            "memory": list(input.get("memory") or []),
            "notes": list(input.get("notes") or []),
            "plan": input.get("plan", ""),
            "state": dict(input.get("state") or {}),
        }
    }


ACTORS = {
    "repo.open": open_repo,
    "repo.run": run_command,
    "memory.edit": edit_memory,
    "answer.record": record_answer,
    "workspace.run": workspace_run,
    "workspace.edit": workspace_edit,
    "workspace.validate": workspace_validate,
    "workspace.rollback": workspace_rollback,
    "checkpoint.save": save_checkpoint,
}
