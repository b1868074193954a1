"""How the stand-in models read: a question's kind, and what the outputs they were shown support.

A real model reads the task and the command outputs in its prompt; a stand-in needs the same two
skills as code. `parse_question` recognises the question templates of the scenarios (the kinds of
question the original agent was asked: variants of an enum, the first struct of a file, a default
setting, how many scripts, ...). `read` turns the outputs and notes a model was shown back into
what they say (visible file lines, directory entries, search hits). `derive` answers the question
from that, or returns None when the evidence is not there: a model that answers anyway is
guessing, and the world's label will say so.

Nothing here looks at labels: every answer comes from tool output the model was shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.examples.code_agent.repo import TRUNCATED, mentions, terms

_WHOLE = re.compile(r"^(\S+) \((\d+) lines\)$")
_RANGE = re.compile(r"^(\S+):(\d+)-(\d+) \(of (\d+) lines\)$")
_DIR = re.compile(r"^(\S+)/ \((\d+) entries\)$")
_LINE = re.compile(r"^\s*(\d+)\| ?(.*)$")
_HIT = re.compile(r"^(\S+?):(\d+): (.*)$")
_NOTE = re.compile(r"^(\S+): (\w+) = (.+)$")
_FN = re.compile(r"^\s*(?:pub(?:\([\w:]+\))? )?(?:async )?fn (\w+)")
_VALUE = r"(\"[^\"]*\"|[0-9][0-9_.]*|true|false)"


@dataclass(frozen=True)
class Question:
    """What a task asks. `files` are the paths it names; `term` the word worth searching for."""

    kind: str
    task: str
    files: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    directory: str | None = None
    term: str | None = None

    @property
    def lookup(self) -> bool:
        """A single-file lookup (the kind a naive model believes it can answer from memory)."""
        return self.kind in LOOKUP_KINDS and len(self.files) == 1


_TEMPLATES: list[tuple[str, re.Pattern[str]]] = [
    ("enum-count", re.compile(r"How many variants does the `(\w+)` enum(?: in (\S+))? have\?")),
    ("first-struct", re.compile(r"What is the first struct in (\S+)\?")),
    ("default", re.compile(r"What is the default `(\w+)` in (\S+)\?")),
    ("exported-count", re.compile(r"How many exported functions are in (\S+)\?")),
    ("file-count", re.compile(r"How many (Lua scripts|Rust files) are in (\S+?)/?\?")),
    ("manifest", re.compile(r"(?:Which Rust edition|What minimum Rust version \(`(rust-version)`\))")),
    ("which-file", re.compile(r"Which file defines the (function|struct|enum) `(\w+)`\?")),
    ("last-fn", re.compile(r"What is the last function defined in (\S+)\?")),
    ("fn-count", re.compile(r"How many functions are defined in (\S+)\?")),
    ("cross-check", re.compile(r"Do `(\w+)` in (\S+) and `(\w+)` in (\S+) have the same value\?")),
]

LOOKUP_KINDS = frozenset({"enum-count", "first-struct", "default", "exported-count"})
"""Questions about one fact of one named file."""


def parse_question(task: str) -> Question:
    """The question's kind and parameters; `unknown` when no template matches."""
    files = tuple(m for m in mentions(task) if not m.endswith("/"))
    term = next(iter(terms(task)), None)
    for kind, pattern in _TEMPLATES:
        match = pattern.search(task)
        if match is None:
            continue
        groups = match.groups()
        if kind == "enum-count":
            return Question(kind, task, files, (groups[0],), term=groups[0])
        if kind == "default":
            return Question(kind, task, files, (groups[0],), term=groups[0])
        if kind == "file-count":
            return Question(
                kind, task, names=(".lua" if groups[0] == "Lua scripts" else ".rs",), directory=groups[1]
            )
        if kind == "manifest":
            key = "rust-version" if groups[0] else "edition"
            return Question(kind, task, ("Cargo.toml",) if "Cargo.toml" in task else (), (key,), term=term)
        if kind == "which-file":
            return Question(kind, task, files, (groups[0], groups[1]), term=groups[1])
        if kind == "cross-check":
            return Question(kind, task, (groups[1], groups[3]), (groups[0], groups[2]))
        return Question(kind, task, files, term=term)
    return Question("unknown", task, files, term=term)


