"""The statechart core: config models, CEL expressions, the pure interpreter, snapshots, the walk over a
config's expressions (`expressions`, `literals`).

Nothing in this package does I/O or imports another package of ours (except `improve.errors`).

    >>> from improve.machine import parse_machine, compile_machine, initial, transition
    >>> m = compile_machine(parse_machine(config_dict))
    >>> s = initial(m, {"amount": 40})
    >>> s = transition(m, s, {"type": "ISSUE"})
"""

from improve.machine.config import (
    DECIDE_SRC,
    MODEL_DECIDE,
    SENTINEL_PREFIX,
    SENTINEL_TAG,
    DecideInputConfig,
    InvokeConfig,
    MachineConfig,
    NamedGuard,
    StateConfig,
    TransitionConfig,
    parse_machine,
    transitions_of,
)
from improve.machine.explore import ExploreOptions, ExploreResult, can_reach
from improve.machine.expr import ALLOWED_ROOTS, MAX_EXPRESSION_LENGTH, Expr, Scope, compile_expr
from improve.machine.interpreter import (
    DONE_EVENT,
    ERROR_EVENT,
    GuardFn,
    Machine,
    State,
    Transition,
    can,
    compile_machine,
    initial,
    transition,
)
from improve.machine.rules import RuleEval, RuleResult, run_rule_evals
from improve.machine.snapshot import Invocation, Snapshot, canonical_hash, canonical_json
from improve.machine.walk import Constant, Expression, expressions, literals

__all__ = [
    "ALLOWED_ROOTS",
    "DECIDE_SRC",
    "DONE_EVENT",
    "ERROR_EVENT",
    "MAX_EXPRESSION_LENGTH",
    "MODEL_DECIDE",
    "SENTINEL_PREFIX",
    "SENTINEL_TAG",
    "Constant",
    "DecideInputConfig",
    "ExploreOptions",
    "ExploreResult",
    "Expr",
    "Expression",
    "GuardFn",
    "Invocation",
    "InvokeConfig",
    "Machine",
    "MachineConfig",
    "NamedGuard",
    "RuleEval",
    "RuleResult",
    "Scope",
    "Snapshot",
    "State",
    "StateConfig",
    "Transition",
    "TransitionConfig",
    "can",
    "can_reach",
    "canonical_hash",
    "canonical_json",
    "compile_expr",
    "compile_machine",
    "expressions",
    "initial",
    "literals",
    "parse_machine",
    "run_rule_evals",
    "transition",
    "transitions_of",
]
