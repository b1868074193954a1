"""`improve describe`: an environment or a policy as text, a Mermaid diagram or an XState machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from improve.cli.common import (
    WorkspaceOption,
    emit_json,
    handled,
    out,
    workspace,
)
from improve.errors import WorkspaceError


def describe_command(
    env: Annotated[
        str | None, typer.Option("--env", "-e", help="Environment (default from improve.toml).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text, mermaid or xstate.")] = "text",
    policy: Annotated[
        str | None, typer.Option("--policy", "-p", help="Describe this policy instead.")
    ] = None,
    diff: Annotated[
        tuple[str, str] | None,
        typer.Option("--diff", help="Two policy versions: which states and branches the second changed."),
    ] = None,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Describe an environment (or a policy): the goal first, then its states and rules.

    With --diff OLD NEW: the states NEW added, removed or changed, each before and after; with
    --format mermaid, NEW's diagram with the changed states highlighted (GitHub renders it in a PR).

    Example:

        improve describe --env refunds --format mermaid
        improve describe --diff v0 v1 --format mermaid
    """
    from improve.machine import describe_mermaid, describe_text, diff_states, to_xstate

    with handled():
        space = workspace(ws)
        env_name = space.env_name(env)
        if diff:
            old, new = (space.load_policy(env_name, ref) for ref in diff)
            changed = diff_states(old, new)
            if fmt == "mermaid":
                out.print(describe_mermaid(new, highlight=changed), markup=False)
            elif fmt == "text":
                out.print(describe_diff(old, new, changed), markup=False)
            else:
                raise WorkspaceError(f"--diff takes --format text or mermaid, not {fmt!r}")
            return
        if policy:
            environment, config = None, space.load_policy(env_name, policy)
        else:
            environment = space.environment(env_name)
            config = environment.config
        if fmt == "text":
            facts = None
            if environment is not None:
                from improve.runtime import fact_lines, vocabulary

                facts = {d.name: fact_lines(d) for d in vocabulary(environment).decisions}
            out.print(describe_text(config, facts), markup=False)
        elif fmt == "mermaid":
            out.print(describe_mermaid(config), markup=False)
        elif fmt == "xstate":
            emit_json(to_xstate(config))
        else:
            raise WorkspaceError(f"unknown format {fmt!r}; use text, mermaid or xstate")


def describe_diff(old: Any, new: Any, changed: list[str]) -> str:
    lines = [f"{old.id}@{old.version} -> {new.id}@{new.version}: {len(changed)} state(s) changed"]
    for name in changed:
        before = old.states.get(name)
        after = new.states.get(name)
        verb = "added" if before is None else "removed" if after is None else "changed"
        lines.append(f"\n{verb}: {name}")
        for label, st in (("before", before), ("after", after)):
            if st is not None:
                body = json.dumps(st.model_dump(exclude_none=True, exclude_defaults=True), indent=2)
                lines.append(f"  {label}: " + body.replace("\n", "\n  "))
    return "\n".join(lines)
