"""Git for the pull request: a runner whose errors are scrubbed, the repository, and branch names.

`GitRunner` runs git commands through gitpython in the repository holding the workspace; a failing
command becomes a `PullRequestError` whose message says what was being done, what git said (scrubbed
of secrets, see `secrets.py`) and how to go on. `open_repo` finds that repository from the workspace
(which may sit below the repository's top) and `repo_path` maps workspace paths into it, refusing
paths that escape the workspace or point into `.git`.

Branch names. `check_branch_name` applies git's rules for branch names (what `git check-ref-format
--branch` accepts) without running git, so a name can be checked before there is a repository;
`base_branch_name` works out which branch a PR should target. The commit itself is built in
`commit.py` and pushed by `push.py`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import NamedTuple

import git
from git.exc import GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from improve.errors import BranchNameError, PullRequestError
from improve.loop.publish.secrets import Scrubber

__all__ = [
    "GitRunner",
    "OpenedRepository",
    "TreeEntry",
    "base_branch_name",
    "check_branch_name",
    "git_detail",
    "open_repo",
    "repo_path",
    "unfinished_operation",
]


class TreeEntry(NamedTuple):
    """One `git ls-tree` record: mode ("100644"), kind ("blob", "tree") and object id."""

    mode: str
    kind: str
    oid: str


class GitRunner:
    """Runs git commands in one repository; failures become scrubbed `PullRequestError`s."""

    def __init__(self, repo: git.Repo, scrub: Scrubber) -> None:
        self.repo = repo
        self.scrub = scrub

    def run(self, *args: str, env: Mapping[str, str] | None = None, what: str, hint: str = "") -> str:
        try:
            out = self.repo.git.execute(
                ["git", *args], env=env, with_extended_output=False, stdout_as_string=True
            )
        except GitCommandError as exc:
            raise self.error(f"{what} failed: {git_detail(exc)}", hint) from None
        return str(out)

    def ok(self, *args: str, env: Mapping[str, str] | None = None) -> str | None:
        """The output of a command whose failure is an answer (a ref that does not exist)."""
        try:
            out = self.repo.git.execute(
                ["git", *args], env=env, with_extended_output=False, stdout_as_string=True
            )
        except GitCommandError:
            return None
        return str(out)

    def error(self, message: str, hint: str = "") -> PullRequestError:
        text = message if not hint else f"{message}; {hint}"
        return PullRequestError(self.scrub(text))

    def commit_of(self, rev: str) -> str | None:
        out = self.ok("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
        return out.strip() if out else None

    def tree_of(self, commit: str) -> str:
        return self.run("rev-parse", "--verify", f"{commit}^{{tree}}", what="reading a commit's tree").strip()

    def entry(self, commit: str, path: str) -> TreeEntry | None:
        """`path` in `commit`, or None when absent."""
        out = self.run("ls-tree", "-z", commit, "--", path, what=f"listing {path}")
        for record in out.split("\0"):
            if not record:
                continue
            meta, _, name = record.partition("\t")
            if name == path:
                mode, kind, oid = meta.split()
                return TreeEntry(mode, kind, oid)
        return None

    def current_branch(self) -> str | None:
        out = self.ok("symbolic-ref", "--quiet", "HEAD")
        if out and out.strip().startswith("refs/heads/"):
            return out.strip()[len("refs/heads/") :]
        return None

    def checked_out_branches(self) -> set[str]:
        out = self.ok("worktree", "list", "--porcelain") or ""
        branches = {
            line[len("branch refs/heads/") :]
            for line in out.splitlines()
            if line.startswith("branch refs/heads/")
        }
        current = self.current_branch()
        if current:
            branches.add(current)
        return branches

    def remotes(self) -> list[str]:
        return [r.name for r in self.repo.remotes]

    def config(self, key: str) -> str | None:
        out = self.ok("config", "--get", key)
        return out.strip() if out else None


def git_detail(exc: GitCommandError) -> str:
    """What git said on stderr, on one line; gitpython's wrapping (`stderr: '...'`) removed."""
    stderr = exc.stderr if isinstance(exc.stderr, str) else str(exc.stderr or "")
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    lines = [line[len("stderr: ") :] if line.startswith("stderr: ") else line for line in lines]
    lines = [line.strip("'").strip() for line in lines]
    detail = " | ".join(line for line in lines if line)
    return detail or f"git exited with status {exc.status}"


