"""Outcome rows: one per thread, computed by replaying the log, never from the agent's own report.

The effects come from the world's receipts journaled with each tool's completion; violations are the
world's after-the-fact audit of those effects plus any sentinel state reached. A row says whether the
run passed (the outcome and every effect as labelled) and, when it did not, why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from improve.errors import ImproveError, RunError, raised
from improve.evals.scenarios import Scenario
from improve.log import EntryView, ThreadId, replay
from improve.machine import DONE_EVENT, ERROR_EVENT, canonical_json
from improve.runtime import POLICY_ERROR, Environment, recorded_thread, refused_at_end


@dataclass(frozen=True)
class Quarantined:
    """A thread set aside instead of scored: its replay does not verify (the reason says where)."""

    thread_id: str
    reason: str


@dataclass(frozen=True)
class OutcomeRow:
    thread_id: str
    scenario: str
    category: str
    split: str
    policy_version: str
    run: int
    status: str
    final_state: str
    output: Any
    expected_outcome: str
    passed: bool
    reason: str
    effects: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    failed_attempts: int = 0
    cost_usd: float = 0.0
    verification: str = "unverified"
    """How its replay was checked: verified, unchained (an older thread), incomplete or unverified."""
    model: str | None = None
    """The model bound to the decider, from the thread's stamp."""
    decisions: int = 0
    """Decisions the model was asked."""
    fallbacks: int = 0
    """Of those, decisions the policy's onError answered because a model call failed (the endpoint)."""
    fallback_reason: str | None = None
    """The first failed call's error."""

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Fallbacks:
    """How many decisions runs asked a model, and how many of those the policy's onError answered
    because a model call failed (the endpoint, not the model's answer)."""

    decisions: int
    fallbacks: int
    reason: str | None
    """The first failed call's error."""

    @property
    def share(self) -> float:
        return self.fallbacks / self.decisions if self.decisions else 0.0

    @property
    def never_answered(self) -> bool:
        """Every decision asked of the model fell back: the model was never consulted."""
        return self.decisions > 0 and self.fallbacks == self.decisions

    def past(self, most: float) -> bool:
        """More than `most` (the objective's `max_fallback_share`) of the decisions fell back: what the
        runs measure is the endpoint more than the model."""
        return self.decisions > 0 and self.share > most

    def beyond(self, most: float) -> str:
        """`sentence`, with the share fallen back against `most`, the objective's allowance."""
        return (
            f"{self.sentence()} ({self.share:.0%} of its decisions; the objective allows "
            f"max_fallback_share = {most:g})"
        )

    def sentence(self) -> str:
        """`38 of 38 decisions fell back to the policy's onError: <the first error>`."""
        why = f": {self.reason.rstrip('.')}" if self.reason else ""  # a sentence of its own may follow
        return f"{self.fallbacks} of {self.decisions} decisions fell back to the policy's onError{why}"


def fallbacks(rows: Iterable[OutcomeRow]) -> Fallbacks:
    decisions = failed = 0
    reason: str | None = None
    for row in rows:
        decisions += row.decisions
        failed += row.fallbacks
        reason = reason or row.fallback_reason
    return Fallbacks(decisions, failed, reason)


def effects_from_log(entries: Sequence[EntryView]) -> list[dict[str, Any]]:
    """The world's receipts, in the order they were recorded."""
    out: list[dict[str, Any]] = []
    for entry in entries:
        if entry.type in (DONE_EVENT, ERROR_EVENT):
            out.extend(entry.event.get("effects") or [])
    return out


def _normal(effect: dict[str, Any], text_fields: Sequence[str]) -> str:
    # Model-written text is compared by presence; numbers compare as numbers (40 == 40.0), and a whole
    # one is written as the int a person labelled (`months: 6`, not 6.0 beside a recorded 6).
    norm: dict[str, Any] = {}
    for key, value in effect.items():
        if key in text_fields:
            if value:
                norm[key] = True
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
            norm[key] = int(number) if number.is_integer() and abs(number) < 2**53 else number
        else:
            norm[key] = value
    return canonical_json(norm)


