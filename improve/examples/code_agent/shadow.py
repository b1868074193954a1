"""The shadow copy an edit task works in: a temporary directory per run, never the package's fixture.

The copy is a function of the repository the world starts from and the list of edits made so far
(`{path, old, new}`, each replacing the one occurrence of `old` in `path`). The machine keeps that
list in its context (and so in the thread), and every tool that touches the copy is given it: the
copy brings itself in line first (applying the new edits, or starting again from the repository when
the list is not an extension of what it holds). So a rollback is the machine assigning an older
list, and a run resumed in another process rebuilds its copy from the thread alone.

The validation command is one of `VALIDATIONS`, the stated allowlist: argv lists run with the copy
as the working directory, no shell, a timeout, and a small environment.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKS = Path(__file__).parent / "checks.py"
VALIDATIONS: dict[str, tuple[str, ...]] = {"check": (sys.executable, "-I", str(CHECKS))}
"""The validation commands a scenario may name (`input.validate`), as argv lists: no shell."""
VALIDATION_TIMEOUT = 30.0
"""Seconds a validation may run before it is stopped (and counts as failed)."""
MAX_VALIDATION_OUTPUT = 2000
_VALIDATED: dict[tuple[str, str], Validation] = {}
"""Validations already run, by command and the copy's content. The bundled check reads the files and
nothing else, so its verdict is a function of them: a round's counterfactual runs and reruns, which
validate the same copies again and again, ask it once per content instead of starting a process each
time. A validation that reads anything else (a clock, the network) must not be remembered like this."""
_MAX_VALIDATED = 4096


@dataclass(frozen=True)
class Edit:
    """Replace the one occurrence of `old` in `path` with `new`."""

    path: str
    old: str
    new: str

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> Edit:
        return cls(str(value.get("path", "")), str(value.get("old", "")), str(value.get("new", "")))

    def item(self) -> dict[str, str]:
        return {"path": self.path, "old": self.old, "new": self.new}


class EditRefused(ValueError):
    """An edit that cannot be made as given (no such file, the text is not there, or not once)."""


def apply(files: Mapping[str, str], edit: Edit) -> dict[str, str]:
    """The files with one edit made; the path must be exact (writes never guess which file)."""
    if edit.path not in files:
        raise EditRefused(f"edit: no such file: {edit.path} (give the exact path, as `view` shows it)")
    text = files[edit.path]
    count = text.count(edit.old)
    if count != 1:
        where = "is not in" if count == 0 else f"occurs {count} times in"
        raise EditRefused(f"edit: the text to replace {where} {edit.path}; view the file and copy it exactly")
    return {**files, edit.path: text.replace(edit.old, edit.new, 1)}


def diff_effects(before: Mapping[str, str], after: Mapping[str, str]) -> list[dict[str, Any]]:
    """One effect per changed file: the lines added and removed (whitespace-trimmed, blank ones left
    out), in file order. This is what is scored against the label, not the agent's summary."""
    effects = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, "").split("\n"), after.get(path, "").split("\n")
        if old == new:
            continue
        added, removed = [], []
        for line in difflib.ndiff(old, new):
            text = line[2:].strip()
            if text and line.startswith("+ "):
                added.append(text)
            elif text and line.startswith("- "):
                removed.append(text)
        effects.append({"kind": "diff", "path": path, "added": added, "removed": removed})
    return effects


@dataclass(frozen=True)
class Validation:
    ok: bool
    output: str


class Shadow:
    """The repository's shadow copy for one run: files in memory, written to a temporary directory
    the first time a command must run in it."""

    def __init__(self, files: Mapping[str, str]) -> None:
        self.base = dict(files)
        self.files = dict(files)
        self.applied: list[Edit] = []
        self._dir: Path | None = None

    @property
    def directory(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="code-agent-shadow-"))
            weakref.finalize(self, shutil.rmtree, self._dir, True)
            self._write(self.files, {})
        return self._dir

    def _write(self, files: Mapping[str, str], previous: Mapping[str, str]) -> None:
        if self._dir is None:
            return
        for path in set(previous) - set(files):
            (self._dir / path).unlink(missing_ok=True)
        for path, text in files.items():
            if previous.get(path) != text:
                target = self._dir / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")

    def sync(self, edits: Sequence[Mapping[str, Any]]) -> None:
        """Bring the copy in line with the edits the machine says were made."""
        wanted = [Edit.of(e) for e in edits]
        if wanted == self.applied:
            return
        start = len(self.applied) if wanted[: len(self.applied)] == self.applied else 0
        files = self.files if start else dict(self.base)
        for edit in wanted[start:]:
            files = apply(files, edit)
        self._write(files, self.files)
        self.files, self.applied = files, wanted

    def edit(self, edits: Sequence[Mapping[str, Any]], edit: Edit) -> dict[str, Any]:
        """Make one more edit after `edits`; raises `EditRefused` when it cannot be made."""
        self.sync(edits)
        files = apply(self.files, edit)
        self._write(files, self.files)
        self.files, self.applied = files, [*self.applied, edit]
        return diff_effects({edit.path: self.base.get(edit.path, "")}, {edit.path: files[edit.path]})[0]

    def validate(self, name: str) -> Validation:
        argv = VALIDATIONS.get(name)
        if argv is None:
            return Validation(False, f"validation {name!r} is not one of {sorted(VALIDATIONS)}")
        key = (name, _content_key(self.files))
        known = _VALIDATED.get(key)
        if known is None:
            known = self._run(name, argv)
            if len(_VALIDATED) >= _MAX_VALIDATED:
                _VALIDATED.clear()
            _VALIDATED[key] = known
        return known

    def _run(self, name: str, argv: tuple[str, ...]) -> Validation:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        try:
            done = subprocess.run(
                list(argv),
                cwd=self.directory,
                capture_output=True,
                text=True,
                timeout=VALIDATION_TIMEOUT,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Validation(False, f"validation {name!r} timed out after {VALIDATION_TIMEOUT:g} s")
        output = (done.stdout + done.stderr).strip()[:MAX_VALIDATION_OUTPUT]
        return Validation(done.returncode == 0, output)

    def changes(self) -> list[dict[str, Any]]:
        return diff_effects(self.base, self.files)


def _content_key(files: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return digest.hexdigest()
