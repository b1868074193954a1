"""Appending a scenario to a scenario file as text, so the file keeps its comments and layout.

The new item is written at the end of the `scenarios:` list in the style the bundled files use: one
key per line, `input` and each member of `world`, `people` and `expected` as a one-line flow value,
text in double quotes, the list's own indentation, and a blank line before it when the items are
separated by one. The result is read back with `load_scenarios` before it replaces the file, and must
hold the scenario exactly; otherwise nothing is written.

Two appends at once (two `improve scenarios add` processes) are a read-modify-write of one file: each
holds the lock of the file's directory from reading it to replacing it, so the second reads what the
first wrote and neither loses the other's scenario. The replacement is atomic (`write_atomic`):
a full disk leaves the file as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from improve.errors import ScenarioError
from improve.evals.scenarios import OPEN_SPLITS, Scenario, ScenarioSet, load_scenarios, load_scenarios_text
from improve.files import locked, write_atomic
from improve.machine import canonical_json


class _Dumper(yaml.SafeDumper):
    """One-line flow values; text with spaces or control characters in double quotes (escaped, so a
    ticket's line breaks stay on one line)."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    quoted = any(c.isspace() for c in value) or not value.isprintable()
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if quoted else None)


_Dumper.add_representer(str, _represent_str)


def flow(value: Any) -> str:
    """`value` as one line of flow YAML."""
    text = yaml.dump(
        value, Dumper=_Dumper, default_flow_style=True, sort_keys=False, allow_unicode=True, width=2**31
    )
    text = text.removesuffix("\n...\n").rstrip("\n")  # a lone scalar ends its document with `...`
    if "\n" in text:
        raise ScenarioError(f"cannot write {value!r} on one line of YAML")
    return text


def scenario_yaml(scenario: Scenario, indent: int = 2, comment: str | None = None) -> str:
    """The scenario as one item of a block list whose dashes stand at column `indent`."""
    pad = " " * indent
    body = pad + "  "
    lines = [f"{pad}# {' '.join(comment.split())}"] if comment else []
    lines.append(f"{pad}- id: {flow(scenario.id)}")
    lines.append(f"{body}category: {flow(scenario.category)}")
    lines.append(f"{body}split: {flow(scenario.split)}")
    if scenario.description:
        lines.append(f"{body}description: {flow(scenario.description)}")
    lines.append(f"{body}input: {flow(scenario.input)}")
    lines += _block(body, "world", scenario.world)
    if scenario.people:
        lines += _block(body, "people", scenario.people)
    expected: dict[str, Any] = {"outcome": scenario.expected.outcome}
    if scenario.expected.effects is not None:
        expected["effects"] = scenario.expected.effects
    lines += _block(body, "expected", expected)
    return "\n".join(lines) + "\n"


def _block(body: str, key: str, value: dict[str, Any]) -> list[str]:
    if not value:
        return [f"{body}{key}: {{}}"]
    return [f"{body}{key}:"] + [f"{body}  {flow(k)}: {flow(v)}" for k, v in value.items()]


def append_scenario(
    path: Path, scenario: Scenario, environment: str, comment: str | None = None
) -> ScenarioSet:
    """Append `scenario` to the scenario file at `path` (created, for `environment`, when missing) and
    return the file as it now loads. Refused, with nothing written, when the file does not load now,
    the id is taken, or the result would not load back holding exactly `scenario`."""
    target = path.resolve()  # a symlinked file (the bundled desks') is written where it lives
    target.parent.mkdir(parents=True, exist_ok=True)
    # The directory is the lock: a lock file beside the scenario file would be one more file in git.
    with locked(target.parent, f"the scenario file {path}"):
        if target.exists():
            current = load_scenarios(target, environment)
            taken = current.by_id().get(scenario.id)
            if taken is not None:
                raise ScenarioError(
                    f"{path}: scenario id '{scenario.id}' is already used; pass --id with another id"
                )
            text = target.read_text(encoding="utf-8")
            new_text = _appended(text, scenario, target, comment)
        else:
            new_text = f"environment: {flow(environment)}\nscenarios:\n" + scenario_yaml(scenario, 2, comment)
        return _replace_checked(path, target, new_text, scenario, environment)


def _appended(text: str, scenario: Scenario, path: Path, comment: str | None) -> str:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    assert isinstance(root, yaml.MappingNode)  # load_scenarios read a mapping with a list under it
    pairs = root.value
    position = next(i for i, (key, _) in enumerate(pairs) if key.value == "scenarios")
    node = pairs[position][1]
    assert isinstance(node, yaml.SequenceNode)
    lines = text.splitlines(keepends=True)
    if node.flow_style and node.value:
        raise ScenarioError(
            f"{path}:{node.start_mark.line + 1}: the scenarios list is written in flow style ([...]); write "
            "it as a block list (one `- id: ...` item per scenario) to append to it"
        )
    if node.flow_style:  # `scenarios: []`: the brackets go, the list starts on the next line
        text = text[: node.start_mark.index] + text[node.end_mark.index :]
        lines = text.splitlines(keepends=True)
        at = node.start_mark.line + 1
        indent, separator = 2, ""
    else:
        last = node.value[-1]
        dash_line = lines[last.start_mark.line]
        dash = dash_line.rfind("-", 0, last.start_mark.column)
        indent = dash if dash >= 0 else 2
        separator = "\n" if _blank_before(lines, last.start_mark.line) else ""
        at = len(lines) if position == len(pairs) - 1 else _before_key(lines, pairs[position + 1][0])
    head = "".join(lines[:at])
    if head and not head.endswith("\n"):
        head += "\n"
    return head + separator + scenario_yaml(scenario, indent, comment) + "".join(lines[at:])


