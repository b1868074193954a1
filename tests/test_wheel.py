"""The package as a user installs it: a wheel built from the source tree, installed into a fresh
virtualenv, runs `improve demo` and `improve init` from a directory that is not this repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import test_publish
from tests.test_publish import FakeGitHub

REPO = Path(__file__).resolve().parents[1]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@dataclass(frozen=True)
class Installed:
    """The wheel built from the source tree, installed into a fresh virtualenv."""

    wheel: Path
    venv: Path
    env: dict[str, str]
    """The environment to run the virtualenv's commands in (no PYTHONPATH or VIRTUAL_ENV of ours)."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp_path = tmp_path_factory.mktemp("wheel")
    # The files git knows of, copied: a build of a clean tree, never of stale build/ leftovers.
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=REPO)
    source = tmp_path / "source"
    for name in filter(None, listed.split("\0")):
        path = REPO / name
        if path.is_file() and not path.is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    # The pure-Python wheel (IMPROVE_NATIVE_BUILD=0): compiling the fold's modules (setup.py) is a minute of
    # CPU, and the wheel's contents are the same without them.
    build_env = os.environ | {"IMPROVE_NATIVE_BUILD": "0"}
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
        "-w", tmp_path / "dist", source, cwd=tmp_path, env=build_env)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("improve_agents-*.whl")

    venv = tmp_path / "venv"
    # Without a pip of its own (bootstrapping one is 4 s of CPU): the test environment's pip, reached
    # through the .pth line below like every other dependency, installs into the virtualenv all the same.
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    # Dependencies come from the test environment's site-packages (offline); `improve` itself only
    # from the wheel: a .pth line adds the folder without running the editable install's hook there.
    site = Path(
        run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel, cwd=tmp_path, env=env)
    where = run(python, "-c", "import improve; print(improve.__file__)", cwd=tmp_path, env=env)
    assert where.strip().startswith(str(site)), where
    return Installed(wheel, venv, env)


@pytest.mark.slow
def test_the_wheel_runs_the_demo_from_a_fresh_virtualenv(installed: Installed, tmp_path: Path) -> None:
    venv, env = installed.venv, installed.env
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


# --- the workflow `improve init` writes, step by step --------------------------------------------------


github = test_publish.github  # the fake GitHub API on 127.0.0.1, as a fixture here too


def _steps(workflow: dict[str, Any], job: str) -> dict[str, str]:
    """A job's `run:` steps by name (or first line): what the runner's bash would run."""
    return {
        step.get("name") or step["run"].splitlines()[0]: step["run"]
        for step in workflow["jobs"][job]["steps"]
        if "run" in step
    }


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # How GitHub's runner runs a `run:` step with the default shell on Linux.
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


@dataclass(frozen=True)
class Pushed:
    """A workspace `improve init --env` wrote, committed on `main` and pushed to a local bare remote that
    stands in for GitHub (every clone reaches it under the GitHub URL a round names it by)."""

    workflow: dict[str, Any]
    bare: Path
    env: dict[str, str]
    """git's identity and configuration, the virtualenv's commands first on PATH."""
    runner_env: dict[str, str]
    """What a runner's step sees: the toolkit's requirement (its wheel standing in for PyPI), the token
    and the fake GitHub API."""
    tmp_path: Path

    def checkout(self, name: str, ref: str = "main") -> Path:
        """actions/checkout with fetch-depth 0: every branch, `ref` checked out."""
        clone = self.tmp_path / name
        run("git", "clone", "-q", "https://github.com/acme/desk.git", clone, cwd=self.tmp_path, env=self.env)
        run("git", "checkout", "-q", ref, cwd=clone, env=self.env)
        return clone


