"""Writing a workspace: `improve.toml`, and a bundled environment's scenarios and policies.

`improve init` never overwrites: every file it would write is checked first, and when one exists,
nothing is written and the error lists them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from improve.errors import ImproveError, WorkspaceError
from improve.evals import CONFIG_NAME
from improve.files import storage_error, write_atomic
from improve.runtime import Environment

OBJECTIVE = """\
# How runs are scored, and when a candidate policy may be promoted.
[objective]
primary = "pass_rate"     # mean over scenarios of the fraction of k runs matching the labels
max_violations = 0        # hard constraint: rule violations allowed
cost = "model_calls"      # or "tokens": the tie-breaker, and the budget below
cost_budget = 1.5         # a candidate may cost at most 1.5x the baseline
k = 3                     # runs per scenario
max_model_calls = 100     # model-call budget per run
min_gain = 0.0            # the held-out mean gain must exceed this (and be significant)
confidence = 0.95         # the promotion rule's tests run at alpha = 1 - confidence
tolerance = 0.0           # a significant drop of a scenario no larger than this is allowed
max_fallback_share = 0.05 # more decisions than this left to onError by failed model calls: exit 3
max_extra_runs = 6        # reruns of a scenario whose result changed, per policy (0: none)
max_extra_runs_total = 300  # reruns of a round, both policies and every scenario
seed = 20261130           # resampling seed, printed with every scorecard
held_out_bias = 0.1       # held-out reuse: n held-out scenarios support 1 + floor(2 n 0.1^2 / ln 2) rounds
out_of_sample_cases = 100 # candidates checked with careful on generated cases (0: not)
"""


GITIGNORE = ("traces/", "reports/", ".improve/")
"""What every workspace `improve init` writes keeps out of git: generated threads and their warehouse,
round reports, and the workspace's own memory (`.improve/`)."""


def appended(path: Path, text: str, present: str) -> str | None:
    """The file's text with `text` appended, or None when `present` is already in it."""
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    if present in before:
        return None
    separator = "" if not before or before.endswith("\n\n") else ("\n" if before.endswith("\n") else "\n\n")
    return before + separator + text


def gitignored(root: Path) -> dict[str, str]:
    """`{".gitignore": text}`: `root`'s .gitignore with the lines of `GITIGNORE` it lacks appended, for
    `write_files(replace=...)`; empty when it has them all."""
    ignored = root / ".gitignore"
    existing = ignored.read_text(encoding="utf-8").splitlines() if ignored.exists() else []
    missing = [line for line in GITIGNORE if line not in existing]
    text = appended(ignored, "\n".join(missing) + "\n", "\n".join(missing)) if missing else None
    return {".gitignore": text} if text is not None else {}


def workspace_toml(name: str, header: str, module: str | None = None) -> str:
    """An improve.toml for one environment."""
    module_line = f'module = "{module}"\n' if module else ""
    return (
        f'{header}\n[workspace]\nenvironment = "{name}"\ntraces = "traces"\nreports = "reports"\n\n'
        f'[environments.{name}]\n{module_line}scenarios = "scenarios/{name}.yaml"\n'
        f'policies = "policies/{name}"\n\n{OBJECTIVE}'
    )


def refuse_existing(root: Path, relative: list[str]) -> None:
    """Raise, naming every one of `relative` that already exists under `root`."""
    existing = [r for r in relative if (root / r).exists()]
    if existing:
        raise WorkspaceError(
            f"improve init does not overwrite; these exist in {root}: {', '.join(existing)}. "
            "Choose an empty directory, or move them away"
        )


def write_files(
    root: Path, files: Mapping[str, str | Path], replace: Mapping[str, str] | None = None
) -> list[str]:
    """Write text (a str) or copy a file (a Path) to each relative path, after checking none exists;
    then replace the files of `replace` (a README extended) with their new text.

    All or nothing: each file is written whole (`write_atomic`), and when one cannot be (a full disk, a
    read-only directory, a name too long) the files and directories written before it are removed
    again and the replaced ones get their old text back, so a failed init leaves the directory as it
    was: nothing that a second one would refuse to overwrite."""
    refuse_existing(root, list(files))
    written: list[Path] = []
    replaced: list[tuple[Path, bytes | None]] = []
    made: list[Path] = []
    try:
        for relative, content in files.items():
            path = root / relative
            made += _make_parents(path.parent)
            data = content.read_bytes() if isinstance(content, Path) else content.encode("utf-8")
            write_atomic(path, data)
            written.append(path)
        for relative, text in (replace or {}).items():
            path = root / relative
            made += _make_parents(path.parent)
            replaced.append((path, path.read_bytes() if path.exists() else None))
            write_atomic(path, text)
    except (OSError, ImproveError):
        for path, old in reversed(replaced):
            with contextlib.suppress(OSError, ImproveError):
                if old is None:
                    path.unlink(missing_ok=True)
                else:
                    write_atomic(path, old)
        for path in reversed(written):
            path.unlink(missing_ok=True)
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    return [*files, *(replace or {})]


def _make_parents(directory: Path) -> list[Path]:
    """Create `directory` and its missing parents; the ones created, outermost first."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()][::-1]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise storage_error(error, f"create {directory}") from None
    return missing


def desk_files(env: Environment) -> dict[str, str | Path]:
    """A bundled environment's workspace: improve.toml, its scenarios and its policies."""
    home = env.home
    if home is None or not (home / "scenarios.yaml").is_file() or not (home / "policies").is_dir():
        raise WorkspaceError(
            f"environment {env.name!r} ships no scenarios.yaml and policies/ to write out; "
            "`improve init --from` takes a bundled desk (see `improve init --help`)"
        )
    name = env.name
    files: dict[str, str | Path] = {
        CONFIG_NAME: workspace_toml(
            name,
            f"# Written by `improve init --from {name}`: the {name} environment's workspace, yours to change.",
        ),
        f"scenarios/{name}.yaml": home / "scenarios.yaml",
    }
    for policy in sorted((home / "policies").iterdir()):
        if policy.is_file() and policy.suffix in (".json", ".md"):
            files[f"policies/{name}/{policy.name}"] = policy
    return files


def write_desk(env: Environment, root: Path) -> list[str]:
    """Write a bundled environment's workspace into `root` (created when missing), its `.gitignore`
    extended as `init --env` extends it (what `init` says next commits the workspace with `git add -A`);
    the relative paths written."""
    return write_files(root, desk_files(env), replace=gitignored(root))
