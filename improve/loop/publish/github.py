"""The GitHub side: which repository a remote names, where its API lives, and the PR itself.

`parse_remote_url` reads `owner/name` (and the host) from the remote's URL, in the https, ssh, git and
scp forms. The API base is `GITHUB_API_URL` when set, else api.github.com for github.com and
`https://<host>/api/v3` for GitHub Enterprise Server. `open_or_update_pr` then works through PyGithub:
an open PR whose head is the same branch is updated (title, body) instead of opening a second one, so
running a round again refreshes its PR. Only idempotent requests are retried (a retried POST could
open two PRs), and the tool never merges: nothing here calls the merge endpoint.

API failures become `PullRequestError`s whose message says what the status means for this request
(a refused token, a missing `pull-requests: write`, a wrong remote URL, a missing base branch) and that
the pushed branch can still be turned into a PR by hand.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from improve.errors import PullRequestError
from improve.loop.publish.secrets import Scrubber

__all__ = [
    "DEFAULT_API_URL",
    "OpenedPullRequest",
    "RemoteRepository",
    "api_base",
    "open_or_update_pr",
    "parse_remote_url",
]

DEFAULT_API_URL = "https://api.github.com"


@dataclass(frozen=True)
class RemoteRepository:
    """A GitHub repository parsed from a remote URL."""

    host: str
    owner: str
    name: str

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


class OpenedPullRequest(NamedTuple):
    """The PR for a branch after `open_or_update_pr`: `action` is "opened" or "updated"."""

    number: int
    url: str
    action: str
    base: str


_SCP_LIKE = re.compile(r"^(?:(?P<user>[^@/]+)@)?(?P<host>[^:/]+):(?P<path>.+)$")


def parse_remote_url(url: str) -> RemoteRepository | None:
    """`owner/name` (and host) from a GitHub remote URL, or None when the URL is not of that shape.

    Accepts `https://host/owner/name(.git)`, `http://...`, `ssh://[user@]host[:port]/owner/name(.git)`,
    `git://host/owner/name` and the scp form `[user@]host:owner/name(.git)`.
    """
    url = url.strip()
    host: str | None
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https", "ssh", "git", "git+ssh", "ssh+git"}:
            return None
        host = parts.hostname
        path = parts.path
    else:
        match = _SCP_LIKE.match(url)
        if match is None or url.startswith(("/", ".")):
            return None
        host = match.group("host")
        path = match.group("path")
    if not host:
        return None
    segments = [s for s in path.strip("/").split("/") if s]
    if len(segments) < 2:
        return None
    owner, name = segments[-2], segments[-1]
    if name.endswith(".git"):
        name = name[: -len(".git")]
    if not owner or not name:
        return None
    return RemoteRepository(host=host.lower(), owner=owner, name=name)


def api_base(env: Mapping[str, str], remote: RemoteRepository) -> str:
    """The REST API base for `remote`: `GITHUB_API_URL` when set, else derived from the host."""
    explicit = env.get("GITHUB_API_URL", "").strip()
    if explicit:
        return explicit.rstrip("/")
    if remote.host in {"github.com", "www.github.com", "ssh.github.com"}:
        return DEFAULT_API_URL
    return f"https://{remote.host}/api/v3"  # GitHub Enterprise Server's API lives under /api/v3


def open_or_update_pr(
    scrub: Scrubber,
    *,
    api_url: str,
    token: str,
    repository: RemoteRepository,
    branch: str,
    base_name: str | None,
    title: str,
    body: str,
) -> OpenedPullRequest:
    """The PR for `branch`: an open one updated, or a new one opened against `base_name` (else the
    repository's default branch). Raises `PullRequestError` with a scrubbed message."""
    from github import (
        Auth,
        Github,
        GithubException,
    )  # imported here: only a round that opens a PR pays for it
    from urllib3.util.retry import Retry

    retry = Retry(
        total=3,
        connect=3,
        read=0,
        status=2,
        status_forcelist=(502, 503, 504),
        allowed_methods=frozenset({"GET", "PATCH"}),  # a POST is not retried: it could open two PRs
        backoff_factor=0.5,
        raise_on_status=False,
    )
    gh = Github(
        base_url=api_url,
        auth=Auth.Token(token),
        timeout=30,
        retry=retry,
        seconds_between_requests=None,
        seconds_between_writes=None,
    )
    where = f"{repository.full_name} at {api_url}"
    try:
        repo = gh.get_repo(repository.full_name)
        target = base_name or repo.default_branch
        existing = next(iter(repo.get_pulls(state="open", head=f"{repository.owner}:{branch}")), None)
        if existing is not None:
            existing.edit(title=title, body=body)
            return OpenedPullRequest(existing.number, existing.html_url, "updated", existing.base.ref)
        pr = repo.create_pull(base=target, head=branch, title=title, body=body)
        return OpenedPullRequest(pr.number, pr.html_url, "opened", target)
    except GithubException as exc:
        raise PullRequestError(scrub(_github_message(exc, where, branch))) from None
    except OSError as exc:  # requests' connection errors are OSErrors
        raise PullRequestError(
            scrub(
                f"could not reach the GitHub API for {where}: {type(exc).__name__}: {exc}; check the "
                f"network and GITHUB_API_URL; the branch {branch} is pushed, so the PR can also be "
                f"opened by hand"
            )
        ) from None
    finally:
        gh.close()


def _github_message(exc: Any, where: str, branch: str) -> str:
    status = getattr(exc, "status", None)
    data = getattr(exc, "data", None)
    message = ""
    if isinstance(data, dict):
        message = str(data.get("message", ""))
        errors = data.get("errors")
        if isinstance(errors, list):
            details = [
                str(e.get("message") or e.get("code") or e) if isinstance(e, dict) else str(e) for e in errors
            ]
            message = "; ".join([message, *details]) if message else "; ".join(details)
    elif data:
        message = str(data)
    hints = {
        401: "the token in GITHUB_TOKEN/GH_TOKEN was refused: check that it is valid and not expired",
        403: "the token may not open pull requests here (it needs `pull-requests: write`), or the API "
        "rate limit was hit",
        404: "the repository was not found: check the remote URL (`git remote -v`), GITHUB_API_URL, and "
        "that the token can see the repository",
        422: "GitHub refused the request: check that the base branch exists on the remote and that the "
        "branch has commits the base does not",
    }
    hint = hints.get(status or 0, "retry later, or open the PR by hand")
    return (
        f"the GitHub API answered {status} for {where}: {message or 'no message'}; {hint}. "
        f"The branch {branch} is pushed, so the PR can also be opened by hand."
    )
