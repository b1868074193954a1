"""The label of a row: `same`, `intended` or `regression`, and the reason that decided it.

- `same`: outcome, effects, violations and rule-break count are all equal.
- `intended`: something differs, and either the scenario's labels ask for it (the candidate's run is
  what the labels say, with no violation, and the baseline's is not), or the candidate blocks a rule
  break the baseline made: the baseline broke at least one rule, the candidate breaks fewer, it has no
  violation the baseline did not have, and its outcome is the same or safer (the environment's
  `safety_order`). Effects may differ.
- `regression`: any other difference; and any difference where the candidate's policy raised instead
  of deciding (a guard failing on the run's facts), said as that: what followed is the machine's
  onError, not a decision of the candidate's.

People wrote the labels: a change that turns a run the labels call wrong into the run they ask for (the
change a round makes to fix labelled failures) is intended, whatever the baseline's rule breaks were.
Every other difference is judged by the rule-break rules alone, so a change away from a labelled
answer is a regression unless it blocks a rule break with a safer outcome.

Parity knows no environment's states: how safe each outcome is comes from `Environment.safety_order`,
so an environment without one only ever sees an unchanged outcome as "same or safer".
"""

from __future__ import annotations

from typing import Literal

from improve.evals import Scenario, compare_effects
from improve.parity.diff import Difference, item_text
from improve.parity.runners import ParityRun
from improve.runtime import Environment

Label = Literal["same", "intended", "regression"]
LABELS: tuple[Label, ...] = ("same", "intended", "regression")


def safety_rank(env: Environment, state: str) -> int | None:
    """How safe `state` is in `env` (higher is safer), or None when the environment does not rank it."""
    return env.safety_order.get(state)


def same_or_safer(env: Environment, old: str, new: str) -> bool:
    if old == new:
        return True
    old_rank, new_rank = safety_rank(env, old), safety_rank(env, new)
    return old_rank is not None and new_rank is not None and new_rank >= old_rank


def as_labelled(env: Environment, scenario: Scenario, run: ParityRun) -> bool:
    """Whether `run` is what the scenario's labels say: its outcome, its effects when labelled, and no
    violation (as `improve score` passes a run)."""
    expected = scenario.expected
    return (
        run.status == "done"
        and run.final_state == expected.outcome
        and not run.violations
        and (
            expected.effects is None
            or compare_effects(run.effects, expected.effects, env.effect_text_fields).ok
        )
    )


def label_difference(
    env: Environment, old: ParityRun, new: ParityRun, diff: Difference, scenario: Scenario | None = None
) -> tuple[Label, str]:
    """The label rules of this module's docstring, with the reason that decided. Without `scenario`
    only the rule-break rules apply."""
    if diff.empty:
        return "same", "outcome, effects, violations and rule breaks as before"
    if new.policy_error is not None:
        # Not a decision of NEW's: its policy raised (a guard failing on these facts) and the machine went
        # on by the decision's onError. Said as that, whatever the labels or the rule breaks make of it.
        return (
            "regression",
            f"NEW's policy raised instead of deciding, so the run went on by the decision's onError: "
            f"{new.policy_error}",
        )
    if scenario is not None and as_labelled(env, scenario, new) and not as_labelled(env, scenario, old):
        return (
            "intended",
            f"the labels ask for it: {scenario.id} expects '{scenario.expected.outcome}' ({diff.outcome})",
        )
    problems = []
    if old.rule_breaks == 0:
        problems.append("the baseline broke no rule, so the difference does not come from blocking one")
    elif new.rule_breaks >= old.rule_breaks:
        problems.append(f"rule breaks not reduced ({old.rule_breaks} -> {new.rule_breaks})")
    if diff.violations_added:
        problems.append("new violation(s): " + ", ".join(item_text(v) for v in diff.violations_added))
    if not same_or_safer(env, old.final_state, new.final_state):
        order = env.safety_order
        known = " < ".join(sorted(order, key=order.__getitem__)) if order else "no order for this environment"
        problems.append(f"outcome {diff.outcome} is not the same or safer ({known})")
    if problems:
        if scenario is not None and as_labelled(env, scenario, old) and not as_labelled(env, scenario, new):
            # Said first: what a reviewer reads the row for (the rules above only say it is no fix).
            problems.insert(
                0,
                f"it leaves the label: {scenario.id} expects '{scenario.expected.outcome}', which OLD gave "
                f"({diff.outcome})",
            )
        return "regression", "; ".join(problems)
    outcome = "same outcome" if old.final_state == new.final_state else f"safer outcome {diff.outcome}"
    return (
        "intended",
        f"blocks rule breaks the baseline made ({old.rule_breaks} -> {new.rule_breaks}), {outcome}",
    )
