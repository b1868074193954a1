"""What a round leaves behind, its record step: the report folder with the round record and its
renderings, the CHANGELOG entry, and for a recommended candidate its review branch and pull request
(or, outside git, the files and how to apply them)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from improve.errors import ImproveError
from improve.files import write_atomic
from improve.loop.changelog import Added
from improve.loop.inputs import Inputs, review_branch
from improve.loop.render import pr_body
from improve.loop.round_record import PROPOSED, ROUND_RECORD, SCORECARDS, Review, RoundRecord

Say = Callable[[str], None]


TITLE_MAX = 120
"""The longest pull request title (and commit subject) a round writes."""


def whole_words(text: str, limit: int) -> str:
    """`text` whole when it fits, else cut after its last whole word with an ellipsis: a rule in a title
    is never cut inside a name, a number or an operator."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    kept = text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:")[: limit - 2]
    return kept + " …"


def answer_first(summary: str, room: int) -> str:
    """ "When COND, answer X" as it is when it fits in `room`, else "answer X when COND" (the condition
    then cut by `whole_words`): a cut title still says what the branch answers."""
    if len(summary) <= room or not summary.startswith("When "):
        return summary
    condition, found, answer = summary.removeprefix("When ").rpartition(", answer ")
    return f"answer {answer} when {condition}" if found else summary


class Recorder:
    """The round's record step: its report folder, its CHANGELOG entry, and a recommended candidate's
    review branch and pull request (`allow_insecure_github`: see `RoundOptions`)."""

    def __init__(self, inputs: Inputs, say: Say, allow_insecure_github: bool = False) -> None:
        self.inputs, self.say, self.allow_insecure_github = inputs, say, allow_insecure_github

    def leave(self, record: RoundRecord) -> RoundRecord:
        """Write the report folder and the CHANGELOG entry, and open the review of a recommended
        candidate; the record, written once, as it ends."""
        inputs = self.inputs
        folder = report_folder(inputs.space.reports, record, self.say)
        root = inputs.space.root
        record.report = str(folder.relative_to(root)) if folder.is_relative_to(root) else str(folder)
        added = inputs.memory.add(record, inputs.env_name)
        record.history = added.history
        body = pr_body(record)
        write_atomic(folder / "scorecard.md", body)
        # The scorecards as data, for analysts (the record holds them too; the markdown is for people).
        write_atomic(
            folder / SCORECARDS, json.dumps([c.to_json() for c in record.scorecards], indent=2) + "\n"
        )
        if record.proposed is not None:
            write_atomic(folder / PROPOSED, json.dumps(record.proposed, indent=2) + "\n")
        write_atomic(folder / "changelog-entry.md", added.entry)
        if record.status in ("nothing-to-fix", "nothing-left-to-try"):
            record.write(folder)
            self.say(
                f"{record.status.replace('-', ' ')}: the CHANGELOG is left as it is; report in {record.report}"
            )
            return record
        if not record.recommended:
            record.write(folder)
            self.say(f"discarded {record.candidate_version}: recorded in {inputs.memory.changelog.path}")
            return record
        write_atomic(folder / "pr.md", body)
        record.pr = self.review(record, folder, body, added)
        record.write(folder)
        return record

    def review(self, record: RoundRecord, folder: Path, body: str, added: Added) -> Review:
        """Commit the candidate's policy file and the CHANGELOG with its entry to its review branch and
        open the pull request with `body`; outside git, leave both files in the report folder with how
        to apply them."""
        inputs = self.inputs
        policy_text = json.dumps(record.proposed, indent=2, ensure_ascii=False) + "\n"
        name = (
            f"v{record.candidate_version.lstrip('v')}.json" if record.candidate_version else "candidate.json"
        )
        policy_file = inputs.policies_dir / name
        changelog = inputs.memory.changelog.path
        try:
            import git

            repo = git.Repo(inputs.space.root, search_parent_directories=True)
            top = Path(repo.working_tree_dir or inputs.space.root).resolve()
        except Exception:
            # Not a git repository: the files are left in the report for a person to apply.
            write_atomic(folder / name, policy_text)
            write_atomic(folder / "CHANGELOG.md", added.text)
            return Review(
                instructions=f"not a git repository: copy {folder / name} to {policy_file} "
                f"and {folder / 'CHANGELOG.md'} to {changelog}",
            )
        from improve.loop.publish import branch_diff, open_pull_request

        branch = review_branch(inputs.env_name, record.candidate_version or "")
        policy_rel = str(policy_file.resolve().relative_to(top))
        files = {policy_rel: policy_text, str(changelog.resolve().relative_to(top)): added.text}
        # "refunds: policy v2: When facts.order.deliveredDaysAgo > 30, answer CLOSE" (the rule, not the numbers).
        summary = (record.rationale or record.cluster or "").split(" without ")[0].split(": it ")[0]
        # A candidate carrying a discarded one's branches says so before its own rule, which may be cut.
        carried = f" (with the branch of {record.behind.candidate})" if record.behind is not None else ""
        head = f"{inputs.env_name}: policy {record.candidate_version}{carried}: "
        title = whole_words(head + answer_first(summary, TITLE_MAX - len(head)), TITLE_MAX)
        try:
            pr = open_pull_request(
                top,
                branch=branch,
                files=files,
                title=title,
                body=body,
                commit_message=f"{title}\n\nProposed by improve round {record.round_id}.",
                allow_insecure_github=self.allow_insecure_github,
                # A rerun proposing the same policy with the same evidence adds no commit (its CHANGELOG
                # entry differs only in the round id); measured otherwise (another model, other figures),
                # its entry goes on top, so the branch holds the evidence its PR body shows.
                candidate=[policy_rel],
                alike=partial(ROUND_ID.sub, "<round>"),
            )
        except ImproveError as err:
            self.say(f"pull request: {err}")
            return Review(error=str(err))
        branch = pr.branch  # another name when the version's branch holds another line's candidate
        write_atomic(folder / "policy.diff", branch_diff(top, branch, None))
        moved = restore_changelog(repo, added.current, changelog, top)
        if moved:
            # They were said as "recorded in CHANGELOG.md" when discarded: say where they went.
            self.say(
                f"the CHANGELOG's entries not committed yet ({', '.join(moved)}) travel on branch {branch} "
                "with this one, and the working tree's CHANGELOG is back to the committed one, so the branch "
                "merges cleanly (closed unmerged, the branch keeps their text, and the workspace still "
                "remembers each discarded candidate: no round proposes it again)"
            )
        # How to publish a branch left unpushed is said once, in the round's summary (`render`); why it was
        # not published (a refusal, a missing remote) is said here as it happens.
        why = f": {'; '.join(pr.notes)}" if pr.notes else ""
        self.say(f"pull request: {pr.pr_url}" if pr.pr_url else f"branch {branch} ready, not published{why}")
        return Review.model_validate(pr.to_json())


