"""The commit: exact files onto a branch with git plumbing, beside the user's checkout.

Committing without touching the user's checkout. The commit is built with git plumbing against a
*temporary index file* (`GIT_INDEX_FILE` pointing into a temporary directory):

    git read-tree <parent>                              # the parent's tree into the temporary index
    git hash-object -w --no-filters -- <tmp file>       # one blob per new file, content as given
    git update-index --add --cacheinfo <mode>,<blob>,<path>
    git write-tree                                      # the new tree
    git commit-tree <tree> -p <parent> -m <message>     # the commit object
    git update-ref refs/heads/<branch> <commit> <old>   # compare-and-swap on the branch ref only

None of these reads or writes the working tree, the real index or HEAD, so uncommitted and staged
changes, the checked-out branch and file timestamps stay exactly as they were. Only the object store
and the ref `refs/heads/<branch>` change (plus `branch.<branch>.*` upstream config after a push). A
branch checked out in any worktree is never moved.

Branch reuse. If `branch` already exists (locally, or as `<remote>/<branch>` from an earlier fetch)
and its tip already holds the same content for every file, it is reused as is (no new commit). If it
holds different content, a new commit goes on top of its tip, so the push that follows is a
fast-forward (`push.py` never forces one), as long as the tip contains the base: a branch of the same
name that does not holds another line's candidate (the history it was proposed on was reset since), and
a commit on it would carry that candidate along and miss what the base changed. The next free name
(`<branch>-2`, ...) is used then, and the old branch is left alone. With `same_if` (the candidate's own files, e.g. the policy),
a tip that already holds those is reused too when every other file reads the same once `alike` has
rewritten both: a round rerun on the same candidate writes a CHANGELOG entry that differs only in its
round id (which `alike` masks), and committing that would put a second commit of the same candidate on
the branch. Where another file says something else (the same candidate measured again on another model,
with other figures), a commit goes on top: the branch carries the evidence of the round that proposes it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import NamedTuple

from improve import clock
from improve.loop.publish.git import GitRunner

__all__ = ["BranchCommit", "commit_to_branch"]

_FALLBACK_NAME = "improve"
_FALLBACK_EMAIL = "improve@localhost"


class BranchCommit(NamedTuple):
    """The branch tip holding the files: `reused` when it already did (no new commit was made).
    `branch` is the branch used: the one asked for, or the first of `<branch>-2`, `-3`, ... when it holds
    another line's candidate (see `commit_to_branch`)."""

    commit: str
    reused: bool
    notes: list[str]
    branch: str


MAX_SUFFIX = 100
"""Branch names tried past the one asked for (`-2` to `-100`) before giving up."""


def commit_to_branch(
    g: GitRunner,
    *,
    branch: str,
    files: Mapping[str, bytes],
    message: str,
    base_commit: str,
    remote: str | None,
    same_if: Collection[str] = (),
    alike: Callable[[str], str] = lambda text: text,
) -> BranchCommit:
    """Point `refs/heads/<branch>` at a commit holding `files` (repository paths to content).

    The parent is the branch's tip (local, else `<remote>/<branch>` when `remote` is given), or
    `base_commit` for a new branch. A branch that exists with other content and does not contain
    `base_commit` holds another line's candidate (a round's branch of the same version, made before
    the history it was proposed on was reset or rewritten): a commit on top of it would carry that
    candidate's history and miss the base's changes, so the PR would conflict or drop them. It is left
    as it is, and the first of `<branch>-2`, `<branch>-3`, ... that is free or holds this line's
    candidate is used instead (`BranchCommit.branch`, and a note says why). Raises `PullRequestError`
    when the files change nothing on a new branch or the branch is checked out somewhere.
    """
    blobs = _write_blobs(g, files)
    candidate = {path: blobs[path] for path in same_if if path in blobs}
    skipped: list[str] = []
    for suffix in range(1, MAX_SUFFIX + 1):
        name = branch if suffix == 1 else f"{branch}-{suffix}"
        local_tip = g.commit_of(f"refs/heads/{name}")
        remote_tip = g.commit_of(f"refs/remotes/{remote}/{name}") if remote is not None else None
        start = local_tip or remote_tip
        held = None if start is None else _held(g, name, start, blobs, candidate, files, alike)
        if (
            start is None
            or held is not None
            or g.ok("merge-base", "--is-ancestor", base_commit, start) is not None
        ):
            break
        skipped.append(f"{name} (at {start[:12]})")
    else:
        raise g.error(
            f"the branches {branch} to {branch}-{MAX_SUFFIX} all hold candidates of other lines of history",
            "delete the ones no longer wanted (git branch -D NAME) and run the round again",
        )
    notes: list[str] = []
    if skipped:
        notes.append(
            f"{', '.join(skipped)} holds another candidate, on a history without this round's base "
            f"{base_commit[:12]}: left as it is, and this candidate goes to {name}"
        )
    if held is not None:
        assert start is not None
        commit, reused = start, True
        notes.append(held)
    else:
        parent = start or base_commit
        new = _commit_on(g, parent, blobs, message)
        if new is None:
            raise g.error(
                f"nothing to commit: the files already have this content at {parent[:12]}; "
                "the round has no change to propose"
            )
        commit, reused = new, False
        if start is not None:
            notes.append(
                f"the branch {name} existed at {start[:12]} with other content; added {commit[:12]} on top"
            )
    ref = f"refs/heads/{name}"
    if commit != local_tip:
        if name in g.checked_out_branches():
            raise g.error(
                f"the branch {name} is checked out in a work tree, so it cannot be moved without "
                "touching that checkout; switch to another branch or run the round with another branch name"
            )
        old = local_tip or "0" * len(commit)
        g.run(
            "update-ref",
            "-m",
            "improve: pull request branch",
            ref,
            commit,
            old,
            what=f"updating {ref}",
            hint="another process moved the branch meanwhile; run the round again",
        )
    return BranchCommit(commit, reused, notes, name)


