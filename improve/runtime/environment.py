"""An environment: the machine people wrote, the tools (actors) it invokes, and the world they act on.

The world is a scenario's fixture state plus the effects the tools record (refunds paid, questions
asked, ...). Ground truth is read from those effects, never from what the agent says it did. Tools
put their receipt in their output, so the journal carries the effects and a replay sees them too.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from improve.errors import ConfigError, ImproveError, WorkspaceError, did_you_mean
from improve.machine import (
    DECIDE_SRC,
    MODEL_DECIDE,
    ExploreOptions,
    GuardFn,
    Machine,
    MachineConfig,
    RuleEval,
    Scope,
    compile_expr,
    compile_machine,
    edges,
    expressions,
    loads_document,
    parse_json_path,
    parse_machine,
    referenced_paths,
    state_path,
    tokenize,
)
from improve.registry import Registry, instance_of
from improve.runtime.judgment import Judgment
from improve.runtime.models import ModelFactory
from improve.runtime.policy import load_json_text, located, read_document_text, syntax_problems
from improve.runtime.recorded import RecordedThread


class World:
    """A scenario's fixture, and every effect the tools record while a run acts on it."""

    def __init__(self, fixture: Mapping[str, Any] | None = None) -> None:
        self.fixture: dict[str, Any] = copy.deepcopy(dict(fixture or {}))
        self.effects: list[dict[str, Any]] = []

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        effect = {"kind": kind, **fields}
        self.effects.append(effect)
        return dict(effect)

    def audit(self, effects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Rule violations found after the fact in `effects` (default: this world's). None here."""
        return []


Actor = Callable[[World, dict[str, Any]], Any]
"""A tool: `(world, input) -> output`. Raise `ActorFailure` for a failure the machine handles."""

WorldFactory = Callable[[Mapping[str, Any]], World]

WorldFromThread = Callable[[RecordedThread], dict[str, Any]]
"""From a thread's input and its tools' recorded answers, the `world` fixture under which the tools
answer the same way. Raise `WorldFromThreadError` (naming the call's entry) for an answer no fixture
can give."""


def load_machine(path: Path) -> MachineConfig:
    """An environment's machine.json, validated; errors name the file, the line and the JSON path. An
    expression that reads a context key the machine never sets (`context.diference`) is refused here, not
    when a run first takes that transition (then it failed each run, as an infrastructure error).

    Every problem of the file is said at once, in the order of its lines: a CEL typo, a context key
    misspelt and a target that is no state, each with its `file:line: $.path`, so one edit fixes them all.
    A document that is not a machine at all (a field missing, a wrong type) is said alone: its
    expressions cannot be walked until it is one."""
    text, data = load_json_text(path)
    config = parse_machine(data, source=str(path), text=text)
    # Each expression parsed here, so a typo (`a = true`) is named with the file and its JSON path, not
    # only with the state when the machine is first compiled for a run.
    problems = syntax_problems(config)  # (JSON path, what is wrong there)
    problems += [
        (
            where,
            f"`{source}` reads context.{key}, which the machine never sets; its context has {sorted(known)} "
            "(the `context` block and every `assign`)",
        )
        for where, source, key, known in unknown_context_keys(config)
    ]
    problems += _unknown_targets(config, data)
    if not problems:
        return config
    raise located(path, text, problems)


def _unknown_targets(config: MachineConfig, data: Any) -> list[tuple[str, str]]:
    """(JSON path, problem) for the `initial` state and each transition target that is not a state (in
    `data`, the document `config` was read from): said by `compile_machine` too, but one at a time and
    without the file."""
    names = sorted(config.states)
    found = []
    if config.initial not in config.states:
        found.append(("$.initial", f"initial state '{config.initial}' does not exist; states are {names}"))
    for name, state in config.states.items():
        for edge in edges(name, state):
            if edge.target is not None and edge.target not in config.states:
                # `"GO": "next"` is a target alone; `{"target": "next"}` names the field.
                written: Any = data
                for part in parse_json_path(edge.path):
                    written = written[part]
                where = f"{edge.path}.target" if isinstance(written, dict) else edge.path
                found.append((where, f"target '{edge.target}' is not a state; states are {names}"))
    return found


_ASSIGNED = re.compile(r"\.assign(?:\.([A-Za-z_][A-Za-z0-9_]*)|\['([^']+)'\])")


def unknown_context_keys(config: MachineConfig) -> list[tuple[str, str, str, set[str]]]:
    """(path, expression, key, the keys there are) for each `context.KEY` read that neither the context
    block nor any `assign` sets."""
    every = list(expressions(config))
    known = set(config.context)
    for expr in every:
        if expr.position == "assign" and (m := _ASSIGNED.search(expr.path)):
            known.add(m.group(1) or m.group(2))
    found = []
    for expr in every:
        for ref in referenced_paths(tokenize(expr.source)):
            if ref[0] == "context" and len(ref) > 1 and ref[1] not in known:
                found.append((expr.path, expr.source, ref[1], known))
    return found


FactType = str | tuple[Any, ...]
"""A fact's declared type: a type name, or the tuple of values of an enumerated fact."""

CaseGenerator = Callable[[random.Random], Mapping[str, Any]]
"""Draws one plausible case from the generator given: its `input`, `world` and `people` as a scenario
has them and, when the environment labels the case by its own rules, `expected` (`outcome` and
`effects`, as a scenario's) and a `category`."""


@dataclass
class Environment:
    """Everything needed to run, replay and score one kind of agent.

    `name` is the environment's slug (`support-desk`), the name it is registered under; it appears in
    thread metadata, branch names, report folders and CHANGELOG headings.
    """

    name: str
    config: MachineConfig
    actors: dict[str, Actor]
    make_world: WorldFactory
    models: dict[str, ModelFactory]
    guards: dict[str, GuardFn] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    """The files that define it, hashed by the gates: a round must not change the environment."""
    effect_text_fields: tuple[str, ...] = ("text",)
    """Effect fields written by a model: compared by presence, not by value."""
    safety_order: dict[str, int] = field(default_factory=dict)
    """How safe each final (or waiting) state is, least safe lowest; states may share a rank. Parity
    calls a changed outcome "safer" only when both states are ranked and the new one ranks at least as
    high; a state not listed is only ever "same" as itself."""
    fact_types: Mapping[str, Mapping[str, FactType]] = field(default_factory=dict)
    """Per decision name, the type of each fact path: `"number"`, `"int"`, `"bool"`, `"text"` (free
    text, tested for words), `"string"` (tested for words only when its values read as prose: not a
    name, an id or an address), `"list"`, `"any"`, or a tuple of the values an enumerated fact takes
    (`("free", "pro")`, or a list of them); a number may carry its unit (`"int:days"`: two facts of one unit may be
    compared, `split_unit`). The vocabulary a policy's guards are type-checked against, and what the
    rule miner may test."""
    policy_guards: dict[str, GuardFn] = field(default_factory=dict)
    """Named guards the environment exports to policies (called with the request as context)."""
    judgments: dict[str, Judgment] = field(default_factory=dict)
    """Judgment actors a policy may invoke: deterministic helpers such as a classifier."""
    probe: ExploreOptions | None = None
    """What the world may do, for exploration proofs: actor outputs, payload values at the guards'
    boundaries, actors that may fail."""
    probe_inputs: list[dict[str, Any]] = field(default_factory=list)
    """One input per distinct input shape, for exploration proofs."""
    rule_evals: list[RuleEval] = field(default_factory=list)
    """The rules tested directly on the interpreter, each naming the states it covers."""
    world_from_thread: WorldFromThread | None = None
    """How to rebuild a scenario's `world` fixture from a recorded thread (`improve scenarios add
    --from-thread`): given the thread's input, tool calls (tool, input, output or error, effects) and
    people's answers, the fixture `make_world` needs so that every tool answers as it did. Without
    it, a thread cannot become a scenario: a world is never guessed."""
    home: Path | None = None
    """The folder the environment ships in, when it carries its own `scenarios.yaml` and `policies/`
    (the bundled desks do): `improve init --from NAME` writes them out into a workspace."""
    resume_budget: int | None = None
    """Model calls a run may make after each resume (`improve resume`), a fresh budget each time: a code
    agent's turns after a checkpoint. None: a resumed run goes on with what its own budget has left,
    counted across resumes. With a fresh budget per resume, exploration must prove the resumes along any
    path bounded (`improve explore`, the explore gate): a machine that can wait again after a resume
    counts its resumes in its context and guards on the count."""
    cases: CaseGenerator | None = None
    """A generator of plausible cases, unseen by any round: what checks a policy out of sample
    (`improve.evals.out_of_sample`). A case without `expected` is labelled by the `careful` stand-in's
    run of the first policy; a generator that knows the rules labels its own."""
    ref: EnvironmentRef | None = field(default=None, repr=False, compare=False)
    """How the registry loaded it, so a worker process can load it again (set by `load_environment`)."""

    def __post_init__(self) -> None:
        # An enumeration written as a list (as JSON has it, or by habit) is the tuple the readers expect.
        if isinstance(self.fact_types, Mapping) and all(
            isinstance(t, Mapping) for t in self.fact_types.values()
        ):
            self.fact_types = {
                decision: {
                    path: tuple(kind) if isinstance(kind, list) else kind for path, kind in types.items()
                }
                for decision, types in self.fact_types.items()
            }

    @property
    def machine(self) -> Machine:
        """The compiled machine, compiled once. Not a functools.cached_property: on Python 3.11 its lock
        is one for every instance, and every concurrent run asks for the machine."""
        found: Machine | None = self.__dict__.get("_machine")
        if found is None:
            found = self.__dict__["_machine"] = compile_machine(
                self.config, guards=self.guards, actors=set(self.actors)
            )
        return found

    @property
    def files_digest(self) -> str:
        """One sha256 over `file_hashes()`, taken the first time it is asked and kept: the code this
        process loaded. A recorded run is reused only when its stamp carries the same (`SuiteSpec.stamp`)."""
        found: str | None = self.__dict__.get("_files_digest")
        if found is None:
            text = json.dumps(self.file_hashes(), sort_keys=True, separators=(",", ":"))
            found = self.__dict__["_files_digest"] = hashlib.sha256(text.encode()).hexdigest()
        return found

    def file_hashes(self) -> dict[str, str]:
        """The sha256 of each file in `files`, keyed by its path relative to `home` (POSIX), or by its
        name when it lies outside `home` or there is none. Keys must be unique: a file that shared
        another's key would drop out of the comparison, and the gate would miss its changes."""
        hashes: dict[str, str] = {}
        owners: dict[str, Path] = {}
        for path in self.files:
            key = _file_key(path, self.home)
            if key in owners and owners[key].resolve() != path.resolve():
                raise WorkspaceError(
                    f"environment {self.name!r} lists {owners[key]} and {path}, which both hash under the key "
                    f"{key!r}; rename one, or set home= to a folder that holds both (keys are paths relative "
                    "to it)"
                )
            owners[key] = path
            hashes[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        return hashes


def _file_key(path: Path, home: Path | None) -> str:
    if home is not None:
        try:
            return path.resolve().relative_to(home.resolve()).as_posix()
        except ValueError:
            pass  # outside home: its name is the best key a lock file can carry across machines
    return path.name


@dataclass(frozen=True)
class EnvironmentRef:
    """An environment by name, with the workspace specs and root that make it loadable: picklable."""

    name: str
    local: tuple[tuple[str, str], ...] = ()
    root: str | None = None

    def load(self) -> Environment:
        return load_environment(self.name, dict(self.local), Path(self.root) if self.root else None)

    def shared(self) -> Environment:
        """Loaded once per process: a worker of an executor reuses it for every task it runs (runs share
        an environment in one process anyway; each makes its own world)."""
        return _shared(self)


@functools.lru_cache(maxsize=16)
def _shared(ref: EnvironmentRef) -> Environment:
    return ref.load()


ENVIRONMENTS: Registry[Environment] = Registry("environments", instance_of(Environment, "an Environment"))
"""Environments by slug: the bundled desks and installed packages through the `improve.environments`
entry point group, a workspace's through `[environments.NAME] module = ...` in improve.toml."""


def load_environment(
    name: str, local: Mapping[str, str] | None = None, root: Path | None = None
) -> Environment:
    """The environment registered as `name` (`local`: the workspace's specs, importable from `root`)."""
    env = ENVIRONMENTS.load(name, local, root)
    if env.name != name:
        raise WorkspaceError(
            f"environment {name!r} is built with name {env.name!r}; the registered name is its identity "
            f"in threads, branches and reports, so set Environment(name={name!r}, ...)"
        )
    unknown = unknown_actors(env)
    if unknown:
        raise _machine_problems(env, unknown)
    problems = fact_type_problems(env)
    if problems:
        raise WorkspaceError(
            f"environment {name!r}: " + "; ".join(problems) + ". A declared fact type the machine does not "
            "match is otherwise ignored: the fact stays untyped, and no policy or rule could use it"
        )
    env.ref = EnvironmentRef(name, tuple(sorted((local or {}).items())), str(root) if root else None)
    return env


def unknown_actors(env: Environment) -> list[tuple[str, str]]:
    """(JSON path, problem) for each invoke of the environment's machine whose `src` is none of its
    actors (nor `agent.decide`, the decision request). A misspelt tool was found only when a run first
    reached it, and each command then said something else (a scenario's input, an infrastructure error,
    nothing at all); the machine and its tools are both at hand when the environment loads."""
    offered = [*sorted(env.actors), DECIDE_SRC]
    found = []
    for name, state in env.config.states.items():
        if state.invoke is None or state.invoke.src in env.actors or state.invoke.src == DECIDE_SRC:
            continue
        src = state.invoke.src
        if src == MODEL_DECIDE:
            why = (
                f"'{MODEL_DECIDE}' asks a model inside a policy; an environment's machine asks for a decision "
                f"with '{DECIDE_SRC}', and the policy decides how"
            )
        elif src in env.judgments:
            why = (
                f"'{src}' is one of the environment's judgments, which a policy invokes; the environment's "
                f"machine invokes its actors, {sorted(env.actors)}, and '{DECIDE_SRC}'"
            )
        else:
            why = (
                f"actor '{src}' is none of environment {env.name}'s actors{did_you_mean(src, offered)}; "
                f"its actors are {sorted(env.actors)} and '{DECIDE_SRC}' (a decision request): correct the "
                "name, or add the tool to the Environment's `actors`"
            )
        found.append((f"{state_path(name)}.invoke.src", why))
    return found


def _machine_problems(env: Environment, problems: list[tuple[str, str]]) -> ConfigError:
    """The problems of the environment's machine at their `file:line`, when the machine is one of its
    `files` (an environment holds the config, not where it was read from: the file whose machine it is
    is found again); else at their JSON path, with the environment's name."""
    for path in env.files:
        if path.suffix != ".json":
            continue
        try:
            text = read_document_text(path)
            if parse_machine(loads_document(text, str(path)), str(path)) == env.config:
                return located(path, text, problems)
        except (ImproveError, ValueError):  # not a machine, or not this one: look at the next file
            continue
    return ConfigError(
        "\n".join(f"environment {env.name}'s machine: {where}: {what}" for where, what in problems)
    )


FACT_KINDS = ("number", "int", "bool", "text", "string", "list", "any")
"""The type names a fact may be declared with (`Environment.fact_types`); an enumerated fact is declared
by the tuple of its values instead, and a number may carry its unit (`"int:days"`, `split_unit`)."""

UNIT = re.compile(r"[a-z][a-z0-9_-]{0,39}")
"""A unit's name: a lowercase word (`days`, `usd`, `seats`)."""


def split_unit(kind: FactType) -> tuple[FactType, str | None]:
    """A declared fact type and its unit, apart: `"int:days"` -> `("int", "days")`, `"int"` -> `("int",
    None)`. Two numbers of one unit measure the same thing, so a rule may compare them with each other
    (`facts.rx.daysSinceFill >= facts.rx.daysSupply`); numbers of different units or of none are compared
    only with thresholds, since whether one exceeds the other is a coincidence of scale."""
    if isinstance(kind, str) and ":" in kind:
        base, unit = kind.split(":", 1)
        return base, unit
    return kind, None


def fact_type_problems(env: Environment) -> list[str]:
    """What is wrong with the environment's `fact_types`: a decision the machine does not have, a path
    that is no fact of its decision, a type that is not one of `FACT_KINDS` (nor a tuple of values).
    Each would be ignored silently otherwise: the fact left untyped (`any`), so the rule miner and
    policies could never use it, with nothing said about why."""
    declared_facts: dict[str, set[str]] = {}
    for state in env.config.states.values():
        if state.invoke is None or state.invoke.src != DECIDE_SRC:
            continue
        raw = state.invoke.input or {}
        facts = declared_facts.setdefault(_decision_name(str(raw.get("name", "''"))), set())
        facts.update(_fact_paths(raw.get("facts") or {}))
    problems: list[str] = []
    for decision, types in env.fact_types.items():
        if decision not in declared_facts:
            problems.append(
                f"{written_at(env, decision)}fact_types names decision {decision!r}, which the machine does not have; its decisions "
                f"are {sorted(declared_facts)}"
            )
            continue
        leaves = declared_facts[decision]
        for path, kind in types.items():
            # A fact given whole (`"request": "context.request"`) holds its fields: a path under it is
            # one of them (`request.category`), its type declared here and checked on the scenarios' runs.
            if path not in leaves and not any(path.startswith(f"{leaf}.") for leaf in _whole(leaves)):
                problems.append(
                    f"{written_at(env, path)}fact_types[{decision!r}] names {path!r}, which is no fact of decision {decision!r} "
                    f"(the machine's `facts` of that decision, as paths without `facts.`: "
                    f"{', '.join(sorted(declared_facts[decision])) or 'none'})"
                )
                continue
            base, unit = split_unit(kind)
            if not isinstance(base, tuple) and base not in FACT_KINDS:
                problems.append(
                    f"{written_at(env, path, kind)}fact_types[{decision!r}][{path!r}] is {kind!r}, not a fact type: use one of "
                    f"{', '.join(FACT_KINDS)} (a number with its unit: 'int:days', 'number:usd'), or the "
                    "values of an enumerated fact, a tuple or a list (('basic', 'pro'))"
                )
            elif unit is not None and base not in ("number", "int"):
                problems.append(
                    f"{written_at(env, path, kind)}fact_types[{decision!r}][{path!r}] is {kind!r}: only a number has a unit, written "
                    "after a colon as a lowercase word ('int:days', 'number:usd')"
                )
            elif unit is not None and not UNIT.fullmatch(unit):
                problems.append(
                    f"{written_at(env, path, kind)}fact_types[{decision!r}][{path!r}] is {kind!r}: a unit is a lowercase word after the "
                    "colon, letters, digits, '-' or '_' ('int:days', 'number:usd')"
                )
    return problems


def written_at(env: Environment, key: str, value: object = None) -> str:
    """`file:line: ` of the line of the environment's Python files that writes `key` as a string literal
    (the `fact_types` entry a problem is about), or nothing where none does (the mapping built by code):
    the declaration lives in the environment's own module, not in any file improve reads. A fact's name
    is often written elsewhere too (a case generator's dict, a probe's input), so the line that also
    writes `value` (the type declared) comes first, then a line of a file that names `fact_types`, then
    any other."""
    quoted = (f"'{key}'", f'"{key}"')
    typed = (f"'{value}'", f'"{value}"') if isinstance(value, str) else ()
    found: list[tuple[int, int, int, str]] = []
    for order, path in enumerate(env.files):
        if path.suffix != ".py":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        declares = "fact_types" in text.lower()
        for number, line in enumerate(text.splitlines(), 1):
            if any(q in line for q in quoted):
                rank = 0 if any(t in line for t in typed) else 1 if declares else 2
                found.append((rank, order, number, f"{path}:{number}: "))
    return min(found)[3] if found else ""


def _decision_name(source: str) -> str:
    """A decision's name is a CEL expression, almost always a quoted literal (as the vocabulary reads it)."""
    try:
        return str(compile_expr(source, "decision name").evaluate(Scope()))
    except Exception:
        return source


def _whole(paths: set[str]) -> set[str]:
    """The facts of a decision given whole, by one expression: the paths no other path is under."""
    return {p for p in paths if not any(q.startswith(f"{p}.") for q in paths)}


def _fact_paths(tree: Any, prefix: str = "") -> set[str]:
    """Every path of a decision's `facts` tree, maps and leaves, without `facts.`."""
    found: set[str] = {prefix} if prefix else set()
    if isinstance(tree, dict):
        for key, sub in tree.items():
            found |= _fact_paths(sub, f"{prefix}.{key}" if prefix else str(key))
    return found
