"""The round's pull request: one commit on a new branch, pushed, and a PR opened (or updated) for review.

The PR holds exactly the files the round hands over (the new policy version and the policies'
CHANGELOG.md) and nothing else; its body is the scorecard. The tool never merges: there is no merge
function here, and nothing calls the merge endpoint.

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
and its tip already holds the same content for every file, it is reused as is (`reused=True`, no new
commit). If it holds different content, a new commit goes on top of its tip. Nothing is ever
force-pushed: a push the remote rejects (someone else's commits on the branch) raises an error that
says how to reconcile.

Publishing. With the remote present and a token in `GITHUB_TOKEN` (else `GH_TOKEN`) the branch is
pushed with gitpython; the token reaches git only through the child's environment
(`GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`: an `http.<origin>.extraheader`, as
actions/checkout does), never on a command line or in a URL, so it cannot show up in gitpython's
error messages. The PR is then opened with PyGithub against `owner/name` parsed from the remote URL
(https or ssh forms), with `GITHUB_API_URL` as the API base when set. An open PR whose head is the same
branch is updated (title, body) instead of opening a second one. Without the remote or the token the
local branch is left in place and `instructions` says exactly how to push it and open the PR.

Secrets. Every message, exception and result is scrubbed of the token and of the values of
secret-looking environment variables (`*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*API_KEY*`, ...); the PR
title, body and commit message are scrubbed the same way before they leave the machine, and a file
that contains such a value is refused. Errors are `PullRequestError` (exit code 3) and are raised
without chaining the original exception, so a traceback cannot carry an unscrubbed message either.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import git
from git.exc import GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from improve.errors import ImproveError

__all__ = [
    "PullRequestError",
    "PullRequestResult",
    "RemoteRepository",
    "branch_diff",
    "open_pull_request",
    "parse_remote_url",
]

DEFAULT_API_URL = "https://api.github.com"
_FALLBACK_NAME = "improve"
_FALLBACK_EMAIL = "improve@localhost"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|PRIVATE_?KEY|CREDENTIAL", re.IGNORECASE)
_MIN_SECRET_LEN = 8
_REDACTED = "***"


class PullRequestError(ImproveError):
    """Committing, pushing or opening the pull request failed; the message says what to do."""

    exit_code = 3


@dataclass(frozen=True)
class RemoteRepository:
    """A GitHub repository parsed from a remote URL."""

    host: str
    owner: str
    name: str

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


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


# --------------------------------------------------------------------------------------------------
# secrets


class _Scrubber:
    """Replaces every secret value (and the encodings git and HTTP use for it) with `***`."""

    def __init__(self, env: Mapping[str, str], token: str | None) -> None:
        values: set[str] = set()
        self.names: dict[str, str] = {}
        for name, value in env.items():
            if value and len(value) >= _MIN_SECRET_LEN and _SECRET_NAME.search(name):
                values.add(value)
                self.names.setdefault(value, name)
        if token:
            values.add(token)
            for user in ("x-access-token", "oauth2", "git"):
                values.add(base64.b64encode(f"{user}:{token}".encode()).decode())
        # longest first, so a secret that contains another is replaced whole
        self.values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, _REDACTED)
        return text

    def find(self, text: str) -> str | None:
        """The environment variable name of a secret found in `text` (or "the token")."""
        for value in self.values:
            if value in text:
                return self.names.get(value, "the token")
        return None


def _token(env: Mapping[str, str]) -> str | None:
    for name in ("GITHUB_TOKEN", "GH_TOKEN"):
        value = env.get(name, "").strip()
        if value:
            return value
    return None


# --------------------------------------------------------------------------------------------------
# remote URLs

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


def _api_url(env: Mapping[str, str], remote: RemoteRepository) -> str:
    explicit = env.get("GITHUB_API_URL", "").strip()
    if explicit:
        return explicit.rstrip("/")
    if remote.host in {"github.com", "www.github.com", "ssh.github.com"}:
        return DEFAULT_API_URL
    return f"https://{remote.host}/api/v3"  # GitHub Enterprise Server's API lives under /api/v3


# --------------------------------------------------------------------------------------------------
# git helpers


class _Git:
    """Runs git commands in one repository; failures become scrubbed `PullRequestError`s."""

    def __init__(self, repo: git.Repo, scrub: _Scrubber) -> None:
        self.repo = repo
        self.scrub = scrub

    def run(self, *args: str, env: Mapping[str, str] | None = None, what: str, hint: str = "") -> str:
        try:
            out = self.repo.git.execute(
                ["git", *args], env=env, with_extended_output=False, stdout_as_string=True
            )
        except GitCommandError as exc:
            raise self.error(f"{what} failed: {_git_detail(exc)}", hint) from None
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

    def entry(self, commit: str, path: str) -> tuple[str, str, str] | None:
        """(mode, type, object id) of `path` in `commit`, or None when absent."""
        out = self.run("ls-tree", "-z", commit, "--", path, what=f"listing {path}")
        for record in out.split("\0"):
            if not record:
                continue
            meta, _, name = record.partition("\t")
            if name == path:
                mode, kind, oid = meta.split()
                return mode, kind, oid
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


def _git_detail(exc: GitCommandError) -> str:
    stderr = exc.stderr if isinstance(exc.stderr, str) else str(exc.stderr or "")
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    lines = [line[len("stderr: ") :] if line.startswith("stderr: ") else line for line in lines]
    lines = [line.strip("'").strip() for line in lines]
    detail = " | ".join(line for line in lines if line)
    return detail or f"git exited with status {exc.status}"


def _open_repo(workspace_root: Path, scrub: _Scrubber) -> tuple[_Git, str]:
    """The repository holding `workspace_root`, and the workspace's path prefix inside it."""
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
    return _Git(repo, scrub), prefix


