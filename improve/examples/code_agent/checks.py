"""The code agent's validation command: the project check run in the shadow copy of the repository.

The fixture repository is a Rust project, but no Rust toolchain is assumed; this script stands in for
`cargo check` with the errors the compiler would give for the kinds of change the agent is asked to
make, read from the files in the current directory (the shadow copy):

- every `.rs` file has balanced brackets;
- every `ENUM::VARIANT` path names a variant the enum declares (a removed variant still used fails);
- a `match` in a function `parse_<enum>` covers every variant of the enum (an added variant must be
  parsed too);
- a `#[derive(Subcommand)]` enum's variants are each matched in its file and documented in
  docs/cli.md as `tern <kebab-case name>`;
- `impl Default for S` sets every field of struct S and no other;
- Cargo.toml parses and names the package, its version and edition.

Each problem is printed as `path: message`; the exit status is 1 when there is one, 0 otherwise. It
imports nothing but the standard library and is run isolated (`python -I checks.py`), with a timeout,
by the environment (an argv list from its allowlist, no shell).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ENUM = re.compile(r"\benum\s+(\w+)\s*\{(.*?)\n\}", re.S)
STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{(.*?)\n\}", re.S)
PATHS = re.compile(r"\b([A-Z]\w*)::([A-Z]\w*)")
PARSE_FN = re.compile(r"fn\s+parse_(\w+)\s*\([^)]*\)[^{]*\{(.*?)\n\}", re.S)
DEFAULT_IMPL = re.compile(r"impl\s+Default\s+for\s+(\w+)\s*\{.*?\1\s*\{(.*?)\n\s*\}", re.S)
PAIRS = {")": "(", "]": "[", "}": "{"}


def variants(body: str) -> list[str]:
    """The variant names of an enum body (one per line, `Name`, `Name { .. }` or `Name(..)`)."""
    names = []
    for line in body.split("\n"):
        line = line.strip()
        if not line or line.startswith(("//", "#")):
            continue
        match = re.match(r"([A-Z]\w*)", line)
        if match:
            names.append(match.group(1))
    return names


def fields(body: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\s*(?:pub\s+)?(\w+)\s*:", body, re.M)]


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def kebab(name: str) -> str:
    return snake(name).replace("_", "-")


def balanced(text: str) -> str | None:
    stack: list[str] = []
    code = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)\'|//[^\n]*', "", text)
    for number, line in enumerate(code.split("\n"), start=1):
        for char in line:
            if char in "([{":
                stack.append(char)
            elif char in PAIRS and (not stack or stack.pop() != PAIRS[char]):
                return f"line {number}: unbalanced '{char}'"
    return f"unclosed '{stack[-1]}'" if stack else None


def check(root: Path) -> list[str]:
    problems: list[str] = []
    sources = {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.rs"))
    }
    enums: dict[str, list[str]] = {}
    structs: dict[str, list[str]] = {}
    for path, text in sources.items():
        bad = balanced(text)
        if bad:
            problems.append(f"{path}: {bad}")
        for match in ENUM.finditer(text):
            enums[match.group(1)] = variants(match.group(2))
        for match in STRUCT.finditer(text):
            structs[match.group(1)] = fields(match.group(2))
    for path, text in sources.items():
        for enum, variant in PATHS.findall(text):
            if enum in enums and variant not in enums[enum]:
                problems.append(f"{path}: no variant `{variant}` in enum `{enum}`")
        for match in PARSE_FN.finditer(text):
            enum = next((e for e in enums if snake(e) == match.group(1)), None)
            if enum is None:
                continue
            handled = set(re.findall(rf"\b{enum}::([A-Z]\w*)", match.group(2)))
            for variant in enums[enum]:
                if variant not in handled:
                    problems.append(f"{path}: parse_{match.group(1)} does not handle `{enum}::{variant}`")
        for match in DEFAULT_IMPL.finditer(text):
            struct, body = match.group(1), match.group(2)
            declared, given = structs.get(struct, []), fields(body)
            problems += [
                f"{path}: missing field `{f}` in the default {struct}" for f in declared if f not in given
            ]
            problems += [f"{path}: struct `{struct}` has no field `{f}`" for f in given if f not in declared]
        for match in re.finditer(r"#\[derive\(Subcommand\)\]\s*enum\s+(\w+)", text):
            enum = match.group(1)
            docs_path = root / "docs" / "cli.md"
            docs = docs_path.read_text(encoding="utf-8") if docs_path.is_file() else ""
            for variant in enums.get(enum, []):
                if not re.search(rf"\b{enum}::{variant}\b", text):
                    problems.append(f"{path}: non-exhaustive match: `{enum}::{variant}` not covered")
                if f"`tern {kebab(variant)}" not in docs:
                    problems.append(f"docs/cli.md: subcommand `tern {kebab(variant)}` is not documented")
    manifest = root / "Cargo.toml"
    try:
        package = tomllib.loads(manifest.read_text(encoding="utf-8")).get("package", {})
        missing = [k for k in ("name", "version", "edition") if k not in package]
        if missing:
            problems.append(f"Cargo.toml: [package] lacks {', '.join(missing)}")
    except (OSError, tomllib.TOMLDecodeError) as err:
        problems.append(f"Cargo.toml: {err}")
    return problems


def main() -> int:
    problems = check(Path.cwd())
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)" if problems else "check passed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
