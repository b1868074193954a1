"""The generated cases' decisions the out-of-sample gate showed a candidate answering wrongly, kept for
the rounds after it.

A round whose `out-of-sample` gate refuses a candidate hands the repair the decisions its new branch
answered otherwise than careful, labelled by careful's answer (`gates.out_of_sample`). Kept only in
that round, they were lost to the next: a later round proposed a rule much like the refused one, and
its own draw of cases happened not to show where it reached too far. So the round also appends them to
`.improve/generated/<environment>.jsonl` in the workspace (its state directory, beside the memory of
discarded candidates, which git ignores), one line each, with the key of the environment's files; every
round after it reads those of the same key into its training decisions from the start, as decisions a
rule must not answer wrongly (never as failures to fix). A changed environment may answer them
otherwise: its key differs, and they are left out. Lines are appended whole; one cut short is ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from improve.files import append_whole
from improve.machine import canonical_json

GENERATED_DIR = ".improve/generated"


def generated_path(root: Path, env: str) -> Path:
    """Where a workspace at `root` keeps the generated decisions of environment `env`."""
    return root / GENERATED_DIR / f"{env}.jsonl"


def environment_key(hashes: Mapping[str, str]) -> str:
    """The key of the environment's files (their hashes), under which its decisions are kept."""
    return hashlib.sha256(canonical_json(dict(hashes)).encode("utf-8")).hexdigest()[:16]


def same(decision: Mapping[str, Any]) -> str:
    """What makes two kept decisions one: the case, the decision and its facts."""
    return canonical_json([decision.get("thread_id"), decision.get("name"), decision.get("facts")])


def keep(path: Path, decisions: Sequence[Mapping[str, Any]], key: str) -> None:
    """Append the decisions, each one whole line, under the environment's `key`."""
    if not decisions:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(
        json.dumps({"environment": key, "decision": dict(d)}, sort_keys=True, ensure_ascii=False, default=str)
        + "\n"
        for d in decisions
    )
    append_whole(path, lines)


def kept(path: Path, key: str) -> list[dict[str, Any]]:
    """The decisions kept under `key`, oldest first, each once; none when there is no file. A line that
    is not one (cut short, edited) is skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    found: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            decision = entry["decision"]
            if entry["environment"] != key or not isinstance(decision, dict):
                continue
            found.setdefault(same(decision), decision)
        except (ValueError, KeyError, TypeError):
            continue
    return list(found.values())
