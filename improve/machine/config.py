"""The machine config: a subset of XState v5 JSON, as pydantic models.

Spelling (kept stable; docs/contracts.md is the contract this follows):

- Every *expression position* holds a CEL string: guards, `assign` values, `context` initialisers,
  invoke `input` values and state `output`. A literal string is quoted inside the CEL (`"'issued'"`).
  Objects and arrays in those positions are structure: each member is itself an expression, so
  `{"outcome": "'issued'", "amount": "context.amount"}` evaluates member by member. Numbers, booleans
  and null are literals.
- A transition is a target name, an object (`target`, `guard`, `assign`, `description`) or a list of
  them; the first whose guard passes is taken. No `target` means stay without re-entering.
- A guard is a CEL string or a named guard `{"type": "name", "params": {...}}` that the host registers.
- `invoke.src = "agent.decide"` is a decision request (docs/contracts.md, decision protocol). Its `allowedEvents`
  is a list of event *names* (not CEL); `payloads` maps event -> field -> a CEL expression that yields
  the list of allowed values (a closed choice) or `'text'` (free text, optional, e.g. a reason);
  `facts`, `name` and `prompt` are expressions.
- States are flat (siblings of one machine): a target names a key of `states`.
- A **sentinel** is a final state tagged `"sentinel"` (`"type": "final", "tags": ["sentinel"]`, with a
  `description` saying what must never happen): an invariant that must be unreachable. Exploration
  proves it, replay counts reaching it as a violation. The older spelling, a final state whose
  description starts with `SENTINEL:`, is still read.
"""

from __future__ import annotations

import json
import re
from difflib import get_close_matches
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from improve.errors import MachineConfigError
from improve.machine.locate import duplicate_keys, json_lines, json_path, line_of

DECIDE_SRC = "agent.decide"
"""The built-in invoke source of a decision request."""

MODEL_DECIDE = "model.decide"
"""The invoke source of a model request inside a policy; its input names the model ref."""

SENTINEL_TAG = "sentinel"
"""A final state with this tag is an invariant that must be unreachable."""

SENTINEL_PREFIX = "SENTINEL:"
"""The older sentinel marker, still read: a final state whose description starts with it."""

WAITING_STATUS = "waiting"
"""The status of a run that stops in a waiting state (no invoke, events to receive) with nobody to answer."""

RESUMABLE_STATUSES = (WAITING_STATUS, "checkpointed", "blocked_ask")
"""The statuses a run can be resumed from (`improve resume`): `waiting`, or what a waiting state declares
in `meta.status` (`checkpointed` after a checkpoint, `blocked_ask` after a question)."""

PAYLOAD_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}
"""The JSON Schema type names a waiting state's `meta.payloads` may use, and the Python values each accepts."""

ExprTree = Any
"""A CEL string, or a dict / list of expression trees, or a JSON literal (number, bool, null)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class NamedGuard(_Strict):
    """A guard implemented by the host and referenced by name (XState's `{type, params}` form)."""

    type: str = Field(description="The registered guard name.")
    params: dict[str, Any] = Field(default_factory=dict, description="Static parameters passed to it.")


Guard = str | NamedGuard


class TransitionConfig(_Strict):
    """One candidate transition."""

    target: str | None = Field(default=None, description="Sibling state to enter; none stays put.")
    guard: Guard | None = Field(default=None, description="CEL boolean expression or a named guard.")
    assign: dict[str, ExprTree] | None = Field(
        default=None, description="Context keys to set, each a CEL expression over the pre-step context."
    )
    description: str | None = Field(default=None, description="Why this transition exists.")


TransitionSpec = str | TransitionConfig | list[str | TransitionConfig]


class DecideInputConfig(_Strict):
    """The input of an `agent.decide` invoke: a decision request (docs/contracts.md)."""

    name: str = Field(description="CEL expression naming the decision, e.g. \"'chooseResolution'\".")
    allowedEvents: list[str] = Field(description="Event names a decider may answer (not CEL).")
    payloads: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Per event, per payload field: a CEL expression yielding the list of allowed values "
        "(a closed choice), or the string 'text' for a free-text field such as a reason.",
    )
    facts: dict[str, ExprTree] = Field(default_factory=dict, description="What a decider may read.")
    prompt: str | None = Field(default=None, description="CEL expression for the instruction text.")


