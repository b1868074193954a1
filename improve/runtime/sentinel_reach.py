"""Whether the environment's own search reaches a sentinel: the verdict `improve explore` gives, made for
the gates and the round.

A sentinel the environment's probe reaches (a decision's offered answer, then a person's event its guard
lets through, say) is reachable whatever a policy does between the decisions, so no policy change can
keep it unreachable: the explore gate fails on it and a round is blocked until a person fixes the
machine. The search is the probe's (payload values at the rules' boundaries, every output each tool may
give, tools that fail) with the decisions answering only what they offer, as the decision protocol
holds any decider to: a way there through an answer it refuses (a guard that lets through more than the
closed choice offers) is `improve explore`'s finding, not a reach of the agent's. Made once per process
(`resume_bound.explorations`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from improve.machine import ExploreOptions, can_reach
from improve.runtime.environment import Environment
from improve.runtime.resume_bound import explorations


@dataclass(frozen=True)
class SentinelReach:
    """The first sentinel the probe reaches (with the input and the events that reach it), or none."""

    environment: str
    sentinels: list[str]
    inputs: int
    """Probe inputs searched from."""
    complete: bool
    """Every search finished: "unreachable" is a proof, relative to the probe."""
    sentinel: str | None = None
    input: Any = None
    witness: list[dict[str, Any]] = field(default_factory=list)
    cuts: list[str] = field(default_factory=list)

    @property
    def reachable(self) -> bool:
        return self.sentinel is not None

    def summary(self) -> str:
        if not self.sentinels:
            return "no sentinel state"
        if not self.inputs:
            return "the sentinels' reach is not searched: the environment declares no probe inputs"
        if self.sentinel is not None:
            steps = " -> ".join(json.dumps(e) for e in self.witness) or "start"
            return (
                f"the environment's sentinel '{self.sentinel}' is reachable from probe input "
                f"{json.dumps(self.input)}, after: {steps}. No policy can make it unreachable: a guard of "
                "the machine must refuse the way there (`improve explore` prints the witness state by state)"
            )
        named = ", ".join(self.sentinels)
        if not self.complete:
            return (
                f"no sentinel ({named}) reached, not a proof: the search was cut ({'; '.join(self.cuts[:2])})"
            )
        return (
            f"no sentinel ({named}) reachable from {self.inputs} probe input(s) with the decisions answering what "
            "they offer (a proof, relative to the probe)"
        )


def reach_sentinels(env: Environment) -> SentinelReach:
    """The environment's sentinels searched for from every probe input, as `improve explore` does."""
    sentinels = env.config.sentinels()
    if not sentinels or not env.probe_inputs:
        return SentinelReach(env.name, sentinels, len(env.probe_inputs), True)
    explored = explorations(env, closed_choice=True)
    complete = all(result.complete for _, result in explored)
    cuts = [c for _, result in explored for c in result.cuts]
    for sentinel in sentinels:
        for inp, result in explored:
            if sentinel in result.reached:
                # The full search passed it: search again for the shortest way there, to show it.
                probe = dataclasses.replace(env.probe or ExploreOptions(), closed_choice=True)
                found = can_reach(env.machine, sentinel, inp, probe)
                if found.reachable:
                    return SentinelReach(
                        env.name, sentinels, len(explored), complete, sentinel, inp, found.witness or [], cuts
                    )
    return SentinelReach(env.name, sentinels, len(explored), complete, cuts=cuts)
