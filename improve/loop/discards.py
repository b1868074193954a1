"""The candidates a workspace's rounds discarded, kept where a reverted working tree cannot lose them.

A discarded candidate's CHANGELOG entry is an edit of the working tree until a recommended branch
carries it into review: `git checkout -- .` after a discarded round takes it away, and the next round
would propose the same candidate again. So a round also appends one line per discarded candidate to
`.improve/discarded/<environment>.jsonl` in the workspace, its state directory (beside the model-call
cache): ignored by git (`improve init` and the demo write `.improve/` into `.gitignore`), so no
checkout, stash, reset or branch switch touches it, and read back, with the CHANGELOG, by every round
that starts. The CHANGELOG stays the record people review; this file is the workspace's own memory.

Each line holds what the next rounds need: the baseline and the cluster the candidate was for, why
it was discarded (`reach`: its branch answered wrongly where it answered, or made a scenario worse;
`gain`: no significant gain; `gates`: it never passed the gates; `none`: no rule was found), the
branches it added (guard, answer, and the output as written), and its route (every guarded branch of
the candidate, in order): enough to evaluate what it answered, so a later candidate that answers the
same decisions the same way is recognised as the same candidate (the novelty gate), whatever its
guard looks like. A candidate that gained too little on a held-out set that has changed since is set
aside (`changelog.read_memory`): scenarios added may show the gain it lacked. What a
candidate's cluster was mined from is kept too (`train`: the training set's key and the environment's
files, `mined_from`): a cluster that had no rule, or none that passed the gates, is tried afresh once
scenarios are labelled or the environment changes (a fact the machine now computes) (`focus`). A candidate that gained too little while the training runs its branches answered
otherwise still failed also keeps those scenarios (`later`) and its policy document: the next round
tries the later decision behind its branches, once (`followed`; `behind` when it carries them).
A recommended candidate leaves one line too, in `.improve/recommended/<environment>.jsonl`:
its version and what it holds (`content`, the policy's hash with its version left out). Until a
person merges it, its review branch and its recorded threads hold that version: a round started
before the merge that proposes another candidate under it takes the next free version instead, and
one that proposes the same candidate again (a killed round run again) keeps it.
Lines are appended whole (`improve.files.append_whole`: a failed write leaves the
file as it was); a last line cut short all the same (an older writer, a copy) is ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from improve.errors import WorkspaceError
from improve.files import append_whole
from improve.loop.branches import Branch, answer_text, answers

DISCARDED_DIR = ".improve/discarded"
RECOMMENDED_DIR = ".improve/recommended"
Reason = Literal["reach", "gain", "gates", "none"]
REASONS: tuple[Reason, ...] = ("reach", "gain", "gates", "none")


@dataclass(frozen=True)
class RouteBranch:
    """A guarded branch as a candidate wrote it: its guard and its output tree."""

    guard: str
    output: Mapping[str, Any]

    @property
    def answer(self) -> str:
        return answer_text(self.output)


@dataclass(frozen=True)
class DiscardedCandidate:
    """A candidate a round discarded, as the workspace remembers it."""

    round: str
    baseline: str
    """The version label it would have replaced (`v3`)."""
    candidate: str
    cluster: str | None
    reason: Reason
    added: tuple[RouteBranch, ...]
    """The branches it added."""
    route: tuple[RouteBranch, ...]
    """Every guarded branch of the candidate, in order (the added ones among them)."""
    held_out: tuple[str, int] | None = None
    """The held-out set its promotion rule read (its key) and which read that was: a reverted
    CHANGELOG does not lower the count."""
    wrong: tuple[str, ...] = ()
    """The held-out decisions of that set its added branches answered wrongly (`decision_key`s, as
    sha256 digests): where they still answer one of them, the same check refuses it again."""
    model: str | None = None
    """The model whose runs its round read (None: remembered before the memory kept it). Failures, and
    so clusters, are a model's: a cluster tried on one model's runs is another's to try afresh."""
    later: tuple[str, ...] = ()
    """The training scenarios its branches answered otherwise than the baseline and that still failed,
    when it gained too little: a later decision fails them, and the next round may try that decision
    behind its branches (`Round._behind`)."""
    policy: Mapping[str, Any] | None = None
    """The candidate's policy document, kept when `later` is: the round behind it runs it again as it
    was (its recorded runs are reused)."""
    behind: str | None = None
    """The round whose candidate this one carried the branches of (`Round._behind`)."""
    followed: str | None = None
    """The round whose candidate this one's round looked behind, carried or not: each discarded
    candidate is looked behind once."""
    train: str | None = None
    """The training set its cluster was mined from (`evals.set_key`; None: remembered before the
    memory kept it). No rule found (`none`) or none that passed the gates (`gates`) is a finding about
    those scenarios: scenarios labelled since may show the rule (`focus`)."""

    def branches(self) -> tuple[list[Branch], set[int]]:
        """Its route as branches, and the indexes of the added ones."""
        added = {(b.guard, b.answer) for b in self.added}
        branches = [Branch(i, b.guard, f"branch_{i}", dict(b.output)) for i, b in enumerate(self.route)]
        return branches, {b.index for b in branches if (b.guard, b.answer()) in added}

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "cluster": self.cluster,
            "reason": self.reason,
            "added": [{"guard": b.guard, "output": dict(b.output)} for b in self.added],
            "route": [{"guard": b.guard, "output": dict(b.output)} for b in self.route],
            "held_out": list(self.held_out) if self.held_out else None,
            **({"wrong": list(self.wrong)} if self.wrong else {}),
            **({"model": self.model} if self.model is not None else {}),
            **({"later": list(self.later)} if self.later else {}),
            **({"policy": dict(self.policy)} if self.policy is not None else {}),
            **({"behind": self.behind} if self.behind is not None else {}),
            **({"followed": self.followed} if self.followed is not None else {}),
            **({"train": self.train} if self.train is not None else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DiscardedCandidate:
        reason = doc.get("reason")
        if reason not in REASONS:
            raise ValueError(f"reason {reason!r} is not one of {', '.join(REASONS)}")
        return cls(
            round=str(doc["round"]),
            baseline=str(doc["baseline"]),
            candidate=str(doc["candidate"]),
            cluster=None if doc.get("cluster") is None else str(doc["cluster"]),
            reason=reason,
            added=tuple(RouteBranch(str(b["guard"]), dict(b["output"])) for b in doc.get("added") or []),
            route=tuple(RouteBranch(str(b["guard"]), dict(b["output"])) for b in doc.get("route") or []),
            held_out=(str(doc["held_out"][0]), int(doc["held_out"][1])) if doc.get("held_out") else None,
            wrong=tuple(str(w) for w in doc.get("wrong") or ()),
            model=None if doc.get("model") is None else str(doc["model"]),
            later=tuple(str(s) for s in doc.get("later") or ()),
            policy=dict(doc["policy"]) if isinstance(doc.get("policy"), dict) else None,
            behind=None if doc.get("behind") is None else str(doc["behind"]),
            followed=None if doc.get("followed") is None else str(doc["followed"]),
            train=None if doc.get("train") is None else str(doc["train"]),
        )


def discarded_path(root: Path, env: str) -> Path:
    """Where a workspace at `root` remembers the candidates discarded for environment `env`."""
    return root / DISCARDED_DIR / f"{env}.jsonl"


def recommended_path(discarded: Path) -> Path:
    """Where the workspace whose discarded candidates are at `discarded` remembers its recommended ones."""
    return discarded.parent.parent / Path(RECOMMENDED_DIR).name / discarded.name


def remember_recommended(discarded: Path, candidate: str, round_id: str, content: str) -> None:
    """Append the version a recommended candidate took and what it holds (see the module docstring)."""
    path = recommended_path(discarded)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"candidate": candidate, "round": round_id, "content": content}
    append_whole(path, _on_a_line_of_its_own(json.dumps(line, sort_keys=True)))


