"""The policies' CHANGELOG.md as one object: read once per command, asked for what it records, and
appended to through the same module.

One entry per candidate a round proposed, recommended or discarded, newest last (docs/contracts.md):

    ## v3 (discarded) — round 20261130-155524-refunds-v3

    - Baseline: v2; proposer: rules; model: naive; k = 3; bootstrap seed 7.
    - Branch added: `facts.order.deliveredDaysAgo > 30` -> `CLOSE`
    - held-out: 0.605 -> 0.620 (mean diff +0.015, exact stratified test p = 0.31 > alpha 0.05), ...
    - Held-out set `5f0c2a9e13b7` (27 scenarios) read 3 times, this round included; ...
    - Decision: **discarded**. ...

`Changelog.parse` reads those lines back once (`Entry`): the versions it names (the next version is
the first one no entry and no policy file uses), the branches discarded against a policy (what a round
must not propose against it again), the reads of each held-out set (the count survives across rounds
and travels with the policies through review; changing the held-out set starts a new count, as its key
is a hash of its scenarios), and the line of versions that led to a policy with their pass rates (the
history chart). `entry_text` writes an entry from a round record; `Entry.of(record)` is the entry that
text parses back to.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from improve.evals import HeldOutRead, Scenario, VersionScore, fixed_note, p_value, policy_content, set_key
from improve.files import append_whole
from improve.loop.branches import DiscardedBranch
from improve.loop.branches import route as branch_route
from improve.loop.discards import (
    DiscardedCandidate,
    Reason,
    read_discarded,
    recommended_versions,
    remember,
    remember_recommended,
    route_of,
)
from improve.machine import MachineConfig

if TYPE_CHECKING:
    from improve.loop.round_record import HeldOutReuse, RoundRecord, SplitScore

CHANGELOG = "CHANGELOG.md"

HEADER = (
    "# CHANGELOG: {env} policies\n\nEvery candidate a round proposes is recorded here, recommended or discarded, "
    "with its scorecard.\n"
)

_ENTRY = re.compile(
    r"^## (?P<version>\S+) \((?P<decision>recommended|discarded)\) — round (?P<round>\S+)", re.M
)
_VERSION = re.compile(r"^## v(\d+)\b", re.M)
_BASELINE = re.compile(r"^- Baseline: (?P<baseline>[^;]+);(?:.*?; model: (?P<model>[^;]+);)?", re.M)
_BRANCH = re.compile(r"^- Branch added: `(?P<guard>.+)` -> `(?P<answer>.+)`$", re.M)
_CLUSTER = re.compile(r"^- Cluster: (?P<cluster>\S+?)(?: \(|\.?$)", re.M)
_DISCARDED = re.compile(r"^- Decision: \*\*discarded\*\*\. (?P<checks>.*)$", re.M)
_CHECK = re.compile(r"(?:^|; )(?P<name>[a-z][a-z -]*?): (?P<verdict>pass|FAIL) \(")
REACH_CHECKS = frozenset({"branches hold", "no regressions", "violations"})
"""The promotion rule's checks a candidate fails by reaching too far (`reason_of`): any other failed
check alone (the held-out gain) is gaining too little."""
_SCORE = re.compile(
    r"^- (?P<split>train|held-out): (?P<before>\d+(?:\.\d+)?) -> (?P<after>\d+(?:\.\d+)?)\b", re.M
)
_HELD_OUT_READ = re.compile(r"^- Held-out set `([0-9a-f]+)` \(\d+ scenarios\) read (\d+) times?\b", re.M)
"""The line of an entry that records its round's read of a held-out set (`HeldOutReuse.sentence`)."""