def pushed_workspace(installed: Installed, github: FakeGitHub, tmp_path: Path, name: str) -> Pushed:
    bin_dir = installed.venv / "bin"
    env = {
        **installed.env,
        "PATH": f"{bin_dir}{os.pathsep}{installed.env.get('PATH', '')}",
        "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Dana",
        "GIT_AUTHOR_EMAIL": "dana@example.invalid",
        "GIT_COMMITTER_NAME": "Dana",
        "GIT_COMMITTER_EMAIL": "dana@example.invalid",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    made = tmp_path / "made"
    run(bin_dir / "improve", "init", made, "--env", name, cwd=tmp_path, env=env)
    workflow = yaml.safe_load((made / ".github" / "workflows" / "improve.yml").read_text())
    requirement = workflow["env"]["IMPROVE_REQUIREMENT"]
    assert requirement == installed.wheel.name.split("-")[0].replace("_", "-") + "==0.1.0"
    bare = tmp_path / "desk.git"
    run("git", "init", "-q", "--bare", "-b", "main", bare, cwd=tmp_path, env=env)
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-q", "-m", "improve init")):
        run("git", *args, cwd=made, env=env)
    run("git", "push", "-q", str(bare), "main", cwd=made, env=env)
    (tmp_path / "gitconfig").write_text(f'[url "{bare}"]\n\tinsteadOf = https://github.com/acme/desk.git\n')
    runner_env = {
        **env,
        "IMPROVE_REQUIREMENT": requirement,
        "PIP_NO_INDEX": "1",  # the toolkit's wheel stands in for PyPI
        "PIP_FIND_LINKS": str(installed.wheel.parent),
        "RUNNER_TEMP": str(tmp_path),
        "GITHUB_TOKEN": "ghs_workflowTOKEN0123456789",
        "GITHUB_API_URL": github.url,
        "GITHUB_REPOSITORY": "acme/desk",
        "IMPROVE_ALLOW_INSECURE_GITHUB": "1",  # the fake API is plain http on 127.0.0.1
    }
    return Pushed(workflow, bare, env, runner_env, tmp_path)


@pytest.mark.slow
def test_every_step_of_the_scaffolded_workflow_runs_in_a_clone(
    installed: Installed, github: FakeGitHub, tmp_path: Path
) -> None:
    """The workspace `improve init` writes, committed and pushed to a local bare remote that stands in
    for GitHub. In a fresh clone, each `run:` step of the round job, then of the parity job, runs as the
    runner runs it (the install step against a folder holding the toolkit's wheel instead of PyPI):
    the round opens its PR and reports parity on it as a green status; the parity job is green on the
    round's own branch and red on a hand-made regression."""
    pushed = pushed_workspace(installed, github, tmp_path, "flow-desk")
    workflow, bare, env, runner_env = pushed.workflow, pushed.bare, pushed.env, pushed.runner_env
    checkout = pushed.checkout
    # The round job.
    clone = checkout("round")
    for name, script in _steps(workflow, "round").items():
        done = _bash(script, clone, runner_env)
        assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
    (pr,) = github.pulls.values()
    branch = pr["head"]["ref"]
    assert branch == "improve/flow-desk-v1" and pr["base"]["ref"] == "main"
    (status,) = [r for r in github.requests if "/statuses/" in r.path]
    head = run("git", "rev-parse", branch, cwd=bare, env=env).strip()
    assert status.path == f"/repos/acme/desk/statuses/{head}"
    assert status.body["state"] == "success" and status.body["context"] == "improve / parity"
    assert status.body["description"] == "parity compare v0.json v1.json"
    assert status.authorization == ["Bearer ghs_workflowTOKEN0123456789"]

    # The parity job on the round's pull request: green.
    parity = _steps(workflow, "parity")
    checks_env = {**runner_env, "BASE_REF": "main"}
    clone = checkout("pr", branch)
    for name, script in parity.items():
        done = _bash(script, clone, checks_env)
        assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
    assert "no unreviewed regression" in done.stdout

    # A hand-made regression: a v1 that declines every ticket. Red, naming the rows.
    clone = checkout("regression")
    policy = json.loads((clone / "policies" / "flow-desk" / "v0.json").read_text())
    policy.update(
        version="1", initial="decided", states={"decided": {"type": "final", "output": {"type": "'DECLINE'"}}}
    )
    (clone / "policies" / "flow-desk" / "v1.json").write_text(json.dumps(policy, indent=2))
    for name, script in parity.items():
        done = _bash(script, clone, checks_env)
        if name.startswith("parity compare"):
            assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
            assert "regression(s)" in done.stdout and "credited -> declined" in done.stdout
        else:
            assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"


def _declines(policy: dict[str, Any], version: str) -> dict[str, Any]:
    """`policy` as a version that declines every ticket."""
    final = {"decided": {"type": "final", "output": {"type": "'DECLINE'"}}}
    return {**policy, "version": version, "initial": "decided", "states": final}


@pytest.mark.slow
def test_the_parity_job_verifies_the_newest_policy_and_compares_it_with_the_base_branch_s(
    installed: Installed, github: FakeGitHub, tmp_path: Path
) -> None:
    """Each pull request a branch of a clone, committed; the parity job's steps run on it as the runner
    runs them, against `main` on the bare remote. "Before" is the base branch's content, so a version
    edited in place is compared (it used to pass as "no new policy version"), and an older version the
    pull request also changes is not read as before; the newest policy goes through `improve verify`;
    a change to the environment alone is said to have no policy difference to compare."""
    pushed = pushed_workspace(installed, github, tmp_path, "base-desk")
    parity = _steps(pushed.workflow, "parity")
    assert list(parity)[1:] == [
        "improve verify the newest policy",
        "parity compare the base branch's newest policy with this pull request's",
    ]
    checks_env = {**pushed.runner_env, "BASE_REF": "main"}
    v0 = json.loads((tmp_path / "made" / "policies" / "base-desk" / "v0.json").read_text())

    def pull_request(name: str, files: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], ...]:
        clone = pushed.checkout(name)
        run("git", "checkout", "-q", "-b", name, cwd=clone, env=pushed.env)
        for path, text in files.items():
            (clone / path).write_text(text)
        run("git", "add", "-A", cwd=clone, env=pushed.env)
        run("git", "commit", "-q", "-m", name, cwd=clone, env=pushed.env)
        done = tuple(_bash(script, clone, checks_env) for script in parity.values())
        assert done[0].returncode == 0, done[0].stderr
        return done[1:]

    policies = "policies/base-desk"
    # v0 edited in place: compared with main's v0, and red.
    verified, compared = pull_request("in-place", {f"{policies}/v0.json": json.dumps(_declines(v0, "0"))})
    assert verified.returncode == 0, f"{verified.stdout}\n{verified.stderr}"
    assert compared.returncode == 1, f"{compared.stdout}\n{compared.stderr}"
    assert (
        f"comparing main's {policies}/v0.json (as on main) with this pull request's {policies}/v0.json"
        in (compared.stdout)
    )
    assert "credited -> declined" in compared.stdout and "no new policy version" not in compared.stdout

    # v0 changed and v1 added as main's v0 was: before is main's v0, so nothing differs; the change to
    # the older version is warned about.
    verified, compared = pull_request(
        "older-changed",
        {
            f"{policies}/v0.json": json.dumps(_declines(v0, "0")),
            f"{policies}/v1.json": json.dumps({**v0, "version": "1"}),
        },
    )
    assert verified.returncode == 0 and compared.returncode == 0, f"{compared.stdout}\n{compared.stderr}"
    assert "no unreviewed regression" in compared.stdout
    assert f"::warning file={policies}/v0.json::" in compared.stdout

    # The environment alone changed: verify runs on it; parity says what it did not compare.
    world = (tmp_path / "made" / "base_desk" / "world.py").read_text()
    verified, compared = pull_request("environment", {"base_desk/world.py": world + "\n# a comment\n"})
    assert verified.returncode == 0 and "pass explore" in verified.stdout, verified.stdout
    assert compared.returncode == 0, f"{compared.stdout}\n{compared.stderr}"
    said = " ".join(compared.stdout.split())
    assert (
        f"{policies}/v0.json is main's {policies}/v0.json unchanged: no policy difference to compare" in said
    )
    assert "checked by improve verify above" in said

    # A new version improve verify refuses: red at verify, and parity refuses it too (exit 2).
    latent = {
        **v0,
        "version": "1",
        "initial": "route",
        "states": {
            **v0["states"],
            "route": {
                "type": "choice",
                "choice": [
                    {"guard": "facts.customer.refundz == 1", "target": "escalate"},
                    {"target": "ask_model"},
                ],
            },
        },
    }
    verified, compared = pull_request("latent", {f"{policies}/v1.json": json.dumps(latent, indent=2)})
    assert verified.returncode == 1 and "FAIL vocabulary" in verified.stdout, verified.stdout
    assert "facts.customer.refundz" in verified.stdout
    assert compared.returncode == 2 and "cannot run as written" in compared.stderr, compared.stderr