def _blank_before(lines: list[str], line: int) -> bool:
    """Whether the item starting at `line` is set off by a blank line (comments above it aside)."""
    for previous in range(line - 1, -1, -1):
        stripped = lines[previous].strip()
        if not stripped:
            return True
        if not stripped.startswith("#"):
            return False
    return False


def _before_key(lines: list[str], key: yaml.Node) -> int:
    """The line where the next top-level key's block starts: its own line, less the comments and blank
    lines right above it (they belong to it)."""
    at = key.start_mark.line
    while at > 0 and (not lines[at - 1].strip() or lines[at - 1].lstrip().startswith("#")):
        at -= 1
    return at


def _replace_checked(
    path: Path, target: Path, text: str, scenario: Scenario, environment: str
) -> ScenarioSet:
    """Check that `text` loads holding exactly `scenario`, then replace the file with it (atomically)."""
    try:
        loaded = load_scenarios_text(text, target, environment)
    except ScenarioError as error:
        raise ScenarioError(
            f"appending scenario '{scenario.id}' would leave {path} unreadable, so nothing was written: {error}"
        ) from None
    if loaded.by_id().get(scenario.id) != scenario:
        raise ScenarioError(
            f"appending scenario '{scenario.id}' to {path} would not read back as the same scenario "
            "(the file's layout around the `scenarios:` list?); nothing was written"
        )
    write_atomic(target, text)
    loaded.source = str(path)
    return loaded


def split_warnings(scenarios: Sequence[Scenario], category: str) -> list[str]:
    """A category in only one of train and held-out fails `improve scenarios check`: say which split it
    still needs (`scenarios`: the open ones). The sealed test split needs nothing: a category may be in it
    alone, or not at all."""
    splits = {s.split for s in scenarios if s.category == category}
    missing = [split for split in OPEN_SPLITS if split not in splits]
    if not missing or not splits:
        return []
    return [
        f"category '{category}' has no scenario in {', '.join(missing)} yet: `improve scenarios check` "
        f"fails until one is added (every category needs both train and held-out); add one with --split {missing[0]} "
        f"--category {category}"
    ]


def alike_warnings(scenarios: ScenarioSet, only: Scenario | None = None) -> list[str]:
    """Scenarios that start from the same input, world and people (one of them `only`, when given), said,
    not refused (a person may mean it, but rarely does). Values compare as the tools read them (140 and
    140.0 alike). Two kinds:
    - labelled otherwise: no policy passes both, and every rule is measured against a coin (a label
      mistyped, or a case whose difference the file does not hold);
    - of different splits: the held-out or test score of one measures a run training has already seen."""
    by_input: dict[str, list[Scenario]] = {}
    for s in scenarios.scenarios:
        by_input.setdefault(canonical_json(s.input), []).append(s)
    warnings = []
    for same_input in by_input.values():
        groups: list[list[Scenario]] = []
        for s in same_input:
            group = next((g for g in groups if g[0].world == s.world and g[0].people == s.people), None)
            if group is None:
                groups.append([s])
            else:
                group.append(s)
        for same in groups:
            if len(same) < 2 or (only is not None and only.id not in {s.id for s in same}):
                continue
            labels: list[dict[str, Any]] = []  # compared as the tools read them too (140 == 140.0)
            for s in same:
                if (label := s.expected.model_dump(mode="json")) not in labels:
                    labels.append(label)
            if len(labels) > 1:
                said = ", ".join(f"'{s.id}' ({s.expected.outcome})" for s in same)
                warnings.append(
                    f"scenarios {said} start from the same input, world and people but are labelled "
                    "otherwise: no policy can pass them all; correct the label that is wrong, or give the "
                    "case what tells it apart"
                )
            if len({s.split for s in same}) > 1:
                named = ", ".join(f"'{s.id}' ({s.split})" for s in same)
                warnings.append(
                    f"scenarios {named} start from the same input, world and people: a score on one split of "
                    "a run the other split's scenario already holds measures what training saw; give each "
                    "split its own cases"
                )
    return warnings


def write_drafts(path: Path, environment: str, drafts: Sequence[tuple[Scenario, str]]) -> ScenarioSet:
    """A new scenario file at `path` holding `drafts` (each scenario with a comment above it), for a person
    to check and move into the environment's own file. Refused, with nothing written, when `path` exists
    (nothing a person edited is ever replaced); read back with `load_scenarios` before it is kept."""
    text = f"environment: {flow(environment)}\nscenarios:\n" + "\n".join(
        scenario_yaml(scenario, 2, comment) for scenario, comment in drafts
    )
    loaded = load_scenarios_text(text, path, environment)
    if [s.id for s in loaded.scenarios] != [s.id for s, _ in drafts]:
        raise ScenarioError(f"{path}: the drafts did not read back as written; nothing written")
    try:
        with path.open("x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        raise ScenarioError(
            f"{path}: already exists; the drafts go to a new file (name another, or move this one away)"
        ) from None
    except OSError as error:
        path.unlink(missing_ok=True)
        raise ScenarioError(f"{path}: cannot be written ({error.strerror or error})") from None
    return loaded