@dataclass(frozen=True)
class Entry:
    """One round as its CHANGELOG entry records it."""

    candidate: str
    baseline: str
    round_id: str
    recommended: bool
    before: dict[str, float]
    """Each split's pass rate before (the baseline's), when the promotion rule ran."""
    after: dict[str, float]
    branches: tuple[tuple[str, str], ...] = ()
    """The branches the candidate added: (guard, answer) as written."""
    held_out: tuple[str, int] | None = None
    """The held-out read it records: the set's key and which read it was."""
    model: str | None = None
    """The model the round ran on (None: an entry that does not say)."""
    cluster: str | None = None
    """The failure cluster its candidate was for."""
    gained_too_little: bool = False
    """Discarded by the promotion rule for its held-out gain alone (`reason_of`'s `gain`)."""

    @classmethod
    def of(cls, record: RoundRecord) -> Entry | None:
        """The entry `entry_text(record)` writes, as `Changelog.parse` reads it back (None when the round
        proposed no candidate: it writes no entry)."""
        if not record.candidate_version:
            return None
        return cls(
            candidate=record.candidate_version,
            baseline=record.baseline_version.strip(),
            round_id=record.round_id,
            recommended=record.recommended,
            before={split: float(_figure(s.before)) for split, s in _shown(record.scores)},
            after={split: float(_figure(s.after)) for split, s in _shown(record.scores)},
            branches=tuple((b.guard, b.answer) for b in record.branches),
            held_out=(record.held_out.key, record.held_out.read) if record.held_out else None,
            model=record.model,
            cluster=record.cluster,
            gained_too_little=not record.recommended and _gained_too_little(record.decision_detail),
        )


@dataclass(frozen=True)
class HeldOutStatus:
    """Where a held-out set stands for `improve score`: the rounds that have read it, what it supports,
    and how far those reads may bias the held-out pass rates of the policies they chose."""

    key: str
    scenarios: int
    reads: int
    supported: int
    max_bias: float
    bias_bound: float
    warning: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scenarios": self.scenarios,
            "reads": self.reads,
            "supported": self.supported,
            "max_bias": self.max_bias,
            "bias_bound": round(self.bias_bound, 6),
            "warning": self.warning,
        }