def recommended_versions(discarded: Path) -> dict[str, str]:
    """Each version a recommended candidate took, and what it holds (the latest line for a version).
    A line that is not one (cut short, edited) is skipped: it can only let a round reuse a version,
    which the thread store's stamp check still refuses."""
    try:
        text = recommended_path(discarded).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        try:
            doc = json.loads(line)
            found[str(doc["candidate"])] = str(doc["content"])
        except (ValueError, KeyError, TypeError):
            continue
    return found


def read_discarded(path: Path) -> tuple[DiscardedCandidate, ...]:
    """Every candidate remembered at `path`, oldest first (none when there is no file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    found = []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            found.append(DiscardedCandidate.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError) as err:
            if number == len(lines):
                continue  # the last line, cut short: a write that never finished
            raise WorkspaceError(
                f"{path}, line {number}: not a discarded candidate ({err}). The file is the workspace's memory "
                "of discarded candidates, one JSON object per line: fix or delete that line (the CHANGELOG "
                "still records the candidates a review carried)"
            ) from err
    return tuple(found)


def remember(path: Path, candidate: DiscardedCandidate) -> None:
    """Append one discarded candidate, as one whole line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_whole(
        path, _on_a_line_of_its_own(json.dumps(candidate.to_json(), sort_keys=True, ensure_ascii=False))
    )


def _on_a_line_of_its_own(line: str) -> Callable[[bytes], str]:
    """`line` appended after what the file holds, on a line of its own: after a last line a killed
    process cut short, it would otherwise join that line and be lost with it."""
    return lambda held: ("\n" if held and not held.endswith(b"\n") else "") + line + "\n"


