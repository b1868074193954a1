"""The gates a candidate policy must pass before it may run, in order, stopping at the first failure.

1. `environment-unchanged`: the environment's files hash as recorded when the round started;
2. `validate`: the document is a machine config (pydantic; each error with its JSON path);
3. `vocabulary`: every name it uses is in the environment's vocabulary;
4. `lower`: it compiles (CEL parses, targets exist) and every choice guard type-checks against a request
   whose facts have the declared types;
5. `lint`: no lint error;
6. `explore`: for each probe request (recorded decisions of training scenarios), every final output is
   one of the options offered, on every path, including when the model call fails;
7. `overfit`: no literal that singles out a scenario (its ids, its ticket text, an amount or a word
   found in it alone), unless training scenarios on both sides of the condition support it;
8. `interactions`: a new branch does not override another branch in a combination of their
   conditions that no training decision covers, unless the safety order ranks its answer safer;

in a round whose baseline has candidates discarded against it, `novelty` (a new branch not discarded
against that policy before) right after `validate`; then the extension gates, by name: those installed
packages register (entry points `improve.gates`) and, through `gates_for(workspace)`, the workspace's
own (`[gates.NAME]` in improve.toml); last, in a round whose objective sets `out_of_sample_cases` on an
environment with a generator of cases, `out-of-sample` (no new branch answers a generated case
otherwise than labelled, where careful's answer was right).

Each gate is a `Gate` (a `name`, `run(ctx) -> GateResult`), one module each; the `GateContext` carries
what they check against and what they made of the candidate (the parsed and the compiled policy). Each
returns `{name, ok, detail}`; a failing detail says what is wrong, where, and how to fix it, precisely
enough to send back to a proposer verbatim. A crash inside a gate is itself a failing result.
"""

from improve.loop.gates.environment import EnvironmentGate
from improve.loop.gates.explore import ExploreGate
from improve.loop.gates.gate import Gate, GateContext, GateResult, Unparsed
from improve.loop.gates.interactions import InteractionsGate
from improve.loop.gates.lint import LintGate
from improve.loop.gates.lower import LowerGate, type_problems, typed_request
from improve.loop.gates.novelty import NoveltyGate
from improve.loop.gates.out_of_sample import OutOfSampleGate
from improve.loop.gates.overfit import OverfitGate
from improve.loop.gates.registry import BUILTIN_GATES, GATE_NAMES, GATES, STATIC_GATES, gates_for
from improve.loop.gates.run import Gated, gate, passed, run_gates
from improve.loop.gates.scenario_literals import ScenarioLiterals, scenario_literals
from improve.loop.gates.validate import ValidateGate
from improve.loop.gates.vocabulary import VocabularyGate, vocabulary_problems

__all__ = [
    "BUILTIN_GATES",
    "GATES",
    "GATE_NAMES",
    "STATIC_GATES",
    "EnvironmentGate",
    "ExploreGate",
    "Gate",
    "GateContext",
    "GateResult",
    "Gated",
    "InteractionsGate",
    "LintGate",
    "LowerGate",
    "NoveltyGate",
    "OutOfSampleGate",
    "OverfitGate",
    "ScenarioLiterals",
    "Unparsed",
    "ValidateGate",
    "VocabularyGate",
    "gate",
    "gates_for",
    "passed",
    "run_gates",
    "scenario_literals",
    "type_problems",
    "typed_request",
    "vocabulary_problems",
]