@dataclass(frozen=True)
class EffectDiff:
    missing: list[str]
    unexpected: list[str]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unexpected


def compare_effects(
    actual: Sequence[dict[str, Any]],
    expected: Sequence[dict[str, Any]],
    text_fields: Sequence[str] = ("text",),
) -> EffectDiff:
    """Multiset comparison of effects, order ignored."""
    have = Counter(_normal(e, text_fields) for e in actual)
    want = Counter(_normal(e, text_fields) for e in expected)
    return EffectDiff(missing=sorted((want - have).elements()), unexpected=sorted((have - want).elements()))


def _stamped_version(stamp: dict[str, Any]) -> str:
    """The policy version a thread's stamp names (`{"policy": {"version": "3"}}`, as a deployed agent
    stamps its runs) as thread ids label it (`v3`); empty when it names none."""
    policy = stamp.get("policy")
    version = policy.get("version") if isinstance(policy, dict) else None
    if not isinstance(version, (str, int)) or version == "":
        return ""
    text = str(version)
    return text if text.startswith("v") else f"v{text}"


def _world_of(env: Environment, entries: Sequence[EntryView], thread_id: str) -> dict[str, Any]:
    """The world a thread of no scenario (a production run) is audited in: the one the environment's
    `world_from_thread` rebuilds from what its tools answered, so that a rule the audit checks against
    the world (a member's plan, an order's total) reads what the run read; the empty world when the
    environment has no such hook or it cannot rebuild this thread."""
    if env.world_from_thread is None:
        return {}
    try:
        world = env.world_from_thread(recorded_thread(env.machine, entries, thread_id))  # type: ignore[arg-type]
    except Exception:  # people's code, on a thread it may not know how to read: no world is guessed
        return {}
    return world if isinstance(world, dict) else {}


def policy_failure(entries: Sequence[EntryView]) -> str | None:
    """Where the policy itself failed to evaluate in a thread (its first such decision, as journaled:
    `POLICY_ERROR`), in words; None when it never did."""
    for entry in entries:
        source = (entry.metadata or {}).get("source")
        if isinstance(source, str) and source.startswith(POLICY_ERROR):
            decision = (entry.metadata or {}).get("decision")
            name = decision.get("name") if isinstance(decision, dict) else None
            where = f" at decision '{name}'" if name else ""
            return f"the policy failed{where}: {source.removeprefix(POLICY_ERROR)}"
    return None


def exhausted_decision(entries: Sequence[EntryView]) -> str | None:
    """The first decision that refused every answer it was given (`decision-exhausted`), with the last
    refusal and who gave it, in words; None when none did. The machine goes on by its onError (a safe
    answer, a person's step), so a run that failed there read as a wrong or waiting outcome alone."""
    for entry in entries:
        event = entry.event
        error = event.get("error") if event.get("type") == "xstate.error.actor" else None
        if not isinstance(error, dict) or error.get("kind") != "decision-exhausted":
            continue
        meta = entry.metadata or {}
        decision = meta.get("decision")
        name = decision.get("name") if isinstance(decision, dict) else event.get("actorId")
        source = meta.get("source")
        by = ""
        if isinstance(source, str) and source.startswith("policy:"):
            by = f" (answered by the policy's final '{source.removeprefix('policy:')}')"
        # One reason: the reasons are joined, and a table shows the first, by "; ".
        said = str(error.get("message") or "every answer refused").replace("; ", ", ")
        return f"decision '{name}' took none of its answers{by}: {said}"
    return None


def refused_script(entries: Sequence[EntryView]) -> str | None:
    """Where the run ended because its scenario's people script answered a wait with an event the
    machine refused there (the end entry's `peopleRefused`), in words; None when it did not."""
    refused = refused_at_end(entries)
    # One reason: the reasons are joined, and a table shows the first, by "; ".
    return refused.sentence().replace("; ", ", ") if refused is not None else None


