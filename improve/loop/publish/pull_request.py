"""The two public functions: `open_pull_request` (commit, push, open or update) and `branch_diff`.

`open_pull_request` checks its input (files relative to the workspace, none holding a secret, a
commit message), commits exactly the given files onto the branch (`commit.py`), and then goes as far
as the environment allows: with the remote present and a token it pushes (`push.py`) and opens or
updates the PR (`github.py`). Without the remote or the token, or when the remote's URL names no
GitHub repository, the branch is left in place and `PullRequestResult.instructions` says exactly how
to push it and open the PR by hand.

The token never travels over plain `http://`: when the push URL or the GitHub API (`GITHUB_API_URL`)
is `http://`, anyone on the path could read it, so nothing is sent and the branch is left in place with
instructions, unless `allow_insecure_github` (`improve round --allow-insecure-github`, meant for a
local GitHub Enterprise test) says to send it anyway.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from improve.errors import PullRequestError
from improve.loop.publish.commit import commit_to_branch
from improve.loop.publish.git import base_branch_name, open_repo, repo_path
from improve.loop.publish.github import RemoteRepository, api_base, open_or_update_pr, parse_remote_url
from improve.loop.publish.push import push
from improve.loop.publish.secrets import Scrubber, find_token

__all__ = ["PullRequestResult", "branch_diff", "open_pull_request"]


@dataclass
class PullRequestResult:
    """What `open_pull_request` did.

    `commit` is the branch tip holding the files; `reused` says the branch already held exactly this
    content (no new commit); `pushed` says the remote branch now points at `commit`; `pr_number` and
    `pr_url` are set when a PR was opened or updated (`pr_action` says which); `instructions` says how
    to finish by hand when something was left undone (no remote, no token, an unparseable remote URL).
    """

    branch: str
    commit: str
    pushed: bool
    pr_number: int | None
    pr_url: str | None
    reused: bool
    instructions: str | None
    base: str | None = None
    remote: str | None = None
    pr_action: str | None = None  # "opened", "updated" or None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "branch": self.branch,
            "commit": self.commit,
            "pushed": self.pushed,
            "pr_number": self.pr_number,
            "pr_url": self.pr_url,
            "pr_action": self.pr_action,
            "reused": self.reused,
            "base": self.base,
            "remote": self.remote,
            "instructions": self.instructions,
            "notes": list(self.notes),
        }


def open_pull_request(
    workspace_root: Path,
    *,
    branch: str,
    files: dict[str, str],
    commit_message: str,
    title: str,
    body: str,
    base: str | None = None,
    remote: str = "origin",
    env: Mapping[str, str] = os.environ,
    body_file: str | Path | None = None,
    allow_insecure_github: bool = False,
    candidate: Iterable[str] = (),
    alike: Callable[[str], str] = lambda text: text,
) -> PullRequestResult:
    """Commit exactly `files` to `branch` (from HEAD or `base`), push it, and open or update its PR.
    (`PullRequestResult.branch` is `branch-2` or later when `branch` holds another line's candidate:
    `commit.commit_to_branch`.)

    `files` maps paths relative to the workspace (the repository root in the usual layout) to their
    full new content. The working tree, the index and the checked-out branch are left untouched. With
    no remote named `remote` or no token in `env` (`GITHUB_TOKEN`, else `GH_TOKEN`) nothing leaves the
    machine and `instructions` says how to push and open the PR (`body_file` names the file holding
    the body for the `gh pr create` line). A push URL or API URL that is plain `http://` sends nothing
    either (the token would travel in clear text) unless `allow_insecure_github`; `instructions` and
    `notes` say so. `candidate` names the files (of `files`) that are the proposal itself: a branch whose
    tip already holds them, and the other files as they read once `alike` rewrote them (a round id
    masked), gets no new commit. Never merges. Raises `PullRequestError` (exit code 3).
    """
    token = find_token(env)
    scrub = Scrubber(env, token)
    if not files:
        raise PullRequestError("no files to commit: pass the policy file and the CHANGELOG.md of the round")
    g, prefix = open_repo(workspace_root, scrub)

    if g.ok("check-ref-format", "--branch", branch) is None or branch.startswith("-"):
        raise PullRequestError(scrub(f"{branch!r} is not a valid branch name; pick one like improve/round-3"))
    content: dict[str, bytes] = {}
    for path, text in files.items():
        repo_file = repo_path(path, prefix)
        found = scrub.find(text)
        if found is not None:
            raise PullRequestError(
                f"{path} contains the value of {found}; refusing to commit a secret. Remove it from the file "
                "and run the round again"
            )
        content[repo_file] = text.encode("utf-8")
    commit_message, title, body = scrub(commit_message), scrub(title), scrub(body)
    if not commit_message.strip():
        raise PullRequestError("the commit message is empty; pass one that names the round and the policy")

    base_commit = g.commit_of(base or "HEAD")
    if base_commit is None:
        what = f"the base {base!r} does not name a commit" if base else "the repository has no commit yet"
        raise PullRequestError(
            scrub(f"{what}; commit the workspace first, or pass an existing branch as base")
        )

    has_remote = remote in g.remotes()
    commit, reused, notes, branch = commit_to_branch(
        g,
        branch=branch,
        files=content,
        message=commit_message,
        base_commit=base_commit,
        remote=remote if has_remote else None,
        same_if=[repo_path(path, prefix) for path in candidate],
        alike=alike,
    )

    base_name = base_branch_name(g, base, remote, has_remote)
    result = PullRequestResult(
        branch=branch,
        commit=commit,
        pushed=False,
        pr_number=None,
        pr_url=None,
        reused=reused,
        instructions=None,
        base=base_name,
        remote=remote if has_remote else None,
        notes=notes,
    )
    body_path = str(body_file) if body_file is not None else None

    if not has_remote or token is None:
        reason = (
            f"the repository has no remote named {remote}"
            if not has_remote
            else "no token: set GITHUB_TOKEN or GH_TOKEN to push and open the PR automatically"
        )
        result.instructions = scrub(
            _instructions(
                branch=branch,
                remote=remote,
                has_remote=has_remote,
                need_push=True,
                base_name=base_name,
                title=title,
                body_file=body_path,
                reason=reason,
            )
        )
        return result

    url = g.config(f"remote.{remote}.url") or ""
    repository = parse_remote_url(url)
    insecure = _plain_http(g, remote, env, repository)
    if insecure and not allow_insecure_github:
        refusal = (
            f"refused to send the GitHub token over plain http to {' and '.join(insecure)}: anyone on the "
            "network path could read it. Use an https:// URL, or pass --allow-insecure-github "
            "(allow_insecure_github=True) for a local GitHub Enterprise test"
        )
        result.notes.append(scrub(refusal))
        result.instructions = scrub(
            _instructions(
                branch=branch,
                remote=remote,
                has_remote=True,
                need_push=True,
                base_name=base_name,
                title=title,
                body_file=body_path,
                reason=refusal,
            )
        )
        return result

    push(g, remote, branch, token)
    result.pushed = True

    if repository is None:
        result.instructions = scrub(
            _instructions(
                branch=branch,
                remote=remote,
                has_remote=True,
                need_push=False,
                base_name=base_name,
                title=title,
                body_file=body_path,
                reason=f"pushed, but the URL of {remote} does not name a GitHub owner/repository",
            )
        )
        return result

    pr = open_or_update_pr(
        scrub,
        api_url=api_base(env, repository),
        token=token,
        repository=repository,
        branch=branch,
        base_name=base_name,
        title=title,
        body=body,
    )
    result.pr_number, result.pr_url, result.pr_action = pr.number, scrub(pr.url), pr.action
    result.base = pr.base  # an updated PR keeps the base it was opened against
    return result


def _plain_http(
    g: Any, remote: str, env: Mapping[str, str], repository: RemoteRepository | None
) -> list[str]:
    """Where the token would go over plain `http://`: the push URL (git sends it as a header there,
    `push.py`) and the GitHub API (when the remote names a GitHub repository), as "what (url)"."""
    found = []
    push_url = (g.ok("remote", "get-url", "--push", remote) or "").strip()
    if urlsplit(push_url).scheme.lower() == "http":
        found.append(f"the push URL of {remote} ({_origin(push_url)})")
    if repository is not None:
        api = api_base(env, repository)
        if urlsplit(api).scheme.lower() == "http":
            found.append(f"the GitHub API ({_origin(api)}, from GITHUB_API_URL)")
    return found


def _origin(url: str) -> str:
    """scheme://host[:port] of a URL, without any user or password in it."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def branch_diff(
    workspace_root: Path,
    branch: str,
    base: str | None = None,
    paths: Iterable[str] | None = None,
) -> str:
    """The unified diff of `branch` against its base (`base`, else HEAD), from their merge base.

    `paths` (relative to the workspace) limits the diff, e.g. to the policy file. This is what the
    round writes to `reports/<round>/policy.diff`.
    """
    scrub = Scrubber({}, None)
    g, prefix = open_repo(workspace_root, scrub)
    tip = g.commit_of(f"refs/heads/{branch}") or g.commit_of(branch)
    if tip is None:
        raise PullRequestError(f"no branch {branch!r} in {workspace_root}; run the round to create it")
    base_commit = g.commit_of(base or "HEAD")
    if base_commit is None:
        raise PullRequestError(f"the base {base or 'HEAD'!r} does not name a commit in {workspace_root}")
    merge_base = (g.ok("merge-base", base_commit, tip) or "").strip() or base_commit
    args = [
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        merge_base,
        tip,
        "--",
    ]
    args += [repo_path(p, prefix) for p in paths] if paths is not None else []
    out = g.run(*args, what=f"diffing {branch} against {base or 'HEAD'}")
    return out + "\n" if out and not out.endswith("\n") else out


def _instructions(
    *,
    branch: str,
    remote: str,
    has_remote: bool,
    need_push: bool,
    base_name: str | None,
    title: str,
    body_file: str | None,
    reason: str,
) -> str:
    """How to finish by hand: add the remote, push, and `gh pr create` (or the web page)."""
    q = shlex.quote
    lines = [f"The branch {branch} was left in the local repository ({reason}). To publish it:"]
    if not has_remote:
        lines.append(f"  git remote add {q(remote)} <repository URL>")
    if need_push:
        lines.append(f"  git push -u {q(remote)} {q(branch)}")
    create = f"  gh pr create --head {q(branch)}"
    if base_name:
        create += f" --base {q(base_name)}"
    create += f" --title {q(title)} --body-file {q(body_file or 'pr.md')}"
    lines.append(create)
    if body_file is None:
        lines.append("where pr.md holds the PR body (the round writes it to reports/<round>/pr.md).")
    lines.append(
        "Or open the pull request from the branch on the repository's web page. The tool never merges."
    )
    return "\n".join(lines)
