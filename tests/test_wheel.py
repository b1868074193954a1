"""The package as a user installs it: a wheel built from the source tree, installed into a fresh
virtualenv, runs `improve demo` and `improve init` from a directory that is not this repository."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.mark.slow
def test_the_wheel_runs_the_demo_from_a_fresh_virtualenv(tmp_path: Path) -> None:
    # The files git knows of, copied: a build of a clean tree, never of stale build/ leftovers.
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=REPO)
    source = tmp_path / "source"
    for name in filter(None, listed.split("\0")):
        path = REPO / name
        if path.is_file() and not path.is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
        "-w", tmp_path / "dist", source, cwd=tmp_path)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("improve_agents-*.whl")

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    # Dependencies come from the test environment's site-packages (offline); `improve` itself only
    # from the wheel: a .pth line adds the folder without running the editable install's hook there.
    site = Path(
        run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = run(python, "-c", "import improve; print(improve.__file__)", cwd=tmp_path, env=env)
    assert where.strip().startswith(str(site)), where

    improve = venv / "bin" / "improve"
    demo = run(
        improve, "demo", "--dir", tmp_path / "demo", "--rounds", "2", "--k", "1", cwd=tmp_path, env=env
    )
    promoted = re.search(r"(\d+) round\(s\) promoted: v0 -> v(\d+)", demo)
    assert promoted and int(promoted[1]) >= 1, demo
    assert (tmp_path / "demo" / "policies" / "refunds" / "CHANGELOG.md").is_file()
    made = run(improve, "init", tmp_path / "ws", "--env", "wheel-desk", cwd=tmp_path, env=env)
    assert "wheel_desk/machine.json" in made
    checked = run(improve, "verify", "v0", cwd=tmp_path / "ws", env=env)
    assert "pass overfit" in checked
    # Every bundled desk ships its scenarios and policies as package data: the newest, written out.
    run(improve, "init", tmp_path / "triage", "--from", "triage", cwd=tmp_path, env=env)
    desk = run(improve, "scenarios", "check", cwd=tmp_path / "triage", env=env)
    assert "71 scenarios in 13 categories" in desk, desk
