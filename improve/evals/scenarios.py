"""Scenarios: inputs, the world they act on, how people answer, and the outcome people labelled.

A scenario file is YAML:

    environment: refunds
    scenarios:
      - id: small-refund-01
        category: small-refund
        split: train                  # train | held-out | test, fixed in the file
        input: {ticket: "...", customerId: C-1001, orderId: O-5001, amount: 40}
        world: {customers: {...}, orders: {...}}
        people: {awaitingApproval: [{type: APPROVE, approver: dana}]}
        expected:
          outcome: issued             # a final state of the environment
          effects: [{kind: refund, orderId: O-5001, amount: 40}]

Errors name the file, the line, the scenario id and the field.

`test` is the optional sealed split: no round, diagnosis, proposer or gate reads it (they get
`ScenarioSet.open_scenarios`), and asking for it without unsealing raises `SealedSplitError`.
"""

from __future__ import annotations

import functools
import pickle
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from improve.errors import ConfigError, ScenarioError, SealedSplitError
from improve.machine import PAYLOAD_TYPES, JsonPath, MachineConfig, canonical_hash, line_of

# libyaml's parser when PyYAML was built with it: a scenario file is read on every scoring pass,
# and the pure-Python parser is most of that pass's time on a few hundred scenarios.
SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

OPEN_SPLITS = ("train", "held-out")
"""The splits a round reads: train shapes a candidate, held-out decides on it. Every category needs both."""
SEALED_SPLIT = "test"
"""The optional sealed split: never read by a round, scored only by `improve score --split test --unseal`."""
SPLITS = (*OPEN_SPLITS, SEALED_SPLIT)
Split = Literal["train", "held-out", "test"]

UNSEAL_HOW = (
    "the test split is sealed: no round reads it, so its score is the one estimate no round has adapted "
    "to. Score it with `improve score --policy VERSION --split test --unseal` (add --vs BASELINE to "
    "compare): the scores are shown and the unsealing is recorded (who, when, which policy, the scores) in "
    "the policies' test-unsealings.jsonl. The cost: once a change is made because of a test score, the "
    "test split is one more reused held-out set, so unseal it for a final number, not to choose the next "
    "change"
)
"""What a refusal to read the sealed split says: how to unseal it and what that costs."""


class Expected(BaseModel):
    """Ground truth labelled by people."""

    model_config = ConfigDict(extra="forbid")

    outcome: str = Field(description="The final state the run must end in.")
    effects: list[dict[str, Any]] | None = Field(
        default=None,
        description="Every effect the world must record (any order); None compares the outcome only.",
    )


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Unique within the file.")
    category: str = Field(min_length=1)
    split: Split
    description: str | None = None
    input: dict[str, Any]
    world: dict[str, Any] = Field(default_factory=dict)
    people: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    expected: Expected

    def answers(self, state: str) -> bool:
        """Whether its people script answers a run waiting in `state`: a run left there by `--suspend` has
        no outcome yet, while one waiting where the script has no answer ended there for good."""
        return bool(self.people.get(state))


class ScenarioSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    environment: str
    scenarios: list[Scenario]
    source: str = Field(default="", exclude=True)

    def split(self, split: str | None, *, unseal: bool = False) -> list[Scenario]:
        """The scenarios of a split; `all` (or None) is every open split, and the sealed test split too
        only with `unseal`. The test split itself without `unseal` is refused (`SealedSplitError`)."""
        if split in (None, "all"):
            return list(self.scenarios) if unseal else self.open_scenarios
        if split not in SPLITS:
            raise ScenarioError(f"unknown split {split!r}; use one of {', '.join(SPLITS)} or all")
        if split == SEALED_SPLIT and not unseal:
            raise SealedSplitError(f"--split {SEALED_SPLIT}: {UNSEAL_HOW}")
        return [s for s in self.scenarios if s.split == split]

    @property
    def open_scenarios(self) -> list[Scenario]:
        """Every scenario but the sealed test split's: all a round, a diagnosis, a proposer or a gate reads."""
        return [s for s in self.scenarios if s.split != SEALED_SPLIT]

    @property
    def sealed(self) -> list[Scenario]:
        """The sealed test split's scenarios (none when the file has no `split: test`)."""
        return [s for s in self.scenarios if s.split == SEALED_SPLIT]

    def by_id(self) -> dict[str, Scenario]:
        return {s.id: s for s in self.scenarios}


