"""The round's pull request: a branch committed beside the user's checkout, pushed to a local bare
remote that looks like GitHub, and a PR opened on a fake GitHub API on 127.0.0.1. No network."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from improve.errors import BranchNameError, ConfigError, ImproveError, PullRequestError
from improve.loop.publish import (
    RemoteRepository,
    branch_diff,
    check_branch_name,
    open_pull_request,
    parse_remote_url,
)
from improve.loop.publish.github import OpenedPullRequest

TOKEN = "ghp_FAKEtoken1234567890abcdefSECRET"
REMOTE_URL = "https://github.com/acme/desk.git"
BRANCH = "improve/refunds-v1"
V0 = '{"id": "refunds-policy", "version": "0"}\n'
V1 = '{"id": "refunds-policy", "version": "1", "initial": "route"}\n'
CHANGELOG = "# Policies\n\n## v0\n\nThe model decides directly.\n"
CHANGELOG_V1 = CHANGELOG + "\n## v1 (recommended)\n\nEscalate frequent refunders.\n"
FILES = {"policies/refunds/v1.json": V1, "policies/refunds/CHANGELOG.md": CHANGELOG_V1}


# ------------------------------------------------------------------------------------------------
# a fake GitHub API


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    authorization: list[str] = field(default_factory=list)


@dataclass
class FakeGitHub:
    url: str = ""
    requests: list[Request] = field(default_factory=list)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    fail_post: int | None = None  # answer POST /pulls with this status


def _handler(state: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, doc: Any) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            state.requests.append(
                Request(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    dict(self.headers.items()),
                    body,
                    self.headers.get_all("Authorization") or [],
                )
            )
            base = f"{state.url}/repos/acme/desk"
            if parts.path == "/repos/acme/desk" and self.command == "GET":
                self._send(
                    200,
                    {
                        "id": 1,
                        "name": "desk",
                        "full_name": "acme/desk",
                        "owner": {"login": "acme", "id": 2},
                        "default_branch": "main",
                        "url": base,
                        "html_url": "https://github.com/acme/desk",
                    },
                )
            elif parts.path == "/repos/acme/desk/pulls" and self.command == "GET":
                head = parse_qs(parts.query).get("head", [""])[0]
                found = [
                    p for p in state.pulls.values() if p["state"] == "open" and p["head"]["label"] == head
                ]
                self._send(200, found)
            elif parts.path == "/repos/acme/desk/pulls" and self.command == "POST":
                if state.fail_post is not None:
                    self._send(
                        state.fail_post, {"message": "Validation Failed", "errors": [{"code": "invalid"}]}
                    )
                    return
                number = len(state.pulls) + 1
                pr = {
                    "number": number,
                    "state": "open",
                    "url": f"{base}/pulls/{number}",
                    "html_url": f"https://github.com/acme/desk/pull/{number}",
                    "title": body["title"],
                    "body": body["body"],
                    "head": {"ref": body["head"], "label": f"acme:{body['head']}"},
                    "base": {"ref": body["base"], "label": f"acme:{body['base']}"},
                }
                state.pulls[number] = pr
                self._send(201, pr)
            elif parts.path.startswith("/repos/acme/desk/statuses/") and self.command == "POST":
                self._send(201, {"id": len(state.requests), **body})
            elif parts.path.startswith("/repos/acme/desk/pulls/") and self.command == "PATCH":
                number = int(parts.path.rsplit("/", 1)[1])
                pr = state.pulls[number]
                pr.update({k: v for k, v in body.items() if k in {"title", "body", "state"}})
                self._send(200, pr)
            else:
                self._send(404, {"message": "Not Found"})

        do_GET = do_POST = do_PATCH = _handle

    return Handler


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    state = FakeGitHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


# ------------------------------------------------------------------------------------------------
# repositories


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture(autouse=True)
def _isolated_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user or system git config, a fixed identity, and no proxy for the fake API."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_COUNT"):
        monkeypatch.delenv(var, raising=False)
    for var in ("GIT_AUTHOR", "GIT_COMMITTER"):
        monkeypatch.setenv(f"{var}_NAME", "Test Person")
        monkeypatch.setenv(f"{var}_EMAIL", "test@example.com")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@dataclass
class Workspace:
    root: Path
    bare: Path | None


def make_workspace(tmp_path: Path, *, remote: bool = True, bare_name: str = "desk.git") -> Workspace:
    root = tmp_path / "work"
    (root / "policies" / "refunds").mkdir(parents=True)
    (root / "policies" / "refunds" / "v0.json").write_text(V0)
    (root / "policies" / "refunds" / "CHANGELOG.md").write_text(CHANGELOG)
    (root / "README.md").write_text("desk\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "initial")
    bare = None
    if remote:
        bare = tmp_path / bare_name
        git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
        git(root, "remote", "add", "origin", REMOTE_URL)
        # the remote looks like GitHub; git actually talks to the local bare repository
        git(root, "config", f"url.{bare}.insteadOf", REMOTE_URL)
        git(root, "push", "-q", "-u", "origin", "main")
    return Workspace(root, bare)


def user_state(root: Path) -> dict[str, Any]:
    """What the user sees: checkout, status, staged and unstaged diffs, file contents and mtimes."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    return {
        "head": git(root, "symbolic-ref", "HEAD"),
        "head_commit": git(root, "rev-parse", "HEAD"),
        "status": git(root, "status", "--porcelain=v1", "--untracked-files=all"),
        "staged": git(root, "diff", "--cached"),
        "unstaged": git(root, "diff"),
        "files": {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in files},
    }