class OpenedRepository(NamedTuple):
    """The repository holding a workspace, and the workspace's path prefix inside it ("" at the top)."""

    git: GitRunner
    prefix: str


def open_repo(workspace_root: Path, scrub: Scrubber) -> OpenedRepository:
    """The repository holding `workspace_root`; raises `PullRequestError` when there is none."""
    root = Path(workspace_root)
    try:
        repo = git.Repo(root, search_parent_directories=True)
    except (InvalidGitRepositoryError, NoSuchPathError):
        raise PullRequestError(
            scrub(
                f"{root} is not inside a git repository: run `git init` there and commit the workspace "
                "(policies/, scenarios/, improve.toml), then run the round again"
            )
        ) from None
    if repo.bare or repo.working_tree_dir is None:
        raise PullRequestError(
            scrub(f"{root} is a bare git repository: run the round in a clone with a work tree")
        )
    top = Path(repo.working_tree_dir).resolve()
    try:
        rel = root.resolve().relative_to(top).as_posix()
    except ValueError:
        rel = "."
    prefix = "" if rel in {"", "."} else rel + "/"
    return OpenedRepository(GitRunner(repo, scrub), prefix)


_UNFINISHED = (
    ("MERGE_HEAD", "a merge", "git merge --abort"),
    ("rebase-merge", "a rebase", "git rebase --abort"),
    ("rebase-apply", "a rebase", "git rebase --abort"),
    ("CHERRY_PICK_HEAD", "a cherry-pick", "git cherry-pick --abort"),
    ("REVERT_HEAD", "a revert", "git revert --abort"),
)
"""What git leaves in its directory while an operation waits for a person: the marker, what it is, and
how to abort it."""


def unfinished_operation(workspace_root: Path) -> str | None:
    """What git operation the repository holding `workspace_root` is in the middle of (a merge waiting
    for its conflicts to be resolved, say), with its unmerged paths and how to finish or abort it; None
    when there is none, or no repository."""
    try:
        repo = git.Repo(workspace_root, search_parent_directories=True)
    except (InvalidGitRepositoryError, NoSuchPathError):
        return None
    git_dir = Path(repo.git_dir)
    found = next(((what, abort) for marker, what, abort in _UNFINISHED if (git_dir / marker).exists()), None)
    try:
        unmerged = sorted(
            {line.split("\t", 1)[1] for line in repo.git.ls_files("-u").splitlines() if "\t" in line}
        )
    except GitCommandError:
        unmerged = []
    if found is None and not unmerged:
        return None
    what, abort = found or ("a merge", "git merge --abort")
    paths = (
        f" (unmerged: {', '.join(unmerged[:5])}{', ...' if len(unmerged) > 5 else ''})" if unmerged else ""
    )
    return f"{what}{paths}; finish it (resolve, git add, git commit) or abort it ({abort})"


def repo_path(path: str, prefix: str) -> str:
    """`path` (relative to the workspace) as a path in the repository; refuses escapes and .git."""
    raw = path.replace("\\", "/")
    pure = PurePosixPath(raw)
    if not raw or pure.is_absolute() or any(part in {"", ".", ".."} for part in raw.split("/")):
        raise PullRequestError(
            f"file path {path!r} must be relative to the workspace, without '.', '..' or a leading '/' "
            "(for example policies/refunds/v1.json)"
        )
    if pure.parts[0] == ".git":
        raise PullRequestError(f"file path {path!r} points into .git; only workspace files can be committed")
    return prefix + pure.as_posix()


# --------------------------------------------------------------------------------------------------
# branch names