def label_digest(scenario: Scenario) -> str:
    """A digest of what scores a run of the scenario (its label, category and world, whose audit counts
    violations): a row scored against another digest is scored again (`materialize.refresh_outcomes`)."""
    scored = scenario.model_dump(mode="json", include={"expected", "category", "world"})
    return canonical_hash(scored)[:16]


def people_problems(config: MachineConfig, scenario: Scenario) -> list[tuple[JsonPath, str]]:
    """(field, problem) for each field of the scenario's people script that the waiting state's
    `meta.payloads` declares of another type, or requires and the event leaves out: a run would only
    fail on it deep inside a guard (`event.depositMonths >= 0` on "two": no such overload). The field is
    a path into the scenario (`people.awaitingLandlord[0].depositMonths`), for its line."""
    found: list[tuple[JsonPath, str]] = []
    waiting = [n for n, st in config.states.items() if st.on and st.invoke is None and st.type != "final"]
    for state, events in scenario.people.items():
        if (
            state not in config.states
            or config.states[state].invoke is not None
            or not config.states[state].on
        ):
            # A script for a state no run waits in answers nothing: the run waits unanswered, or never there.
            found.append(
                (
                    ("people", state),
                    f"people script for '{state}', which is no state the machine waits in; it waits in "
                    f"{waiting or 'none'}",
                )
            )
            continue
        accepts = sorted(config.states[state].on)
        for index, event in enumerate(events):
            if event.get("type") not in accepts:
                found.append(
                    (
                        ("people", state, index),
                        f"people event {event.get('type')!r} in '{state}', which accepts {accepts}",
                    )
                )
        declared = config.states[state].meta.get("payloads")
        if not isinstance(declared, dict):
            continue
        for index, event in enumerate(events):
            fields = declared.get(event.get("type"))
            if not isinstance(fields, dict):
                continue
            for name, kind in fields.items():
                wanted = kind.rstrip("?") if isinstance(kind, str) else None
                if wanted not in PAYLOAD_TYPES:
                    continue  # not a type name at all: compile_machine refuses the machine for it
                said = f"people event {event['type']}: {name}"
                because = f"(the machine's meta.payloads declares it {kind})"
                value = event.get(name)
                if value is None:
                    if not kind.endswith("?"):
                        given = " is null" if name in event else " is not given"
                        found.append(
                            (
                                ("people", state, index, name) if name in event else ("people", state, index),
                                f"{said}{given} {because}; give it, or end the type with `?` to make it "
                                "optional",
                            )
                        )
                    continue
                accepted = PAYLOAD_TYPES[wanted]
                # As `payload_problem` reads a resumed event: true is no number, 2.0 no integer.
                if (isinstance(value, bool) and bool not in accepted) or not isinstance(value, accepted):
                    article = "an" if wanted[0] in "aeiou" else "a"
                    found.append(
                        (
                            ("people", state, index, name),
                            f"{said} = {value!r} is not {article} {wanted} {because}",
                        )
                    )
    return found


