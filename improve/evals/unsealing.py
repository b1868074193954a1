"""The sealed test split's unsealings: an append-only record of every time its scores were shown.

No round reads the `test` split. A person scores it with `improve score --split test --unseal` (or runs
it with `improve run --unseal`), and each such command appends one line to `test-unsealings.jsonl` in
the environment's policies directory, next to its CHANGELOG (docs/contracts.md, the sealed test split):

    {"format": "improve.unsealing/1", "number": 1, "at": "2026-11-30T09:12:03Z",
     "who": "Dana <dana@example.com>", "command": "improve score --policy v3 --split test --unseal",
     "environment": "refunds", "test_set": "5f0c2a9e13b7", "test_scenarios": 20, "model": "naive",
     "scores": [{"version": "v3", "policy_hash": "...", "pass_rate": 0.9, "violations": 0, "runs": 60,
                 "k": 3, "scenarios": {"fraud-signal-t1": 1.0, ...}}],
     "comparison": null}

`number` counts the unsealings of the same test set (`test_set` is its key, as held-out sets are keyed
in `holdout.py`), so a changed test set starts at 1 again. The file is only ever appended to: commit
it with the policies, and a reviewer sees how often the final number was looked at.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from improve import clock
from improve.errors import ImproveError, WorkspaceError
from improve.evals.holdout import set_key
from improve.evals.scenarios import ScenarioSet
from improve.evals.workspace import Workspace
from improve.files import append_whole, storage_error

if TYPE_CHECKING:
    from improve.evals.scorecards import Scorecard

UNSEALINGS_FILE = "test-unsealings.jsonl"
FORMAT = "improve.unsealing/1"


@dataclass(frozen=True)
class UnsealedScore:
    """One policy version's score on the test split, as it was shown."""

    version: str
    policy_hash: str
    pass_rate: float
    violations: int
    runs: int
    k: int
    scenarios: dict[str, float]
    """Each test scenario's pass fraction over its runs."""

    @classmethod
    def of(cls, card: Scorecard, policy_hash: str) -> UnsealedScore:
        return cls(
            version=card.policy_version,
            policy_hash=policy_hash,
            pass_rate=card.pass_rate,
            violations=card.violations,
            runs=card.runs,
            k=card.k,
            scenarios={s.scenario: s.pass_fraction for s in card.scenarios},
        )


@dataclass(frozen=True)
class Unsealing:
    """One line of `test-unsealings.jsonl`."""

    number: int
    """Which unsealing of this test set it is (1 for the first)."""
    at: str
    """When, RFC 3339 UTC."""
    who: str
    command: str
    environment: str
    test_set: str
    """The test set's key (`holdout.set_key` of its scenarios)."""
    test_scenarios: int
    model: str
    scores: list[UnsealedScore]
    comparison: dict[str, Any] | None = None
    """The paired comparison with `--vs`, as `improve score --json` prints it."""

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}


def unsealings_path(policies_dir: Path) -> Path:
    return policies_dir / UNSEALINGS_FILE


def read_unsealings(path: Path) -> list[dict[str, Any]]:
    """Every recorded unsealing, oldest first; none when the file does not exist."""
    if not path.exists():
        return []
    return _records(path, path.read_bytes())


def _records(path: Path, data: bytes) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise WorkspaceError(
                f"{path}:{number}: not an unsealing record ({FORMAT}); the file is append-only: restore "
                f"it from git (`git checkout -- {path}`) rather than editing it"
            )
        found.append(record)
    return found


def record_unsealing(
    path: Path,
    *,
    who: str,
    command: str,
    environment: str,
    test_set: str,
    test_scenarios: int,
    model: str,
    scores: list[UnsealedScore],
    comparison: dict[str, Any] | None = None,
    at: dt.datetime | None = None,
) -> Unsealing:
    """Append one unsealing to the file (created when missing) and return it. Numbered and appended
    under the file's lock, in one write (`append_whole`): two unsealings at once get numbers 1 and 2, a
    full disk leaves the file as it was."""
    made: list[Unsealing] = []

    def line(current: bytes) -> bytes:
        earlier = [r for r in _records(path, current) if r.get("test_set") == test_set]
        unsealing = Unsealing(
            number=len(earlier) + 1,
            at=(at or clock.now()).strftime("%Y-%m-%dT%H:%M:%SZ"),
            who=who,
            command=command,
            environment=environment,
            test_set=test_set,
            test_scenarios=test_scenarios,
            model=model,
            scores=scores,
            comparison=comparison,
        )
        made.append(unsealing)
        return (json.dumps(unsealing.to_json(), ensure_ascii=False) + "\n").encode("utf-8")

    path.parent.mkdir(parents=True, exist_ok=True)
    append_whole(path, line)
    return made[-1]


