"""Describe a machine config for people and tools: terminal text, a Mermaid diagram, XState v5 JSON.

All functions here are pure: they read a `MachineConfig` and return text or plain data, no I/O.

- `describe_text`: for a person at a terminal: the goal first, then every state in document order
  with its kind, description, tags and transitions (`EVENT [guard] -> target (assign k, ...)`).
- `describe_mermaid`: a `stateDiagram-v2` that GitHub renders inside markdown; sentinel finals and
  states named in `highlight` (e.g. those a policy diff touched) get their own classes.
- `to_xstate`: XState v5 machine JSON for Stately's tools. CEL guards become
  `{"type": "cel", "params": {"expr": ...}}`, `assign` becomes an `xstate.assign` action, `choice`
  states become `always` transitions (XState has no choice type), every invoke is given its id (the
  state's name unless set) and a transition to its own state re-enters it (`reenter: true`), as here. `xstate_host/host.mjs` runs the export in XState (docs/xstate.md).
- `diff_states`: the states added, removed or changed between two configs.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from improve.machine.config import (
    DECIDE_SRC,
    DecideInputConfig,
    MachineConfig,
    NamedGuard,
    StateConfig,
    TransitionConfig,
    TransitionSpec,
    transitions_of,
)
from improve.machine.walk import Edge, edges

__all__ = ["describe_mermaid", "describe_text", "diff_states", "edge_text", "mermaid_label", "to_xstate"]

MERMAID_GUARD_MAX = 64
"""Guards longer than this are cut (with an ellipsis) in diagram labels."""

SENTINEL_CLASS = "classDef sentinel fill:#fdd,stroke:#c00"
CHANGED_CLASS = "classDef changed fill:#ffd,stroke:#a80"

XSTATE_NOTE = (
    "Exported by improve. Every expression position holds a CEL string, not JavaScript: context "
    "initialisers (over `input`), guards of type 'cel' (params.expr), xstate.assign params, invoke "
    "input and final output. Targets name sibling states."
)


# --- shared helpers -------------------------------------------------------------------------------


def _guard_text(guard: str | NamedGuard | None) -> str | None:
    if guard is None:
        return None
    if isinstance(guard, NamedGuard):
        return f"guard:{guard.type}"
    return guard


def _decide_input(state: StateConfig) -> DecideInputConfig | None:
    """The decision request of an `agent.decide` invoke, or None when it is not a valid one."""
    if state.invoke is None or state.invoke.src != DECIDE_SRC:
        return None
    try:
        return DecideInputConfig.model_validate(state.invoke.input or {})
    except ValidationError:
        return None


def _kind(state: StateConfig) -> str:
    """What a state is, in the words a reader needs (the vocabulary of docs/contracts.md)."""
    if state.is_sentinel:
        return "sentinel"
    if state.is_final:
        return "final"
    if state.type == "choice":
        return "choice"
    if state.invoke is not None:
        return "decision" if state.invoke.src == DECIDE_SRC else "actor"
    if state.on:
        return "waits for a person"
    if state.always is not None:
        return "eventless"
    return "atomic (no way out)"


def _tree_text(tree: Any) -> str:
    """An expression tree on one line: CEL strings as written, structure as `{k: v}` / `[a, b]`."""
    if isinstance(tree, str):
        return tree
    if isinstance(tree, dict):
        return "{" + ", ".join(f"{k}: {_tree_text(v)}" for k, v in tree.items()) + "}"
    if isinstance(tree, list):
        return "[" + ", ".join(_tree_text(v) for v in tree) + "]"
    return json.dumps(tree)


def _label(edge: Edge) -> str:
    """What a reader calls a transition: its event, or `choice`, `always`, `done`, `error`."""
    if edge.kind == "on" and edge.event is not None:
        return edge.event
    return {"onDone": "done", "onError": "error"}.get(edge.kind, edge.kind)


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def shorten_guard(guard: str, limit: int) -> str:
    """A guard for a diagram's label: whole when it fits, else its first whole conjuncts (`a && b && …`,
    split at the top-level `&&` and `||`), never cut inside a name or a number; a first conjunct longer
    than the limit is cut after its last whole word."""
    text = " ".join(guard.split())
    if len(text) <= limit:
        return text
    parts = _top_level_parts(text)
    kept = ""
    for part, joiner in parts:
        candidate = kept + part
        if len(candidate) + 2 > limit:
            break
        kept = candidate + joiner
    if kept:
        return kept.rstrip() + " …"
    words = text[: limit - 2].rsplit(" ", 1)[0]
    return words + " …"


def _top_level_parts(text: str) -> list[tuple[str, str]]:
    """`text` cut at its `&&` / `||` outside parentheses, brackets and quotes: each part with the
    operator (and spaces) that follows it."""
    parts: list[tuple[str, str]] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith((" && ", " || "), i):
            parts.append((text[start:i], text[i : i + 4]))
            start = i = i + 4
            continue
        i += 1
    parts.append((text[start:], ""))
    return parts


# --- text -----------------------------------------------------------------------------------------


def _transition_line(label: str, t: TransitionConfig, names: Collection[str]) -> str:
    guard = _guard_text(t.guard)
    line = label + (f" [{guard}]" if guard else "")
    if t.target is None:
        line += " -> (stays)"
    else:
        line += f" -> {t.target}" + ("" if t.target in names else " (no such state!)")
    if t.assign:
        line += " (assign " + ", ".join(t.assign) + ")"
    if t.description:
        line += f"  -- {t.description}"
    return line


def describe_text(config: MachineConfig, facts: Mapping[str, Sequence[str]] | None = None) -> str:
    """A plain-text account of the machine for a terminal: goal, id@version, states, summary. `facts`:
    per decision name, its facts as the environment types them (`daysSupply (int)`), and lines about
    them (which numbers are in one unit), in place of the facts' bare names."""
    names = list(config.states)
    goal = config.description.strip() or "(no goal written: add a `description` with success criteria)"
    lines = [f"Goal: {goal}", f"Machine: {config.id}@{config.version} (initial: {config.initial})"]
    if config.context:
        lines.append("Context: " + ", ".join(f"{k} = {_tree_text(v)}" for k, v in config.context.items()))

    for name, state in config.states.items():
        kind = _kind(state)
        kinds = ["initial", kind] if name == config.initial else [kind]
        if kind == "sentinel":
            kinds.append("final, must be unreachable")
        lines.append("")
        lines.append(f"{name} ({', '.join(kinds)})")
        pad = "  "
        if state.description:
            lines.append(pad + state.description)
        if state.tags:
            lines.append(pad + "tags: " + ", ".join(state.tags))

        inv = state.invoke
        if inv is not None:
            retries = f", maxRetries {inv.maxRetries}" if inv.maxRetries is not None else ""
            if inv.src == DECIDE_SRC:
                decide = _decide_input(state)
                if decide is None:
                    lines.append(pad + f"invokes {DECIDE_SRC} (input is not a valid decision request)")
                else:
                    lines.append(
                        pad + f"decision {decide.name}: events " + " | ".join(decide.allowedEvents) + retries
                    )
                    for ev, fields in decide.payloads.items():
                        for fld, expr in fields.items():
                            lines.append(pad + f"  payload {ev}.{fld} one of {expr}")
                    typed = (facts or {}).get(decide.name.strip().strip("'\""))
                    if typed:
                        lines += [pad + "  " + line for line in typed]
                    elif decide.facts:
                        lines.append(pad + "  facts: " + ", ".join(decide.facts))
                    if decide.prompt:
                        lines.append(pad + "  prompt: " + _shorten(decide.prompt, 100))
            else:
                ident = f" (id {inv.id})" if inv.id else ""
                lines.append(pad + f"invokes {inv.src}{ident}{retries}")
                if inv.input:
                    lines.append(pad + "  input: " + ", ".join(inv.input))

        for edge in edges(name, state):
            lines.append(pad + _transition_line(_label(edge), edge.transition, names))
        if state.is_final and state.output is not None:
            lines.append(pad + "output: " + _tree_text(state.output))

    finals = config.final_states()
    sentinels = config.sentinels()
    lines.append("")
    summary = f"{len(names)} states, {len(finals)} final" + ("" if len(finals) == 1 else "s")
    summary += f" ({', '.join(finals)})" if finals else ""
    summary += f", {len(sentinels)} sentinel" + ("" if len(sentinels) == 1 else "s")
    summary += f" ({', '.join(sentinels)})" if sentinels else ""
    lines.append(summary + ".")
    return "\n".join(lines) + "\n"


