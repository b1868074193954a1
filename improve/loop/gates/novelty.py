"""`novelty`: a candidate must not be one already discarded against the policy it would replace, or
against a version that policy descends from.

Two memories say what was discarded: the CHANGELOG's (`Changelog.discarded_branches`: each discarded
candidate's entry lists the branches it added, against its baseline) and the workspace's own
(`discards.py`, which a reverted working tree does not lose). A candidate fails when every branch it
adds was discarded before as written, or when its new branches answer the training and held-out
decisions exactly as a discarded candidate's did: the same decisions, the same answers. Two branches
that answer alike are one candidate, whatever their guards say (`type != 'employee'` and `type ==
'contractor'` where no intern ever asked), and a round that tried one must not spend a held-out read
on the other (unless that candidate never passed its gates: it was never judged on what it answers,
so one answering alike that does pass them is judged for the first time). It fails too when its new branches answer a held-out decision as a candidate discarded
for reaching too far answered it wrongly (`DiscardedCandidate.wrong`, on the same held-out set): the
same labels refuse it for the same reason, whatever else it answers (a rule re-proposed behind a
branch promoted since, which answers first only some of the decisions it took). A round whose
baseline has such a memory runs this gate right after `validate`; on a failure the proposer is asked
for another condition or another answer.
"""

from __future__ import annotations

from improve.loop.branches import added, answers, route
from improve.loop.discards import DiscardedCandidate, wrong_key
from improve.loop.gates.gate import GateContext, GateResult

WHY = {
    "reach": "its branch answered decisions wrongly where it answered, or made a scenario worse",
    "gain": "it gained too little",
    "gates": "it did not pass the gates",
    "none": "no rule was proposed",
}


class NoveltyGate:
    name = "novelty"

    def run(self, ctx: GateContext) -> GateResult:
        if (not ctx.discarded and not ctx.tried) or ctx.baseline is None:
            return GateResult(self.name, True, "no candidate was discarded against this policy")
        new_branches = added(ctx.baseline, ctx.policy)
        new = [(b.guard or "", b.answer()) for b in new_branches]
        seen = {(d.guard, d.answer): d.round for d in ctx.discarded}
        if new and all(branch in seen for branch in new):
            rounds = sorted({seen[branch] for branch in new})
            return GateResult(
                self.name,
                False,
                f"this change was already discarded against {ctx.baseline.id}@{ctx.baseline.version} or a "
                f"version before it (round(s) {', '.join(rounds)}, see the CHANGELOG): "
                + "; ".join(f"`{guard}` -> {answer}" for guard, answer in new)
                + ". Propose another condition or another answer",
            )
        decisions = [*ctx.training_decisions(), *ctx.held_out_decisions]
        answered = answers(route(ctx.policy), {b.index for b in new_branches}, decisions)
        if answered:
            for tried in ctx.tried:
                if tried.reason == "gates":
                    # Never run: a candidate failing its gates was never judged on what it answers, so one
                    # answering alike that passes them is judged for the first time (its branches as
                    # written stay refused above).
                    continue
                branches, indexes = tried.branches()
                if indexes and answers(branches, indexes, decisions) == answered:
                    return GateResult(
                        self.name,
                        False,
                        f"this change answers the {len(answered)} training and held-out decision(s) it takes "
                        f"exactly as candidate {tried.candidate} did ({_shown(tried)}), discarded against "
                        f"{tried.baseline} in round {tried.round}: {WHY[tried.reason]}. Two branches that "
                        "answer the same decisions the same way are one candidate: propose a rule that "
                        "answers other decisions, or another answer",
                    )
            refused = _refused_again(ctx, answered)
            if refused is not None:
                return refused
        return GateResult(
            self.name,
            True,
            f"{len(new)} new branch(es), not discarded before, answering {len(answered)} known decision(s) "
            "unlike any discarded candidate",
        )


def _shown(tried: DiscardedCandidate) -> str:
    """The branches a discarded candidate added, as a message shows them."""
    return "; ".join(f"`{b.guard}` -> {b.answer}" for b in tried.added)


def _refused_again(ctx: GateContext, answered: frozenset[tuple[str, str]]) -> GateResult | None:
    """A failure when the new branches answer a held-out decision of the set a candidate discarded for
    reaching too far was read on, with the answer its branches gave there and the labels refused."""
    if ctx.held_out_key is None or not ctx.held_out_decisions:
        return None
    for tried in ctx.tried:
        if tried.reason != "reach" or not tried.wrong or tried.held_out is None:
            continue
        if tried.held_out[0] != ctx.held_out_key:
            continue
        branches, indexes = tried.branches()
        wrong = set(tried.wrong)
        theirs = {a for a in answers(branches, indexes, ctx.held_out_decisions) if wrong_key(a[0]) in wrong}
        again = theirs & answered
        if again:
            return GateResult(
                NoveltyGate.name,
                False,
                f"this change answers {len(again)} held-out decision(s) as candidate {tried.candidate} did "
                f"({_shown(tried)}), discarded against {tried.baseline} in round {tried.round} because the labels "
                f"of the same held-out set refuse that answer there: {WHY[tried.reason]}. Propose a rule "
                "that keeps out of the decisions it answered wrongly, or another answer",
            )
    return None