def outcome_row(
    env: Environment,
    scenario: Scenario | None,
    thread_id: str,
    entries: Sequence[EntryView],
    verify: bool = False,
) -> OutcomeRow:
    """Replay one thread and score it against the scenario's labels (unscored when `scenario` is None:
    `passed` is False and the reason says there is no label). `verify` checks the journaled hashes
    first, so a thread that was tampered with raises instead of being scored."""
    result = replay(env.machine, entries, verify=verify, thread_id=thread_id)
    effects = effects_from_log(entries)
    world = scenario.world if scenario else _world_of(env, entries, thread_id)
    try:
        violations = env.make_world(world).audit(effects)
    except ImproveError:
        raise
    except Exception as err:  # the environment's code: said with the thread and where, not a traceback
        raise RunError(
            f"thread {thread_id}: the environment's world ({getattr(env.make_world, '__name__', 'World')}) "
            f"crashed auditing its effects: {raised(err)}"
        ) from None
    snapshot = result.snapshot
    state = env.machine.states[snapshot.value]
    if state.config.is_sentinel:
        violations = [
            {"rule": "sentinel", "state": snapshot.value, "description": state.config.description},
            *violations,
        ]
    reasons = []
    if scenario is None:
        reasons.append("no labelled scenario for this thread")
    else:
        if result.status != "done":
            reasons.append(f"run ended {result.status} in '{snapshot.value}'")
        if snapshot.value != scenario.expected.outcome:
            reasons.append(f"ended in '{snapshot.value}', expected '{scenario.expected.outcome}'")
        if scenario.expected.effects is not None:
            diff = compare_effects(effects, scenario.expected.effects, env.effect_text_fields)
            if diff.missing and diff.unexpected:
                # One reason, both sides: a table that shows a run's first reason showed only the missing
                # half of a wrong payload (`reason: prereqs` recorded for `suspended`), read as nothing done.
                reasons.append(
                    f"wrong effects: expected {', '.join(diff.missing)}, recorded {', '.join(diff.unexpected)}"
                )
            elif diff.missing:
                reasons.append(f"missing effects {', '.join(diff.missing)}")
            elif diff.unexpected:
                reasons.append(f"unexpected effects {', '.join(diff.unexpected)}")
    if violations:
        reasons.append(f"{len(violations)} violation(s): {', '.join(v['rule'] for v in violations)}")
    if reasons and (refused := refused_script(entries)) is not None:
        # Why the run ended waiting where it did: said first (after what led the run there, below), or the
        # table showed "run ended waiting" as if no person of the scenario answered.
        reasons.insert(0, refused)
    if reasons and (exhausted := exhausted_decision(entries)) is not None:
        # The rest follows from it (the machine's onError, a person's step): said first, or the table
        # showed "run ended waiting" for a policy whose answer the decision refused.
        reasons.insert(0, exhausted)
    failed = policy_failure(entries) if reasons else None
    if failed is not None:
        # First: where the policy itself failed, the rest follows from it (a fallback's answer), and a run
        # must not read as the model's wrong answer.
        reasons.insert(0, failed)
    parsed = ThreadId.parse(thread_id)
    return OutcomeRow(
        thread_id=thread_id,
        scenario=scenario.id if scenario else (parsed.scenario if parsed else ""),
        category=scenario.category if scenario else "",
        split=parsed.split if parsed else str(result.stamp.get("split", "")),
        policy_version=parsed.policy_version if parsed else _stamped_version(result.stamp),
        run=parsed.run if parsed else int(result.stamp.get("run", 1)),
        status=result.status,
        final_state=snapshot.value,
        output=snapshot.output,
        expected_outcome=scenario.expected.outcome if scenario else "",
        passed=not reasons,
        reason="; ".join(reasons) if reasons else "outcome and effects as labelled",
        effects=effects,
        violations=violations,
        steps=result.steps,
        model_calls=result.model_calls,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        cost_usd=result.cost_usd,
        failed_attempts=result.failed_attempts,
        model=(result.stamp.get("models") or {}).get("decider"),
        verification=result.verification,
        decisions=result.decisions,
        fallbacks=result.fallbacks,
        fallback_reason=result.fallback_reason,
    )
