"""The layering contract (pyproject.toml, `[tool.importlinter]`): kept by the code, and able to fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(source_root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the `improve` package found in `source_root`, with the repository's contract."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=source_root,
        env={**os.environ, "PYTHONPATH": str(source_root)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_code_keeps_the_layers() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_import_that_goes_up_a_layer_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(REPO / "improve", tmp_path / "improve", ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "improve" / "machine" / "config.py"
    config.write_text(config.read_text() + "\nfrom improve.loop import round as _upward  # noqa: E402\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout and "improve.machine.config -> improve.loop.round" in result.stdout


def test_no_two_modules_import_each_other() -> None:
    """A circle of imports, however long, shows as a module importing another that leads back to it."""
    graph = grimp.build_graph("improve", cache_dir=None)
    circles = sorted(
        f"{module} -> {imported}"
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        # A package's __init__ hands its modules' names on: that edge is its public face, not a circle.
        if not module.startswith(f"{imported}.") and graph.chain_exists(importer=imported, imported=module)
    )
    assert circles == []


def test_other_packages_import_a_package_through_its_face() -> None:
    """`from improve.evals import Workspace`, never `from improve.evals.workspace import ...`, outside
    `improve.evals` itself: a package's `__init__` is its public face."""
    graph = grimp.build_graph("improve", cache_dir=None)
    faces = {
        f"improve.{name}" for name in ("machine", "log", "runtime", "warehouse", "evals", "loop", "scaffold")
    }

    def face(module: str) -> str:
        return ".".join(module.split(".")[:2])

    reaching_in = sorted(
        f"{module}: {detail['line_contents']}"
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if face(imported) in faces and imported != face(imported) and face(module) != face(imported)
        for detail in graph.get_import_details(importer=module, imported=imported)
        # `from improve.log import replay` names the function the face exports, though a module of the
        # package has the same name: only a statement that spells the submodule reaches past the face.
        if imported in detail["line_contents"]
    )
    assert reaching_in == []
