"""The bundled desks: one folder each, of the same shape, and every file that defines one is hashed by
the environment-unchanged gate, under a key no other file of the desk shares."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

from improve.errors import WorkspaceError
from improve.runtime import load_environment

EXAMPLES = Path(__file__).resolve().parents[1] / "improve" / "examples"
DESKS = {
    "refunds": "refunds",
    "refund-approval": "refund_approval",
    "tool-loop": "tool_loop",
    "code-agent": "code_agent",
    "triage": "triage",
}
SHAPE = ("__init__.py", "machine.json", "env.py", "models.py", "rules.py", "scenarios.yaml", "policies")


def _desk_imports(path: Path, package: str) -> set[Path]:
    """The desk's own modules that `path` imports, and theirs in turn."""
    found: set[Path] = set()
    todo = [path]
    while todo:
        tree = ast.parse(todo.pop().read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(package):
                continue
            names = [node.module] if node.module != package else [f"{package}.{a.name}" for a in node.names]
            for name in names:
                module = Path(importlib.import_module(name).__file__ or "")
                if module not in found:
                    found.add(module)
                    todo.append(module)
    return found


@pytest.mark.parametrize("slug", DESKS)
def test_each_desk_is_one_folder_of_the_same_shape(slug: str) -> None:
    folder = EXAMPLES / DESKS[slug]
    assert [name for name in SHAPE if not (folder / name).exists()] == []
    assert (folder / "world.py").exists() or not load_environment(slug).actors  # tools live in world.py
    assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
    assert load_environment(slug).home == folder


@pytest.mark.parametrize("slug", DESKS)
def test_the_gate_hashes_every_module_the_factory_is_built_from(slug: str) -> None:
    env = load_environment(slug)
    folder = EXAMPLES / DESKS[slug]
    needed = {folder / "machine.json", folder / "env.py"} | _desk_imports(
        folder / "env.py", f"improve.examples.{DESKS[slug]}"
    )
    assert needed - set(env.files) == set()
    assert len(env.file_hashes()) == len(env.files)


def test_file_hashes_are_keyed_by_the_path_under_home(tmp_path: Path) -> None:
    home = tmp_path / "desk"
    for name in ("desk/machine.json", "desk/a/notes.md", "desk/b/notes.md", "outside.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    files = [home / "machine.json", home / "a/notes.md", home / "b/notes.md", tmp_path / "outside.md"]
    env = dataclasses.replace(load_environment("refund-approval"), home=home, files=files)
    assert sorted(env.file_hashes()) == ["a/notes.md", "b/notes.md", "machine.json", "outside.md"]
    # Without a home the names are the keys, and two files of one name would hide each other.
    with pytest.raises(WorkspaceError, match=r"both hash under the key 'notes\.md'"):
        dataclasses.replace(env, home=None).file_hashes()
