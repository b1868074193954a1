"""The code agent's repository: a small repository held in memory, and the commands the tools run on it.

The original agent shelled out to `moss view`, `moss text-search` and a shell. Here the same commands
run against a repository held in memory (the fixture repository shipped with the example, or a
scenario's own files), so every output is a pure function of the command and the files: a run
reproduces exactly, and a replay needs nothing but the log.

Commands (the spelling the original's prompts taught its model):

    view PATH                 a file with line numbers, or a directory listing
    view PATH:START-END       lines START to END of a file (1-based, inclusive)
    text-search "PATTERN"     every line containing PATTERN (case-sensitive), as `path:line: text`
    run PROGRAM ARGS...       only programs on the allowlist: ls, wc -l, head [-n N], grep [-c] P FILE

An output longer than `MAX_OUTPUT` characters is cut at a line boundary and ends with a marker that
says how much was cut and, for a file, which lines are missing and which range to view instead.

Every result also suggests the commands that make sense next (the entries of a listing, the ranges
a cut view left out, the lines around each search hit); the agent's menu of commands grows with them,
so the explorer's choice is always among commands that exist.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "fixture_repo"
MAX_OUTPUT = 2000
"""Characters of output a command may show; more is cut with a marker (the original cut at 10 KB)."""
ALLOWED_PROGRAMS = ("ls", "wc", "head", "grep")
MAX_HITS = 40
"""Search hits shown before the rest are only counted."""
SUGGESTED_HITS = 5
"""Search hits whose surrounding lines are suggested as ranges to view."""
HIT_CONTEXT = (2, 22)
"""Lines before and after a search hit in a suggested range: enough for a definition's body."""
TRUNCATED = "[... output truncated:"

_MENTION = re.compile(r"(?<![\w/])((?:[\w.-]+/)*[\w.-]+\.(?:rs|lua|toml|md)|(?:[\w.-]+/)+)(?![\w/])")
_TERM = re.compile(r"`([^`]+)`")


@functools.cache
def fixture_files() -> dict[str, str]:
    """The bundled fixture repository: path (POSIX, relative) -> text."""
    return {
        path.relative_to(FIXTURE).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(FIXTURE.rglob("*"))
        if path.is_file()
    }


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


class Repo:
    """A repository as a map of paths to text; directories are implied by the paths."""

    def __init__(self, files: Mapping[str, str]) -> None:
        self.files = {self.normal(p): t for p, t in sorted(files.items())}
        dirs = {"."}
        for path in self.files:
            parts = path.split("/")[:-1]
            dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        self.dirs = dirs

    @staticmethod
    def normal(path: str) -> str:
        """`./src/` -> `src`; the root is `.`."""
        path = path.strip().replace("\\", "/")
        while path.startswith("./"):
            path = path[2:]
        path = path.rstrip("/")
        return path or "."

    def children(self, directory: str) -> list[str]:
        """Entry names of a directory, sorted; subdirectories end with `/`."""
        prefix = "" if directory == "." else directory + "/"
        names: set[str] = set()
        for path in [*self.files, *self.dirs]:
            if path == directory or not path.startswith(prefix) or path == ".":
                continue
            rest = path[len(prefix) :]
            head, _, tail = rest.partition("/")
            names.add(head + "/" if tail or path in self.dirs else head)
        return sorted(names)

    def join(self, directory: str, name: str) -> str:
        return self.normal(name if directory == "." else f"{directory}/{name}")

    def resolve(self, query: str) -> str | None:
        """An exact file or directory, else the one file whose path ends with the query (like the
        original's fuzzy path resolution: `view llm.rs` finds `src/llm.rs`)."""
        name = self.normal(query)
        if name in self.files or name in self.dirs:
            return name
        matches = [p for p in self.files if p.endswith("/" + name)]
        return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True)
class Result:
    """One command's outcome: what the agent sees, and the commands it suggests next."""

    command: str
    ok: bool
    output: str
    truncated: bool = False
    suggestions: list[str] = field(default_factory=list)

    def item(self) -> dict[str, Any]:
        """The output as the agent's context holds it (ephemeral unless the evaluator keeps it)."""
        return {"command": self.command, "ok": self.ok, "output": self.output, "truncated": self.truncated}


def _failure(command: str, message: str) -> Result:
    return Result(command, False, message)


def cap(text: str, limit: int = MAX_OUTPUT) -> tuple[str, int]:
    """The text cut at the last line boundary within `limit`, and how many characters were cut."""
    if len(text) <= limit:
        return text, 0
    kept = text[:limit]
    if "\n" in kept:
        kept = kept[: kept.rindex("\n")]
    return kept, len(text) - len(kept)


