from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The fake OpenAI-compatible endpoint's `serve` fixture, for every test module.
pytest_plugins = ["tests.fake_openai"]


def copy_workspace(target: Path) -> Path:
    """A scratch copy of the example workspace: improve.toml, scenarios/ and policies/."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "improve.toml", target / "improve.toml")
    shutil.copytree(REPO / "scenarios", target / "scenarios")
    shutil.copytree(REPO / "policies", target / "policies")
    return target
