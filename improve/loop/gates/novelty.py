"""`novelty`: a candidate must add a branch not already discarded against the policy it would replace.

The memory is the CHANGELOG's (`Changelog.discarded_branches`): each discarded candidate's entry lists
the branches it added, against its baseline. A round whose baseline has such a memory runs this gate
right after `validate`; a candidate whose every new branch was discarded before fails it, and the
proposer is asked for another condition or another answer.
"""

from __future__ import annotations

from improve.loop.branches import added
from improve.loop.gates.gate import GateContext, GateResult


class NoveltyGate:
    name = "novelty"

    def run(self, ctx: GateContext) -> GateResult:
        if not ctx.discarded or ctx.baseline is None:
            return GateResult(self.name, True, "no branch was discarded against this policy")
        new = [(b.guard or "", b.answer()) for b in added(ctx.baseline, ctx.policy)]
        seen = {(d.guard, d.answer): d.round for d in ctx.discarded}
        if not new or any(branch not in seen for branch in new):
            return GateResult(self.name, True, f"{len(new)} new branch(es), not discarded before")
        rounds = sorted({seen[branch] for branch in new})
        return GateResult(
            self.name,
            False,
            f"this change was already discarded against {ctx.baseline.id}@{ctx.baseline.version} (round(s) "
            f"{', '.join(rounds)}, see the CHANGELOG): "
            + "; ".join(f"`{guard}` -> {answer}" for guard, answer in new)
            + ". Propose another condition or another answer",
        )
