"""The round's pull request: one commit on a new branch, pushed, and a PR opened (or updated) for review.

The PR holds exactly the files the round hands over (the new policy version and the policies'
CHANGELOG.md) and nothing else; its body is the scorecard. The tool never merges: there is no merge
function here, and nothing calls the merge endpoint.

How it goes (`pull_request.open_pull_request`):

1. The files are committed onto the branch with git plumbing against a temporary index, so the
   working tree, the index and HEAD are never touched; an existing branch that already holds the
   content is reused (`commit.py`, on top of the git runner and repository of `git.py`).
2. With the remote present and a token in `GITHUB_TOKEN` (else `GH_TOKEN`) the branch is pushed, the
   token travelling only in an HTTP header scoped to the remote, never forced (`push.py`).
3. The PR is opened with PyGithub against `owner/name` parsed from the remote URL, or the open PR of
   the same branch is updated (`github.py`).

Without the remote or the token the local branch is left in place and the result's `instructions` say
exactly how to push it and open the PR. Every message, exception and result is scrubbed of the token
and of secret-looking environment values, and a file holding one is refused (`secrets.py`). Errors
are `PullRequestError` (exit code 3), raised without chaining the original exception, so a traceback
cannot carry an unscrubbed message either.

`check_branch_name` checks a branch name by git's rules before any of this runs (`BranchNameError`,
a `ConfigError`, exit code 2).
"""

from __future__ import annotations

from improve.loop.publish.git import check_branch_name
from improve.loop.publish.github import RemoteRepository, parse_remote_url
from improve.loop.publish.pull_request import PullRequestResult, branch_diff, open_pull_request

__all__ = [
    "PullRequestResult",
    "RemoteRepository",
    "branch_diff",
    "check_branch_name",
    "open_pull_request",
    "parse_remote_url",
]