def answers_anew(
    candidate: DiscardedCandidate,
    baseline: Sequence[Branch],
    decisions: Sequence[Mapping[str, Any]],
    held_out: str | None = None,
) -> bool:
    """Whether the branches `candidate` added, placed behind the guarded `baseline` branches (where a
    rule goes that no safety rank puts in front), answer `decisions` otherwise than in the candidate's
    own policy: a branch in front now answers some of them first. Not when the held-out set is the one
    it was discarded on (`held_out`, its key) and they still answer a held-out decision it answered
    wrongly there: the same labels would refuse it for the same reason, and the round would spend a
    read of the held-out set to learn nothing."""
    own, indexes = candidate.branches()
    if not indexes:
        return False
    guarded = [b for b in baseline if b.guard is not None]
    placed = [Branch(i, b.guard, b.target, b.output) for i, b in enumerate(guarded)]
    placed += [
        Branch(len(guarded) + j, b.guard, f"again_{j}", dict(b.output)) for j, b in enumerate(candidate.added)
    ]
    again = answers(placed, set(range(len(guarded), len(placed))), decisions)
    if candidate.wrong and candidate.held_out is not None and candidate.held_out[0] == held_out:
        still = {wrong_key(key) for key, _ in again}
        if still & set(candidate.wrong):
            return False
    return again != answers(own, indexes, decisions)


