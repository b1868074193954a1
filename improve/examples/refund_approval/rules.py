"""refund-approval's rule evals and exploration probe: its guards, without a model."""

from __future__ import annotations

from improve.machine import ExploreOptions, RuleEval


def probe() -> ExploreOptions:
    """The world for proofs: no tools, so only the payloads of the events that carry one."""
    return ExploreOptions(
        payloads={
            "REFUSE": {"reasoning": ["looks like fraud"]},
            "APPROVE": {"approver": ["dana"]},
            "REJECT": {"reason": ["no"]},
        },
    )


PROBE_INPUTS = [{"amount": amount, "reason": "broken"} for amount in (0, 40, 100, 101, 240)]
"""Amounts either side of the threshold (100), and 0."""


RULE_EVALS = [
    RuleEval(
        "ISSUE is refused above 100 until approved",
        ("classifying",),
        {"amount": 100.01, "reason": "x"},
        state="classifying",
        accepts=[{"type": "ESCALATE"}, {"type": "REFUSE"}],
        refuses=[{"type": "ISSUE"}],
    ),
    RuleEval(
        "ISSUE is accepted at 100",
        ("classifying", "issuing"),
        {"amount": 100, "reason": "x"},
        [{"type": "ISSUE"}],
        "issued",
    ),
    RuleEval(
        "an approved escalation is issued",
        ("approving", "issuing"),
        {"amount": 240, "reason": "x"},
        [{"type": "ESCALATE"}, {"type": "APPROVE", "approver": "dana"}],
        "issued",
    ),
    RuleEval(
        "a rejected escalation is rejected",
        ("approving",),
        {"amount": 240, "reason": "x"},
        [{"type": "ESCALATE"}, {"type": "REJECT", "reason": "no"}],
        "rejected",
    ),
]
