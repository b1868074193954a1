"""`out-of-sample`: a candidate's new branches must not answer a generated case otherwise than labelled.

A branch answers wherever its condition holds, and a condition that separates the training decisions
can reach combinations no labelled scenario shows: the train and held-out splits cannot see them, so
the promotion rule cannot either. An environment with a generator of plausible cases
(`Environment.cases`) can: a round whose objective sets `out_of_sample_cases` draws that many cases
once (labelled by the generator, or by `careful`'s run of the line's first policy), runs its baseline
with `careful` on them, and then each candidate. A case one of the candidate's branches answered
otherwise than `careful` answers it, where the baseline's branches did not, fails the gate: the branch
overrode a right answer the labelled scenarios never asked about. The proposer is sent the cases (their
input, world, label and where the candidate ended them) and asked for a rule that keeps out of them;
the round also adds the decisions the branch answered there, labelled by careful's answer, to the
training decisions the repair reads (`AgainstReference.counterexamples`), so the rule miner mines again
and its rule must not answer them wrongly, as it must not answer a training decision wrongly. Their
text is the generator's wording, not a person's: each joins twice, its text emptied and filled
(`without_wording`), so no word test keeps it out. The workspace keeps them for the rounds after
(`loop/generated.py`).

A repair is checked on a new draw as well as on the ones before (`draw_seed`): a rule mined to keep out
of the cases a draw showed can do so by what those few cases happen to share (the rooms left, on a
desk where no rule reads them), and only cases it was not shaped on tell. Each read of the held-out set
draws other cases too (the seed is the objective's plus the reads before), so a rule shaped to pass one
round's draws meets others in the next round. A generator that cannot label its cases is said, and the
gate passes without a check: a mistake of the environment's, not of the candidate's.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from improve.errors import ImproveError
from improve.evals import REFERENCE_MODEL, AgainstReference, CandidateCheck, Disagreement
from improve.loop.branches import fact_at
from improve.loop.gates.gate import GateContext, GateResult
from improve.loop.proposers.conditions import grams

SHOWN = 3
"""The overridden cases a failure shows (each with its input, world, label and end)."""


def draw_seed(seed: int, draw: int) -> int:
    """The seed of a round's `draw`th draw of cases (the first is the round's own seed): apart from every
    round's seed (`seed + reads`) by far more than a round count, so no two draws coincide."""
    return seed + draw * DRAW_STRIDE


DRAW_STRIDE = 1_000_003
"""Between the seeds of one round's draws: a prime, more than any number of held-out reads."""


class OutOfSampleGate:
    name = "out-of-sample"

    def __init__(self, prepare: Callable[[int], CandidateCheck | None]) -> None:
        """`prepare(draw)`: the round's `draw`th draw of cases, with its baseline's agreement (`draw_seed`)."""
        self._prepare = prepare
        self._checks: list[CandidateCheck] = []
        self._failed = False
        """The last candidate failed: the next one is a repair, checked on a new draw as well."""
        self.found: AgainstReference | None = None
        """The last candidate's check (a passing candidate's, once the gates pass)."""
        self.error: str | None = None
        """Why the cases could not be drawn, when they could not."""

    def run(self, ctx: GateContext) -> GateResult:
        self.found = None
        checks = self._cases()
        if not checks or ctx.config is None:
            return GateResult(
                self.name, True, f"not checked: {self.error or 'the candidate did not validate'}"
            )
        # The newest draw first (the one a repair was not shaped on), then the ones before: the first that
        # shows a new branch answering otherwise than labelled is the one said.
        for check in reversed(checks):
            found = check.against(ctx.config)
            self.found = found
            if found.newly_overridden:
                break
        new = found.newly_overridden
        self._failed = bool(new)
        where = f"with careful on {found.cases} generated cases (seed {found.seed}, labelled by {found.labelled_by})"
        if not new:
            return GateResult(
                self.name,
                True,
                f"{where}: no new branch answered a case otherwise than labelled "
                f"({found.candidate.agreed}/{found.cases} agree; baseline {found.baseline.agreed}/{found.cases})",
            )
        shown = examples(found, new) or [", ".join(new[:SHOWN])]
        return GateResult(
            self.name,
            False,
            f"{where}: a new branch answered {len(new)} case(s) otherwise than labelled, where careful's own "
            f"answer was right (the baseline's branches did not override it): "
            + "; ".join(shown)
            + ". No labelled scenario shows such a case, so its condition reaches further than the evidence: "
            "propose a rule that keeps out of these cases (keep in its condition what the decisions it fixes "
            "have in common), or a rule for another cluster",
        )

    def _cases(self) -> list[CandidateCheck]:
        """The round's draws of cases, each with its baseline's agreement: the first for the first
        candidate, one more for each repair after a failed check."""
        if self.error is None and (not self._checks or self._failed):
            try:
                check = self._prepare(len(self._checks))
            except ImproveError as error:
                self.error = str(error)
            else:
                if check is None:
                    self.error = f"the environment has no {REFERENCE_MODEL!r} stand-in to run the cases with"
                else:
                    self._checks.append(check)
            self._failed = False
        return [] if self.error is not None else self._checks


