"""Lint a machine config: structural mistakes a compiler accepts (or reports one at a time).

`lint(config, kind)` reads a `MachineConfig` (no host registry, no I/O) and returns every finding as a
`Lint(code, severity, path, message)`, ordered by `path`, a JSON path into the document such as
`$.states.ask_model.invoke.onError`, spelled as `improve.machine.walk` spells every path (keys that are
not identifiers are bracketed: `$.states['ask-model']`). Each message names the state, says what is wrong and how to fix it, so it can be pasted verbatim into a
prompt that asks a model to repair the document.

`kind` is `"environment"` (people's code) or `"policy"` (a machine answering a decision request, which
must always end in a final state whose output is the chosen event). Some codes are errors for policies
and warnings for environments.

The rules live in one module per concern, each reading the config once built into a `Document` (its
states as a graph) and adding findings: `reachability` (targets, reachable states, runs that end),
`structure` (choice states, shadowed transitions, finals), `invokes` (results used, errors handled,
decision requests), `expressions` (CEL that compiles) and `policy` (rules for policies only).

Codes:

    unknown-initial           error    `initial` names no state
    unknown-target            error    a transition targets a state that does not exist
    invalid-expression        error    an expression position holds CEL that does not compile
    unreachable-state         error/w  no path from `initial` reaches the state (sentinels exempt)
    dead-end                  error    a non-final state none of whose transitions leads elsewhere
    no-way-to-finish          error/w  every path from the state loops without reaching a final
    final-with-exit           error    a final state (or sentinel) with `on`/`always`/`choice`/`invoke`
    final-without-output      error/w  a policy final (or a non-sentinel environment final) has no output
    invoke-without-on-done    error    an actor's result is dropped: no `onDone` (decisions exempt)
    invoke-without-on-error   error/w  an actor (or a model) can fail and nothing handles it
    decide-without-events     error    `agent.decide` offers no events; in a policy, a `model.decide`
                                       whose onDone never reaches a final state (a final without an
                                       output is final-without-output)
    decide-event-unhandled    error    an allowed event has no transition in the state's `on`
    invalid-decide-input      error    an `agent.decide` input is not a valid decision request
    choice-without-branches   error    `type: choice` with no `choice` list
    choice-without-default    error    no unguarded branch: the interpreter raises when none matches
    choice-with-other-exits   error    a choice state also has `always` (never read) or `on`/`invoke`
    shadowed-transition       warning  transitions after an unguarded one can never be taken
    self-loop-always          error    an eventless transition back to its own state that loops forever
    always-cycle              error    unguarded eventless transitions that form a cycle
    policy-on-event           error    a policy state with `on`: a policy receives no events
    decide-in-policy          error    a policy invokes `agent.decide` instead of `model.decide`
    policy-output-not-event   error    a policy final's output cannot be an event (`{"type": ...}`)
"""

from __future__ import annotations

from improve.machine.config import MachineConfig
from improve.machine.lint import expressions, invokes, policy, reachability, structure
from improve.machine.lint.document import Document
from improve.machine.lint.finding import Kind, Lint, Severity, has_errors, sort_key

__all__ = ["Kind", "Lint", "Severity", "has_errors", "lint"]

_RULES = (reachability.check, structure.check, invokes.check, policy.check, expressions.check)
"""Each module checks one concern; the order only decides ties, and findings are sorted by path anyway."""


def lint(config: MachineConfig, kind: Kind) -> list[Lint]:
    """Every finding for `config` read as an environment or a policy, ordered by path."""
    doc = Document(config, kind)
    for check in _RULES:
        check(doc)
    return sorted(doc.found, key=sort_key)
