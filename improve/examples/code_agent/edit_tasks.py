"""What the stand-in models read in an edit task, and the edits they make (the answer key is never read).

Edit tasks are sentences of three shapes:

    Add a `NAME` variant to the `ENUM` enum in FILE.
    Add the provider the maintainers chose to the `ENUM` enum in FILE.   (the name must be asked)
    Remove the `NAME` variant from the `ENUM` enum in FILE.
    Change the default `FIELD` in FILE to VALUE.

A model sees the file only through the outputs it is shown (a `view` it ran, or kept); the edits are
computed from that text the way a person would write them, in the file's own style.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from improve.examples.code_agent.reader import Seen

_ADD = re.compile(r"Add a `(\w+)` variant to the `(\w+)` enum in (\S+?)\.?$")
_ASKED = re.compile(r"Add the (\w+) the maintainers chose to the `(\w+)` enum in (\S+?)\.?$")
_REMOVE = re.compile(r"Remove the `(\w+)` variant from the `(\w+)` enum in (\S+?)\.?$")
_DEFAULT = re.compile(r"Change the default `(\w+)` in (\S+) to (\S+?)\.?$")
ANSWERED = re.compile(r"answer: (\w+)$")


@dataclass(frozen=True)
class EditTask:
    kind: str  # add-variant | remove-variant | set-default
    file: str  # as the task writes it
    name: str  # the variant or field; "" when it must be asked
    enum: str = ""
    value: str = ""


def parse_edit_task(task: str, notes: Sequence[str] = ()) -> EditTask | None:
    """The task's shape; an asked-for name is filled in from a person's answer in the notes."""
    text = " ".join(task.split())
    if match := _ADD.search(text):
        return EditTask("add-variant", match.group(3), match.group(1), match.group(2))
    if match := _ASKED.search(text):
        answered = [m.group(1) for n in notes if (m := ANSWERED.search(str(n)))]
        return EditTask("add-variant", match.group(3), answered[-1] if answered else "", match.group(2))
    if match := _REMOVE.search(text):
        return EditTask("remove-variant", match.group(3), match.group(1), match.group(2))
    if match := _DEFAULT.search(text):
        return EditTask("set-default", match.group(2), match.group(1), value=match.group(3))
    return None


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def file_text(seen: Seen, task: EditTask) -> tuple[str, str] | None:
    """(the file's path, its text) when a whole view of the file the task names was shown."""
    for path, lines in seen.lines.items():
        if path == task.file or path.endswith("/" + task.file):
            total = seen.totals.get(path, 0)
            if total and len(lines) == total:
                return path, "\n".join(lines[n] for n in range(1, total + 1))
    return None


def complete_edits(task: EditTask, path: str, text: str) -> list[dict[str, str]]:
    """Every edit the change needs, as someone who knows the codebase's conventions makes it: a
    variant is also parsed (and unparsed) where a `parse_<enum>` function lists the variants."""
    edits: list[dict[str, str]] = []
    parse = f"fn parse_{snake(task.enum)}" in text
    if task.kind == "add-variant" and task.name:
        edits.append(first_variant_edit(task, path))
        if parse:
            edits.append(parse_arm_edit(task, path))
    elif task.kind == "remove-variant":
        edits.append({"path": path, "old": f"    {task.name},\n", "new": ""})
        arm = re.search(rf"\n(\s*\"\w+\" => Some\({task.enum}::{task.name}\),)", text)
        if parse and arm:
            edits.append({"path": path, "old": arm.group(1) + "\n", "new": ""})
    elif task.kind == "set-default":
        found = re.search(rf"\n(\s*{task.name}: [^,\n]+,)", text)
        if found:
            line = found.group(1)
            edits.append({"path": path, "old": line, "new": re.sub(r": .*,", f": {task.value},", line)})
    return edits


def first_variant_edit(task: EditTask, path: str) -> dict[str, str]:
    """The new variant as the enum's first line."""
    return {
        "path": path,
        "old": f"pub enum {task.enum} {{\n",
        "new": f"pub enum {task.enum} {{\n    {task.name},\n",
    }


def parse_arm_edit(task: EditTask, path: str) -> dict[str, str]:
    arm = f'        "{task.name.lower()}" => Some({task.enum}::{task.name}),\n'
    return {"path": path, "old": "        _ => None,\n", "new": arm + "        _ => None,\n"}


def made(edits: Sequence[dict[str, object]], edit: dict[str, str]) -> bool:
    return any(e.get("path") == edit["path"] and e.get("old") == edit["old"] for e in edits)