class InvokeConfig(_Strict):
    """An actor the state invokes on entry: an environment tool, a model, or a decision request."""

    src: str = Field(description="The actor's registered name, or `agent.decide`.")
    id: str | None = Field(default=None, description="Invoke id; defaults to the state name.")
    input: dict[str, ExprTree] | None = Field(default=None, description="Expression tree for the input.")
    onDone: TransitionSpec | None = Field(default=None, description="Taken on `xstate.done.actor`.")
    onError: TransitionSpec | None = Field(default=None, description="Taken on `xstate.error.actor`.")
    maxRetries: int | None = Field(
        default=None, ge=0, le=10, description="Decision requests: retries after a failed answer (default 2)."
    )


class StateConfig(_Strict):
    """One state of the machine."""

    type: Literal["atomic", "final", "choice"] | None = Field(
        default=None, description="`final` ends the machine; `choice` branches at once on guards."
    )
    description: str | None = None
    on: dict[str, TransitionSpec] = Field(default_factory=dict, description="Event name -> transitions.")
    always: TransitionSpec | None = Field(default=None, description="Eventless transitions, tried on entry.")
    choice: list[TransitionConfig] | None = Field(
        default=None, description="Branches of a `choice` state; the last should be unguarded."
    )
    invoke: InvokeConfig | None = None
    tags: list[str] = Field(default_factory=list)
    output: ExprTree | None = Field(default=None, description="Final states: the machine's output.")
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def is_final(self) -> bool:
        return self.type == "final"

    @property
    def is_sentinel(self) -> bool:
        return self.is_final and (
            SENTINEL_TAG in self.tags or (self.description or "").startswith(SENTINEL_PREFIX)
        )

    @field_validator("tags")
    @classmethod
    def _sentinel_is_final(cls, tags: list[str], info: Any) -> list[str]:
        if SENTINEL_TAG in tags and info.data.get("type") != "final":
            raise ValueError(
                f'a state tagged "{SENTINEL_TAG}" marks an invariant and must be final: add "type": "final"'
            )
        # A misspelt sentinel tag would not fail anything: the state would be an ordinary final state,
        # exploration would prove nothing about it and a run reaching it would count no violation.
        for tag in tags:
            if tag != SENTINEL_TAG and get_close_matches(tag.lower(), [SENTINEL_TAG], cutoff=0.75):
                raise ValueError(
                    f'tag "{tag}" is not "{SENTINEL_TAG}": a final state tagged "{SENTINEL_TAG}" (exactly so) is '
                    "an invariant that must never be reached; spell it so, or name your own tag otherwise"
                )
        return tags


class MachineConfig(_Strict):
    """A state machine: an environment written by people, or a policy written by the loop."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: str | None = Field(default=None, alias="$schema", description="Optional JSON Schema URL.")
    id: str = Field(min_length=1, description="Stable machine id, kept across versions.")
    version: str = Field(min_length=1, description="Bumped whenever behaviour changes.")
    description: str = Field(default="", description="The goal, with measurable success criteria.")
    initial: str = Field(description="The state entered first.")
    context: dict[str, ExprTree] = Field(
        default_factory=dict, description="Initial context: each value a CEL expression over `input`."
    )
    states: dict[str, StateConfig] = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_text(cls, value: Any) -> Any:
        # "version": 1 is a common slip; the contract says a string.
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError(f'version must be a string, e.g. "{value}"')
        return value

    def final_states(self) -> list[str]:
        return [name for name, state in self.states.items() if state.is_final]

    def sentinels(self) -> list[str]:
        return [name for name, state in self.states.items() if state.is_sentinel]


def transitions_of(spec: TransitionSpec | list[TransitionConfig] | None) -> list[TransitionConfig]:
    """Normalise the three spellings of a transition into a list of `TransitionConfig`."""
    if spec is None:
        return []
    items = spec if isinstance(spec, list) else [spec]
    return [TransitionConfig(target=item) if isinstance(item, str) else item for item in items]


def format_validation_error(err: ValidationError, source: str, text: str | None = None) -> str:
    """One line per problem: where in the document (a JSON path) and what was expected. Given the
    document's `text`, each also names its line (`source:LINE: $.path: ...`), for an editor to jump to."""
    lines = json_lines(text) if text is not None else {}
    said = []
    for loc, message in _without_union_noise(err.errors()):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
        line = line_of(lines, loc)
        said.append(f"{source}{f':{line}' if line else ''}: {path}: {message}")
    return "\n".join(said)


