"""code-agent's world: the repository the tools read, the answers recorded, and the tools (actors).

The repository is the fixture shipped in `fixture_repo/` (a scenario's `world` may add or replace
`files: {path: text}`, or `remove` paths); the commands that read it are repo.py's. The answer is an
effect the world records when the evaluator concludes, `{kind: answer, text: <normalised answer>}`,
compared exactly with the label: a wrong answer fails, a right one passes; concluding is not being
right. Ground truth is the repository, never a model's claim.

The freeform variant (freeform.py) uses the same world and tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from improve.examples.code_agent.repo import Repo, execute, fixture_files, merge, opening_menu
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

    def audit(self, effects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """A question has one answer: a second recorded answer is a violation."""
        effects = self.effects if effects is None else effects
        answers = [e for e in effects if e.get("kind") == "answer"]
        return [{"rule": "one-answer", "answers": len(answers)}] if len(answers) > 1 else []


# --- the tools (actors) ----------------------------------------------------------------------------


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