def check_recordable(path: Path) -> None:
    """Refuse, before anything is run or scored, an unsealing that could not be recorded: the file (or,
    when it does not exist yet, its directory) must be writable. A full disk is found only when the
    record is written."""
    doing = f"record the unsealing in {path}; nothing was run or scored (the test split is scored only when its unsealing can be recorded)"
    try:
        if path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        os.unlink(probe)
    except OSError as error:
        raise storage_error(error, doing) from None


def current_user(root: Path) -> str:
    """Who is unsealing: git's user.name and user.email where the workspace is, else the CI actor
    (GITHUB_ACTOR), else the login name."""
    name, email = (_git_config(root, key) for key in ("user.name", "user.email"))
    if name or email:
        return f"{name} <{email}>" if name and email else name or email
    return os.environ.get("GITHUB_ACTOR") or getpass.getuser()


def _git_config(root: Path, key: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "config", "--get", key],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


@dataclass(frozen=True)
class Unsealed:
    """An unsealing just recorded: the record, the file it went to, and the first unsealing of the same
    test set (None when this is the first)."""

    unsealing: Unsealing
    path: Path
    first: dict[str, Any] | None = None

    def message(self) -> str:
        """What a command says once it has recorded the unsealing (before it shows any test score)."""
        u = self.unsealing
        before = f"; the first was on {self.first.get('at')} by {self.first.get('who')}" if self.first else ""
        return (
            f"unsealed the test split of {u.environment}: unsealing {u.number} of test set {u.test_set} "
            f"({u.test_scenarios} scenarios) by {u.who}, recorded in {self.path}{before}. Commit it with the "
            "policies; a change made because of these scores makes the test split one more reused held-out set"
        )


def unseal(
    space: Workspace,
    scenario_set: ScenarioSet,
    model: str,
    scores: list[UnsealedScore],
    command: str,
    comparison: dict[str, Any] | None = None,
    forget: Callable[[], None] | None = None,
) -> Unsealed:
    """Record an unsealing of the workspace's test split (who, when, the command, the scores shown) in
    the policies' test-unsealings.jsonl, before anything shows the scores. When it cannot be written (a
    full disk), `forget` takes the test runs' scores out of the warehouse again before the error goes on:
    no test score stays recorded without its unsealing."""
    path = unsealings_path(space.policies_dir(scenario_set.environment))
    key = set_key(scenario_set.sealed)
    earlier = [r for r in read_unsealings(path) if r.get("test_set") == key]
    try:
        unsealing = record_unsealing(
            path,
            who=current_user(space.root),
            command=command,
            environment=scenario_set.environment,
            test_set=key,
            test_scenarios=len(scenario_set.sealed),
            model=model,
            scores=scores,
            comparison=comparison,
        )
    except ImproveError:
        if forget is not None:
            with contextlib.suppress(Exception):
                forget()
        raise
    return Unsealed(unsealing, path, earlier[0] if earlier else None)


def check_unsealable(space: Workspace, scenario_set: ScenarioSet) -> None:
    """Before anything is run or scored: the unsealing must be recordable (`check_recordable`)."""
    check_recordable(unsealings_path(space.policies_dir(scenario_set.environment)))


def unsealings_so_far(space: Workspace, scenario_set: ScenarioSet) -> int:
    """How many times the current test set has been unsealed (its key: `set_key` of its scenarios)."""
    key = set_key(scenario_set.sealed)
    path = unsealings_path(space.policies_dir(scenario_set.environment))
    return sum(1 for r in read_unsealings(path) if r.get("test_set") == key)