def wrong_key(key: str) -> str:
    """How the memory writes a decision's key (`decision_key`): its sha256, so a line stays short."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def route_of(branches: Sequence[Branch]) -> tuple[RouteBranch, ...]:
    """The guarded branches that answer with an output tree, as a candidate remembers them."""
    return tuple(RouteBranch(b.guard, dict(b.output)) for b in branches if b.guard is not None and b.output)


def superseded(
    tried: Sequence[DiscardedCandidate],
    promoted: Sequence[tuple[str, str | None, str]],
    lineage: Sequence[str],
) -> frozenset[str]:
    """The rounds of `tried` after which a candidate for the same cluster was promoted along the line:
    `promoted` holds each recommended round's (round id, cluster, candidate version), `lineage` the
    baseline and its ancestors, newest first. Round ids start with their time, so they order."""
    at = {version: i for i, version in enumerate(lineage)}
    return frozenset(
        t.round
        for t in tried
        if t.cluster is not None
        and any(
            cluster == t.cluster
            and version in at
            and at[version] < at.get(t.baseline, -1)
            and round_id > t.round
            for round_id, cluster, version in promoted
        )
    )


def mined_from(train_key: str, env_hashes: Mapping[str, str]) -> str:
    """The key of what a round's clusters are mined from: the training set's key (`holdout.set_key`)
    and the environment's files, as hashed (`train` of a remembered candidate): either changed, a
    cluster that had no rule may have one now. The training set's own key when the environment hashes
    nothing."""
    if not env_hashes:
        return train_key
    text = json.dumps([train_key, sorted(env_hashes.items())], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _mined_elsewhere(candidate: DiscardedCandidate, train: str | None) -> bool:
    """Whether `candidate` was tried on another training set than `train` (`focus`)."""
    if train is None or candidate.train == train:
        return False
    return candidate.train is not None or candidate.reason in ("none", "gates")


@dataclass(frozen=True)
class Focus:
    """Where a round aims after discarded candidates: the clusters tried enough along the policy's line
    (skipped: the round moves on to the next cluster), the clusters whose one candidate reached too
    far (tried again, with a narrower rule inside that candidate's), and, among the skipped, those
    whose one candidate gained too little (when every cluster was tried and one comes round again, it
    gets a rule that reaches as far as its evidence allows)."""

    skip: tuple[str, ...] = ()
    narrower: Mapping[str, DiscardedCandidate] | None = None
    broader: Mapping[str, DiscardedCandidate] | None = None
    spent: tuple[str, ...] = ()
    """Tried clusters whose last candidate, against the round's own baseline, added no branch (nothing
    was proposed for them): a proposer that answers the same request the same way finds nothing again."""
    afresh: tuple[str, ...] = ()
    """Clusters found rule-less, or whose rule failed the gates, on another training set or environment
    (`mined_from`): tried afresh."""

    def says(self, chosen: str | None) -> str | None:
        """What the round says about its cluster: a narrower rule for it, or the next cluster after the
        ones already tried; None when no cluster was tried before."""
        if chosen is not None and self.narrower and chosen in self.narrower:
            last = self.narrower[chosen]
            return (
                f"a narrower rule for cluster {chosen} (or one of another cause): candidate {last.candidate} "
                f"(round {last.round}, against {last.baseline}) reached too far"
            )
        if not self.skip:
            return None
        return f"the next cluster: already tried along this policy's line: {', '.join(self.skip)}"

    def again(self, cluster: str) -> str:
        """What the round says when every cluster was tried and `cluster`, tried longest ago, comes round
        again: with a broader rule when its one candidate gained too little."""
        said = f"every cluster was tried along this policy's line, {cluster} longest ago"
        last = (self.broader or {}).get(cluster)
        if last is None:
            return f"cluster {cluster} again: {said} (a candidate answering as a discarded one did is still refused)"
        return (
            f"a broader rule for cluster {cluster}: {said}, and candidate {last.candidate} (round {last.round}, "
            f"against {last.baseline}) gained too little where it answered only as far as its right answers"
        )


def focus(
    tried: Sequence[DiscardedCandidate],
    renewed: Collection[str] = (),
    baseline: str | None = None,
    model: str | None = None,
    train: str | None = None,
    superseded: Collection[str] = (),
) -> Focus:
    """Each cluster gets one candidate along a policy's line, and one narrower candidate when the first
    was discarded for reaching too far (`reach`): a rule that gained too little, never passed the gates
    or was never found is not helped by the same cause again, and the round moves on. One that gained
    too little (`gain`) gets a broader rule when it comes round again, every other cluster tried: its
    thresholds at the edge of the decisions answered otherwise rather than of its right answers, since
    the values between, which no training decision showed, may be where held-out cases found it silent;
    and when that broader rule reaches too far, a narrower one inside it, once.

    A candidate discarded for reaching too far whose round is in `renewed` counts for nothing here: its
    branches, behind the branches of the round's baseline, answer otherwise than they did (a branch
    promoted since, or one the safety order had put them in front of, answers first some of the
    decisions they took, `answers_anew`), so the same rule, behind them, is another candidate now.

    Only the candidates tried on `model`'s runs count (and those remembered without a model): a cluster
    is a model's failures, so one tried, or found rule-less, on a stand-in's runs is tried afresh on a
    real model's. A branch discarded against the baseline stays refused whatever the model
    (`Memory.discarded`): its labels, not the model, refused it.

    A candidate whose round is in `superseded` counts for nothing here either: a candidate for its
    cluster was promoted along the line since (`superseded`), so the cluster's failures left are others
    than those it was mined from, and are mined afresh (its branches stay refused as written). A
    discarded rule used to anchor its cluster for good: every later round asked for a rule narrower
    than it, and the failures outside it were never a target.

    A cluster tried on a training set other than `train` is tried afresh too, whatever came of it: the
    scenarios labelled since may show a rule the earlier ones did not (the round's own advice is to label
    more like its failures, or the out-of-sample drafts where a rule reached too far). Its branches, if
    any, stay refused as written (the novelty gate). A user who relabelled a desk after a candidate
    reached too far had every later round ask for a rule narrower than that candidate, on words the new
    scenarios no longer had: none was found, and the rounds ended with nothing left to try. One found
    rule-less (`none`) or whose rule never passed the gates (`gates`), remembered without its training
    set (before the memory kept it), is tried afresh once: which set it was mined from is not known, and
    the round that tries it again remembers its own."""
    mine = [
        t
        for t in tried
        if t.round not in renewed
        and t.round not in superseded
        and (model is None or t.model in (None, model))
    ]
    kept = [t for t in mine if not _mined_elsewhere(t, train)]
    by_cluster: dict[str, list[DiscardedCandidate]] = {}
    for candidate in kept:
        if candidate.cluster:
            by_cluster.setdefault(candidate.cluster, []).append(candidate)
    skip: list[str] = []
    narrower: dict[str, DiscardedCandidate] = {}
    broader: dict[str, DiscardedCandidate] = {}
    for cluster, candidates in by_cluster.items():
        first, newest = candidates[0], candidates[-1]
        # One narrower rule per cluster, inside the candidate that reached too far: the first one, or
        # the broader one that followed a rule that gained too little (it reached past the evidence).
        reached = [c for c in candidates if c.reason == "reach"]
        if newest.reason == "reach" and newest.added and reached == [newest] and len(candidates) <= 2:
            narrower[cluster] = newest
            continue
        skip.append(cluster)
        if len(candidates) == 1 and first.reason == "gain" and first.added:
            broader[cluster] = first
    # Tried longest ago first (by each cluster's last candidate): the order clusters come round again.
    last = {cluster: candidates[-1] for cluster, candidates in by_cluster.items()}
    spent = tuple(c for c in skip if last[c].baseline == baseline and not last[c].added)
    latest = {candidate.cluster: i for i, candidate in enumerate(kept) if candidate.cluster}
    afresh = sorted({t.cluster for t in mine if t.cluster and t not in kept and t.cluster not in by_cluster})
    return Focus(tuple(sorted(skip, key=latest.__getitem__)), narrower, broader, spent, tuple(afresh))