@dataclass(frozen=True)
class Changelog:
    """A CHANGELOG as read once: its text and what its lines record."""

    path: Path
    text: str = ""
    entries: tuple[Entry, ...] = ()
    """Every entry with a baseline line, oldest first."""
    versions: tuple[int, ...] = ()
    """The number of every `## vN` heading."""
    reads: tuple[tuple[str, int], ...] = ()
    """Every held-out read line: the set's key and the count it states."""
    seen: tuple[int, int] | None = field(default=None, compare=False)
    """The file's size and modification time when read (None: no file)."""

    @classmethod
    def read(cls, path: Path) -> Changelog:
        """The CHANGELOG at `path` (a missing file records nothing)."""
        try:
            with path.open(encoding="utf-8") as handle:
                text = handle.read()
                status = os.fstat(handle.fileno())
        except FileNotFoundError:
            return cls(path)
        return cls.parse(text, path, (status.st_size, status.st_mtime_ns))

    @classmethod
    def parse(cls, text: str, path: Path = Path(CHANGELOG), seen: tuple[int, int] | None = None) -> Changelog:
        heads = list(_ENTRY.finditer(text))
        entries = []
        for index, head in enumerate(heads):
            end = heads[index + 1].start() if index + 1 < len(heads) else len(text)
            entry = _entry(head, text[head.end() : end])
            if entry is not None:
                entries.append(entry)
        return cls(
            path,
            text,
            tuple(entries),
            tuple(int(n) for n in _VERSION.findall(text)),
            tuple((key, int(n)) for key, n in _HELD_OUT_READ.findall(text)),
            seen,
        )

    def next_version(self, policies_dir: Path) -> str:
        """The first version number no policy file in `policies_dir` and no entry uses."""
        files = [
            int(m.group(1)) for p in policies_dir.glob("v*.json") if (m := re.fullmatch(r"v(\d+)", p.stem))
        ]
        return str(max([*files, *self.versions], default=0) + 1)

    def discarded_branches(self, baseline: str) -> list[DiscardedBranch]:
        """The branches of candidates discarded against `baseline` (a version label such as `v3`): what a
        round must not propose against that policy again."""
        return [
            DiscardedBranch(guard, answer, e.round_id)
            for e in self.entries
            if not e.recommended and e.baseline == baseline
            for guard, answer in e.branches
        ]

    def lineage(self, version: str) -> tuple[str, ...]:
        """`version` and the versions it descends from, newest first: each recommended entry leads from
        its candidate back to its baseline (a version no recommended entry proposed ends the line)."""
        line = [version]
        while True:
            step = next((e for e in self.entries[::-1] if e.recommended and e.candidate == line[-1]), None)
            if step is None or step.baseline in line:
                return tuple(line)
            line.append(step.baseline)

    def held_out_reads(self, key: str) -> int:
        """How many rounds the CHANGELOG records as reads of the held-out set `key`: its lines that say
        so, or the highest count one of them states when that is larger (an entry lost with a branch
        nobody merged, or edited away, never lowers the count below a number already written)."""
        numbers = [n for found, n in self.reads if found == key]
        return max(len(numbers), max(numbers, default=0))

    def next_held_out_read(
        self,
        held_out: Sequence[Scenario],
        max_bias: float,
        remembered: Sequence[DiscardedCandidate] = (),
    ) -> HeldOutRead:
        """The read a round that decides on `held_out` makes: one more than recorded for the set, in the
        CHANGELOG or by the workspace's memory of discarded candidates (`remembered`: a reverted working
        tree loses their entries, not the reads they made)."""
        key = set_key(held_out)
        reads = max(
            [
                self.held_out_reads(key),
                *(t.held_out[1] for t in remembered if t.held_out and t.held_out[0] == key),
            ]
        )
        return HeldOutRead(key, len(held_out), reads + 1, max_bias)

    def held_out_status(
        self, held_out: Sequence[Scenario], max_bias: float, remembered: Sequence[DiscardedCandidate] = ()
    ) -> HeldOutStatus:
        upcoming = self.next_held_out_read(held_out, max_bias, remembered)
        reads = upcoming.read - 1
        # A policy chosen after r reads carries r bits, as the numbers of the (r + 1)-th read do.
        warning = (
            f"held-out set `{upcoming.key}` ({upcoming.scenarios} scenarios) has been read by {reads} rounds "
            f"({self.path}); its held-out pass rates may be biased by up to sqrt((r - 1) ln 2 / (2n)) = "
            f"{upcoming.bias_bound:.3f} (r - 1 = {reads} earlier reads, n = {upcoming.scenarios}), more than held_out_bias = {max_bias:g}: read the test split "
            "(`--split test --unseal`) or fresh held-out scenarios for a number no round has adapted to"
            if upcoming.bias_bound > max_bias
            else None
        )
        return HeldOutStatus(
            upcoming.key,
            upcoming.scenarios,
            reads,
            upcoming.supported,
            max_bias,
            upcoming.bias_bound,
            warning,
        )

    def history(self, head: str, current: Entry | None = None) -> list[VersionScore]:
        """The versions that led to `head` with their pass rates (`policy_history`)."""
        return policy_history(self.entries, head, current)

    def with_entry(self, entry: str, env: str) -> str:
        """The file's text with `entry` appended (a new file starts with the header)."""
        text = self.text if self.seen is not None else HEADER.format(env=env)
        return text + ("" if text.endswith("\n") else "\n") + "\n" + entry

    def append(self, entry: str, env: str) -> Changelog:
        """Append `entry` to the file (created with its header when missing), in one write at its end,
        so an entry another process appended meanwhile stays; the CHANGELOG as it now reads."""
        current = self.current()
        added = current.with_entry(entry, env)[len(current.text) :]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Whole or not at all, under the file's lock: a full disk leaves the CHANGELOG as it was.
        append_whole(self.path, added)
        return Changelog.parse(current.text + added, self.path, _stat(self.path))

    def current(self) -> Changelog:
        """This CHANGELOG when the file is as it was read; otherwise the file read again."""
        return self if _stat(self.path) == self.seen else Changelog.read(self.path)


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_size, status.st_mtime_ns


