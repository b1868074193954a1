"""The round record: what one round did and found, typed and versioned (`round.json`).

A round builds its record once, when it ends, and writes it once; everything a round shows is
rendered from it: the pull request's body (`render.pr_body`), the CHANGELOG entry
(`changelog.entry_text`), the HTML page (`report_page.round_page`) and the lines `improve round`
prints (`render.round_lines`). It is read back typed (`read_round_record`); a `round.json` written
before the record had a `format` is migrated on the way in by one validator (`RoundRecord._migrate`),
its scorecards and candidate taken from the files beside it.

A section a later round wants to record (as the production impact preview was) is one more optional
field: older records read with it empty.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from improve.errors import ImproveError, WorkspaceError
from improve.evals import PromotionDecision, Quarantined, Reruns, Scorecard, VersionScore, scenarios_needed
from improve.files import write_atomic
from improve.loop.diagnose import Hypothesis
from improve.loop.gates import GateResult
from improve.machine import MachineConfig, parse_machine

FORMAT = "improve.round/2"
"""`round.json`'s format: 2 is the typed record; a file without a format is 1 (migrated when read)."""

ROUND_RECORD = "round.json"
SCORECARDS = "scorecards.json"
PROPOSED = "policy.json"

Status = Literal["recommended", "discarded", "blocked", "nothing-to-fix", "nothing-left-to-try"]


class Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class SplitScore(Part):
    """One split's comparison as the promotion rule read it (the `Comparison`), with the cost and
    violations of both sides."""

    before: float
    after: float
    mean_diff: float
    ci_low: float = 0.0
    ci_high: float = 0.0
    confidence: float = 0.95
    test: str | None = None
    """The deciding test's name; None in a record from before the exact tests (a bootstrap interval)."""
    p: float | None = None
    alpha: float | None = None
    fixed: bool = False
    """The runs' design fixed every scenario's count: the test could say nothing (`Comparison.fixed`)."""
    sequential: bool = False
    """The test was conditioned on the sequential reruns' design (`Comparison.sequential`)."""
    extra_runs: int = 0
    violations_after: int = 0
    cost_before: float = 0.0
    cost_after: float = 0.0
    k: int = 0


class Behind(Part):
    """The discarded candidate a candidate carries the branches of (`Round._behind`)."""

    round: str
    candidate: str


class HeldOutReuse(Part):
    """Which read of the held-out set the round was, what the set supports, and the warning past that
    (`improve.evals.HeldOutRead`, docs/contracts.md: held-out reuse)."""

    key: str
    scenarios: int
    read: int
    supported: int
    max_bias: float
    bias_bound: float
    warning: str | None = None
    sentence: str = ""
    """`Held-out set `KEY` (27 scenarios) read 3 times, ...`: the read and its bound, as the CHANGELOG
    entry and the PR body say it (written from the figures when not given)."""

    @property
    def short(self) -> str | None:
        """The warning in one line, as a round's progress says it (the report, the CHANGELOG entry and
        the summary give it whole); None within what the set supports."""
        if not self.warning:
            return None
        return (
            f"held-out set `{self.key}` read by {self.read} rounds, more than the {self.supported} its "
            f"{self.scenarios} scenarios support: its pass rates may be biased by up to {self.bias_bound:.3f}; "
            f"{scenarios_needed(self.read, self.max_bias)} held-out scenarios would support {self.read} reads, "
            "or score a sealed `split: test` set once (the report says more)"
        )

    @model_validator(mode="after")
    def _said(self) -> HeldOutReuse:
        if not self.sentence:
            times = "time" if self.read == 1 else "times"
            said = (
                f"Held-out set `{self.key}` ({self.scenarios} scenarios) read {self.read} {times}, this round "
                f"included; it supports {self.supported} at held_out_bias = {self.max_bias:g} (reads <= 1 + "
                "floor(2 n eps^2 / ln 2)), and the earlier reads may bias this round's held-out pass rates "
                f"by up to sqrt((r - 1) ln 2 / (2n)) = {self.bias_bound:.3f} (r = {self.read}, n = {self.scenarios})."
            )
            object.__setattr__(self, "sentence", said)
        return self


class Calls(Part):
    """The model calls of a round's runs (`improve.llm.Meter.to_json`)."""

    calls: int = 0
    live: int = 0
    recorded: int = 0
    repeated: int = 0
    reused: int = 0
    """Answers replay-first runs took from the baseline's recorded runs: no model was asked."""
    failed: int = 0
    reasked: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float | None = None
    retries: int = 0
    limit_usd: float | None = None
    notes: list[str] = Field(default_factory=list)


