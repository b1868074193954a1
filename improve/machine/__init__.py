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
    MAX_DEPTH,
    MODEL_DECIDE,
    RESUMABLE_STATUSES,
    SENTINEL_PREFIX,
    SENTINEL_TAG,
    WAITING_STATUS,
    DecideInputConfig,
    InvokeConfig,
    MachineConfig,
    NamedGuard,
    StateConfig,
    TransitionConfig,
    check_depth,
    format_validation_error,
    loads_document,
    parse_machine,
    transitions_of,
)
from improve.machine.describe import describe_mermaid, describe_text, diff_states, mermaid_label, to_xstate
from improve.machine.diagram import describe_svg
from improve.machine.explore import (
    ExploreOptions,
    ExploreResult,
    ResumeBound,
    branches,
    can_reach,
    check_target,
    explore_paths,
)
from improve.machine.expr import (
    ALLOWED_ROOTS,
    MAX_EXPRESSION_LENGTH,
    Expr,
    Scope,
    compile_expr,
    referenced_paths,
    tokenize,
)
from improve.machine.fold import Fold, FoldRun, fold_of
from improve.machine.formula import Formula, parse_formula
from improve.machine.interpreter import (
    DONE_EVENT,
    ERROR_EVENT,
    FREE_TEXT,
    GuardFn,
    Machine,
    State,
    Transition,
    can,
    compile_machine,
    initial,
    refusing_guard,
    transition,
)
from improve.machine.lint import has_errors, lint
from improve.machine.rules import RuleEval, RuleResult, run_rule_evals, uncovered
from improve.machine.snapshot import (
    Invocation,
    Snapshot,
    canonical_bytes,
    canonical_hash,
    canonical_json,
    decoded_canonical_bytes,
    plain_hash,
    plain_json,
    sorted_text,
)
from improve.machine.waits import payload_problem, wait_status, waiting_for
from improve.machine.walk import Constant, Expression, edges, expressions, literals, state_path

__all__ = [
    "ALLOWED_ROOTS",
    "DECIDE_SRC",
    "DONE_EVENT",
    "ERROR_EVENT",
    "FREE_TEXT",
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "MODEL_DECIDE",
    "RESUMABLE_STATUSES",
    "SENTINEL_PREFIX",
    "SENTINEL_TAG",
    "WAITING_STATUS",
    "Constant",
    "DecideInputConfig",
    "ExploreOptions",
    "ExploreResult",
    "Expr",
    "Expression",
    "Fold",
    "FoldRun",
    "Formula",
    "GuardFn",
    "Invocation",
    "InvokeConfig",
    "Machine",
    "MachineConfig",
    "NamedGuard",
    "ResumeBound",
    "RuleEval",
    "RuleResult",
    "Scope",
    "Snapshot",
    "State",
    "StateConfig",
    "Transition",
    "TransitionConfig",
    "branches",
    "can",
    "can_reach",
    "canonical_bytes",
    "canonical_hash",
    "canonical_json",
    "check_depth",
    "check_target",
    "compile_expr",
    "compile_machine",
    "decoded_canonical_bytes",
    "describe_mermaid",
    "describe_svg",
    "describe_text",
    "diff_states",
    "edges",
    "explore_paths",
    "expressions",
    "fold_of",
    "format_validation_error",
    "has_errors",
    "initial",
    "lint",
    "literals",
    "loads_document",
    "mermaid_label",
    "parse_formula",
    "parse_machine",
    "payload_problem",
    "plain_hash",
    "plain_json",
    "referenced_paths",
    "refusing_guard",
    "run_rule_evals",
    "sorted_text",
    "state_path",
    "to_xstate",
    "tokenize",
    "transition",
    "transitions_of",
    "uncovered",
    "wait_status",
    "waiting_for",
]