ROUND_ID = re.compile(r"\b\d{8}-\d{6}-[A-Za-z0-9_.-]+-v\d+(?:-\d+)?\b")
"""A round id as `Round` makes it (`20261204-004707-refunds-v1`, `-2` after it when taken): what a rerun
of the same round changes in its CHANGELOG entry."""

ROUND_FILES = re.compile(
    r"(scorecard|pr|changelog-entry|CHANGELOG)\.md|policy\.(json|diff)|(candidate|scorecards)\.json|v\d+\.json"
    r"|report\.html"
)
"""The files `Recorder.leave` writes into a report folder; a folder holding only these (and no round.json) is
what a killed round left behind."""


def report_folder(reports: Path, record: RoundRecord, say: Say) -> Path:
    """The round's report folder, made empty and ready.

    A finished round's folder (it has `round.json`) is never written over: a round id already taken
    (two rounds in one second) gets a suffix, `-2`, `-3`. A folder without `round.json` is a round
    killed before it finished (after creating its branch, say): the leftovers of this round id, and of
    earlier killed rounds of the same candidate version, are replaced by this round's complete report,
    so no half-written report stays behind looking like a round. A folder holding anything a round
    does not write is left alone.
    """
    base, n = record.round_id, 1
    while (reports / record.round_id / ROUND_RECORD).exists():
        n += 1
        record.round_id = f"{base}-{n}"
    suffix = f"-{record.environment}-{record.candidate_version}" if record.candidate_version else None
    partial = [reports / record.round_id]
    if suffix is not None and reports.is_dir():
        partial += [d for d in reports.iterdir() if d.is_dir() and d.name.endswith(suffix)]
    for folder in dict.fromkeys(partial):
        if not folder.is_dir() or (folder / ROUND_RECORD).exists():
            continue
        if all(f.is_file() and ROUND_FILES.fullmatch(f.name) for f in folder.iterdir()):
            shutil.rmtree(folder)
            say(
                f"replaced {folder.name}: a report folder without round.json, left by a round that did not finish"
            )
    folder = reports / record.round_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def restore_changelog(repo: Any, current: str, changelog: Path, top: Path) -> list[str]:
    """The branch carries every entry written since HEAD; the working tree (whose CHANGELOG reads
    `current`) goes back to HEAD's CHANGELOG when it merely appended entries, so the branch merges
    cleanly. HEAD's file is restored byte for byte (read from its blob: `git show` through GitPython
    drops a final newline, and a file that ended in a blank line, or in none, was left modified, so the
    reviewer's merge refused to run). The headings of the entries it took from the working tree
    (`v1 (discarded)`)."""
    rel = changelog.resolve().relative_to(top).as_posix()
    try:
        head_text = (repo.head.commit.tree / rel).data_stream.read().decode("utf-8")
    except Exception:
        return []
    if not current.startswith(head_text.rstrip("\n")):
        return []
    write_atomic(changelog, head_text)
    return re.findall(r"^## (\S+ \([^)]*\))", current[len(head_text.rstrip("\n")) :], flags=re.MULTILINE)
