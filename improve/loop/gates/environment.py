"""`environment-unchanged`: the environment's files hash as recorded when the round started (or, for
`improve verify`, as `improve lock` recorded them)."""

from __future__ import annotations

from improve.loop.gates.gate import GateContext, GateResult


class EnvironmentGate:
    """A candidate may never change the environment: failing here discards it (no repair can help)."""

    name = "environment-unchanged"

    def run(self, ctx: GateContext) -> GateResult:
        if not ctx.expected_hashes:
            # Only `improve verify` asks without them (a round records them as it starts).
            return GateResult(
                self.name,
                True,
                "not checked: no lock records the environment's files (`improve lock` writes "
                "policies/<env>/environment.lock.json, and verify then checks the files against it)",
            )
        now = ctx.env.file_hashes()
        changed = [
            f"{name} (recorded {want[:12]}, now {now.get(name, 'missing')[:12]})"
            for name, want in sorted(ctx.expected_hashes.items())
            if now.get(name) != want
        ]
        if changed and ctx.hashes_from is not None:
            return GateResult(
                self.name,
                False,
                f"the environment changed since it was locked in {ctx.hashes_from}: {', '.join(changed)}. "
                "The policies were made against the locked files: if the change is meant, check them against "
                "it (`improve run`, `improve score`) and record it with `improve lock`",
            )
        if changed:
            return GateResult(
                self.name,
                False,
                f"the environment changed since the round started: {', '.join(changed)}. A candidate may "
                "never change the environment; this one is discarded (not repaired)",
            )
        return GateResult(self.name, True, "environment files hash as recorded")