def _entry(head: re.Match[str], body: str) -> Entry | None:
    baseline = _BASELINE.search(body)
    if baseline is None:
        return None
    scores = {m["split"]: (float(m["before"]), float(m["after"])) for m in _SCORE.finditer(body)}
    read = _HELD_OUT_READ.search(body)
    cluster = _CLUSTER.search(body)
    decided = _DISCARDED.search(body)
    return Entry(
        candidate=head["version"],
        baseline=baseline["baseline"].strip(),
        round_id=head["round"],
        recommended=head["decision"] == "recommended",
        before={split: pair[0] for split, pair in scores.items()},
        after={split: pair[1] for split, pair in scores.items()},
        branches=tuple((b["guard"], b["answer"]) for b in _BRANCH.finditer(body)),
        held_out=(read[1], int(read[2])) if read else None,
        model=baseline["model"].strip() if baseline["model"] else None,
        cluster=cluster["cluster"] if cluster else None,
        gained_too_little=decided is not None and _gained_too_little(decided["checks"]),
    )


def _gained_too_little(checks: str) -> bool:
    """Whether the promotion rule's checks as a discarded entry states them (`name: FAIL (...)`) failed
    only on the gain (`reason_of`'s `gain`), not by reaching too far."""
    failed = {m["name"] for m in _CHECK.finditer(checks) if m["verdict"] == "FAIL"}
    return bool(failed) and not failed & REACH_CHECKS


def policy_history(entries: Sequence[Entry], head: str, current: Entry | None = None) -> list[VersionScore]:
    """The versions that led to `head` (itself last) with their pass rates, oldest first.

    `current` is the round being recorded (its candidate is `head`); without it the head's newest entry
    starts the walk. A version proposed by a recommended entry leads back to that entry's baseline; the
    walk stops at a version no recommended entry proposed (v0, a policy written by hand) or at a loop.
    Each version gets the pass rates of the newest round on the walk that measured it with the head's
    model, so the last two points are always one round's own measurement of both sides, and a version
    measured only with another model (a stand-in's rounds before a real model's) stays off the line
    rather than beside figures it cannot be compared with; discarded candidates and unmerged branches
    stay off it too.
    """
    start = current or next((e for e in entries[::-1] if e.candidate == head), None)
    if start is None:
        return []
    rates: dict[str, tuple[float, float, str, str | None]] = {}

    def note(version: str, scores: dict[str, float], step: Entry) -> None:
        same = step.model is None or start.model is None or step.model == start.model
        if same and version not in rates and "train" in scores and "held-out" in scores:
            held_out = step.held_out[0] if step.held_out else None
            rates[version] = (scores["train"], scores["held-out"], step.round_id, held_out)

    chain = [start.candidate]
    step: Entry | None = start
    while step is not None:
        note(step.candidate, step.after, step)
        note(step.baseline, step.before, step)
        if step.baseline in chain:
            break
        baseline = step.baseline
        chain.append(baseline)
        step = next((e for e in entries[::-1] if e.recommended and e.candidate == baseline), None)
    return [VersionScore(v, *rates[v]) for v in reversed(chain) if v in rates]


# --- what a round knows from it -------------------------------------------------------------------


@dataclass(frozen=True)
class Added:
    """A round's entry, added: its text, the CHANGELOG with it (what the review branch carries), the
    working tree's CHANGELOG now, and the history of versions that led to the round's head."""

    entry: str
    text: str
    current: str
    history: list[VersionScore]


