"""Pushing the branch with the token, never forcing and never showing the token.

The token reaches git only through the child's environment (`GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/
`GIT_CONFIG_VALUE_n`: an `http.<origin>.extraheader`, as actions/checkout does), never on a command
line or in a URL, so it cannot show up in gitpython's error messages. The header is scoped to the
push URL's origin, so it goes to no other host. Nothing is ever force-pushed: a push the remote
rejects (someone else's commits on the branch) raises an error that says how to reconcile.
"""

from __future__ import annotations

import base64
import os
from urllib.parse import urlsplit

from git.exc import GitCommandError

from improve.loop.publish.git import GitRunner, git_detail

__all__ = ["push"]


def push(g: GitRunner, remote: str, branch: str, token: str) -> None:
    """`git push --set-upstream <remote> <branch>`; raises a scrubbed `PullRequestError` with a hint."""
    ref = f"refs/heads/{branch}"
    try:
        g.repo.git.execute(
            ["git", "push", "--porcelain", "--set-upstream", remote, f"{ref}:{ref}"],
            env=_push_env(g, remote, token),
            with_extended_output=False,
        )
    except GitCommandError as exc:
        detail = git_detail(exc)
        lowered = detail.lower()
        if "[rejected]" in lowered or "non-fast-forward" in lowered or "fetch first" in lowered:
            hint = (
                f"the remote branch {branch} has commits that the local branch does not (someone else "
                "pushed to it); the tool never force-pushes. Inspect them with "
                f"`git fetch {remote} {branch}` and `git log {branch}..FETCH_HEAD`, then rebase the local "
                "branch onto them or run the round with another branch name"
            )
        elif any(s in lowered for s in ("authentication", "403", "401", "permission", "denied")):
            hint = (
                "the remote refused the credentials: the token in GITHUB_TOKEN/GH_TOKEN needs write access "
                "to the repository's contents (for GitHub Actions: `permissions: contents: write`)"
            )
        else:
            hint = (
                f"check `git remote -v` and that `git push -u {remote} {branch}` works from this "
                "directory; the local branch is kept, so the push can be done by hand"
            )
        raise g.error(f"pushing {branch} to {remote} failed: {detail}", hint) from None


def _push_env(g: GitRunner, remote: str, token: str) -> dict[str, str]:
    """Environment for `git push`: no prompts, and the token as an HTTP header scoped to the remote."""
    env = {"GIT_TERMINAL_PROMPT": "0"}
    push_url = (g.ok("remote", "get-url", "--push", remote) or "").strip()
    parts = urlsplit(push_url) if "://" in push_url else None
    if parts is not None and parts.scheme in {"http", "https"} and parts.hostname:
        origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/"
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        try:
            count = int(os.environ.get("GIT_CONFIG_COUNT", "0"))
        except ValueError:
            count = 0
        key = f"http.{origin}.extraheader"
        # an empty value first clears a header configured elsewhere (actions/checkout persists one)
        env.update(
            {
                f"GIT_CONFIG_KEY_{count}": key,
                f"GIT_CONFIG_VALUE_{count}": "",
                f"GIT_CONFIG_KEY_{count + 1}": key,
                f"GIT_CONFIG_VALUE_{count + 1}": f"AUTHORIZATION: basic {basic}",
                "GIT_CONFIG_COUNT": str(count + 2),
            }
        )
    return env