# --- mermaid --------------------------------------------------------------------------------------

_MERMAID_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_MERMAID_KEYWORDS = frozenset(
    {
        "state",
        "note",
        "end",
        "direction",
        "classdef",
        "class",
        "style",
        "click",
        "as",
        "left",
        "right",
        "of",
        "over",
        "default",
        "hide",
        "accdescr",
        "acctitle",
        "fork",
        "join",
        "choice",
    }
)
# Mermaid decodes `#name;` / `#code;` entity codes in every diagram type before parsing.
_LABEL_ESCAPES = {
    '"': "#quot;",
    ";": "#59;",
    "{": "#123;",
    "}": "#125;",
    "<": "#lt;",
    ">": "#gt;",
    "#": "#35;",
    "|": "#124;",
    "`": "#96;",
}


def mermaid_label(text: str) -> str:
    """Text safe inside a Mermaid label: one line, the characters that break it replaced."""
    text = " ".join(text.split())
    return "".join(_LABEL_ESCAPES.get(ch, ch) for ch in text)


def _mermaid_ids(names: Collection[str]) -> dict[str, str]:
    """A Mermaid-safe id per state name: kept when already safe, else sanitised and made unique."""
    ids: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        if _MERMAID_ID.match(name) and name.lower() not in _MERMAID_KEYWORDS:
            ids[name] = name
            used.add(name)
    for name in names:
        if name in ids:
            continue
        base = re.sub(r"[^A-Za-z0-9_]", "_", name)
        if not base or not (base[0].isalpha() or base[0] == "_") or base.lower() in _MERMAID_KEYWORDS:
            base = "s_" + base
        candidate, n = base, 2
        while candidate in used:
            candidate, n = f"{base}_{n}", n + 1
        ids[name] = candidate
        used.add(candidate)
    return ids