@dataclass(frozen=True)
class Memory:
    """What a round knows from its policies' CHANGELOG, read once when it starts: the version its
    candidate takes, the branches already discarded against its baseline (the novelty gate refuses
    them), the read of the held-out set its promotion rule would be, and the entries the history of
    versions is drawn from. `add` writes the round's entry through the same object at its end."""

    changelog: Changelog
    version: str
    discarded: tuple[DiscardedBranch, ...]
    """Branches discarded against the baseline or a version it descends from, as the CHANGELOG and the
    workspace's memory of discarded candidates (`discards.py`) record them."""
    held_out: HeldOutReuse
    tried: tuple[DiscardedCandidate, ...] = ()
    """The candidates the workspace remembers discarding against the baseline or a version it descends
    from, oldest first: what the novelty gate compares a candidate's answers with, and what tells a
    round which clusters were tried (`lineage` says against which version)."""
    lineage: tuple[str, ...] = ()
    """The baseline and the versions it descends from, newest first."""
    remembered: Path | None = None
    """Where the workspace remembers discarded candidates (None: nowhere)."""
    recommended: Mapping[str, str] = field(default_factory=dict)
    """The versions recommended candidates took, and what each holds (`content`): a review branch
    nobody merged yet holds its version for that candidate alone (`own_version`)."""
    stale: tuple[DiscardedCandidate, ...] = ()
    """Candidates discarded along the line for gaining too little on a held-out set that has changed
    since: neither refused nor counted as tried (`read_memory`)."""

    def own_version(self, version: str, candidate: MachineConfig) -> str:
        """`version` (a number), or the next free one when a recommended candidate that holds something
        else took it: its threads are recorded under it. A candidate recommended before keeps the
        version it took then (its review branch already holds it)."""
        mine = policy_content(candidate)
        same = [label for label, held in self.recommended.items() if held == mine]
        if same and re.fullmatch(r"v\d+", same[-1]):
            return same[-1][1:]
        if self.recommended.get(f"v{version}") is None:
            return version
        numbers = [int(m.group(1)) for label in self.recommended if (m := re.fullmatch(r"v(\d+)", label))]
        return str(max([int(version), *numbers]) + 1)

    def add(self, record: RoundRecord, env: str) -> Added:
        """The round's entry: appended to the file for a discarded candidate (and the candidate to the
        workspace's memory); for a recommended one only written into the text its review branch
        carries (the working tree stays as it is)."""
        discarded = discarded_of(record)
        if discarded is not None and self.remembered is not None:
            remember(self.remembered, discarded)
        candidate = record.candidate_policy
        if record.recommended and record.candidate_version and candidate and self.remembered is not None:
            remember_recommended(
                self.remembered, record.candidate_version, record.round_id, policy_content(candidate)
            )
        entry = entry_text(record)
        current = Entry.of(record) if record.scores else None  # the round is the history's head
        history = policy_history(
            self.changelog.entries, record.candidate_version or record.baseline_version, current
        )
        if record.recommended:
            now = self.changelog.current()
            return Added(entry, now.with_entry(entry, env), now.text, history)
        if record.status in ("nothing-to-fix", "nothing-left-to-try"):
            # No candidate was proposed: the CHANGELOG records candidates, and no version is spent.
            now = self.changelog.current()
            return Added(entry, now.text, now.text, history)
        after = self.changelog.append(entry, env)
        return Added(entry, after.text, after.text, history)


def read_memory(
    path: Path,
    policies_dir: Path,
    baseline: str,
    held_out: Sequence[Scenario],
    max_bias: float,
    remembered: Path | None = None,
) -> Memory:
    """Read the CHANGELOG at `path` once, and the workspace's memory of discarded candidates at
    `remembered`, for a round against `baseline` (a version label)."""
    from improve.loop.round_record import HeldOutReuse

    changelog = Changelog.read(path)
    lineage = changelog.lineage(baseline)
    everything = read_discarded(remembered) if remembered else ()
    read = changelog.next_held_out_read(held_out, max_bias, everything)
    # A candidate that gained too little did so on the held-out set its round read: once that set has
    # changed (scenarios added that show its answer), it may be proposed again, and its cluster is not
    # tried. The CHANGELOG's entries of those rounds are set aside with it; one the workspace does not
    # remember (a fresh clone) says no reason, and still refuses.
    stale = _stale(changelog, everything, lineage, read.key)
    gone = {t.round for t in stale}
    tried = tuple(t for t in everything if t.baseline in lineage and t.round not in gone)
    # A version a discarded candidate took stays taken when its entry is gone with a reverted working
    # tree: its threads are recorded under it. Not one a round with no candidate to run took (nothing
    # found, or nothing left to try: no thread, no CHANGELOG entry): the next round takes it again, where
    # each such round used up a number no policy ever had.
    # So does a version a recommended candidate took, until its branch is merged (a round meanwhile
    # proposing another candidate must not take it: `Memory.own_version` keeps it for that candidate).
    # Merged, its policy file is there: the version is a policy, held by no review branch any more (the
    # memory keeps every line, and a round finding that candidate again took the version back, as "not
    # merged yet", for a second branch of it: `Round._already` says it is that policy instead).
    recommended = {
        label: held
        for label, held in (recommended_versions(remembered) if remembered else {}).items()
        if not (policies_dir / f"{label}.json").is_file()
    }
    taken = [
        int(m.group(1))
        for t in everything
        if t.reason in ("reach", "gain") and (m := re.fullmatch(r"v(\d+)", t.candidate))
    ]
    taken += [int(m.group(1)) for label in recommended if (m := re.fullmatch(r"v(\d+)", label))]
    version = str(max(int(changelog.next_version(policies_dir)), max(taken, default=0) + 1))
    discarded = [
        b for version in lineage for b in changelog.discarded_branches(version) if b.round not in gone
    ]
    discarded += [DiscardedBranch(b.guard, b.answer, t.round) for t in tried for b in t.added]
    unique = list({(b.guard, b.answer): b for b in reversed(discarded)}.values())[::-1]
    return Memory(
        changelog,
        version,
        tuple(unique),
        HeldOutReuse(
            key=read.key,
            scenarios=read.scenarios,
            read=read.read,
            supported=read.supported,
            max_bias=read.max_bias,
            bias_bound=round(read.bias_bound, 6),
            warning=read.warning(),
        ),
        tried,
        lineage,
        remembered,
        recommended,
        stale,
    )