def _identity_env(g: GitRunner) -> dict[str, str]:
    """Author and committer for the commit: the user's git identity, or a fallback when none is set;
    dated by the clock (`improve.clock`) unless the user's environment already sets the dates."""
    when = clock.now().strftime("%Y-%m-%dT%H:%M:%S+0000")
    env = {name: when for name in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE") if name not in os.environ}
    if g.ok("var", "GIT_AUTHOR_IDENT") is None:
        env.update(GIT_AUTHOR_NAME=_FALLBACK_NAME, GIT_AUTHOR_EMAIL=_FALLBACK_EMAIL)
    if g.ok("var", "GIT_COMMITTER_IDENT") is None:
        env.update(GIT_COMMITTER_NAME=_FALLBACK_NAME, GIT_COMMITTER_EMAIL=_FALLBACK_EMAIL)
    return env


def _write_blobs(g: GitRunner, files: Mapping[str, bytes]) -> dict[str, str]:
    blobs: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="improve-pr-") as tmp:
        for i, (path, data) in enumerate(files.items()):
            source = Path(tmp) / f"blob-{i}"
            source.write_bytes(data)
            blobs[path] = g.run(
                "hash-object", "-w", "--no-filters", "--", str(source), what=f"storing {path}"
            ).strip()
    return blobs


def _commit_on(g: GitRunner, parent: str, blobs: Mapping[str, str], message: str) -> str | None:
    """A new commit on `parent` whose tree is the parent's with `blobs` in place; None if unchanged."""
    with tempfile.TemporaryDirectory(prefix="improve-index-") as tmp:
        index_env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        g.run("read-tree", parent, env=index_env, what="reading the base tree into a temporary index")
        for path, oid in blobs.items():
            existing = g.entry(parent, path)
            if existing is not None and existing.kind != "blob":
                raise g.error(
                    f"{path} is a {existing.kind} at the base commit, not a file; pick another path"
                )
            # an executable bit (or a plain file's mode) survives; a symlink becomes a regular file
            mode = (
                existing.mode if existing is not None and existing.mode in {"100644", "100755"} else "100644"
            )
            g.run(
                "update-index",
                "--add",
                "--replace",
                "--cacheinfo",
                f"{mode},{oid},{path}",
                env=index_env,
                what=f"adding {path} to the temporary index",
            )
        tree = g.run("write-tree", env=index_env, what="writing the tree").strip()
    if tree == g.tree_of(parent):
        return None
    return g.run(
        "commit-tree", tree, "-p", parent, "-m", message, env=_identity_env(g), what="creating the commit"
    ).strip()


def _held(
    g: GitRunner,
    name: str,
    start: str,
    blobs: Mapping[str, str],
    candidate: Mapping[str, str],
    files: Mapping[str, bytes],
    alike: Callable[[str], str],
) -> str | None:
    """Why the branch `name` at `start` is reused as it is (a note), or None when it holds other content:
    every file as given, or the candidate's files with the others reading alike."""
    if _holds(g, start, blobs):
        return f"the branch {name} already holds this content at {start[:12]}; reused it"
    others = {p: c for p, c in files.items() if p not in candidate}
    if candidate and _holds(g, start, candidate) and _reads_alike(g, start, others, alike):
        return (
            f"the branch {name} already holds this candidate ({', '.join(sorted(candidate))}) at "
            f"{start[:12]}; reused it without a second commit"
        )
    return None


def _reads_alike(g: GitRunner, commit: str, files: Mapping[str, bytes], alike: Callable[[str], str]) -> bool:
    """Whether each of `files` at `commit` reads as the content given, once `alike` rewrote both (git's
    output loses a final newline, so none counts)."""
    for path, data in files.items():
        held = g.ok("show", f"{commit}:{path}")
        if held is None or alike(held).rstrip("\n") != alike(data.decode("utf-8", "replace")).rstrip("\n"):
            return False
    return True


def _holds(g: GitRunner, commit: str, blobs: Mapping[str, str]) -> bool:
    for path, oid in blobs.items():
        entry = g.entry(commit, path)
        if entry is None or entry.oid != oid:
            return False
    return True