def _items(path: Path) -> tuple[str, list[Any]]:
    """The text of a scenario file and the items of its `scenarios` list, as YAML reads them (no items
    when it cannot be read so)."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = yaml.load(text, Loader=SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return "", []
    items = doc.get("scenarios") if isinstance(doc, dict) else None
    return text, items if isinstance(items, list) else []


def valid_scenarios(path: Path) -> list[Scenario]:
    """The items of a scenario file that are valid scenarios on their own (none when the file cannot be
    read as YAML with a `scenarios` list): what a check of a file with some invalid items still checks."""
    found = []
    for item in _items(path)[1]:
        try:
            found.append(Scenario.model_validate(item))
        except ValidationError:
            continue
    return found


def scenario_lines(path: Path) -> dict[str, int]:
    """Each scenario id of the file at `path` -> the 1-based line its item starts at (none for a file
    that cannot be read or parsed): for a message about a scenario to point into the file."""
    return ScenarioLines.read(path).starts()


def yaml_lines(text: str) -> dict[JsonPath, int]:
    """Each node's path in the YAML document `text` -> the 1-based line it is written on; a member of a
    mapping is placed at its key (`pets: hamster` is at the line of `pets`). Empty when it cannot be
    composed. A path is keys and indexes, as pydantic's `loc` spells them."""
    try:
        root = yaml.compose(text, Loader=SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return {}
    if root is None:
        return {}
    found: dict[JsonPath, int] = {(): root.start_mark.line + 1}
    stack: list[tuple[JsonPath, yaml.Node]] = [((), root)]
    seen: set[int] = set()  # an alias is the node it names: walked once, where it is first written
    while stack:
        path, node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        children: list[tuple[str | int, yaml.Node, yaml.Node]] = []
        if isinstance(node, yaml.MappingNode):
            children = [(k.value, k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)]
        elif isinstance(node, yaml.SequenceNode):
            children = [(i, v, v) for i, v in enumerate(node.value)]
        for part, at, child in children:
            found.setdefault((*path, part), at.start_mark.line + 1)
            stack.append(((*path, part), child))
    return found


@dataclass
class ScenarioLines:
    """Where each scenario of a file, and each field of it, is written: for a message about a scenario to
    point at the line of the field that is wrong, and not only at the scenario's first line."""

    path: Path
    lines: dict[JsonPath, int]
    items: list[Any]

    @classmethod
    def read(cls, path: Path) -> ScenarioLines:
        """The lines of the file at `path` (none when it cannot be read or parsed)."""
        text, items = _items(path)
        return cls(path, yaml_lines(text) if items else {}, items)

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for index, item in enumerate(self.items):
            if isinstance(item, dict) and "id" in item:
                found.setdefault(str(item["id"]), index)
        return found

    def starts(self) -> dict[str, int]:
        """Each scenario id -> the line its item starts at."""
        return {
            sid: line for sid, index in self._index.items() if (line := self.lines.get(("scenarios", index)))
        }

    def line(self, scenario: str, field: Sequence[str | int] = ()) -> int | None:
        """The line of `field` of the scenario (`("world", "accounts", "A-1", "plan")`), or of the deepest
        part of it that is written; the scenario's first line for no field."""
        index = self._index.get(scenario)
        return None if index is None else line_of(self.lines, ("scenarios", index, *field))

    def where(self, scenario: str, field: Sequence[str | int] = ()) -> str:
        """`file:line` of `field` of the scenario (`line`), or the file alone when it is not found."""
        line = self.line(scenario, field)
        return f"{self.path}:{line}" if line else str(self.path)

    def holding(self, scenario: str, key: str, value: Any) -> JsonPath:
        """The field of the scenario that gives `value` under the name `key` (the field a decision's fact
        `account.plan` was read from, through a tool's output: `world.accounts.A-1.plan`), the first in
        `input`, `world` and `people` order; else the one field anywhere in it holding `value`; else ()."""
        index = self._index.get(scenario)
        if index is None:
            return ()
        named: list[JsonPath] = []
        valued: list[JsonPath] = []
        stack: list[tuple[JsonPath, Any]] = [
            ((part,), self.items[index][part])
            for part in reversed(("input", "world", "people"))
            if part in self.items[index]
        ]
        while stack:
            path, node = stack.pop()
            if isinstance(node, dict):
                stack += [((*path, k), v) for k, v in reversed(list(node.items()))]
            elif isinstance(node, list):
                stack += [((*path, i), v) for i, v in reversed(list(enumerate(node)))]
            elif type(node) is type(value) and node == value:
                (named if path[-1] == key else valued).append(path)
        if named:
            return named[0]
        return valued[0] if len(valued) == 1 else ()


def read_yaml(path: Path, error: type[ConfigError], what: str) -> tuple[str, Any]:
    """The text and the decoded document of a YAML file; a syntax error names the line and column."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: a directory, not a {what}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(
            f"{path}: not UTF-8 text (byte {err.start} is {raw[err.start]:#04x}); a {what} is YAML text"
        ) from None
    return text, parse_yaml(text, path, error)


_PARSED: OrderedDict[str, bytes] = OrderedDict()
"""The documents of the texts parsed last, pickled: a command reads one scenario file several times (to
plan, to score, to record), and building a document from YAML costs ten times as much as unpickling a
copy of it. Only this process's own pickles are ever loaded."""
_PARSED_KEPT = 16
_parsed_lock = threading.Lock()


def parse_yaml(text: str, path: Path, error: type[ConfigError]) -> Any:
    """The YAML document in `text` (read from `path`); a syntax error names the line and column. Each
    call returns a document of its own (the caller may change it)."""
    with _parsed_lock:
        kept = _PARSED.get(text)
        if kept is not None:
            _PARSED.move_to_end(text)
    if kept is not None:
        return pickle.loads(kept)  # pickled just below by this process: never bytes from outside
    document = _parse_yaml(text, path, error)
    with _parsed_lock:
        _PARSED[text] = pickle.dumps(document, protocol=pickle.HIGHEST_PROTOCOL)
        while len(_PARSED) > _PARSED_KEPT:
            _PARSED.popitem(last=False)
    return document


def _parse_yaml(text: str, path: Path, error: type[ConfigError]) -> Any:
    try:
        # yaml.load, with the composed document looked over before it is built: a mapping that gives a
        # key twice keeps the last without a word (`outcome: refilled`, then `outcome: refused`: the
        # label changed, and every check passed).
        loader = SafeLoader(text)
        try:
            root = loader.get_single_node()
            repeated = _repeated_keys(root, loader)
            if repeated:
                ids = _scenario_ids(root)
                raise error("\n".join(_repeated_message(path, one, ids) for one in repeated))
            return loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        opened, context = getattr(err, "context_mark", None), getattr(err, "context", None)
        if mark is not None and opened is not None and context and mark.index >= len(text.rstrip()):
            # Found only at the end of the file (a quote or bracket never closed): where it was opened is
            # the line to fix, not the file's last.
            raise error(
                f"{path}:{opened.line + 1}:{opened.column + 1}: invalid YAML: {problem} "
                f"(at line {mark.line + 1}) {context} that starts here: is it closed?"
            ) from None
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise error(f"{where}: invalid YAML: {problem}") from None
    except RecursionError:
        raise error(f"{path}: invalid YAML: nested too deep to read") from None


_MERGE = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class _Repeated:
    """A key one mapping gives twice: where (the path to it), and its nodes as first and again given."""

    where: JsonPath
    first: yaml.ScalarNode
    dropped: yaml.Node
    again: yaml.ScalarNode


def _repeated_keys(root: yaml.Node | None, loader: yaml.SafeLoader) -> list[_Repeated]:
    """Each key a mapping of the composed document gives twice, in the order of the text. Keys are
    compared as YAML reads them (`1` and `01` are one key, and so are `yes` and `on`). A key set again
    after a merge (`<<: *base`) overrides the merged one on purpose: not a repeat."""
    found: list[_Repeated] = []
    stack: list[tuple[JsonPath, yaml.Node]] = [((), root)] if root is not None else []
    # An alias is the node it names: looked over once, at the path it is first written at (the walk
    # goes in the order of the text: children are pushed last first).
    seen: set[int] = set()
    while stack:
        path, node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack += reversed([((*path, index), item) for index, item in enumerate(node.value)])
            continue
        if not isinstance(node, yaml.MappingNode):
            continue
        keys: dict[Any, tuple[yaml.ScalarNode, yaml.Node]] = {}
        children: list[tuple[JsonPath, yaml.Node]] = []
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE:
                continue
            children.append(((*path, key.value), value))
            try:
                first, dropped = keys.setdefault(loader.construct_object(key), (key, value))
            except TypeError:  # a key read as no dict key can hold: constructing the document refuses it
                continue
            if first is not key:
                found.append(_Repeated((*path, key.value), first, dropped, key))
        stack += reversed(children)
    found.sort(key=lambda one: one.again.start_mark.index)
    return found


def _scenario_ids(root: yaml.Node | None) -> dict[int, str]:
    """The index of each item of the top-level `scenarios` list -> its `id`, as written."""
    if not isinstance(root, yaml.MappingNode):
        return {}
    items = next((v for k, v in root.value if k.value == "scenarios"), None)
    if not isinstance(items, yaml.SequenceNode):
        return {}
    return {
        index: ids[-1]
        for index, item in enumerate(items.value)
        if isinstance(item, yaml.MappingNode)
        and (ids := [v.value for k, v in item.value if k.value == "id" and isinstance(v, yaml.ScalarNode)])
    }


def _repeated_message(path: Path, repeated: _Repeated, ids: Mapping[int, str]) -> str:
    """`FILE:LINE:COL: scenario 'ID': field: ...` (`FILE:LINE:COL: a.b[0].c: ...` outside a scenario)."""
    where = repeated.where
    scenario = ""
    if len(where) > 2 and where[0] == "scenarios" and isinstance(where[1], int) and where[1] in ids:
        scenario, where = f"scenario {ids[where[1]]!r}: ", where[2:]
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where).lstrip(".")
    mark, first = repeated.again.start_mark, repeated.first.start_mark
    dropped = repeated.dropped
    # A label's value is what the repeat changes without a word: name it.
    what = f"the first ({dropped.value!r})" if isinstance(dropped, yaml.ScalarNode) else "the first"
    key, written = repeated.again, repeated.first
    # `on` and `yes` are one key to YAML 1.1 (both true): say so, or the two would look different.
    same = (
        f"the key {key.value!r} is given twice in one mapping"
        if key.value == written.value
        else f"the key {key.value!r} is the key {written.value!r} again, as YAML reads them"
    )
    return (
        f"{path}:{mark.line + 1}:{mark.column + 1}: {scenario}{field}: {same} (first on line "
        f"{first.line + 1}); YAML keeps only the last, dropping {what} without a word: give each key once"
    )