class ModelInfo(Part):
    """Which model the runs used and how its calls were answered: for a model behind an endpoint, what
    identifies its behaviour (`improve.llm.ModelSpec.public`, never a key) and its fingerprints."""

    name: str
    provider: str
    model: str | None = None
    endpoint: str | None = None
    temperature: float | None = None
    seed: int | None = None
    max_output_tokens: int | None = Field(default=None, alias="maxOutputTokens")
    fingerprints: list[str] = Field(default_factory=list)
    calls: Calls = Field(default_factory=Calls)
    mixed: bool = False
    """Recorded and live calls were combined: a replay needs the recordings of both."""


class Review(Part):
    """What became of a recommended candidate's review: the branch, the pull request, or why not
    (`improve.loop.publish.PullRequestResult`, or the files to apply outside git)."""

    pushed: bool = False
    branch: str | None = None
    commit: str | None = None
    pr_number: int | None = None
    pr_url: str | None = None
    pr_action: str | None = None
    reused: bool = False
    base: str | None = None
    remote: str | None = None
    instructions: str | None = None
    error: str | None = None
    """Why the pull request could not be opened (saying where the branch is)."""
    notes: list[str] = Field(default_factory=list)


class NewBranch(Part):
    """A branch the candidate adds, as written: its guard and its answer (the CHANGELOG records both,
    so a branch discarded against a policy is not proposed against it again)."""

    guard: str
    answer: str


class ImpactChange(Part):
    """Production decisions the candidate would answer otherwise, by kind: the decision, the event type
    answered and the one the candidate would answer, in how many threads, a few of them, and the first
    one's answers in full."""

    decision: str
    before: str
    after: str
    threads: int
    examples: list[str] = Field(default_factory=list)
    example: str = ""
    """The first example's answers: `REFUND{amount=90} -> REFUND{amount=60}`."""


class OutOfSampleCheck(Part):
    """The candidate and its baseline run with `careful` on cases the environment's generator drew, no
    round having seen them (`evals.out_of_sample`): how often a learned branch answers otherwise than
    labelled, where careful's own answer would have agreed."""

    cases: int
    seed: int
    labelled_by: str
    baseline_agreed: int
    candidate_agreed: int
    by_branch: int
    """The candidate's disagreements where one of its branches answered (not the model)."""
    examples: list[str] = Field(default_factory=list)
    """A few of those: the case's input, its label and where the candidate ended it."""
    reference: str | None = None
    """The version whose careful runs labelled the cases the generator left unlabelled (the line's
    first): what `improve out-of-sample` takes first to check the same (None in older records)."""

    def summary(self) -> str:
        return (
            f"with careful on {self.cases} generated cases (seed {self.seed}, labelled by {self.labelled_by}): "
            f"baseline {self.baseline_agreed}/{self.cases}, candidate {self.candidate_agreed}/{self.cases}; "
            + (
                f"a learned branch answered {self.by_branch} case(s) otherwise than labelled"
                if self.by_branch
                else "no learned branch answered a case otherwise than labelled"
            )
        )


class Impact(Part):
    """The production impact preview: the candidate's policy run over the decisions of the workspace's
    most recent production threads (unlabelled, from the warehouse), each thread's recorded answers
    taken wherever it asks what the thread asked (`improve.loop.impact`)."""

    available: int = 0
    """Production threads of the environment in the warehouse."""
    threads: int = 0
    """Those read: the most recent, at most `limit`."""
    limit: int = 0
    decisions: int = 0
    """Decisions read: each thread's, up to the first one the candidate would answer otherwise."""
    changed: int = 0
    """Threads with a decision the candidate would answer otherwise (each counts its first only: from
    there the candidate's run would go elsewhere)."""
    unknown: int = 0
    """Threads where the candidate would ask the model what the thread never asked (its answer is not
    known without asking) before any change."""
    unreadable: int = 0
    """Threads the environment's machine no longer folds (it changed since they were recorded)."""
    changes: list[ImpactChange] = Field(default_factory=list)
    """The changes, most threads first."""

    def summary(self) -> str:
        """One sentence: what the candidate would change, or that there was nothing to read."""
        if not self.available:
            return (
                "No production threads in the workspace's warehouse: nothing to preview (`improve ingest` a "
                "deployed agent's threads to see how much of its traffic a change touches)."
            )
        share = f" ({self.changed / self.threads:.1%})" if self.threads else ""
        read = (
            f"the {self.threads} most recent of {self.available} production threads"
            if self.threads < self.available
            else f"all {self.threads} production threads"
        )
        text = (
            f"Of {read} ({self.decisions} decisions read), the candidate would answer {self.changed}{share} "
            "differently at some decision"
        )
        text += (
            f"; in {self.unknown} it would ask the model what the thread never asked" if self.unknown else ""
        )
        text += f"; {self.unreadable} no longer fold under the machine" if self.unreadable else ""
        return text + "."