def dirty(root: Path) -> None:
    """Uncommitted work of the user's own, in the very files the PR changes."""
    (root / "policies" / "refunds" / "CHANGELOG.md").write_text(CHANGELOG + "\nmy unsaved notes\n")
    (root / "policies" / "refunds" / "v1.json").write_text('{"draft": true}\n')
    (root / "staged.txt").write_text("staged\n")
    git(root, "add", "staged.txt")


def api_env(github: FakeGitHub, **extra: str) -> dict[str, str]:
    return {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": github.url, **extra}


def call(ws: Workspace, env: dict[str, str], **kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "branch": BRANCH,
        "files": FILES,
        "commit_message": "policy refunds v1: escalate frequent refunders",
        "title": "refunds policy v1 (round 1)",
        "body": "## Scorecard\n\nheld-out 0.70 -> 0.93\n",
    }
    # The fake API (and the http remote of one test) is plain http on 127.0.0.1: tests that mean to
    # reach it say so, as `--allow-insecure-github` does; the refusal itself is tested below.
    args.setdefault("allow_insecure_github", True)
    args.update(kwargs)
    return open_pull_request(ws.root, env=env, **args)


def assert_no_token(*texts: str) -> None:
    for text in texts:
        assert TOKEN not in text


# ------------------------------------------------------------------------------------------------
# tests


def test_pushes_one_commit_and_opens_the_pr_without_touching_the_checkout(
    tmp_path: Path, github: FakeGitHub
) -> None:
    ws = make_workspace(tmp_path)
    dirty(ws.root)
    before = user_state(ws.root)

    result = call(ws, api_env(github))

    assert user_state(ws.root) == before
    assert result.pushed and not result.reused
    assert (result.pr_number, result.pr_action, result.base) == (1, "opened", "main")
    assert result.pr_url == "https://github.com/acme/desk/pull/1"
    assert result.instructions is None
    assert ws.bare is not None
    # the bare remote has the branch: one commit on main, exactly the two files
    assert git(ws.bare, "rev-parse", BRANCH).strip() == result.commit
    assert git(ws.bare, "rev-list", "--count", f"main..{BRANCH}").strip() == "1"
    assert git(ws.bare, "rev-parse", f"{BRANCH}^").strip() == git(ws.root, "rev-parse", "main").strip()
    changed = git(ws.bare, "diff", "--name-status", "main", BRANCH).split("\n")
    assert sorted(filter(None, changed)) == [
        "A\tpolicies/refunds/v1.json",
        "M\tpolicies/refunds/CHANGELOG.md",
    ]
    assert git(ws.bare, "show", f"{BRANCH}:policies/refunds/v1.json") == V1
    assert git(ws.bare, "show", f"{BRANCH}:policies/refunds/CHANGELOG.md") == CHANGELOG_V1
    assert (
        git(ws.bare, "log", "-1", "--format=%s", BRANCH).strip()
        == "policy refunds v1: escalate frequent refunders"
    )
    # the local branch tracks the remote one
    assert git(ws.root, "config", f"branch.{BRANCH}.remote").strip() == "origin"
    # what PyGithub sent
    calls = [(r.method, r.path) for r in github.requests]
    assert calls == [
        ("GET", "/repos/acme/desk"),
        ("GET", "/repos/acme/desk/pulls"),
        ("POST", "/repos/acme/desk/pulls"),
    ]
    assert github.requests[1].query["head"] == [f"acme:{BRANCH}"]
    assert github.requests[1].query["state"] == ["open"]
    post = github.requests[2].body
    assert post == {
        "title": "refunds policy v1 (round 1)",
        "head": BRANCH,
        "base": "main",
        "body": "## Scorecard\n\nheld-out 0.70 -> 0.93\n",
    }
    for request in github.requests:
        assert request.headers["Authorization"] == f"token {TOKEN}"
    assert not any(r.method == "PUT" or r.path.endswith("/merge") for r in github.requests)
    assert_no_token(json.dumps(result.to_json()))


def test_second_call_reuses_the_branch_and_updates_the_open_pr(tmp_path: Path, github: FakeGitHub) -> None:
    ws = make_workspace(tmp_path)
    first = call(ws, api_env(github))
    github.requests.clear()

    second = call(ws, api_env(github), title="refunds policy v1 (round 1, rerun)", body="new body")

    assert second.reused and second.pushed
    assert second.commit == first.commit
    assert (second.pr_number, second.pr_action) == (1, "updated")
    methods = [(r.method, r.path) for r in github.requests]
    assert ("POST", "/repos/acme/desk/pulls") not in methods
    assert methods[-1] == ("PATCH", "/repos/acme/desk/pulls/1")
    assert github.requests[-1].body == {"title": "refunds policy v1 (round 1, rerun)", "body": "new body"}
    assert len(github.pulls) == 1 and github.pulls[1]["body"] == "new body"


def test_changed_content_adds_a_commit_on_top_of_the_existing_branch(
    tmp_path: Path, github: FakeGitHub
) -> None:
    ws = make_workspace(tmp_path)
    first = call(ws, api_env(github))
    files = {**FILES, "policies/refunds/v1.json": V1.replace("route", "route2")}

    second = call(ws, api_env(github), files=files)

    assert not second.reused and second.pushed
    assert ws.bare is not None
    assert git(ws.bare, "rev-parse", f"{BRANCH}^").strip() == first.commit
    assert git(ws.bare, "rev-parse", BRANCH).strip() == second.commit
    assert second.notes and "on top" in second.notes[0]
    assert [r.method for r in github.requests].count("POST") == 1


def test_a_branch_holding_another_lines_candidate_is_left_alone_and_the_next_name_is_used(
    tmp_path: Path, github: FakeGitHub
) -> None:
    # The history a branch was proposed on was reset and the rounds ran again: the same version number
    # names another candidate. Committed on top of the old branch, the PR would carry the old candidate
    # and miss what the new base holds.
    ws = make_workspace(tmp_path)
    first = call(ws, api_env(github))
    (ws.root / "policies" / "refunds" / "v0.json").write_text(V0 + "\n")
    git(ws.root, "commit", "-q", "-am", "another line: v0 edited")
    base = git(ws.root, "rev-parse", "HEAD").strip()
    other = {**FILES, "policies/refunds/v1.json": V1.replace("route", "route2")}

    second = call(ws, api_env(github), files=other)

    assert second.branch == f"{BRANCH}-2" and not second.reused and second.pushed
    assert ws.bare is not None
    assert git(ws.bare, "rev-parse", BRANCH).strip() == first.commit  # the old branch is untouched
    assert git(ws.bare, "rev-parse", f"{BRANCH}-2^").strip() == base  # the new one starts at the base
    assert f"{BRANCH} (at {first.commit[:12]}) holds another candidate" in second.notes[0]
    assert github.pulls[2]["head"]["ref"] == f"{BRANCH}-2"
    # Run again, the candidate finds its own branch; the old line's candidate, proposed again, its own.
    assert call(ws, api_env(github), files=other).branch == f"{BRANCH}-2"
    again = call(ws, api_env(github))
    assert again.branch == BRANCH and again.reused and again.commit == first.commit


def test_without_a_token_the_branch_stays_local_with_instructions(tmp_path: Path, github: FakeGitHub) -> None:
    ws = make_workspace(tmp_path)
    dirty(ws.root)
    before = user_state(ws.root)

    result = call(ws, {"GITHUB_API_URL": github.url}, body_file="reports/round-1/pr.md")

    assert user_state(ws.root) == before
    assert not result.pushed and result.pr_number is None and result.pr_url is None
    assert git(ws.root, "rev-parse", f"refs/heads/{BRANCH}").strip() == result.commit
    assert result.instructions is not None
    assert f"git push -u origin {BRANCH}" in result.instructions
    assert f"gh pr create --head {BRANCH} --base main" in result.instructions
    assert "--body-file reports/round-1/pr.md" in result.instructions
    assert github.requests == []
    assert ws.bare is not None
    assert git(ws.bare, "branch", "--list", BRANCH).strip() == ""
    assert result.to_json()["pushed"] is False


def test_gh_token_is_used_when_github_token_is_absent(tmp_path: Path, github: FakeGitHub) -> None:
    ws = make_workspace(tmp_path)
    result = call(ws, {"GH_TOKEN": TOKEN, "GITHUB_API_URL": github.url})
    assert result.pushed and result.pr_number == 1
    assert github.requests[0].headers["Authorization"] == f"token {TOKEN}"


def test_push_failure_never_shows_the_token(tmp_path: Path, github: FakeGitHub) -> None:
    ws = make_workspace(tmp_path)
    # point the GitHub-looking URL at a repository that does not exist
    git(ws.root, "config", "--unset-all", f"url.{ws.bare}.insteadOf")
    git(ws.root, "config", f"url.{tmp_path / 'missing.git'}.insteadOf", REMOTE_URL)

    with pytest.raises(PullRequestError) as info:
        call(ws, api_env(github), body=f"a body that leaks {TOKEN}")

    exc = info.value
    assert isinstance(exc, ImproveError) and exc.exit_code == 3
    assert "pushing" in str(exc) and "origin" in str(exc)
    assert exc.__cause__ is None and exc.__suppress_context__
    assert_no_token(str(exc), repr(exc), "".join(traceback.format_exception(exc)))
    assert github.requests == []
    # the local branch is kept, and the token was scrubbed from the commit's inputs too
    assert git(ws.root, "rev-parse", "--verify", f"refs/heads/{BRANCH}")


def test_https_push_sends_the_token_as_a_header_only(tmp_path: Path, github: FakeGitHub) -> None:
    """Over HTTP git sends the token in one Authorization header (a stale one configured by e.g.
    actions/checkout is replaced), and the failed push's message does not carry it."""
    ws = make_workspace(tmp_path, remote=False)
    url = f"{github.url}/acme/desk.git"
    git(ws.root, "remote", "add", "origin", url)
    git(ws.root, "config", f"http.{github.url}/.extraheader", "AUTHORIZATION: basic c3RhbGU=")

    with pytest.raises(PullRequestError, match="pushing") as info:
        call(ws, api_env(github))

    assert_no_token(str(info.value), "".join(traceback.format_exception(info.value)))
    assert "c3RhbGU=" not in str(info.value)
    refs = [r for r in github.requests if r.path == "/acme/desk.git/info/refs"]
    assert refs, [r.path for r in github.requests]
    expected = "basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert [a.lower() for a in refs[0].authorization] == [expected.lower()]
    assert not any(r.path.startswith("/repos/") for r in github.requests)
    assert TOKEN not in git(ws.root, "config", "--list")


def test_api_errors_are_infrastructure_errors_without_the_token(tmp_path: Path, github: FakeGitHub) -> None:
    ws = make_workspace(tmp_path)
    github.fail_post = 422

    with pytest.raises(PullRequestError) as info:
        call(ws, api_env(github), title=f"title {TOKEN}")

    message = str(info.value)
    assert "422" in message and "Validation Failed" in message and "pushed" in message
    assert_no_token(message, "".join(traceback.format_exception(info.value)))
    post = next(r for r in github.requests if r.method == "POST")
    assert TOKEN not in json.dumps(post.body) and "***" in post.body["title"]


@pytest.mark.parametrize("where", ["api", "push"])
def test_the_token_never_goes_over_plain_http_unless_allowed(
    tmp_path: Path, github: FakeGitHub, where: str
) -> None:
    """A plain-http GITHUB_API_URL or push URL: nothing is sent (the fake server sees no request, so no
    Authorization header), the branch stays local, and the instructions say why and how to allow it."""
    if where == "api":
        ws = make_workspace(tmp_path)
        env = api_env(github)
        expected = f"the GitHub API ({github.url}, from GITHUB_API_URL)"
    else:
        ws = make_workspace(tmp_path, remote=False)
        git(ws.root, "remote", "add", "origin", f"{github.url}/acme/desk.git")
        env = api_env(github, GITHUB_API_URL="https://api.github.invalid")
        expected = f"the push URL of origin ({github.url})"

    result = call(ws, env, allow_insecure_github=False)

    assert result.pushed is False and result.pr_number is None
    assert github.requests == []
    assert expected in result.instructions and "plain http" in result.instructions
    assert "--allow-insecure-github" in result.instructions and "https://" in result.instructions
    assert result.notes and "refused to send the GitHub token" in result.notes[-1]
    assert git(ws.root, "rev-parse", "--verify", f"refs/heads/{BRANCH}")
    if ws.bare is not None:
        assert BRANCH not in git(ws.bare, "branch")
    assert_no_token(json.dumps(result.to_json()))


def test_an_https_api_and_a_local_remote_need_no_permission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only plain http is refused: a file remote carries no token, and https is what it should be. The
    PR step is a stand-in that records where it would go (no network)."""
    ws = make_workspace(tmp_path)
    seen: list[str] = []

    def opened(scrub: Any, *, api_url: str, **kwargs: Any) -> OpenedPullRequest:
        seen.append(api_url)
        return OpenedPullRequest(3, "https://github.example/acme/desk/pull/3", "opened", "main")

    monkeypatch.setattr("improve.loop.publish.pull_request.open_or_update_pr", opened)
    env = {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": "https://github.example/api/v3"}
    result = call(ws, env, allow_insecure_github=False)
    assert result.pushed and result.pr_number == 3 and seen == ["https://github.example/api/v3"]
    assert ws.bare is not None and BRANCH in git(ws.bare, "branch")


def test_no_remote_at_all_leaves_a_local_branch_and_instructions(tmp_path: Path, github: FakeGitHub) -> None:
    ws = make_workspace(tmp_path, remote=False)
    before = user_state(ws.root)

    result = call(ws, api_env(github))

    assert user_state(ws.root) == before
    assert not result.pushed and result.pr_number is None and result.remote is None
    assert git(ws.root, "rev-parse", f"refs/heads/{BRANCH}").strip() == result.commit
    assert "git remote add origin" in result.instructions
    assert f"git push -u origin {BRANCH}" in result.instructions
    assert "gh pr create" in result.instructions
    assert github.requests == []
    assert_no_token(json.dumps(result.to_json()))


def test_branch_diff_shows_the_policy_change(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, remote=False)
    call(ws, {})

    diff = branch_diff(ws.root, BRANCH, "main")
    assert "+++ b/policies/refunds/v1.json" in diff
    assert '+{"id": "refunds-policy", "version": "1", "initial": "route"}' in diff
    assert "+## v1 (recommended)" in diff
    only_policy = branch_diff(ws.root, BRANCH, "main", paths=["policies/refunds/v1.json"])
    assert "v1.json" in only_policy and "CHANGELOG" not in only_policy
    assert only_policy.endswith("\n")


def test_base_option_and_identical_content_errors(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, remote=False)
    git(ws.root, "checkout", "-q", "-b", "feature")
    (ws.root / "README.md").write_text("feature work\n")
    git(ws.root, "commit", "-qam", "feature")

    result = call(ws, {}, base="main")
    assert git(ws.root, "rev-parse", f"{BRANCH}^").strip() == git(ws.root, "rev-parse", "main").strip()
    assert result.base == "main"

    with pytest.raises(PullRequestError, match="nothing to commit"):
        call(ws, {}, branch="improve/same", files={"policies/refunds/v0.json": V0})


def test_refuses_to_move_a_checked_out_branch(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, remote=False)
    call(ws, {})
    git(ws.root, "checkout", "-q", BRANCH)
    with pytest.raises(PullRequestError, match="checked out"):
        call(ws, {}, files={**FILES, "policies/refunds/v1.json": "{}\n"})
    # identical content needs no move, so it is fine
    assert call(ws, {}).reused


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"files": {"../outside.json": "{}"}}, "relative to the workspace"),
        ({"files": {"/etc/passwd": "{}"}}, "relative to the workspace"),
        ({"files": {".git/config": "{}"}}, ".git"),
        ({"files": {}}, "no files"),
        ({"branch": "bad..name"}, "not a valid branch name"),
        ({"files": {"policies/refunds/v1.json": f'{{"k": "{TOKEN}"}}'}}, "GITHUB_TOKEN"),
    ],
)
def test_bad_input_is_refused(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    ws = make_workspace(tmp_path, remote=False)
    with pytest.raises(PullRequestError, match=match) as info:
        call(ws, {"GITHUB_TOKEN": TOKEN}, **kwargs)
    assert TOKEN not in str(info.value)


def test_not_a_git_repository(tmp_path: Path) -> None:
    with pytest.raises(PullRequestError, match="not inside a git repository") as info:
        open_pull_request(
            tmp_path, branch=BRANCH, files=FILES, commit_message="m", title="t", body="b", env={}
        )
    assert info.value.exit_code == 3


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://github.com/acme/desk.git", RemoteRepository("github.com", "acme", "desk")),
        ("https://github.com/acme/desk", RemoteRepository("github.com", "acme", "desk")),
        ("https://x-access-token@github.com/acme/desk.git/", RemoteRepository("github.com", "acme", "desk")),
        ("git@github.com:acme/desk.git", RemoteRepository("github.com", "acme", "desk")),
        ("ssh://git@github.com/acme/desk.git", RemoteRepository("github.com", "acme", "desk")),
        ("ssh://git@ghe.example.com:2222/acme/desk", RemoteRepository("ghe.example.com", "acme", "desk")),
        ("/srv/git/desk.git", None),
        ("file:///srv/git/desk.git", None),
        ("https://github.com/desk", None),
    ],
)
def test_parse_remote_url(url: str, expected: RemoteRepository | None) -> None:
    assert parse_remote_url(url) == expected


# ------------------------------------------------------------------------------------------------
# branch names

VALID_BRANCHES = [
    "improve/support-desk-v2",
    "improve/tool_loop-v10",
    "improve/refunds-v1",
    "main",
    "a/b/c",
    "v1.2",
    "a.lockx",
    "a@b",
    "@",
    "a/HEAD",
    "a/-b",
    "a]b{c}",
    "é/ü-v1",
]
INVALID_BRANCHES = [  # (name, what the message says is wrong)
    ("improve/pkg.env:environment-v9", "contains ':'"),
    ("", "it is empty"),
    ("-v1", "starts with '-'"),
    ("-", "starts with '-'"),
    ("HEAD", "HEAD is git's name"),
    ("a b", "contains a space"),
    ("a\tb", "control character '\\t'"),
    ("a\x7fb", "control character '\\x7f'"),
    ("a\x00b", "control character '\\x00'"),
    ("a~1", "contains '~'"),
    ("a^b", "contains '^'"),
    ("a?b", "contains '?'"),
    ("a*b", "contains '*'"),
    ("a[b", "contains '['"),
    ("a\\b", "contains '\\\\'"),
    ("a..b", "contains '..'"),
    ("a..", "contains '..'"),
    ("a@{1}", "contains '@{'"),
    ("@{-1}", "contains '@{'"),
    ("/a", "starts with '/'"),
    ("a/", "ends with '/'"),
    ("a//b", "contains '//'"),
    (".a", "part '.a' starts with '.'"),
    ("a/.b", "part '.b' starts with '.'"),
    ("a/.", "part '.' starts with '.'"),
    ("a.lock", "part 'a.lock' ends with '.lock'"),
    ("a.lock/b", "part 'a.lock' ends with '.lock'"),
    ("a/b.lock", "part 'b.lock' ends with '.lock'"),
    ("a.", "ends with '.'"),
    ("a/b.", "ends with '.'"),
]


@pytest.mark.parametrize("name", VALID_BRANCHES)
def test_check_branch_name_accepts_what_git_accepts(name: str) -> None:
    assert check_branch_name(name) == name


@pytest.mark.parametrize(("name", "match"), INVALID_BRANCHES)
def test_check_branch_name_refuses_what_git_refuses(name: str, match: str) -> None:
    with pytest.raises(BranchNameError, match=re.escape(match)) as info:
        check_branch_name(name)
    assert isinstance(info.value, ConfigError)
    assert info.value.exit_code == 2
    assert repr(name) in str(info.value)


def test_branch_name_with_an_entry_point_slug_is_refused_with_a_fix() -> None:
    with pytest.raises(BranchNameError) as info:
        check_branch_name("improve/pkg.env:environment-v9")
    message = str(info.value)
    assert "'improve/pkg.env:environment-v9' is not valid" in message
    assert "':'" in message
    assert "use 'improve/pkg.env-environment-v9' instead" in message
    assert check_branch_name("improve/pkg.env-environment-v9") == "improve/pkg.env-environment-v9"


@pytest.mark.parametrize("name", [n for n, _ in INVALID_BRANCHES])
def test_suggested_branch_names_are_valid(name: str) -> None:
    with pytest.raises(BranchNameError) as info:
        check_branch_name(name)
    suggested = re.search(r"use '([^']*)' instead|like '([^']*)'", str(info.value))
    assert suggested is not None
    assert check_branch_name(suggested.group(1) or suggested.group(2))


@pytest.mark.parametrize("name", VALID_BRANCHES + [n for n, _ in INVALID_BRANCHES if "\0" not in n])
def test_check_branch_name_agrees_with_git(tmp_path: Path, name: str) -> None:
    """The reimplementation against `git check-ref-format --branch` itself, outside any repository
    (inside one, git would expand `@{-1}` to the previous branch's name)."""
    done = subprocess.run(
        ["git", "check-ref-format", "--branch", name],
        cwd=tmp_path,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)},
        capture_output=True,
    )
    try:
        check_branch_name(name)
        ours = True
    except BranchNameError:
        ours = False
    assert ours == (done.returncode == 0), done.stderr