_TAG = re.compile(r"(str|int|float|bool|(list|dict|union|literal)\[.*\])")
"""Pydantic's names of built-in alternatives (`str`, `list[union[str,TransitionConfig]]`)."""
_MODELS = {
    "NamedGuard",
    "TransitionConfig",
    "DecideInputConfig",
    "InvokeConfig",
    "StateConfig",
    "MachineConfig",
}
"""The models of this module, as pydantic names them among a union's alternatives."""


def _union_tag(part: Any) -> bool:
    """Whether a loc element is pydantic's name of a union's alternative, not a key of the document."""
    return isinstance(part, str) and (part in _MODELS or _TAG.fullmatch(part) is not None)


def _without_union_noise(problems: list[Any]) -> list[tuple[tuple[Any, ...], str]]:
    """Each problem once, where the document has it: a value of a union field (a transition: a target,
    an object, a list of them) failed each alternative, said as three problems, two of them about shapes
    the value never had (`...REFER.str: Input should be a valid string` beside the misspelt key). The
    alternative that got furthest into the value is kept, its name dropped from the path; where none got
    past the value itself, one line says what it is not."""
    groups: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], str]]] = {}
    plain: list[tuple[tuple[Any, ...], str]] = []
    for problem in problems:
        loc = tuple(problem["loc"])
        at = next((i for i, part in enumerate(loc) if _union_tag(part)), None)
        if at is None:
            plain.append((loc, problem["msg"]))
            continue
        groups.setdefault(loc[:at], []).append((loc[at:], problem["msg"]))
    out = list(plain)
    for prefix, found in groups.items():
        deepest = max(len(rest) for rest, _ in found)
        if deepest > 1:
            out += [
                (prefix + tuple(p for p in rest[1:] if not _union_tag(p)), msg)
                for rest, msg in found
                if len(rest) == deepest
            ]
        else:
            tried = "; ".join(f"as {rest[0]}: {msg}" for rest, msg in found)
            out.append((prefix, f"not a value of any shape it may take ({tried})"))
    return out


MAX_DEPTH = 200
"""How deeply a machine or policy document may nest objects and arrays (the document itself is level 1).

Real policies nest about ten levels. Validation, lowering, linting and CEL compilation all recurse over
the document, so a document nested thousands deep would reach Python's recursion limit somewhere in
them; refusing it up front, with this number in the message, is the one place that can say why. It
matches the limit pydantic's JSON parser puts on log entries (`improve.log.entry.MAX_ENTRY_DEPTH`)."""


def depth_message(source: str, where: str = "$", limit: int = MAX_DEPTH) -> str:
    return (
        f"{source}: {where}: nested deeper than {limit} levels of objects and arrays; a policy needs "
        "about ten: flatten the nesting (is this the file you meant?)"
    )