def edge_text(edge: Edge, limit: int = MERMAID_GUARD_MAX, order: int | None = None) -> str:
    """A transition as a diagram labels it, unescaped: its event, its place among the transitions
    checked in turn (`choice 1`, `choice 2`: the first whose guard holds is taken), and its guard."""
    guard = _guard_text(edge.transition.guard)
    label = _label(edge) + (f" {order}" if order is not None else "")
    return label + (f" [{shorten_guard(guard, limit)}]" if guard else "")


def checked_in_turn(name: str, state: StateConfig) -> list[tuple[Edge, int | None]]:
    """Every transition of a state with its place among those checked in turn for the same exit (the
    branches of a choice, the transitions of one event): 1, 2, ...; None when it is the only one."""
    listed = edges(name, state)
    counts = Counter((e.kind, e.event) for e in listed)
    seen: Counter[tuple[str, str | None]] = Counter()
    ordered: list[tuple[Edge, int | None]] = []
    for edge in listed:
        key = (edge.kind, edge.event)
        seen[key] += 1
        ordered.append((edge, seen[key] if counts[key] > 1 else None))
    return ordered


def describe_mermaid(config: MachineConfig, highlight: Collection[str] = ()) -> str:
    """A Mermaid `stateDiagram-v2` of the machine (GitHub renders it in a ```mermaid block).

    Edges are labelled with the event (`always` for eventless, `choice` for choice branches,
    `done` / `error` for an invoke's outcomes), their order where several are checked in turn (`choice
    1`, `choice 2`), and the guard, shortened at whole conjuncts. Sentinel finals get the
    `sentinel` class; states named in `highlight` that exist get the `changed` class.
    """
    ids = _mermaid_ids(list(config.states))
    lines = ["stateDiagram-v2"]
    for name, state in config.states.items():
        sid = ids[name]
        if state.type == "choice":
            lines.append(f"    state {sid} <<choice>>")
        elif sid != name:
            lines.append(f'    state "{mermaid_label(name)}" as {sid}')
        else:
            lines.append(f"    {sid}")

    if config.initial in ids:
        lines.append(f"    [*] --> {ids[config.initial]}")
    for name, state in config.states.items():
        sid = ids[name]
        for edge, order in checked_in_turn(name, state):
            target = sid if edge.target is None else ids.get(edge.target)
            if target is None:
                continue  # a dangling target: validation reports it; the diagram cannot draw it
            lines.append(f"    {sid} --> {target} : {mermaid_label(edge_text(edge, order=order))}")
        if state.is_final:
            lines.append(f"    {sid} --> [*]")

    sentinels = [ids[n] for n in config.sentinels()]
    changed = [ids[n] for n in config.states if n in set(highlight)]
    if sentinels:
        lines.append(f"    {SENTINEL_CLASS}")
    if changed:
        lines.append(f"    {CHANGED_CLASS}")
    if sentinels:
        lines.append(f"    class {','.join(sentinels)} sentinel")
    if changed:
        lines.append(f"    class {','.join(changed)} changed")
    return "\n".join(lines) + "\n"


