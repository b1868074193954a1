"""`validate`: the document is a machine config (pydantic; each error with its JSON path)."""

from __future__ import annotations

from improve.errors import ImproveError
from improve.loop.gates.gate import GateContext, GateResult, Unparsed
from improve.machine import parse_machine


class ValidateGate:
    """Parses the candidate; the gates after this one read `ctx.policy`."""

    name = "validate"

    def run(self, ctx: GateContext) -> GateResult:
        document = ctx.document
        if isinstance(document, Unparsed):
            return GateResult(self.name, False, document.message)
        if not isinstance(document, dict):
            return GateResult(
                self.name,
                False,
                f"{ctx.source}: $: expected a JSON object (a policy machine), got {type(document).__name__}",
            )
        try:
            ctx.config = parse_machine(document, source=ctx.source)
        except ImproveError as err:
            return GateResult(self.name, False, f"the policy is not a valid machine document:\n{err}")
        return GateResult(self.name, True, "ok")