TEXT_KINDS = ("text", "string")
"""The fact types whose values are words (`runtime.vocabulary`): free text, and strings."""


def without_wording(
    decisions: Sequence[Mapping[str, Any]],
    training: Sequence[Mapping[str, Any]],
    kinds: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Each generated case's decision (`AgainstReference.counterexamples`) twice, its text facts (`kinds`:
    fact path -> type) emptied in one and, in the other, every word and two-word phrase of the training
    decisions' texts at that path, one a line (what the rule miner tests for: `conditions.grams`): the
    generator's wording is no person's, and a rule that kept out of the decision only by a word
    (`!message.matches('ago')`, a word every generated message has) would keep out of the generator,
    not of the cases. No word test keeps out both copies, so the rule's other conditions must."""
    texts = {path: kind for path, kind in kinds.items() if kind in TEXT_KINDS}
    if not texts:
        return [dict(d) for d in decisions]
    every = {path: "\n".join(sorted(_grams(training, path))) for path in texts}
    copies: list[dict[str, Any]] = []
    for decision in decisions:
        for wording in ({p: "" for p in texts}, every):
            facts = copy.deepcopy(dict(decision.get("facts") or {}))
            for path, text in wording.items():
                _set_at(facts, path, text)
            copies.append({**decision, "facts": facts})
    return copies


def _grams(training: Sequence[Mapping[str, Any]], path: str) -> set[str]:
    """The words and two-word phrases of the training decisions' texts at `path`, each once."""
    texts = {v for e in training if isinstance(v := fact_at(e.get("facts") or {}, path), str)}
    return set().union(*(grams(text) for text in texts))


def _set_at(facts: dict[str, Any], path: str, value: str) -> None:
    """`value` at `path` (`facts.owner.message`) where the decision has a string there, else nothing."""
    parts = path.split(".")[1:]
    node: Any = facts
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and isinstance(node.get(parts[-1]), str):
        node[parts[-1]] = value


def overridden_example(d: Disagreement) -> str:
    """One case a branch answered otherwise than labelled: its input and world, its label, its end."""
    assert d.scenario is not None
    said = (
        f"input {clipped(d.scenario.input)}, world {clipped(d.scenario.world)}: labelled {d.expected}, "
        f"ended {d.got}"
    )
    # The same final state: the difference is in the effects, which the reason names.
    return said + (f" ({d.reason[:200]})" if d.expected == d.got and d.reason else "")


def clipped(value: Any, limit: int = 200) -> str:
    """`value` as JSON in about `limit` characters: an object keeps the whole members that fit and names
    the ones left out (cutting the text at `limit` left a member's key without its value, the very value
    a learned branch fired on)."""
    text = json.dumps(value, sort_keys=True)
    if len(text) <= limit:
        return text
    if not isinstance(value, dict):
        return text[:limit] + "…"
    kept: list[str] = []
    left: list[str] = []
    for key in sorted(value):
        member = f"{json.dumps(key)}: {json.dumps(value[key], sort_keys=True)}"
        if sum(len(k) + 2 for k in kept) + len(member) > limit:
            left.append(key)  # too long to show here: the smaller members after it still are
        else:
            kept.append(member)
    # Every member may fit once the quotes and commas the sum leaves out are not counted: nothing is left.
    return "{" + ", ".join([*kept, *([f"… and {', '.join(left)}"] if left else [])]) + "}"


def examples(found: AgainstReference, cases: Sequence[str] | None = None) -> list[str]:
    """Up to `SHOWN` of the candidate's overridden cases (of `cases` when given), as a record shows them."""
    chosen = set(cases) if cases is not None else None
    return [
        overridden_example(d)
        for d in found.candidate.drafted
        if d.by_rule and d.scenario is not None and (chosen is None or d.case in chosen)
    ][:SHOWN]