def _repo_path(path: str, prefix: str) -> str:
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


def _identity_env(g: _Git) -> dict[str, str]:
    """Author and committer for the commit: the user's git identity, or a fallback when none is set."""
    env: dict[str, str] = {}
    if g.ok("var", "GIT_AUTHOR_IDENT") is None:
        env.update(GIT_AUTHOR_NAME=_FALLBACK_NAME, GIT_AUTHOR_EMAIL=_FALLBACK_EMAIL)
    if g.ok("var", "GIT_COMMITTER_IDENT") is None:
        env.update(GIT_COMMITTER_NAME=_FALLBACK_NAME, GIT_COMMITTER_EMAIL=_FALLBACK_EMAIL)
    return env


def _write_blobs(g: _Git, files: Mapping[str, bytes]) -> dict[str, str]:
    blobs: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="improve-pr-") as tmp:
        for i, (path, data) in enumerate(files.items()):
            source = Path(tmp) / f"blob-{i}"
            source.write_bytes(data)
            blobs[path] = g.run(
                "hash-object", "-w", "--no-filters", "--", str(source), what=f"storing {path}"
            ).strip()
    return blobs


def _commit_on(g: _Git, parent: str, blobs: Mapping[str, str], message: str) -> str | None:
    """A new commit on `parent` whose tree is the parent's with `blobs` in place; None if unchanged."""
    with tempfile.TemporaryDirectory(prefix="improve-index-") as tmp:
        index_env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        g.run("read-tree", parent, env=index_env, what="reading the base tree into a temporary index")
        for path, oid in blobs.items():
            existing = g.entry(parent, path)
            if existing is not None and existing[1] != "blob":
                raise g.error(f"{path} is a {existing[1]} at the base commit, not a file; pick another path")
            mode = existing[0] if existing is not None and existing[0] in {"100644", "100755"} else "100644"
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
    commit_env = _identity_env(g)
    return g.run(
        "commit-tree", tree, "-p", parent, "-m", message, env=commit_env or None, what="creating the commit"
    ).strip()


def _holds(g: _Git, commit: str, blobs: Mapping[str, str]) -> bool:
    for path, oid in blobs.items():
        entry = g.entry(commit, path)
        if entry is None or entry[2] != oid:
            return False
    return True


def _base_branch_name(g: _Git, base: str | None, remote: str, has_remote: bool) -> str | None:
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


# --------------------------------------------------------------------------------------------------
# push


def _push_env(g: _Git, remote: str, token: str) -> dict[str, str]:
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


def _push(g: _Git, remote: str, branch: str, token: str) -> None:
    ref = f"refs/heads/{branch}"
    try:
        g.repo.git.execute(
            ["git", "push", "--porcelain", "--set-upstream", remote, f"{ref}:{ref}"],
            env=_push_env(g, remote, token),
            with_extended_output=False,
        )
    except GitCommandError as exc:
        detail = _git_detail(exc)
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