def test_the_same_candidate_with_another_changelog_entry_adds_no_commit(
    tmp_path: Path, github: FakeGitHub
) -> None:
    # A rerun of a round proposes the same policy; its CHANGELOG entry differs only in the round id.
    ws = make_workspace(tmp_path)
    masked = partial(re.sub, r"round \d+", "round")
    entry = {**FILES, "policies/refunds/CHANGELOG.md": CHANGELOG_V1 + "- Report: round 1.\n"}
    first = call(ws, api_env(github), files=entry, candidate=["policies/refunds/v1.json"], alike=masked)
    rerun = {**FILES, "policies/refunds/CHANGELOG.md": CHANGELOG_V1 + "- Report: round 2.\n"}
    second = call(ws, api_env(github), files=rerun, candidate=["policies/refunds/v1.json"], alike=masked)
    assert second.reused and second.commit == first.commit
    assert second.notes and "already holds this candidate (policies/refunds/v1.json)" in second.notes[0]
    assert ws.bare is not None
    assert git(ws.bare, "rev-parse", BRANCH).strip() == first.commit
    # Without naming the candidate, the changed entry is a change: a commit on top (as before).
    third = call(ws, api_env(github), files=rerun)
    assert not third.reused and third.commit != first.commit
    # The same candidate measured otherwise: its entry says other figures, so it goes on top.
    other = {**FILES, "policies/refunds/CHANGELOG.md": CHANGELOG_V1 + "- held-out 0.5 -> 0.6, round 3.\n"}
    fourth = call(ws, api_env(github), files=other, candidate=["policies/refunds/v1.json"], alike=masked)
    assert not fourth.reused and fourth.commit != third.commit