@dataclass
class Seen:
    """What the outputs and notes a model was shown say."""

    lines: dict[str, dict[int, str]] = field(default_factory=dict)
    """File path -> visible line number -> text."""
    totals: dict[str, int] = field(default_factory=dict)
    dirs: dict[str, list[str]] = field(default_factory=dict)
    hits: list[tuple[str, int, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def visible(self, path: str, first: int, last: int) -> bool:
        shown = self.lines.get(path, {})
        return all(n in shown for n in range(first, last + 1))

    def whole(self, path: str) -> bool:
        return path in self.totals and self.visible(path, 1, self.totals[path])

    def texts(self, path: str) -> list[tuple[int, str]]:
        """Visible lines of a file, and search hits in it, by line number."""
        found = dict(self.lines.get(path, {}))
        for hit_path, number, text in self.hits:
            if hit_path == path:
                found.setdefault(number, text)
        return sorted(found.items())


def read(items: Iterable[Mapping[str, Any]], notes: Iterable[str] = ()) -> Seen:
    """Parse command outputs (`{command, ok, output}` items) in the tools' formats."""
    seen = Seen(notes=[str(n) for n in notes])
    for item in items:
        command = str(item.get("command", ""))
        seen.commands.append(command)
        if not item.get("ok"):
            continue
        text_lines = str(item.get("output", "")).split("\n")
        head = text_lines[0] if text_lines else ""
        body = [line for line in text_lines[1:] if not line.startswith(TRUNCATED)]
        if command.startswith("text-search"):
            for line in text_lines:
                match = _HIT.match(line)
                if match:
                    seen.hits.append((match.group(1), int(match.group(2)), match.group(3)))
            continue
        if command.startswith("run ls"):
            target = command.removeprefix("run ls").strip() or "."
            seen.dirs[target.rstrip("/") or "."] = [line.strip() for line in text_lines if line.strip()]
            continue
        if (m := _DIR.match(head)) is not None:
            seen.dirs[m.group(1)] = [line.strip() for line in body if line.strip()]
            continue
        whole, ranged = _WHOLE.match(head), _RANGE.match(head)
        if whole is not None:
            path, total = whole.group(1), int(whole.group(2))
        elif ranged is not None:
            path, total = ranged.group(1), int(ranged.group(4))
        else:
            continue
        seen.totals[path] = total
        shown = seen.lines.setdefault(path, {})
        for line in body:
            numbered = _LINE.match(line)
            if numbered:
                shown[int(numbered.group(1))] = numbered.group(2)
    return seen


def _block(texts: Sequence[tuple[int, str]], start: int) -> list[str] | None:
    """The lines after line `start` up to its closing `}`; None when a line in between is missing."""
    out: list[str] = []
    expected = start + 1
    for number, text in texts:
        if number <= start:
            continue
        if number != expected:
            return None
        if text.strip().startswith("}"):
            return out
        out.append(text)
        expected += 1
    return None


def _value(texts: Sequence[tuple[int, str]], name: str) -> str | None:
    pattern = re.compile(rf"\b{re.escape(name)}\s*[:=]\s*{_VALUE}")
    for _, text in texts:
        match = pattern.search(text)
        if match:
            return match.group(1).strip('"')
    return None


def _noted(seen: Seen, path: str, name: str) -> str | None:
    for note in seen.notes:
        match = _NOTE.match(note)
        if match and match.group(1) == path and match.group(2) == name:
            return match.group(3)
    return None


def value_of(seen: Seen, path: str, name: str) -> str | None:
    """A setting's literal value in a file (from its lines, search hits or a note)."""
    return _noted(seen, path, name) or _value(seen.texts(path), name)


def _fns(texts: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, t in texts if (m := _FN.match(t))]


def derive(question: Question, seen: Seen, lenient: bool = False) -> str | None:
    """The answer the evidence supports, or None. `lenient` reads a partial view as if it were the
    whole file (how a model hallucinates: the last function it saw becomes "the last function")."""
    kind = question.kind
    if kind == "enum-count":
        name = question.names[0]
        paths = list(question.files) or sorted({*seen.lines, *(p for p, _, _ in seen.hits)})
        for path in paths:
            texts = seen.texts(path)
            for number, text in texts:
                if re.search(rf"\benum {name}\b", text):
                    block = _block(texts, number)
                    if block is not None:
                        variants = [t for t in block if re.match(r"^\s*[A-Z]\w*", t)]
                        return str(len(variants))
        return None
    if kind == "first-struct":
        path = question.files[0]
        for number, text in sorted(seen.lines.get(path, {}).items()):
            if not seen.visible(path, 1, number):
                return None
            match = re.search(r"\bstruct (\w+)", text)
            if match:
                return match.group(1)
        return None
    if kind == "default":
        return value_of(seen, question.files[0], question.names[0]) if question.files else None
    if kind == "exported-count":
        path = question.files[0]
        if not seen.whole(path):
            return None
        return str(sum(1 for _, t in seen.texts(path) if re.match(r"^function M\.\w+", t)))
    if kind == "file-count":
        directory = (question.directory or ".").rstrip("/")
        entries = seen.dirs.get(directory)
        if entries is None:
            return None
        return str(sum(1 for e in entries if e.endswith(question.names[0])))
    if kind == "manifest":
        key = question.names[0]
        pattern = re.compile(rf'^{re.escape(key)}\s*=\s*"([^"]+)"')
        for _, text in seen.texts("Cargo.toml"):
            match = pattern.match(text.strip())
            if match:
                return match.group(1)
        return None
    if kind == "which-file":
        keyword = {"function": "fn", "struct": "struct", "enum": "enum"}[question.names[0]]
        pattern = re.compile(rf"\b{keyword} {re.escape(question.names[1])}\b")
        for path, _, text in seen.hits:
            if pattern.search(text):
                return path
        for path, shown in seen.lines.items():
            if any(pattern.search(t) for t in shown.values()):
                return path
        return None
    if kind in ("last-fn", "fn-count"):
        path = question.files[0]
        texts = seen.texts(path)
        fns = _fns(texts)
        total = seen.totals.get(path)
        if lenient:
            if not fns:
                return None
            return fns[-1][1] if kind == "last-fn" else str(len(fns))
        if total is None:
            return None
        if kind == "fn-count":
            return str(len(fns)) if seen.whole(path) else None
        for number, name in reversed(fns):
            if seen.visible(path, number, total):
                return name
        return None
    if kind == "cross-check":
        (first, second), (left, right) = question.files, question.names
        a, b = value_of(seen, first, left), value_of(seen, second, right)
        if a is None or b is None:
            return None
        return "yes" if a == b else "no"
    return None


def findings(question: Question, seen: Seen) -> list[str]:
    """Notes worth writing down for a question that needs more than one output (`path: name =
    value`), for a careful evaluator."""
    if question.kind != "cross-check":
        return []
    notes = []
    for path, name in zip(question.files, question.names, strict=True):
        value = _value(seen.texts(path), name)
        if value is not None and _noted(seen, path, name) is None:
            notes.append(f"{path}: {name} = {value}")
    return notes


BELIEFS = {
    "enum-count": "2",
    "first-struct": "Args",
    "default": "100",
    "file-count": "2",
    "manifest": "2018",
    "which-file": "src/lib.rs",
    "last-fn": "main",
    "fn-count": "2",
    "cross-check": "yes",
}
"""What a naive model believes before reading anything, per kind of question (no belief about how many
functions a Lua module exports): the answers it hallucinates."""


def belief(question: Question) -> str | None:
    """A naive model's prior answer, or None when it has none (then it does not answer blind)."""
    return BELIEFS.get(question.kind)


def guess(question: Question) -> str:
    """Any answer at all, for a model that must say something (a hallucination)."""
    return {
        "enum-count": "2",
        "first-struct": "Args",
        "default": "100",
        "exported-count": "2",
        "file-count": "2",
        "manifest": "2018",
        "which-file": "src/lib.rs",
        "last-fn": "main",
        "fn-count": "2",
        "cross-check": "yes",
    }.get(question.kind, "I don't know")