# --------------------------------------------------------------------------------------------------
# the pull request


def _open_or_update_pr(
    scrub: _Scrubber,
    *,
    api_url: str,
    token: str,
    repository: RemoteRepository,
    branch: str,
    base_name: str | None,
    title: str,
    body: str,
) -> tuple[int, str, str, str]:
    """(number, url, action, base) of the PR for `branch`: an open one updated, or a new one opened."""
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
            return existing.number, existing.html_url, "updated", existing.base.ref
        pr = repo.create_pull(base=target, head=branch, title=title, body=body)
        return pr.number, pr.html_url, "opened", target
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


# --------------------------------------------------------------------------------------------------
# the public functions


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
) -> PullRequestResult:
    """Commit exactly `files` to `branch` (from HEAD or `base`), push it, and open or update its PR.

    `files` maps paths relative to the workspace (the repository root in the usual layout) to their
    full new content. The working tree, the index and the checked-out branch are left untouched. With
    no remote named `remote` or no token in `env` (`GITHUB_TOKEN`, else `GH_TOKEN`) nothing leaves the
    machine and `instructions` says how to push and open the PR (`body_file` names the file holding
    the body for the `gh pr create` line). Never merges. Raises `PullRequestError` (exit code 3).
    """
    token = _token(env)
    scrub = _Scrubber(env, token)
    if not files:
        raise PullRequestError("no files to commit: pass the policy file and the CHANGELOG.md of the round")
    g, prefix = _open_repo(workspace_root, scrub)

    if g.ok("check-ref-format", "--branch", branch) is None or branch.startswith("-"):
        raise PullRequestError(scrub(f"{branch!r} is not a valid branch name; pick one like improve/round-3"))
    content: dict[str, bytes] = {}
    for path, text in files.items():
        repo_path = _repo_path(path, prefix)
        found = scrub.find(text)
        if found is not None:
            raise PullRequestError(
                f"{path} contains the value of {found}; refusing to commit a secret. Remove it from the file "
                "and run the round again"
            )
        content[repo_path] = text.encode("utf-8")
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
    ref = f"refs/heads/{branch}"
    local_tip = g.commit_of(ref)
    remote_tip = g.commit_of(f"refs/remotes/{remote}/{branch}") if has_remote else None
    start = local_tip or remote_tip
    notes: list[str] = []

    blobs = _write_blobs(g, content)
    reused = False
    if start is not None and _holds(g, start, blobs):
        commit = start
        reused = True
        notes.append(f"the branch {branch} already holds this content at {start[:12]}; reused it")
    else:
        parent = start or base_commit
        new = _commit_on(g, parent, blobs, commit_message)
        if new is None:
            raise PullRequestError(
                scrub(
                    f"nothing to commit: the files already have this content at {parent[:12]}; "
                    "the round has no change to propose"
                )
            )
        commit = new
        if start is not None:
            notes.append(
                f"the branch {branch} existed at {start[:12]} with other content; added {commit[:12]} on top"
            )
    if commit != local_tip:
        if branch in g.checked_out_branches():
            raise PullRequestError(
                scrub(
                    f"the branch {branch} is checked out in a work tree, so it cannot be moved without "
                    "touching that checkout; switch to another branch or run the round with another branch name"
                )
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

    base_name = _base_branch_name(g, base, remote, has_remote)
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

    _push(g, remote, branch, token)
    result.pushed = True

    url = g.config(f"remote.{remote}.url") or ""
    repository = parse_remote_url(url)
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

    number, pr_url, action, pr_base = _open_or_update_pr(
        scrub,
        api_url=_api_url(env, repository),
        token=token,
        repository=repository,
        branch=branch,
        base_name=base_name,
        title=title,
        body=body,
    )
    result.pr_number, result.pr_url, result.pr_action, result.base = number, scrub(pr_url), action, pr_base
    return result


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
    scrub = _Scrubber({}, None)
    g, prefix = _open_repo(workspace_root, scrub)
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
    args += [_repo_path(p, prefix) for p in paths] if paths is not None else []
    out = g.run(*args, what=f"diffing {branch} against {base or 'HEAD'}")
    return out + "\n" if out and not out.endswith("\n") else out
