"""The gates by name: the eight built-in ones in their fixed order, then extensions in name order.

An extension gate comes from an installed package (an entry point in the group `improve.gates`) or
from the workspace (`[gates.NAME] module = "package.module:Attribute"` in improve.toml, the workspace
root importable); see `improve.registry`. Extensions run only after the eight pass, so they may read
`ctx.policy` and `ctx.compiled`.
"""

from __future__ import annotations

from improve.errors import WorkspaceError
from improve.evals import Workspace
from improve.loop.gates.environment import EnvironmentGate
from improve.loop.gates.explore import ExploreGate
from improve.loop.gates.gate import Gate
from improve.loop.gates.interactions import InteractionsGate
from improve.loop.gates.lint import LintGate
from improve.loop.gates.lower import LowerGate
from improve.loop.gates.overfit import OverfitGate
from improve.loop.gates.validate import ValidateGate
from improve.loop.gates.vocabulary import VocabularyGate
from improve.registry import Registry, instance_of

BUILTIN_GATES: tuple[Gate, ...] = (
    EnvironmentGate(),
    ValidateGate(),
    VocabularyGate(),
    LowerGate(),
    LintGate(),
    ExploreGate(),
    OverfitGate(),
    InteractionsGate(),
)
"""In the order they run: each later one reads what an earlier one made (the parsed, the compiled policy)."""

GATE_NAMES = tuple(gate.name for gate in BUILTIN_GATES)

STATIC_GATES: tuple[Gate, ...] = tuple(
    gate for gate in BUILTIN_GATES if gate.name in ("validate", "vocabulary", "lower")
)
"""The gates a policy must pass to run as written, and that run nothing: a policy failing one ends the
decisions that reach the failing part in policy-error. `parity compare` refuses such a side with them."""

# Gate is a runtime-checkable Protocol: the isinstance check asks for `name` and `run`, which is the point.
_make = instance_of(Gate, "a Gate (a `name` and `run(ctx) -> GateResult`)")  # type: ignore[type-abstract]
GATES: Registry[Gate] = Registry("gates", _make)
for _gate in BUILTIN_GATES:
    GATES.bundle(_gate.name, _gate)


def gates_for(workspace: Workspace | None = None) -> list[Gate]:
    """The gates a candidate must pass, in order: the eight built-in ones, then the extensions (installed
    packages' and, given a workspace, its own) by name."""
    local = workspace.specs("gates") if workspace is not None else {}
    root = workspace.root if workspace is not None else None
    sources = GATES.sources(local)
    extensions = sorted(name for name, source in sources.items() if source.spec is not None)
    gates = list(BUILTIN_GATES)
    for name in extensions:
        gate = GATES.load(name, local, root)
        if gate.name != name:
            raise WorkspaceError(
                f"gate {name!r} ({sources[name].origin}: {sources[name].spec}) calls itself "
                f"{gate.name!r}; set its `name` to {name!r}, the name it is registered under"
            )
        gates.append(gate)
    return gates