def _stale(
    changelog: Changelog, everything: Sequence[DiscardedCandidate], lineage: Sequence[str], key: str
) -> tuple[DiscardedCandidate, ...]:
    """The candidates along the line discarded for gaining too little on a held-out set other than `key`
    (the workspace's memory, and the CHANGELOG's entries it does not hold, as far as they say), and the
    rounds after one of them that found nothing for its cluster: the rule found was that discarded one,
    which is refused no longer."""
    remembered = {t.round for t in everything}
    gained: list[DiscardedCandidate] = [
        t
        for t in everything
        if t.baseline in lineage and t.reason == "gain" and t.held_out is not None and t.held_out[0] != key
    ]
    gained += [
        DiscardedCandidate(
            e.round_id, e.baseline, e.candidate, e.cluster, "gain", (), (), e.held_out, model=e.model
        )
        for e in changelog.entries
        if e.round_id not in remembered
        and e.gained_too_little
        and e.baseline in lineage
        and e.held_out is not None
        and e.held_out[0] != key
    ]
    first: dict[str | None, str] = {}
    for t in sorted(gained, key=lambda t: t.round):
        first.setdefault(t.cluster, t.round)
    found_nothing = [
        t
        for t in everything
        if t.reason == "none" and t.baseline in lineage and t.cluster in first and t.round > first[t.cluster]
    ]
    return tuple(sorted([*gained, *found_nothing], key=lambda t: t.round))


# --- writing an entry -----------------------------------------------------------------------------


def proposer_text(record: RoundRecord) -> str:
    """The proposer as a record names it: `rules`, or `openai (model smollm2)`."""
    return record.proposer + (f" (model {record.proposer_model})" if record.proposer_model else "")


