"""The gates a candidate policy must pass before it may run, in order, stopping at the first failure.

1. `environment-unchanged`: the environment's files hash as recorded when the round started;
2. `validate`: the document is a machine config (pydantic; each error with its JSON path);
3. `vocabulary`: every name it uses is in the environment's vocabulary;
4. `lower`: it compiles (CEL parses, targets exist) and every choice guard type-checks against a request
   whose facts have the declared types;
5. `lint`: no lint error;
6. `explore`: for each probe request (recorded decisions of training scenarios), every final output is
   one of the options offered, on every path, including when the model call fails;
7. `overfit`: no literal of the scenarios (ids, ticket text, amounts found in only one scenario).

Each gate returns `{name, ok, detail}`; a failing detail says what is wrong, where, and how to fix it,
precisely enough to send back to a proposer verbatim. Gates never raise on bad input: a crash inside a
gate is itself a failing result.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.errors import ImproveError
from improve.evals.scenarios import Scenario
from improve.machine import MachineConfig, NamedGuard, Scope, canonical_json, parse_machine, transitions_of
from improve.machine.config import StateConfig
from improve.machine.explore import ExploreOptions, explore_paths
from improve.machine.expr import referenced_paths, tokenize
from improve.machine.lint import has_errors, lint
from improve.machine.snapshot import Snapshot
from improve.runtime.decision import DecisionRequest
from improve.runtime.environment import Environment
from improve.runtime.policy import MODEL_DECIDE, compile_policy
from improve.runtime.vocabulary import Vocabulary, vocabulary

GATE_NAMES = ("environment-unchanged", "validate", "vocabulary", "lower", "lint", "explore", "overfit")


@dataclass(frozen=True)
class GateResult:
    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class GateContext:
    """What the gates check a candidate against."""

    env: Environment
    expected_hashes: Mapping[str, str] | None = None
    probes: list[DecisionRequest] = field(default_factory=list)
    scenarios: Sequence[Scenario] = ()
    words: Vocabulary | None = None

    @property
    def vocab(self) -> Vocabulary:
        if self.words is None:
            self.words = vocabulary(self.env)
        return self.words


def run_gates(document: Any, ctx: GateContext, source: str = "candidate") -> list[GateResult]:
    """Every gate in order until the first failure; the results so far."""
    results: list[GateResult] = []
    state: dict[str, Any] = {}
    steps: list[tuple[str, Callable[[], str | None]]] = [
        ("environment-unchanged", lambda: _environment(ctx)),
        ("validate", lambda: _validate(document, source, state)),
        ("vocabulary", lambda: _vocabulary(state["config"], ctx.vocab)),
        ("lower", lambda: _lower(state["config"], ctx, state)),
        ("lint", lambda: _lint(state["config"])),
        ("explore", lambda: _explore(state, ctx)),
        ("overfit", lambda: _overfit(state["config"], ctx)),
    ]
    for name, check in steps:
        try:
            problem = check()
        except Exception as err:  # a gate must never crash on a candidate: that is a failure too
            problem = f"the {name} gate could not check this document ({type(err).__name__}: {err})"
        ok = problem is None
        results.append(GateResult(name, ok, _ok_detail(name, ctx, state) if ok else str(problem)))
        if not ok:
            break
    return results


def passed(results: Sequence[GateResult]) -> bool:
    return len(results) == len(GATE_NAMES) and all(r.ok for r in results)


def _ok_detail(name: str, ctx: GateContext, state: dict[str, Any]) -> str:
    if name == "environment-unchanged":
        return (
            "environment files hash as recorded" if ctx.expected_hashes else "no recorded hashes to compare"
        )
    if name == "explore":
        return str(state.get("explore_detail", "ok"))
    return "ok"


# --- 1. the environment ---------------------------------------------------------------------------------


def _environment(ctx: GateContext) -> str | None:
    if not ctx.expected_hashes:
        return None
    now = ctx.env.file_hashes()
    changed = [
        f"{name} (recorded {want[:12]}, now {now.get(name, 'missing')[:12]})"
        for name, want in sorted(ctx.expected_hashes.items())
        if now.get(name) != want
    ]
    if changed:
        return (
            f"the environment changed since the round started: {', '.join(changed)}. A candidate may never "
            "change the environment; this one is discarded (not repaired)"
        )
    return None


# --- 2. validate -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unparsed:
    """A document that is not JSON at all: the validate gate reports `message` (file, line, column)."""

    message: str


def _validate(document: Any, source: str, state: dict[str, Any]) -> str | None:
    if isinstance(document, Unparsed):
        return document.message
    if not isinstance(document, dict):
        return f"{source}: $: expected a JSON object (a policy machine), got {type(document).__name__}"
    try:
        state["config"] = parse_machine(document, source=source)
    except ImproveError as err:
        return f"the policy is not a valid machine document:\n{err}"
    return None


# --- 3. vocabulary ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Expression:
    path: str
    source: str


def expressions(config: MachineConfig) -> list[_Expression]:
    """Every CEL string in a machine document, with its JSON path."""
    found: list[_Expression] = []

    def tree(value: Any, path: str) -> None:
        if isinstance(value, str):
            found.append(_Expression(path, value))
        elif isinstance(value, dict):
            for key, sub in value.items():
                tree(sub, f"{path}.{key}")
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                tree(sub, f"{path}[{i}]")

    tree(config.context, "$.context")
    for name, state in config.states.items():
        base = f"$.states.{name}"
        for label, spec in _transition_lists(state):
            for i, t in enumerate(transitions_of(spec)):
                if isinstance(t.guard, str):
                    found.append(_Expression(f"{base}.{label}[{i}].guard", t.guard))
                tree(t.assign or {}, f"{base}.{label}[{i}].assign")
        if state.invoke is not None:
            tree(state.invoke.input or {}, f"{base}.invoke.input")
        if state.output is not None:
            tree(state.output, f"{base}.output")
    return found


def _transition_lists(state: StateConfig) -> list[tuple[str, Any]]:
    lists: list[tuple[str, Any]] = [(f"on.{event}", spec) for event, spec in state.on.items()]
    lists += [("always", state.always), ("choice", state.choice)]
    if state.invoke is not None:
        lists += [("invoke.onDone", state.invoke.onDone), ("invoke.onError", state.invoke.onError)]
    return [(label, spec) for label, spec in lists if spec]


def _literal_string(source: str) -> str | None:
    tokens = tokenize(source)
    if len(tokens) == 1 and tokens[0].kind == "string":
        text = tokens[0].text
        return text[1:-1] if text[:1] in "'\"" else None
    return None


def _vocabulary(config: MachineConfig, vocab: Vocabulary) -> str | None:
    problems: list[str] = []
    facts = vocab.fact_paths
    for name, state in config.states.items():
        base = f"$.states.{name}"
        if state.invoke is not None:
            src = state.invoke.src
            if src not in vocab.actors:
                problems.append(
                    f"{base}.invoke.src: unknown actor '{src}'; a policy may invoke {vocab.actors}"
                )
            if src == MODEL_DECIDE:
                ref_src = (state.invoke.input or {}).get("model", f"'{vocab.models[0]}'")
                ref = _literal_string(str(ref_src)) if isinstance(ref_src, str) else None
                if ref is None or ref not in vocab.models:
                    problems.append(
                        f"{base}.invoke.input.model: unknown model ref {ref_src!r}; use a quoted ref from "
                        f"{vocab.models}, e.g. \"'{vocab.models[0]}'\""
                    )
        for label, spec in _transition_lists(state):
            for i, t in enumerate(transitions_of(spec)):
                if isinstance(t.guard, NamedGuard) and t.guard.type not in vocab.guards:
                    problems.append(
                        f"{base}.{label}[{i}].guard: unknown named guard '{t.guard.type}'; the environment "
                        f"exports {vocab.guards or 'no named guards'}: write the condition in CEL over facts"
                    )
        output = state.output
        if isinstance(output, dict) and "type" in output:
            event = _literal_string(str(output["type"]))
            if event is not None and event not in vocab.events:
                problems.append(
                    f"{base}.output.type: unknown event '{event}'; the decisions allow {vocab.events}"
                )
    for expr in expressions(config):
        for path in referenced_paths(tokenize(expr.source)):
            root = path[0]
            dotted = ".".join(path)
            if root == "facts" or (root == "input" and len(path) > 1 and path[1] == "facts"):
                fact = "facts." + ".".join(path[2:] if root == "input" else path[1:])
                if fact != "facts." and fact not in facts:
                    problems.append(f"{expr.path}: unknown fact path '{dotted}'; facts are {sorted(facts)}")
            elif root == "input" and len(path) > 1 and path[1] not in vocab.request_fields:
                problems.append(
                    f"{expr.path}: unknown request field '{dotted}'; the request has {list(vocab.request_fields)}"
                )
            elif root == "context" and len(path) > 1 and path[1] not in config.context:
                problems.append(
                    f"{expr.path}: '{dotted}' is not in the policy's context {sorted(config.context)}"
                )
    if problems:
        return "names outside the vocabulary:\n" + "\n".join(f"- {p}" for p in problems)
    return None


# --- 4. lower --------------------------------------------------------------------------------------------

_PROBE_VALUES = {"number": 1.5, "int": 1, "string": "text", "bool": False, "any": None}


def typed_request(vocab: Vocabulary, decision: int = 0) -> dict[str, Any]:
    """A decision request whose facts have the declared types (for type-checking guards)."""
    words = vocab.decisions[decision]
    facts: dict[str, Any] = {}
    for path, kind in sorted(words.facts.items()):
        if kind == "map":
            continue
        node = facts
        parts = path.split(".")[1:]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _PROBE_VALUES.get(kind)
    options = [{"type": event} for event in words.events]
    return {
        "name": words.name,
        "options": options,
        "facts": facts,
        "attempts": [],
        "prompt": "",
        "allowedEvents": list(words.events),
        "payloads": {},
    }


def _lower(config: MachineConfig, ctx: GateContext, state: dict[str, Any]) -> str | None:
    try:
        machine = compile_policy(config, ctx.env.judgments, ctx.env.policy_guards)
    except ImproveError as err:
        return f"the policy does not compile: {err}"
    state["machine"] = machine
    problems = []
    for index, words in enumerate(ctx.vocab.decisions):
        request = typed_request(ctx.vocab, index)
        scope = Scope(input=request, facts=request["facts"], context={}, event={"type": "xstate.init"})
        for name, st in machine.states.items():
            for t in st.choice:
                if t.guard is None:
                    continue
                try:
                    t.guard.check_bool(scope)
                except ImproveError as err:
                    kinds = {p: k for p, k in words.facts.items()}
                    problems.append(
                        f"$.states.{name}: type error for decision '{words.name}': {err} "
                        f"(fact types: {kinds})"
                    )
    if problems:
        return "guards do not type-check against the declared fact types:\n" + "\n".join(
            f"- {p}" for p in problems
        )
    return None


# --- 5. lint ---------------------------------------------------------------------------------------------


def _lint(config: MachineConfig) -> str | None:
    found = lint(config, "policy")
    if has_errors(found):
        errors = [f"- {f.code} at {f.path}: {f.message}" for f in found if f.severity == "error"]
        return "lint errors:\n" + "\n".join(errors)
    return None


# --- 6. explore ------------------------------------------------------------------------------------------


def _same_event(a: Any, b: Mapping[str, Any]) -> bool:
    if not isinstance(a, dict) or a.get("type") != b.get("type") or set(a) != set(b):
        return False
    for key, value in b.items():
        other = a[key]
        numeric = isinstance(value, int | float) and isinstance(other, int | float)
        if not (other == value if numeric else type(other) is type(value) and other == value):
            return False
    return True


def _explore(state: dict[str, Any], ctx: GateContext) -> str | None:
    machine = state["machine"]
    if not ctx.probes:
        state["explore_detail"] = "no probe requests (no training scenario reached a decision)"
        return None
    total_states = 0
    for request in ctx.probes:
        options = request.options
        outputs: dict[str, list[Any]] = {MODEL_DECIDE: [dict(o) for o in options]}
        for name, judgment in ctx.env.judgments.items():
            try:
                outputs[name] = [judgment(request.to_input(), {})]
            except Exception as err:
                return f"judgment '{name}' failed on a probe request: {err}"
        probe = ExploreOptions(
            outputs=outputs, errors={MODEL_DECIDE, *ctx.env.judgments}, max_depth=40, max_paths=20_000
        )

        def bad(snapshot: Snapshot, options: list[dict[str, Any]] = options) -> bool:
            if snapshot.status == "error":
                return True
            return snapshot.status == "done" and not any(_same_event(snapshot.output, o) for o in options)

        result = explore_paths(machine, request.to_input(), probe, target=bad, stop_at_target=True)
        total_states += result.states
        facts = canonical_json(request.facts)
        if result.reachable:
            steps = " -> ".join(_describe(e) for e in result.witness or [])
            return (
                f"on decision '{request.name}' with facts {facts} and options {json.dumps(options)}, the policy "
                f"can end with an answer that is not an offered option (or in error), after: {steps or 'start'}. "
                "Every final output must be one of the offered options; give every invoke an onError that "
                "leads to a final with a safe offered event"
            )
        if not result.complete:
            return f"exploring decision '{request.name}' with facts {facts} did not finish: {result.cuts}"
    state["explore_detail"] = (
        f"{len(ctx.probes)} probe request(s), {total_states} state(s): every output is offered"
    )
    return None


def _describe(event: Mapping[str, Any]) -> str:
    if event.get("type") == "xstate.done.actor":
        return f"{event.get('actorId')} answered {json.dumps(event.get('output'))}"
    if event.get("type") == "xstate.error.actor":
        return f"{event.get('actorId')} failed"
    return json.dumps(dict(event))


# --- 7. overfit ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScenarioLiterals:
    ids: dict[str, str]
    """Identifier -> the scenario it comes from (scenario, customer, order ids)."""
    texts: dict[str, str]
    """Free text (tickets, descriptions) -> scenario."""
    amounts: dict[float, str]
    """Numbers that appear in exactly one scenario -> that scenario."""


def scenario_literals(scenarios: Iterable[Scenario]) -> ScenarioLiterals:
    ids: dict[str, str] = {}
    texts: dict[str, str] = {}
    numbers: dict[float, set[str]] = {}

    def walk(value: Any, sid: str, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and ("-" in k or any(c.isdigit() for c in k)):
                    ids.setdefault(k, sid)
                walk(v, sid, str(k))
        elif isinstance(value, list):
            for v in value:
                walk(v, sid, key)
        elif isinstance(value, bool):
            return
        elif isinstance(value, int | float):
            numbers.setdefault(float(value), set()).add(sid)
        elif isinstance(value, str):
            if key.lower().endswith("id") or key in ("orderId", "customerId", "approver"):
                ids.setdefault(value, sid)
            elif len(value) >= 12:
                texts.setdefault(value, sid)

    for s in scenarios:
        ids.setdefault(s.id, s.id)
        walk(s.input, s.id)
        walk(s.world, s.id)
        walk(s.people, s.id)
    amounts = {n: next(iter(owners)) for n, owners in numbers.items() if len(owners) == 1}
    return ScenarioLiterals(ids, texts, amounts)


def _policy_literals(config: MachineConfig) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for expr in expressions(config):
        for tok in tokenize(expr.source):
            if tok.kind == "string" and tok.text[:1] in "'\"":
                out.append((expr.path, tok.text[1:-1]))
            elif tok.kind == "number":
                try:
                    out.append((expr.path, float(tok.text.rstrip("uU"))))
                except ValueError:
                    continue
    return out


MIN_TEXT_LITERAL = 12
"""A string literal this long found inside a scenario's text is copied text; shorter ones (keywords such
as 'chargeback') may be rules."""


def _overfit(config: MachineConfig, ctx: GateContext) -> str | None:
    if not ctx.scenarios:
        return None
    known = scenario_literals(ctx.scenarios)
    # The environment's own constants (the 30-day window, the 100 threshold) and its vocabulary are rules.
    rules = {v for _, v in _policy_literals(ctx.env.config)}
    words = {*ctx.vocab.events, *(d.name for d in ctx.vocab.decisions), *ctx.vocab.models, *ctx.vocab.actors}
    problems = []
    for path, value in _policy_literals(config):
        if value in rules or value in words:
            continue
        if isinstance(value, str):
            if value in known.ids:
                problems.append(f"{path}: '{value}' is an identifier from scenario {known.ids[value]}")
                continue
            if len(value) >= MIN_TEXT_LITERAL:
                owner = next(
                    (sid for text, sid in known.texts.items() if value.lower() in text.lower()), None
                )
                if owner:
                    problems.append(f"{path}: '{value}' is text from scenario {owner}")
        elif value in known.amounts:
            problems.append(f"{path}: {value:g} appears only in scenario {known.amounts[value]}")
    if problems:
        return (
            "the policy matches on scenario literals (it would learn the test, not the rule):\n"
            + "\n".join(f"- {p}" for p in problems)
            + "\nExpress the rule over facts and thresholds that hold across scenarios"
        )
    return None