def load_scenarios(path: Path, environment: str | None = None) -> ScenarioSet:
    """Read and validate a scenario file; ids must be unique, and its `environment:` must be
    `environment` when one is given (the environment the scenarios are about to run on)."""
    text, data = read_yaml(path, ScenarioError, "scenario file")
    return _scenario_set(text, data, path, environment)


def load_scenarios_text(text: str, path: Path, environment: str | None = None) -> ScenarioSet:
    """`load_scenarios` of `text`, as if it were the content of `path` (checked before it is written)."""
    return _scenario_set(text, parse_yaml(text, path, ScenarioError), path, environment)


def _scenario_set(text: str, data: Any, path: Path, environment: str | None) -> ScenarioSet:
    if not isinstance(data, dict) or "scenarios" not in data:
        raise ScenarioError(f"{path}: expected a mapping with `environment` and a `scenarios` list")
    try:
        result = ScenarioSet.model_validate(data)
    except ValidationError as err:
        lines = yaml_lines(text)  # a second parse, for line numbers, only when there is an error
        problems = []
        for problem in err.errors():
            loc = problem["loc"]
            line = line_of(lines, loc)
            where = f"{path}:{line}" if line else str(path)
            if len(loc) >= 2 and loc[0] == "scenarios" and isinstance(loc[1], int):
                index = loc[1]
                items = data.get("scenarios") or []
                sid = items[index].get("id", f"#{index}") if isinstance(items[index], dict) else f"#{index}"
                field = ".".join(str(p) for p in loc[2:]) or "(the scenario)"
                problems.append(f"{where}: scenario '{sid}': {field}: {problem['msg']}")
            else:
                field = ".".join(str(p) for p in loc)
                problems.append(f"{where}: {field}: {problem['msg']}")
        # Ids used twice too, among the items as written: every problem of the file at once.
        items = data.get("scenarios")
        ids = [i.get("id") if isinstance(i, dict) else None for i in items] if isinstance(items, list) else []
        raise ScenarioError("\n".join(problems + _twice(ids, path, lines))) from None
    twice = _twice([s.id for s in result.scenarios], path, yaml_lines(text))
    if twice:
        raise ScenarioError("\n".join(twice))
    if environment is not None and result.environment != environment:
        raise ScenarioError(
            f"{path}:{_key_line(text, 'environment')}: environment: {result.environment!r}, but it is being "
            f"used with the environment {environment!r}; fix the file's line (`environment: {environment}`), or pass "
            f"--env {result.environment} (or name another file in improve.toml [environments.{environment}])"
        )
    result.source = str(path)
    return result


