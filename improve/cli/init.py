"""`improve init`: a workspace for a new agent, or a bundled environment written out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from improve.cli.common import JsonOption, emit_json, handled, out


def init_command(
    directory: Annotated[Path, typer.Argument(help="Where to write the workspace (default: here).")] = Path(
        "."
    ),
    env: Annotated[
        str | None,
        typer.Option("--env", "-e", help="Name of the new agent's environment (a slug: support-desk)."),
    ] = None,
    package: Annotated[
        str | None, typer.Option("--package", help="Its Python package (default: the name with '_' for '-').")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option("--from", help="Write out a bundled environment's scenarios and policies instead."),
    ] = None,
    as_json: Annotated[bool, JsonOption] = False,
) -> None:
    """Write a workspace: improve.toml, the environment, scenarios/, policies/ and a CI workflow.

    With --env NAME: a working environment for a new agent, to make your own (a support desk granting
    account credits): a machine with two tools, a decision with payloads, a rule as a guard and a
    sentinel; a world with an audit; stand-in models careful, sloppy and naive; 12 labelled
    scenarios; policy v0; a README section; .github/workflows/improve.yml. With --from NAME: a bundled
    environment's scenarios and policies (its code stays in the installed package). Either way
    .gitignore gets what runs generate (traces/, reports/, .improve/), appended to one already there.
    Existing files are never overwritten: if one is in the way, nothing is written.

    Example:

        improve init my-agent --env support-desk
        cd my-agent && improve round --policy v0
        improve init desk --from refunds
    """
    with handled():
        from improve.errors import WorkspaceError

        if (env is None) == (source is None):
            raise WorkspaceError(
                "give exactly one of --env NAME (a new agent) or --from NAME (a bundled one)"
            )
        if source is not None:
            from improve.runtime import load_environment
            from improve.scaffold import write_desk

            name = source
            written = write_desk(load_environment(source), directory)
        else:
            from improve.scaffold import init_environment

            assert env is not None
            name = env
            written = init_environment(directory, env, package)
        steps = [
            f"cd {directory}" if directory != Path(".") else None,
            "improve scenarios check",
            "improve verify v0",
            "improve explore" if source is None else None,
            "improve rules" if source is None else None,  # the template's rule evals, as README's sequence
            "improve run --model careful",
            "improve round --policy v0   # in a git repository: git init && git add -A && git commit",
        ]
        next_steps = [s for s in steps if s]
        if as_json:
            emit_json(
                {
                    "environment": name,
                    "directory": str(directory.resolve()),
                    "written": written,
                    "next": next_steps,
                }
            )
            return
        out.print(f"wrote {len(written)} file(s) for {name} in {directory.resolve()}:", markup=False)
        for path in written:
            out.print(f"  {path}", markup=False)
        out.print("next:", markup=False)
        for step in next_steps:
            out.print(f"  {step}", markup=False)
