"""The document being linted: its config read as a graph of states, and the findings so far.

Every rule module reads one `Document` and adds to it; the graph (each state's transitions and the
states they lead to) is built once here, because most rules ask where a run can go.
"""

from __future__ import annotations

from improve.machine.config import MachineConfig
from improve.machine.lint.finding import Kind, Lint, Severity
from improve.machine.walk import Edge, edges, state_path


def relative(path: str, name: str) -> str:
    """The part of `path` below the state, for messages (`on.ISSUE[0].guard`)."""
    rest = path.removeprefix(state_path(name)).lstrip(".")
    return f"`{rest}`" if rest else "the state"


class Document:
    def __init__(self, config: MachineConfig, kind: Kind) -> None:
        self.config = config
        self.kind = kind
        self.policy = kind == "policy"
        self.found: list[Lint] = []
        self.edges: dict[str, list[Edge]] = {
            name: edges(name, state) for name, state in config.states.items()
        }
        self.succ = {
            name: [e.target for e in out if e.target is not None and e.target in config.states]
            for name, out in self.edges.items()
        }

    def add(self, code: str, severity: Severity, path: str, message: str) -> None:
        self.found.append(Lint(code, severity, path, message))

    def soft(self) -> Severity:
        """Errors for policies, warnings for environments."""
        return "error" if self.policy else "warning"

    def reachable_from(self, starts: list[str]) -> set[str]:
        """States some chain of transitions leads to from `starts` (the starts included)."""
        seen: set[str] = set()
        todo = [s for s in starts if s in self.config.states]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo.extend(self.succ[name])
        return seen

    def can_reach(self, goals: set[str]) -> set[str]:
        """States from which some state in `goals` is reachable (the goals included)."""
        back: dict[str, set[str]] = {name: set() for name in self.config.states}
        for name, targets in self.succ.items():
            for target in targets:
                back[target].add(name)
        seen: set[str] = set()
        todo = list(goals)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo.extend(back[name])
        return seen

    def is_dead_end(self, name: str) -> bool:
        """A non-final state none of whose transitions leads elsewhere (a broken target does not count:
        it is reported as unknown-target)."""
        state = self.config.states[name]
        return (
            not state.is_final
            and not any(t != name for t in self.succ[name])
            and not any(e.target is not None and e.target not in self.config.states for e in self.edges[name])
        )