def check_depth(data: Any, source: str = "<machine>", limit: int = MAX_DEPTH) -> None:
    """Refuse a decoded document that nests objects and arrays deeper than `limit` levels.

    Iterative (an explicit stack), so checking a deep document cannot itself hit the recursion limit.
    """
    stack: list[tuple[Any, int, str]] = [(data, 1, "$")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict):
            children: Any = ((f"{where}.{key}", item) for key, item in value.items())
        elif isinstance(value, list):
            children = ((f"{where}[{index}]", item) for index, item in enumerate(value))
        else:
            continue
        if depth > limit:
            raise MachineConfigError(depth_message(source, where, limit))
        for path, item in children:
            if isinstance(item, dict | list):
                # The path names where the deep part starts; two hundred `[0]` would hide it.
                stack.append((item, depth + 1, path if depth < 4 else f"{where.removesuffix('...')}..."))


class _DuplicateKey(Exception):
    """An object of the document gives a key twice: control flow from the decoder's hook to
    `loads_document`, which finds where (the hook is given an object's members, not their place)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _DuplicateKey
    return found


def loads_document(text: str, source: str = "<machine>", limit: int = MAX_DEPTH) -> Any:
    """`json.loads`, then `check_depth`. A document too deep for the JSON decoder itself (it raises
    RecursionError near Python's recursion limit) is refused with the same message. A syntax error is
    left as `json.JSONDecodeError` for the caller, which knows how to report it (a gate, a file).

    A key given twice in one object is refused, each repeat at its line and JSON path: `json.loads`
    keeps the last without a word, so a second, unguarded `"REFILL"` under `on` would drop the guarded
    first one, and with it a rule of the business."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise MachineConfigError(depth_message(source, "$", limit)) from None
    except _DuplicateKey:
        raise MachineConfigError(duplicate_keys_message(source, text)) from None
    check_depth(data, source, limit)
    return data


def duplicate_keys_message(source: str, text: str) -> str:
    """`FILE:LINE: $.path: ...` for each key of the JSON `text` given twice in one object."""
    found = duplicate_keys(text)
    if not found:  # the decoder saw one the scanner cannot place (a bug there): say it without a line
        return (
            f"{source}: an object gives a key twice; JSON keeps only the last, dropping the first without "
            "a word: give each key once"
        )
    said = []
    for path, first, again in found:
        key = path[-1]
        # Two transitions for one event is what a repeated event under `on` usually meant.
        fix = (
            f'list the transitions under one key (`"{key}": [{{"guard": ...}}, {{...}}]`, the first whose '
            "guard passes wins), or remove the one you did not mean"
            if len(path) >= 2 and path[-2] == "on"
            else "merge the two, or remove the one you did not mean"
        )
        said.append(
            f"{source}:{again}: {json_path(path)}: the key {key!r} is given twice in one object (first on "
            f"line {first}); JSON keeps only the last, dropping the first without a word: {fix}"
        )
    return "\n".join(said)


def json_syntax_error(source: str, error: json.JSONDecodeError) -> str:
    """`FILE:LINE:COL: invalid JSON: ...` for a syntax error. A trailing comma, which the decoder finds
    only at the `}` or `]` after it (often a line later, as a complaint about what follows), is named
    where it is."""
    text, pos = error.doc, error.pos
    before = pos - 1
    while before >= 0 and text[before] in " \t\r\n":
        before -= 1
    if before >= 0 and text[before] == "," and text[pos : pos + 1] in ("}", "]"):
        line = text.count("\n", 0, before) + 1
        column = before - (text.rfind("\n", 0, before) + 1) + 1
        return (
            f"{source}:{line}:{column}: invalid JSON: a trailing comma before the {text[pos]!r} on line "
            f"{error.lineno} (JSON allows none): remove it"
        )
    return f"{source}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}"


def parse_machine(data: Any, source: str = "<machine>", text: str | None = None) -> MachineConfig:
    """Validate a decoded JSON document as a machine config, with the JSON path of every error (and its
    line, given the `text` the document was decoded from).

    The depth is checked first: pydantic validates the recursive expression trees recursively."""
    check_depth(data, source)
    try:
        return MachineConfig.model_validate(data)
    except ValidationError as err:
        raise MachineConfigError(format_validation_error(err, source, text)) from None
