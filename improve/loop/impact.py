"""The production impact preview: how much of a deployed agent's recent traffic a candidate would change.

The replay-first machinery (`improve.runtime.replay_first`) run over production threads instead of a
scenario's runs: the most recent production threads of the environment in the warehouse (verified,
unlabelled, never the sealed test split) are walked decision by decision; at each, the candidate's
policy decides on the request the thread recorded, taking the thread's recorded answer wherever it asks
the model what the thread asked. Where it answers otherwise, that decision is a change, and the rest of
the thread is not read: from there the candidate's run would go elsewhere. Where it would ask the model
something the thread never asked, its answer is not known without asking, and the thread is counted
apart. Nothing is called: no model, tool or person, and nothing is written.

The preview describes; it decides nothing. It goes into the round record and from there into the pull
request's body and the HTML page, so a reviewer sees how much real traffic a change touches before
merging it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.errors import ImproveError
from improve.evals import Ledger
from improve.log import USAGE_EVENT, LogEntry
from improve.loop.probes import requests_in
from improve.loop.round_record import Impact, ImpactChange
from improve.machine import ERROR_EVENT, Machine
from improve.runtime import (
    DecisionRequest,
    Environment,
    ModelReply,
    RecordedRun,
    ReplayFirstDecider,
    answer_text,
)

PREVIEW_THREADS = 500
"""Production threads a preview reads at most, the most recent first."""
EXAMPLES = 3
"""Example threads kept per change."""


class _Unrecorded(Exception):
    """The candidate asks the model what the thread never asked."""


class _NoModel:
    """The model of a preview, named as the thread's model was: every call it gets is one the thread's
    recording could not answer."""

    def __init__(self, name: str) -> None:
        self.name = name

    def answer(self, request: DecisionRequest) -> ModelReply:
        raise _Unrecorded(request.name)


@dataclass
class _Tally:
    decisions: int = 0
    unknown: int = 0
    unreadable: int = 0
    changes: dict[tuple[str, str, str], list[tuple[str, str]]] = field(default_factory=dict)
    """(decision, event type answered, the candidate's) -> each thread and its answers in full."""

    def change(self, decision: str, before: Any, after: Any, thread_id: str) -> None:
        key = (decision, _kind(before), _kind(after))
        shown = f"{answer_text(before) if before is not None else '(every answer refused)'} -> {answer_text(after)}"
        self.changes.setdefault(key, []).append((thread_id, shown))


def preview_impact(ledger: Ledger, candidate: Machine, model: str, limit: int = PREVIEW_THREADS) -> Impact:
    """The candidate (compiled) over the ledger's environment's `limit` most recent production threads.
    A thread's calls are matched under the model its usage entries name (`model` when it made none)."""
    production = ledger.production(limit)
    tally = _Tally()
    for thread_id, entries in production.threads:
        try:
            _walk(ledger.env, candidate, model, thread_id, entries, tally)
        except (ImproveError, KeyError, TypeError, ValueError):
            tally.unreadable += 1  # the machine changed since the thread was recorded
    ranked = sorted(tally.changes.items(), key=lambda item: (-len(item[1]), item[0]))
    return Impact(
        available=production.available,
        threads=len(production.threads),
        limit=limit,
        decisions=tally.decisions,
        changed=sum(len(ids) for ids in tally.changes.values()),
        unknown=tally.unknown,
        unreadable=tally.unreadable,
        changes=[
            ImpactChange(
                decision=d,
                before=b,
                after=a,
                threads=len(found),
                examples=[t for t, _ in found[:EXAMPLES]],
                example=found[0][1],
            )
            for (d, b, a), found in ranked
        ],
    )


def _walk(
    env: Environment,
    candidate: Machine,
    model: str,
    thread_id: str,
    entries: Sequence[LogEntry],
    tally: _Tally,
) -> None:
    """One thread, decision by decision, until the candidate answers one otherwise (or would ask anew)."""
    landed = [e for e in entries if e.metadata and "decision" in e.metadata]
    used = next((str(e.event.get("model")) for e in entries if e.type == USAGE_EVENT), model)
    decider = ReplayFirstDecider(
        candidate, {"decider": _NoModel(used)}, env.judgments, RecordedRun.of(thread_id, entries)
    )
    for request, entry in zip(requests_in(env, entries), landed, strict=False):
        if not request.options:
            continue  # nothing was asked: the environment offered no option
        tally.decisions += 1
        refused = list(entry.attempts or [])
        turns = len(refused) + (entry.type != ERROR_EVENT)
        try:
            for turn in range(turns):
                decision = decider.decide(request.with_attempts(refused[:turn]))
                if decider.parted is not None:
                    answered = None if entry.type == ERROR_EVENT else entry.event
                    tally.change(request.name, answered, decision.event, thread_id)
                    return
        except _Unrecorded:
            tally.unknown += 1
            return


def _kind(answer: Any) -> str:
    """An answer's event type; `(every answer refused)` for a decision that landed none."""
    if answer is None:
        return "(every answer refused)"
    return str(answer.get("type")) if isinstance(answer, dict) else "(no answer)"