def entry_text(record: RoundRecord) -> str:
    """The CHANGELOG entry of a round that proposed a candidate (a round with nothing to fix has one
    only in its report folder)."""
    decision = "recommended" if record.recommended else "discarded"
    if record.status in ("nothing-to-fix", "nothing-left-to-try"):
        decision = record.status.replace("-", " ")
    lines = [
        f"## {record.candidate_version} ({decision}) — round {record.round_id}",
        "",
        f"- Baseline: {record.baseline_version}; proposer: {proposer_text(record)}; model: {record.model}; "
        f"k = {record.k}; bootstrap seed {record.seed}.",
    ]
    lines += [f"- The proposer said: {note}" for note in record.proposer_notes]
    h = record.hypothesis
    if h:
        lines += [
            f"- Cluster: {record.cluster}" + (f" ({record.aim})." if record.aim else "."),
            f"- Hypothesis: {h.cause}.",
            f"- Change: {record.rationale or h.change}",
            f"- Expected to move: {h.metric}.",
            f"- Risk: {h.risk}.",
        ]
    if record.diff_summary:
        lines.append(f"- Diff: {record.diff_summary}.")
    lines += [f"- Branch added: `{b.guard}` -> `{b.answer}`" for b in record.branches]
    if record.gates:
        summary = ", ".join(f"{g.name} {'pass' if g.ok else 'FAIL'}" for g in record.gates)
        lines.append(f"- Gates: {summary}; repairs used: {record.repairs}.")
    for split, s in _shown(record.scores):
        extra = f", {s.extra_runs} extra runs (reruns, both versions)" if s.extra_runs else ""
        lines.append(
            f"- {split}: {s.before:.3f} -> {s.after:.3f} (mean diff {s.mean_diff:+.3f}, {_test(s, split)}), "
            f"violations {s.violations_after}, model calls/run {s.cost_before:.2f} -> {s.cost_after:.2f}"
            f"{extra}."
        )
    if record.held_out:
        lines.append(f"- {record.held_out.sentence}")
        if record.held_out.warning:
            lines.append(f"- **Held-out reuse warning**: {record.held_out.warning}.")
    lines.append(f"- Regressions: {', '.join(record.regressions) if record.regressions else 'none'}.")
    if record.out_of_sample:
        lines.append(f"- Out of sample: {record.out_of_sample.summary()}.")
    lines.append(f"- Decision: **{decision}**. {record.decision_detail}".rstrip())
    if record.report:
        lines.append(f"- Report: `{record.report}`.")
    return "\n".join(lines) + "\n"


def _shown(scores: dict[str, SplitScore]) -> list[tuple[str, SplitScore]]:
    return [(split, scores[split]) for split in ("train", "held-out") if split in scores]


def _figure(rate: float) -> str:
    """A pass rate as an entry writes it (three places), so `Entry.of` agrees with the parsed text."""
    return f"{rate:.3f}"


def _test(score: SplitScore, split: str) -> str:
    """The test the promotion rule decided with, as the entry shows it; a record written before the
    exact tests shows its bootstrap interval, labelled as such."""
    if score.p is None or score.alpha is None:
        return f"{score.confidence:.0%} bootstrap CI [{score.ci_low:+.3f}, {score.ci_high:+.3f}]"
    said = (
        f"{score.test} p = {p_value(score.p)} {'<=' if score.p <= score.alpha else '>'} alpha {score.alpha:g}"
    )
    return said + fixed_note(score.fixed and score.mean_diff != 0, split, score.sequential)


def discarded_of(record: RoundRecord) -> DiscardedCandidate | None:
    """What the workspace remembers of a round that discarded its candidate (None for a round that
    recommended one, or proposed nothing)."""
    if record.recommended or not record.candidate_version:
        return None
    candidate = route_of(branch_route(record.candidate_policy)) if record.candidate_policy is not None else ()
    new = {(b.guard, b.answer) for b in record.branches}
    reason = reason_of(record)
    policy = record.candidate_policy
    later = tuple(record.still_failing) if reason == "gain" and policy is not None else ()
    return DiscardedCandidate(
        round=record.round_id,
        baseline=record.baseline_version.strip(),
        candidate=record.candidate_version,
        cluster=record.cluster,
        reason=reason,
        added=tuple(b for b in candidate if (b.guard, b.answer) in new),
        route=candidate,
        held_out=(record.held_out.key, record.held_out.read) if record.held_out else None,
        wrong=tuple(record.wrong_held_out),
        model=record.model,
        later=later,
        policy=policy.model_dump(mode="json", by_alias=True, exclude_none=True) if later and policy else None,
        behind=record.behind.round if record.behind is not None else None,
        followed=record.followed,
        train=record.train_set,
    )


def reason_of(record: RoundRecord) -> Reason:
    """Why a round discarded its candidate: its branch reached too far (it answered held-out decisions
    wrongly, made a scenario worse or broke a rule), it gained too little, it never passed the gates,
    or no rule was proposed at all."""
    if record.decision is not None:
        failed = {c.name for c in record.decision.checks if not c.ok}
        return "reach" if failed & REACH_CHECKS else "gain"
    if record.proposed is None:
        return "none"
    return "gates"