class RoundRecord(BaseModel):
    """One round, typed: its inputs, each step's outcome, the decision and where it left its review."""

    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="constants", validate_assignment=False)

    format: str = FORMAT
    round_id: str
    environment: str
    baseline_version: str
    candidate_version: str | None = None
    proposer: str
    proposer_model: str | None = None
    """The model a proposer that asks one asked (`--proposer-model`); None for the rule miner."""
    proposer_notes: list[str] = Field(default_factory=list)
    """What the proposer said of its proposal (its request trimmed to fit the model's context, ...)."""
    model: str
    k: int
    seed: int
    status: Status = "discarded"
    """recommended, discarded, blocked (the environment needs a person), nothing-to-fix (the goal holds)
    or nothing-left-to-try (the goal does not hold, and every failure cluster was tried)."""
    recommended: bool = False
    goal_met: bool = False
    decision_detail: str = ""
    # diagnose, propose, gate
    cluster: str | None = None
    aim: str | None = None
    """Why this cluster, after candidates discarded along the policy's line: a narrower rule for it,
    or the next cluster after those tried (None when none was tried)."""
    passed_over: list[str] = Field(default_factory=list)
    """The clusters the round asked a rule for and got none, moving on (`cluster` is the last of them
    when it found no other)."""
    hypothesis: Hypothesis | None = None
    rationale: str | None = None
    branches: list[NewBranch] = Field(default_factory=list)
    diff_summary: str | None = None
    gates: list[GateResult] = Field(default_factory=list)
    repairs: int = 0
    model_calls: int = 0
    """Model calls the proposer made."""
    # replay and decide
    scores: dict[str, SplitScore] = Field(default_factory=dict)
    regressions: list[str] = Field(default_factory=list)
    wrong_held_out: list[str] = Field(default_factory=list)
    """The held-out decisions the new branches answered wrongly (`discards.wrong_key` of each one's
    `branches.decision_key`)."""
    still_failing: list[str] = Field(default_factory=list)
    """The training scenarios whose runs the candidate's branches answered otherwise than the baseline's
    and that failed all the same, having asked another decision than the cluster's: that decision may
    fail them (`Round._still_failing`)."""
    behind: Behind | None = None
    """The discarded candidate whose branches this one carries, with a branch for the decision its runs
    still failed at (`Round._behind`); None for a candidate of one cluster."""
    followed: str | None = None
    """The round of the discarded candidate this round looked behind (`Round._behind`), whether or not
    its runs showed a decision to fix: each is looked behind once."""
    held_out: HeldOutReuse | None = None
    """Set when the promotion rule read the held-out split."""
    train_set: str | None = None
    """The training split's key (`evals.set_key`): what the clusters were mined from. A cluster a
    candidate found no rule for, or none that passed the gates, is tried again once it changes."""
    reruns: Reruns | None = None
    """What the sequential rule ran beyond the first k runs."""
    candidate_threads: list[str] = Field(default_factory=list)
    quarantined: list[Quarantined] = Field(default_factory=list)
    """Threads set aside because their replay does not verify: each thread id and the reason."""
    model_info: ModelInfo | None = None
    impact: Impact | None = None
    """The production impact preview of a candidate that passed the gates; None without one (or in a
    record from before previews)."""
    cases: bool = False
    """The environment draws plausible cases (`Environment.cases`): the pull request says how to check
    the candidate on them further (`improve out-of-sample`)."""
    out_of_sample: OutOfSampleCheck | None = None
    """A recommended candidate and its baseline with `careful` on generated cases; None when not run."""
    # record
    report: str | None = None
    """The report folder, relative to the workspace."""
    pr: Review | None = None
    # what the renderers draw
    scorecards: list[Scorecard] = Field(default_factory=list)
    """Train and held-out, the baseline's and (after a replay) the candidate's."""
    decision: PromotionDecision | None = None
    baseline_policy: MachineConfig | None = Field(default=None, exclude=True)
    """The baseline policy (not written: it is the workspace's `policies/<env>/<version>.json`)."""
    candidate_policy: MachineConfig | None = Field(default=None, exclude=True)
    """The candidate as the gates validated it (not written: read back from `proposed` when the
    validate gate passed it)."""
    proposed: Any = None
    """The candidate document as the proposer returned it (`policy.json`), valid or not: data."""
    history: list[VersionScore] | None = None
    """Pass rates of the versions that led to this round's head (the CHANGELOG's, this round last);
    None in a record from before it was recorded (read from the CHANGELOG then)."""

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        """A `round.json` of format 1 (no `format`): scores of a bootstrap decision, `reruns` with its
        summary, `model_info` and `pr` as loose dicts all read as they are; only the format changes."""
        if isinstance(data, dict) and "format" not in data:
            data = {**data, "format": FORMAT}
        if isinstance(data, dict) and data.get("status") == "nothing-to-fix" and not data.get("goal_met"):
            # Written before nothing-left-to-try had a status of its own: it was this with the goal unmet.
            data = {**data, "status": "nothing-left-to-try"}
        return data

    @field_serializer("scorecards")
    def _cards(self, cards: list[Scorecard]) -> list[dict[str, Any]]:
        return [c.to_json() for c in cards]

    @field_serializer("decision")
    def _decision(self, decision: PromotionDecision | None) -> dict[str, Any] | None:
        return decision.to_json() if decision is not None else None

    @field_serializer("reruns")
    def _reruns(self, reruns: Reruns | None) -> dict[str, Any] | None:
        return reruns.to_json() if reruns is not None else None

    @property
    def nothing_new(self) -> bool:
        """A cluster came round again (every cluster tried along the line) with no candidate that passes
        the gates, or the candidate is a version there is (`Round._already`): nothing-left-to-try, yet a
        candidate was asked for (`Round._nothing_new`). A loop of rounds goes on from it as from a
        discarded candidate: the next one brings another cluster round."""
        # The cluster that came round is named; a round that found no cluster left at all names none, and
        # a loop of rounds stops there (it went on, and said the same twice).
        # One that passed its last cluster over, finding no rule for it, found nothing left either: the
        # next round would say the same.
        return (
            self.status == "nothing-left-to-try"
            and self.candidate_version is not None
            and self.cluster is not None
            and self.cluster not in self.passed_over
        )

    @property
    def stand_in(self) -> bool:
        """The runs' model is a stand-in of the environment (seeded by scenario and run), not one behind
        an endpoint."""
        return self.model_info is None or self.model_info.provider == "stand-in"

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def write(self, folder: Path) -> Path:
        path = folder / ROUND_RECORD
        write_atomic(path, json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")
        return path


def read_round_record(folder: Path, environment: str | None = None) -> RoundRecord:
    """The record in a report folder, typed. A record of format 1 takes its scorecards from
    `scorecards.json` and its candidate from `policy.json` beside it (and `environment` when it names
    none); one too old to have written scorecards is named as such."""
    document = _read_json(folder / ROUND_RECORD, "the round's record, written when a round finishes")
    if not isinstance(document, dict):
        raise WorkspaceError(
            f"{folder / ROUND_RECORD}: not a round record (a JSON object); run the round again"
        )
    if "format" not in document:
        document = _beside(folder, document)
        if environment and not document.get("environment"):
            document["environment"] = environment
    try:
        record = RoundRecord.model_validate(document)
    except ValueError as exc:
        raise WorkspaceError(
            f"{folder / ROUND_RECORD}: not a round record ({exc}); run the round again"
        ) from None
    if record.proposed is not None and any(g.name == "validate" and g.ok for g in record.gates):
        try:
            record.candidate_policy = parse_machine(record.proposed, f"{folder / ROUND_RECORD}: proposed")
        except ImproveError as exc:
            raise WorkspaceError(f"{folder / PROPOSED}: not a policy ({exc}); run the round again") from None
    return record


def _beside(folder: Path, document: dict[str, Any]) -> dict[str, Any]:
    """A format-1 record with what it kept in files of its own: the scorecards, the candidate."""
    cards = folder / SCORECARDS
    if not cards.is_file():
        raise WorkspaceError(
            f"{cards} is missing: the round was recorded before rounds wrote their scorecards as data; "
            f"{folder / 'scorecard.md'} has them as markdown, or run the round again"
        )
    found = {"scorecards": _read_json(cards, "the round's scorecards")}
    if (folder / PROPOSED).is_file():
        found["proposed"] = _read_json(folder / PROPOSED, "the candidate policy")
    return {**document, **found}


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkspaceError(f"{path} is missing: {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkspaceError(f"{path} is not readable JSON ({exc}); {what}") from None