# --- XState v5 ------------------------------------------------------------------------------------


def _xstate_guard(guard: str | NamedGuard) -> dict[str, Any]:
    if isinstance(guard, NamedGuard):
        return {"type": guard.type, "params": copy.deepcopy(guard.params)}
    return {"type": "cel", "params": {"expr": guard}}


def _xstate_transition(t: TransitionConfig, source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if t.target is not None:
        out["target"] = t.target
        if t.target == source:
            # The interpreter enters the state again (its actor is owed anew); XState v5 stays
            # without re-entering, keeping the running actor, unless told to re-enter.
            out["reenter"] = True
    if t.guard is not None:
        out["guard"] = _xstate_guard(t.guard)
    if t.assign:
        out["actions"] = [{"type": "xstate.assign", "params": copy.deepcopy(t.assign)}]
    if t.description:
        out["description"] = t.description
    return out


def _xstate_transitions(spec: TransitionSpec | None, source: str) -> Any:
    items = [_xstate_transition(t, source) for t in transitions_of(spec)]
    return items[0] if len(items) == 1 else items


def _xstate_state(name: str, state: StateConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if state.type in ("final", "atomic"):
        out["type"] = state.type
    if state.description:
        out["description"] = state.description
    if state.tags:
        out["tags"] = list(state.tags)
    meta = copy.deepcopy(state.meta)
    if state.invoke is not None:
        inv = state.invoke
        # Always named: XState's default id (`machine.state[0]`) is not the interpreter's (the state's
        # name), and the log's actor events carry the interpreter's (`actorId`).
        invoke: dict[str, Any] = {"src": inv.src, "id": inv.id or name}
        if inv.input is not None:
            invoke["input"] = copy.deepcopy(inv.input)
        if inv.onDone is not None:
            invoke["onDone"] = _xstate_transitions(inv.onDone, name)
        if inv.onError is not None:
            invoke["onError"] = _xstate_transitions(inv.onError, name)
        if inv.maxRetries is not None:
            meta["maxRetries"] = inv.maxRetries  # not an XState invoke field; kept for the round trip
        out["invoke"] = invoke
    if state.on:
        out["on"] = {ev: _xstate_transitions(spec, name) for ev, spec in state.on.items()}
    # XState has no choice type: the branches are eventless transitions, tried in order on entry
    # (the interpreter takes `choice` over `always` when both are given).
    branches = state.choice if state.choice else transitions_of(state.always)
    if branches:
        out["always"] = [_xstate_transition(t, name) for t in branches]
    if state.output is not None:
        out["output"] = copy.deepcopy(state.output)
    if meta:
        out["meta"] = meta
    return out


def to_xstate(config: MachineConfig) -> dict[str, Any]:
    """The machine as XState v5 JSON (paste into Stately's editor or `createMachine`).

    Expressions stay CEL strings (a note in `meta.improve` says so); a host that runs the export in
    XState registers a `cel` guard and an `xstate.assign` action that evaluate them.
    """
    improve_meta = config.meta.get("improve")
    meta = copy.deepcopy(config.meta)
    meta["improve"] = {
        **(copy.deepcopy(improve_meta) if isinstance(improve_meta, dict) else {}),
        "expressions": "cel",
        "note": XSTATE_NOTE,
    }
    out: dict[str, Any] = {"id": config.id, "version": config.version}
    if config.description:
        out["description"] = config.description
    out["initial"] = config.initial
    out["context"] = copy.deepcopy(config.context)
    out["meta"] = meta
    out["states"] = {name: _xstate_state(name, state) for name, state in config.states.items()}
    return out


# --- diff -----------------------------------------------------------------------------------------


def diff_states(old: MachineConfig, new: MachineConfig) -> list[str]:
    """Names of the states added, removed or changed from `old` to `new`, sorted."""
    names = set(old.states) | set(new.states)
    changed = []
    for name in names:
        before, after = old.states.get(name), new.states.get(name)
        if (
            before is None
            or after is None
            or before.model_dump(exclude_none=True) != after.model_dump(exclude_none=True)
        ):
            changed.append(name)
    return sorted(changed)
