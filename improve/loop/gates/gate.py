"""What a gate is: a `name` and a check of one candidate policy, `run(ctx) -> GateResult`.

A gate's failing `detail` says what is wrong, where (a JSON path, spelled as `improve.machine.walk`
spells it) and how to fix it, precisely enough to send back to a proposer verbatim. A gate may raise on
a document it cannot read: `run_gates` turns that into a failing result, so a candidate never crashes
the round.

    class NoEscalate:                      # [gates.no-escalate] module = "mygates:NoEscalate"
        name = "no-escalate"

        def run(self, ctx: GateContext) -> GateResult:
            finals = [s.output for s in ctx.policy.states.values() if s.is_final]
            if {"type": "'ESCALATE'"} in finals:
                return GateResult(self.name, False, "a final outputs ESCALATE; answer with ...")
            return GateResult(self.name, True, "ok")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from improve.evals import Scenario
from improve.loop.branches import DiscardedBranch
from improve.loop.discards import DiscardedCandidate
from improve.machine import Machine, MachineConfig
from improve.runtime import DecisionRequest, Environment, Vocabulary, vocabulary


@dataclass(frozen=True)
class GateResult:
    name: str
    ok: bool
    detail: str
    """Why it failed and how to fix it; when it passed, what was checked (`ok` when nothing more)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class Unparsed:
    """A document that is not JSON at all: the validate gate reports `message` (file, line, column)."""

    message: str


@runtime_checkable
class Gate(Protocol):
    name: str
    """A slug, the name it is registered under (`[gates.NAME]` in improve.toml, an entry point's name)."""

    def run(self, ctx: GateContext) -> GateResult: ...


@dataclass
class GateContext:
    """What the gates check a candidate against, and what they made of the candidate so far.

    A caller sets the first group once (a round reuses it for every repair); `run_gates` fills the
    second group afresh for each candidate, so nothing one candidate left behind is seen by the next.
    """

    env: Environment
    expected_hashes: Mapping[str, str] | None = None
    """The environment's file hashes when the round started (None: nothing to compare)."""
    hashes_from: str | None = None
    """Where `expected_hashes` were recorded, when not at the round's start: the lock file `improve
    verify` read (its failure then says to lock again, not that a candidate changed anything)."""
    probes: list[DecisionRequest] = field(default_factory=list)
    """Recorded decision requests of training scenarios, for the explore gate."""
    scenarios: Sequence[Scenario] = ()
    """Every scenario, for the overfit gate."""
    words: Vocabulary | None = None
    """The environment's vocabulary, read off it when first needed."""
    baseline: MachineConfig | None = None
    """The policy the candidate would replace (the interactions gate compares their answers)."""
    decisions: Sequence[Mapping[str, Any]] = ()
    """Training decisions (evidence.py's examples: `scenario`, `name`, `facts`, `options`, `correct`):
    where the overfit gate counts a threshold's support, and what the interactions gate calls covered.
    Empty outside a round: then both read the probe requests."""
    discarded: Sequence[DiscardedBranch] = ()
    """Branches discarded against `baseline` or a version before it: what the novelty gate refuses
    again as written."""
    tried: Sequence[DiscardedCandidate] = ()
    """Candidates the workspace remembers discarding against `baseline` or a version before it: what
    the novelty gate refuses again when a candidate answers as one of them did."""
    held_out_decisions: Sequence[Mapping[str, Any]] = ()
    """The held-out decisions of the baseline's runs, their `name`, `facts` and `options` only (no
    label, no outcome): where the novelty gate compares what two candidates answer."""
    held_out_key: str | None = None
    """The key of the held-out set those decisions are of: a decision a discarded candidate answered
    wrongly (`DiscardedCandidate.wrong`) counts only on the set it was answered on."""
    gates: Sequence[Gate] = ()
    """The gates in order, from `gates_for(workspace)` (which adds a workspace's own); empty means
    `gates_for()`: the eight built-in ones and those installed packages register."""

    document: Any = None
    """The candidate as decoded JSON, or `Unparsed`."""
    source: str = "candidate"
    """Where the candidate comes from, for messages (a file, `candidate v3`)."""
    config: MachineConfig | None = None
    """The candidate as a machine config, set by the validate gate."""
    machine: Machine | None = None
    """The candidate compiled, set by the lower gate."""

    def training_decisions(self) -> list[Mapping[str, Any]]:
        """`decisions`, or outside a round the probe requests as decisions (each its own scenario)."""
        if self.decisions:
            return list(self.decisions)
        return [{"scenario": f"probe {i}", **p.to_input()} for i, p in enumerate(self.probes)]

    @property
    def vocab(self) -> Vocabulary:
        if self.words is None:
            self.words = vocabulary(self.env)
        return self.words

    @property
    def policy(self) -> MachineConfig:
        """The validated candidate; every gate after `validate` may read it."""
        if self.config is None:
            raise RuntimeError("the candidate is not validated yet: the validate gate runs before this one")
        return self.config

    @property
    def compiled(self) -> Machine:
        """The compiled candidate; every gate after `lower` may read it."""
        if self.machine is None:
            raise RuntimeError("the candidate is not compiled yet: the lower gate runs before this one")
        return self.machine
