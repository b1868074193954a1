"""`lint`: no lint error (`improve.machine.lint`, the document read as a policy)."""

from __future__ import annotations

from improve.loop.gates.gate import GateContext, GateResult
from improve.machine import has_errors, lint


class LintGate:
    name = "lint"

    def run(self, ctx: GateContext) -> GateResult:
        found = lint(ctx.policy, "policy")
        if has_errors(found):
            errors = [f"- {f.code} at {f.path}: {f.message}" for f in found if f.severity == "error"]
            return GateResult(self.name, False, "lint errors:\n" + "\n".join(errors))
        return GateResult(self.name, True, "ok")