# characters git refuses anywhere in a ref name (besides control characters and DEL)
_BAD_CHARS = frozenset(" ~^:?*[\\")
# a run of them (or of '@{') becomes one '-' in a suggested name
_BAD_RUN = re.compile(r"(?:[\x00-\x1f\x7f ~^:?*\[\\]|@\{)+")


def _branch_name_fault(name: str) -> str | None:
    """What breaks git's rules in branch name `name` (refs.c: check_refname_format), or None."""
    if not name:
        return "it is empty"
    if name.startswith("-"):
        return "it starts with '-', so git would read it as an option"
    if name == "HEAD":
        return "HEAD is git's name for the checked-out commit"
    for char in name:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return f"it contains the control character {char!r}"
        if char in _BAD_CHARS:
            shown = "a space" if char == " " else repr(char)
            return f"it contains {shown}, which git does not allow in branch names"
    if ".." in name:
        return "it contains '..', which git reads as a range of commits"
    if "@{" in name:
        return "it contains '@{', which git reads as a reflog or upstream suffix"
    if name.startswith("/"):
        return "it starts with '/'"
    if name.endswith("/"):
        return "it ends with '/'"
    for part in name.split("/"):
        if not part:
            return "it contains '//' (an empty part)"
        if part.startswith("."):
            return f"its part {part!r} starts with '.'"
        if part.endswith(".lock"):
            return f"its part {part!r} ends with '.lock', which git reserves for its lock files"
    if name.endswith("."):
        return "it ends with '.'"
    return None


def _suggest_branch_name(name: str) -> str | None:
    """A valid name close to `name` (bad characters become '-'), or None when none comes to mind."""
    text = re.sub(r"\.{2,}", ".", _BAD_RUN.sub("-", name))
    parts = []
    for part in text.split("/"):
        part = part.lstrip(".")
        while part.endswith((".lock", ".")):
            part = part.removesuffix(".lock").rstrip(".")
        if part:
            parts.append(part)
    text = "/".join(parts).lstrip("-")
    if text == name or _branch_name_fault(text) is not None:
        return None
    return text


def check_branch_name(name: str) -> str:
    """`name` when git accepts it as a branch name (as `git check-ref-format --branch` does).

    Raises `BranchNameError` (a `ConfigError`, exit code 2) naming the branch, the rule it breaks and
    a name to use instead. Needs no repository and runs no git.
    """
    fault = _branch_name_fault(name)
    if fault is None:
        return name
    suggestion = _suggest_branch_name(name)
    fix = f"use {suggestion!r} instead" if suggestion else "pick a name like 'improve/refunds-v2'"
    raise BranchNameError(
        f"branch name {name!r} is not valid: {fault}; {fix} (git branch names take letters, digits, "
        "'-', '_' and '.', with '/' between parts; no spaces, '..', '~ ^ : ? * [ \\' or '@{', no part "
        "starting with '.' or ending in '.lock')"
    )


def base_branch_name(g: GitRunner, base: str | None, remote: str, has_remote: bool) -> str | None:
    """The branch a PR should target: named by `base`, else the checked-out branch's upstream."""

    def known(name: str) -> bool:
        if g.commit_of(f"refs/heads/{name}") is not None:
            return True
        return has_remote and g.commit_of(f"refs/remotes/{remote}/{name}") is not None

    if base is not None:
        for prefix in ("refs/heads/", f"refs/remotes/{remote}/", f"{remote}/"):
            if base.startswith(prefix) and known(base[len(prefix) :]):
                return base[len(prefix) :]
        return base if known(base) else None
    current = g.current_branch()
    if current is None:
        return None
    if has_remote and g.config(f"branch.{current}.remote") == remote:
        merge = g.config(f"branch.{current}.merge") or ""
        if merge.startswith("refs/heads/"):
            return merge[len("refs/heads/") :]
    if has_remote and g.commit_of(f"refs/remotes/{remote}/{current}") is not None:
        return current
    return None if has_remote else current
