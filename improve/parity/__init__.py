"""Parity: does NEW behave like OLD on these scenarios, and where it differs, is that on purpose?

Each side is a runner (`runners`): a policy version or file, or a `module:function` such as an old
hand-written agent loop, run deterministically with a fresh stand-in model seeded by the scenario.
Compared per scenario and model (`diff`): the outcome (final state), the effects the world recorded,
the violations and the number of rule breaks (a violation, or an answer the guards had to refuse).
Each row is labelled (`labels`) `same`, `intended` (the candidate blocks a rule break the baseline
made, with the same or a safer outcome by the environment's `safety_order`) or `regression`. A
reviewed-differences file (`reviewed`) accepts exactly the differences people looked at. Before
comparing, OLD and NEW each run against themselves (`comparison`): a nondeterministic side compares
nothing. Each side runs in a worker process with a time limit per run (`worker`). The
result (`report`) renders as JSON, a table, a GitHub step summary and `::error` annotations.

Import from here, not from the submodules: this is parity's public face.
"""

from __future__ import annotations

from improve.errors import NondeterministicHarness
from improve.parity.comparison import DEFAULT_MODELS, Progress, compare
from improve.parity.diff import VIOLATION_TEXT_FIELDS, Difference, diff_runs
from improve.parity.labels import LABELS, Label, label_difference, safety_rank, same_or_safer
from improve.parity.report import MAX_ANNOTATIONS, ParityReport, ParityRow
from improve.parity.reviewed import (
    REVIEWED_FILE,
    Reviewed,
    ReviewedChange,
    ReviewedDifference,
    ReviewedFile,
    load_reviewed,
)
from improve.parity.runners import (
    ParityRun,
    PolicyRunner,
    Runner,
    Side,
    load_runner,
    model_seed,
    names_a_runner,
    new_model,
    resolve_side,
)
from improve.parity.worker import DEFAULT_RUN_TIMEOUT

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_RUN_TIMEOUT",
    "LABELS",
    "MAX_ANNOTATIONS",
    "REVIEWED_FILE",
    "VIOLATION_TEXT_FIELDS",
    "Difference",
    "Label",
    "NondeterministicHarness",
    "ParityReport",
    "ParityRow",
    "ParityRun",
    "PolicyRunner",
    "Progress",
    "Reviewed",
    "ReviewedChange",
    "ReviewedDifference",
    "ReviewedFile",
    "Runner",
    "Side",
    "compare",
    "diff_runs",
    "label_difference",
    "load_reviewed",
    "load_runner",
    "model_seed",
    "names_a_runner",
    "new_model",
    "resolve_side",
    "safety_rank",
    "same_or_safer",
]