def _twice(ids: Sequence[Any], path: Path, lines: Mapping[JsonPath, int]) -> list[str]:
    """A problem for each item whose id an earlier item has (ids that are no string are the schema's
    to name), at its line."""
    seen: dict[str, int] = {}
    problems = []
    for index, sid in enumerate(ids):
        if not isinstance(sid, str):
            continue
        if sid in seen:
            line = line_of(lines, ("scenarios", index, "id"))
            problems.append(
                f"{path}{f':{line}' if line else ''}: scenario id '{sid}' is used twice (first as item "
                f"{seen[sid] + 1})"
            )
        else:
            seen[sid] = index
    return problems


def category_splits(path: Path) -> dict[str, set[str]]:
    """Each category the items of a scenario file name -> the splits they give it, valid items or not
    (the splits a check counts where the file does not load: an invalid held-out item still gives its
    category a held-out scenario once it is fixed, so none is said to be missing)."""
    found: dict[str, set[str]] = {}
    for item in _items(path)[1]:
        if (
            isinstance(item, dict)
            and isinstance(item.get("category"), str)
            and isinstance(item.get("split"), str)
        ):
            found.setdefault(item["category"], set()).add(item["split"])
    return found


def _key_line(text: str, key: str) -> int:
    """1-based line of a top-level key (1 when not found)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith(f"{key}:"):
            return number
    return 1