def _numbered(number: int, line: str) -> str:
    return f"{number:>4}| {line}"


def _windows(path: str, lines: list[str], first: int, last: int) -> list[str]:
    """Ranges that cover lines first..last, each small enough to be shown whole."""
    out: list[str] = []
    start = first
    while start <= last:
        size = len(path) + 40
        end = start
        while end <= last and size + len(_numbered(end, lines[end - 1])) + 1 <= MAX_OUTPUT - 120:
            size += len(_numbered(end, lines[end - 1])) + 1
            end += 1
        end = max(end - 1, start)
        out.append(f"view {path}:{start}-{end}")
        start = end + 1
    return out


def view_file(
    repo: Repo, command: str, path: str, start: int | None = None, end: int | None = None
) -> Result:
    lines = _lines(repo.files[path])
    total = len(lines)
    if start is None or end is None:
        first, last = 1, total
        header = f"{path} ({total} lines)"
    else:
        if start < 1 or end < start or start > total:
            return _failure(command, f"view: {path} has {total} lines; {start}-{end} is not a range of it")
        first, last = start, min(end, total)
        header = f"{path}:{first}-{last} (of {total} lines)"
    body = [_numbered(n, lines[n - 1]) for n in range(first, last + 1)]
    text, cut = cap("\n".join([header, *body]))
    if not cut:
        return Result(command, True, text)
    shown = len(text.split("\n")) - 1
    hidden_from = first + shown
    ranges = _windows(path, lines, hidden_from, last)
    marker = (
        f"{TRUNCATED} {cut} more characters not shown (lines {hidden_from}-{last}); "
        f"view a range such as {ranges[0].removeprefix('view ')}]"
    )
    return Result(command, True, f"{text}\n{marker}", truncated=True, suggestions=ranges)


def view_dir(repo: Repo, command: str, directory: str) -> Result:
    names = repo.children(directory)
    shown = "./" if directory == "." else directory + "/"
    text, cut = cap("\n".join([f"{shown} ({len(names)} entries)", *(f"  {n}" for n in names)]))
    if cut:
        text += f"\n{TRUNCATED} {cut} more characters not shown]"
    return Result(
        command,
        True,
        text,
        truncated=bool(cut),
        suggestions=[f"view {repo.join(directory, n)}" for n in names],
    )


def view(repo: Repo, command: str, target: str) -> Result:
    match = re.fullmatch(r"(.+):(\d+)-(\d+)", target.strip())
    name = match.group(1) if match else target
    path = repo.resolve(name)
    if path is None:
        return _failure(command, f"view: no such file or directory: {name}")
    if path in repo.dirs:
        if match:
            return _failure(command, f"view: {path} is a directory; a line range needs a file")
        return view_dir(repo, command, path)
    if match:
        return view_file(repo, command, path, int(match.group(2)), int(match.group(3)))
    return view_file(repo, command, path)


def text_search(repo: Repo, command: str, pattern: str) -> Result:
    if not pattern:
        return _failure(command, 'text-search: give a pattern, e.g. text-search "Provider"')
    hits = [
        (path, number, line.strip())
        for path, text in repo.files.items()
        for number, line in enumerate(_lines(text), start=1)
        if pattern in line
    ]
    if not hits:
        return _failure(command, f'no matches for "{pattern}"')
    files = sorted({p for p, _, _ in hits}, key=[p for p, _, _ in hits].index)
    lines = [f"{p}:{n}: {t}" for p, n, t in hits[:MAX_HITS]]
    if len(hits) > MAX_HITS:
        lines.append(f"... and {len(hits) - MAX_HITS} more matches")
    lines.append(f"{len(hits)} matches in {len(files)} files")
    text, cut = cap("\n".join(lines))
    if cut:
        text += f"\n{TRUNCATED} {cut} more characters not shown]"
    suggestions = []
    for path, number, _ in hits[:SUGGESTED_HITS]:
        total = len(_lines(repo.files[path]))
        suggestions.append(
            f"view {path}:{max(1, number - HIT_CONTEXT[0])}-{min(total, number + HIT_CONTEXT[1])}"
        )
    suggestions += [f"view {p}" for p in files[:SUGGESTED_HITS]]
    return Result(command, True, text, truncated=bool(cut), suggestions=suggestions)


