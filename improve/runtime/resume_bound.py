"""What exploration proves about an environment's resumes: that no path can outspend its budgets.

A resumed run goes on with what its budget has left (counted across resumes), or, when the
environment states a `resume_budget`, with that many fresh model calls per resume. In the first case
a thread can never spend more than its run's budget, however often it waits. In the second, the
total is `max_model_calls + resumes * resume_budget`, finite only if the resumes along every path are:
exploration (`improve.machine.explore`) finds the most resumes any path can take, or a cycle of
snapshots through a waiting state (an unbounded resume loop), which it reports with its events. A
machine that may wait again after a resume bounds that in its own context (a counter and a guard).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.machine import ExploreOptions, ExploreResult, canonical_json, explore_paths
from improve.runtime.environment import Environment


@dataclass(frozen=True)
class ResumeProof:
    """The resume bound over every probe input, and whether the budgets hold with it."""

    environment: str
    resume_budget: int | None
    max_resumes: int | None
    """The most resumes one path takes, over every input explored; None when some path loops."""
    complete: bool
    """Every exploration finished: the bound is a proof, relative to the probe."""
    loop: list[dict[str, Any]] | None = None
    loop_state: str | None = None
    loop_input: Any = None
    cuts: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        """No resume path can exceed its budget: resumes share the run's budget, or a fresh budget each
        is granted only finitely often on every path (proved: the exploration was complete)."""
        if self.resume_budget is None:
            return True
        return self.max_resumes is not None and self.complete

    def most_calls(self, run_budget: int) -> int | None:
        """The most model calls a thread can make across all its resumes (None: unbounded)."""
        if self.resume_budget is None:
            return run_budget
        if self.max_resumes is None:
            return None
        return run_budget + self.max_resumes * self.resume_budget

    def summary(self, run_budget: int) -> str:
        if self.resume_budget is None:
            return (
                f"resumes share the run's budget (no resume_budget): at most {run_budget} model calls per thread, "
                f"however often it waits ({self._count()})"
            )
        if self.max_resumes is None:
            steps = " -> ".join(_describe(e) for e in self.loop or []) or "start"
            return (
                f"unbounded resume loop: every resume grants {self.resume_budget} fresh model calls, and state "
                f"'{self.loop_state}' can be waited in again and again (input {self.loop_input}): {steps}. Count "
                "the resumes in the machine's context and guard the way back on the count"
            )
        if not self.complete:
            return f"the resume bound is not proved: exploration was cut ({'; '.join(self.cuts[:3])})"
        return (
            f"at most {self.max_resumes} resume(s) on any path, each with {self.resume_budget} fresh model calls: "
            f"at most {self.most_calls(run_budget)} model calls per thread"
        )

    def _count(self) -> str:
        if self.max_resumes is None:
            return f"a path may wait in '{self.loop_state}' again and again"
        return f"at most {self.max_resumes} resume(s) on any path"

    def to_json(self) -> dict[str, Any]:
        return {
            "holds": self.holds,
            "resume_budget": self.resume_budget,
            "max_resumes": self.max_resumes,
            "complete": self.complete,
            "loop": self.loop,
            "loop_state": self.loop_state,
            "loop_input": self.loop_input,
            "cuts": self.cuts,
        }


def resume_proof(env: Environment, explored: Sequence[tuple[Any, ExploreResult]]) -> ResumeProof:
    """The proof from full explorations already made, one per input."""
    most: int | None = 0
    complete = bool(explored)
    cuts: list[str] = [] if explored else ["no input explored: the environment declares no probe inputs"]
    for inp, result in explored:
        complete &= result.complete and result.resumes is not None
        cuts += [c for c in result.cuts if c not in cuts]
        bound = result.resumes
        if bound is None:
            continue
        if bound.max_resumes is None:
            return ResumeProof(
                env.name, env.resume_budget, None, complete, bound.loop, bound.loop_state, inp, cuts
            )
        most = max(most or 0, bound.max_resumes)
    return ResumeProof(env.name, env.resume_budget, most, complete, cuts=cuts)


def prove_resumes(
    env: Environment, inputs: Sequence[Any] | None = None, options: ExploreOptions | None = None
) -> ResumeProof:
    """Explore the environment under its probe, from each probe input, for the resume bound (under its
    own probe, from the explorations made once per process: `explorations`)."""
    if inputs is None and options is None:
        return resume_proof(env, explorations(env))
    probe = options or env.probe or ExploreOptions()
    inputs = list(inputs) if inputs is not None else env.probe_inputs
    return resume_proof(env, [(inp, explore_paths(env.machine, inp, probe)) for inp in inputs])


def explorations(env: Environment, closed_choice: bool = False) -> list[tuple[Any, ExploreResult]]:
    """A full exploration of the environment under its own probe from each probe input (`closed_choice`:
    the decisions answering only what they offer). Made once per process for an environment built from
    files: it depends on the environment alone, and every round's explore gate asks for the resume
    bound and the sentinels' reach again."""
    if not env.files:
        return _explore(env, closed_choice)
    key = (*_environment_key(env), str(closed_choice))
    explored = _EXPLORED.get(key)
    if explored is None:
        explored = _EXPLORED[key] = _explore(env, closed_choice)
    return explored


def _explore(env: Environment, closed_choice: bool) -> list[tuple[Any, ExploreResult]]:
    probe = dataclasses.replace(env.probe or ExploreOptions(), closed_choice=closed_choice)
    return [(inp, explore_paths(env.machine, inp, probe)) for inp in env.probe_inputs]


_EXPLORED: dict[tuple[str, ...], list[tuple[Any, ExploreResult]]] = {}


def _environment_key(env: Environment) -> tuple[str, ...]:
    """What the explorations depend on: the environment's name and resume budget, its machine, its probe
    inputs, and the code it is built from (the files its environment gate hashes, which hold the
    probe's options and the machine's guards)."""
    hashes = canonical_json(env.file_hashes())
    return (
        env.name,
        str(env.resume_budget),
        canonical_json(env.config.model_dump(mode="json")),
        canonical_json(env.probe_inputs),
        hashes,
    )


def _describe(event: dict[str, Any]) -> str:
    if event.get("type") == "xstate.done.actor":
        return f"{event.get('actorId')} answered"
    if event.get("type") == "xstate.error.actor":
        return f"{event.get('actorId')} failed"
    return str(event.get("type"))
