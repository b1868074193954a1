"""Plausible questions and edits about the fixture repository, drawn at random: code-agent's generator
of cases (`Environment.cases`), for checking a policy out of sample. The draws carry no label: the
`careful` stand-in's run of `v0` labels them (`improve.evals.out_of_sample`).

Each draw asks one of the kinds of question the scenarios ask (variants of an enum, the first struct
of a file, a default setting, exported functions, which file defines something, the last function of
a file, how many functions it has), or asks for one of their edits (a variant added or removed, a
default changed), about the symbols the repository really has; the turn and cycle budgets and the
planner vary around their defaults.
"""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).parent / "fixture_repo"
_ENUM = re.compile(r"^(?:pub )?enum (\w+) \{\n(.*?)^\}", re.M | re.S)
_STRUCT = re.compile(r"^(?:pub )?struct (\w+)", re.M)
_FN = re.compile(r"^\s*(?:pub )?fn (\w+)", re.M)
_DEFAULT = re.compile(r"^\s*(\w+): (\d+),", re.M)
NEW_VARIANTS = ("Anthropic", "Gemini", "Cohere", "Mistral", "Local", "Toml", "Markdown", "Debug", "Trace")


@functools.cache
def _symbols() -> dict[str, Any]:
    rust = {
        p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((REPO / "src").rglob("*.rs"))
    }
    enums = [
        (
            name,
            path,
            [
                v.strip().split("(")[0].split(" ")[0].rstrip(",")
                for v in body.splitlines()
                if v.strip() and not v.strip().startswith("//")
            ],
        )
        for path, text in rust.items()
        for name, body in _ENUM.findall(text)
    ]
    return {
        "enums": [e for e in enums if e[2]],
        "structs": [(path, _STRUCT.findall(text)) for path, text in rust.items() if _STRUCT.findall(text)],
        "functions": [(path, _FN.findall(text)) for path, text in rust.items() if _FN.findall(text)],
        "defaults": _DEFAULT.findall(rust.get("src/config.rs", "")),
        "scripts": sorted(p.relative_to(REPO).as_posix() for p in (REPO / "scripts").glob("*.lua")),
    }


def _question(rng: random.Random, found: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    kind = rng.choice(
        ("enum-count", "first-struct", "default", "exported", "which-file", "last-fn", "fn-count")
    )
    if kind == "enum-count":
        name, path, _ = rng.choice(found["enums"])
        where = f" in {path}" if rng.random() < 0.7 else ""
        return kind, {"task": f"How many variants does the `{name}` enum{where} have?"}
    if kind == "first-struct":
        path, _ = rng.choice(found["structs"])
        return kind, {"task": f"What is the first struct in {path}?"}
    if kind == "default" and found["defaults"]:
        field, _ = rng.choice(found["defaults"])
        return kind, {"task": f"What is the default `{field}` in src/config.rs?"}
    if kind == "exported":
        return kind, {"task": f"How many exported functions are in {rng.choice(found['scripts'])}?"}
    if kind == "which-file":
        path, names = rng.choice(found["functions"] + found["structs"])
        what = "struct" if (path, names) in found["structs"] else "function"
        return kind, {"task": f"Which file defines the {what} `{rng.choice(names)}`?"}
    path, _ = rng.choice(found["functions"])
    if kind == "last-fn":
        return kind, {"task": f"What is the last function defined in {path}?"}
    return "fn-count", {"task": f"How many functions are defined in {path}?"}


def _edit(rng: random.Random, found: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name, path, variants = rng.choice(found["enums"])
    roll = rng.random()
    if roll < 0.5:
        new = rng.choice([v for v in NEW_VARIANTS if v not in variants] or ["Extra"])
        task = f"Add a `{new}` variant to the `{name}` enum in {path}."
        kind = "add-variant"
    elif roll < 0.75 and len(variants) > 2:
        task = f"Remove the `{rng.choice(variants)}` variant from the `{name}` enum in {path}."
        kind = "remove-variant"
    else:
        field, _ = rng.choice(found["defaults"])
        task = f"Change the default `{field}` in src/config.rs to {rng.choice((12, 20, 30, 60, 120))}."
        kind = "set-default"
    return kind, {"mode": "edit", "validate": "check", "task": task}


def draw(rng: random.Random) -> dict[str, Any]:
    found = _symbols()
    kind, task = _edit(rng, found) if rng.random() < 0.35 else _question(rng, found)
    if rng.random() < 0.3:
        task["maxTurns"] = rng.randint(6, 16)
    if "mode" not in task:
        if rng.random() < 0.2:
            task["maxCycles"] = rng.randint(3, 7)
        if rng.random() < 0.2:
            task["planner"] = True
    return {"category": kind, "input": task}