def run_program(repo: Repo, command: str, args: str) -> Result:
    """`run`: a few read-only programs, implemented over the repository; anything else is refused."""
    try:
        argv = shlex.split(args)
    except ValueError as err:
        return _failure(command, f"run: cannot parse the command line: {err}")
    if not argv:
        return _failure(command, f"run: give a program; allowed: {', '.join(ALLOWED_PROGRAMS)}")
    program, rest = argv[0], argv[1:]
    if program not in ALLOWED_PROGRAMS:
        return _failure(
            command, f"run: {program} is not allowed; allowed programs: {', '.join(ALLOWED_PROGRAMS)}"
        )
    flags = [a for a in rest if a.startswith("-")]
    operands = [a for a in rest if not a.startswith("-")]
    if program == "ls":
        target = repo.resolve(operands[0]) if operands else "."
        if target is None or target not in repo.dirs:
            return _failure(command, f"ls: cannot access {operands[0]}: no such directory")
        listing = view_dir(repo, command, target)
        return Result(
            command, True, "\n".join(listing.output.split("\n")[1:]), suggestions=listing.suggestions
        )
    if program == "head":
        count = 10
        if "-n" in rest:
            index = rest.index("-n")
            if index + 1 >= len(rest) or not rest[index + 1].isdigit():
                return _failure(command, "head: -n needs a number")
            count = int(rest[index + 1])
            operands = [a for a in operands if a != rest[index + 1]]
        paths = [repo.resolve(o) for o in operands]
        if not paths or any(p is None or p not in repo.files for p in paths):
            return _failure(command, "head: give existing files")
        text = "\n".join("\n".join(_lines(repo.files[p])[:count]) for p in paths if p)
        shown, cut = cap(text)
        return Result(
            command, True, shown + (f"\n{TRUNCATED} {cut} more characters not shown]" if cut else "")
        )
    if program == "wc":
        if flags != ["-l"]:
            return _failure(command, "wc: only wc -l FILE... is allowed")
        paths = [repo.resolve(o) for o in operands]
        if not paths or any(p is None or p not in repo.files for p in paths):
            return _failure(command, "wc: give existing files")
        return Result(command, True, "\n".join(f"{len(_lines(repo.files[p]))} {p}" for p in paths if p))
    # grep [-c] PATTERN FILE
    if len(operands) != 2 or set(flags) - {"-c", "-n"}:
        return _failure(command, "grep: only grep [-c] [-n] PATTERN FILE is allowed")
    pattern, name = operands
    path = repo.resolve(name)
    if path is None or path not in repo.files:
        return _failure(command, f"grep: {name}: no such file")
    found = [(n, line) for n, line in enumerate(_lines(repo.files[path]), start=1) if pattern in line]
    if "-c" in flags:
        return Result(command, True, str(len(found)))
    if not found:
        return _failure(command, "")
    text = "\n".join(f"{n}:{line}" if "-n" in flags else line for n, line in found)
    shown, cut = cap(text)
    return Result(command, True, shown + (f"\n{TRUNCATED} {cut} more characters not shown]" if cut else ""))


def execute(repo: Repo, command: str) -> Result:
    """Run one command against the repository. Unknown commands and bad arguments are failed results
    (the agent sees the error), never exceptions."""
    name, _, rest = command.strip().partition(" ")
    rest = rest.strip()
    if name == "view":
        return view(repo, command, rest) if rest else _failure(command, "view: give a path")
    if name == "text-search":
        quoted = re.fullmatch(r'"(.*)"', rest)
        return text_search(repo, command, quoted.group(1) if quoted else rest)
    if name == "run":
        return run_program(repo, command, rest)
    return _failure(command, f"unknown command {name!r}; commands are view, text-search and run")


def mentions(task: str) -> list[str]:
    """Paths a task names (`src/llm.rs`, `scripts/`), in order."""
    return list(dict.fromkeys(m.group(1) for m in _MENTION.finditer(task)))


def terms(task: str) -> list[str]:
    """Words a task quotes in backticks, which are worth searching for (paths excepted)."""
    return [t for t in dict.fromkeys(_TERM.findall(task)) if "/" not in t and not _MENTION.fullmatch(t)]


def opening_menu(repo: Repo, task: str) -> list[str]:
    """The commands that make sense before anything has been seen: the root listing, the paths the
    task names (a directory also by `run ls`), and a search for each term it quotes."""
    menu = ["view ."]
    for mention in mentions(task):
        path = repo.resolve(mention)
        if path is None:
            continue
        menu.append(f"view {path}")
        if path in repo.dirs:
            menu.append(f"run ls {path}")
    menu += [f'text-search "{t}"' for t in terms(task)]
    return merge(menu, ())


def merge(menu: Iterable[str], more: Iterable[str]) -> list[str]:
    """The menu with new suggestions appended, each command once, in first-seen order."""
    return list(dict.fromkeys([*menu, *more]))
