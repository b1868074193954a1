"""`improve verify`, `vocabulary`, `explore` and `schema`: policies as validated, explorable data."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from improve.cli.common import (
    EXIT_FAILED,
    EnvOption,
    JsonOption,
    WorkspaceOption,
    emit_json,
    err,
    handled,
    out,
    styled,
    workspace,
)
from improve.errors import MachineConfigError, WorkspaceError

if TYPE_CHECKING:
    from improve.evals import Workspace
    from improve.runtime import Environment

LOCK_NAME = "environment.lock.json"


def lock_path(space: Workspace, env_name: str) -> Path:
    return space.policies_dir(env_name) / LOCK_NAME


def recorded_hashes(space: Workspace, env_name: str) -> dict[str, str] | None:
    path = lock_path(space, env_name)
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return dict(data.get("files", {}))


def _policy_document(space: Workspace, env_name: str, ref: str) -> tuple[Any, str]:
    from improve.loop import Unparsed
    from improve.machine import json_syntax_error, loads_document
    from improve.runtime import read_document_text

    path = space.policy_path(env_name, ref)
    if not path.exists():
        raise space.policy_not_found(env_name, ref, path)
    # Not a text file at all (a directory, binary data) is a usage error; what is text but not a policy
    # (bad JSON, nested too deep) is the validate gate's failure, with where and why.
    text = read_document_text(path, "policy")
    try:
        document = loads_document(text, source=str(path))
        if isinstance(document, dict) and isinstance(document.get("version"), str):
            space.check_policy_name(env_name, path, document["version"])
        return document, str(path)
    except json.JSONDecodeError as error:
        return Unparsed(json_syntax_error(str(path), error)), str(path)
    except MachineConfigError as error:
        return Unparsed(str(error)), str(path)


_AT_PATH = re.compile(r"^(- )?(\$[^\s:]*): ", re.M)
_IN_STATE = re.compile(r"state '([^']+)'((?:\.\w+|\[\d+\])*)")


def _located(detail: str, path: Path) -> str:
    """A gate's detail with each problem at a JSON path (`- $.states.x.output.type: ...`) also at the
    policy file's line (`- FILE:LINE: $.states...`), for an editor to jump to, as machine errors are."""
    from improve.machine import json_lines, line_of, parse_json_path

    compiled = _IN_STATE.search(detail)
    if not (_AT_PATH.search(detail) or compiled) or not path.is_file():
        return detail
    try:
        lines = json_lines(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return detail
    if compiled and not _AT_PATH.search(detail):
        # The compiler names a state and where in it (`state 'ask'.invoke.onDone[0]`): a transition given
        # alone, not in a list, has no index in the file.
        steps = re.findall(r"\.(\w+)|\[(\d+)\]", compiled.group(2))
        where = ("states", compiled.group(1), *(int(i) if i else k for k, i in steps))
        line = line_of(lines, where) or line_of(lines, where[:-1])
        return f"{path}:{line}: {detail}" if line is not None else detail

    def at(match: re.Match[str]) -> str:
        try:
            line = line_of(lines, parse_json_path(match.group(2)))
        except ValueError:
            line = None
        where = f"{path}:{line}: " if line is not None else ""
        return f"{match.group(1) or ''}{where}{match.group(2)}: "

    return _AT_PATH.sub(at, detail)


def static_gate_failure(space: Workspace, env_name: str, environment: Environment, ref: str) -> str | None:
    """Why the policy `ref` cannot run as written: the first of the gates that run nothing (validate,
    vocabulary, lower: `STATIC_GATES`) it fails, in `improve verify`'s words, each problem at the
    policy file's line; None when it passes them. A decision that reaches what they refuse ends in
    policy-error, which a comparison would otherwise show as the policy's behaviour."""
    from improve.loop import STATIC_GATES, GateContext, run_gates

    document, source = _policy_document(space, env_name, ref)
    results = run_gates(document, GateContext(environment, gates=STATIC_GATES), source)
    failed = next((r for r in results if not r.ok), None)
    if failed is None:
        return None
    named = source if ref.endswith(".json") or "/" in ref or "\\" in ref else f"{ref} ({source})"
    return (
        f"policy {named} cannot run as written: it fails the {failed.name} gate of `improve "
        f"verify`: {_located(failed.detail, Path(source))}"
    )


def verify_command(
    policy: Annotated[str, typer.Argument(help="Policy version (v3) or a .json path.")],
    env: Annotated[str | None, EnvOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Run the gates on a policy, in order, stopping at the first failure; exit 1 when one fails.

    Gates: environment-unchanged, validate, vocabulary, lower, lint, explore, overfit, interactions;
    then, by name, the workspace's own (gates in improve.toml) and those installed packages register.
    environment-unchanged compares with policies/<env>/environment.lock.json when present; explore
    probes with the training scenarios' recorded decisions.

    Example:

        improve verify v1 --env refunds
    """
    from improve.log import JsonlDirStore
    from improve.loop import GateContext, Unparsed, gates_for, passed, probe_requests, run_gates

    with handled():
        space = workspace(ws)
        env_name = space.env_name(env)
        environment = space.environment(env_name)
        document, source = _policy_document(space, env_name, policy)
        # As in a round: the gates never read the sealed test split (docs/contracts.md).
        scenarios = space.scenarios(env_name).open_scenarios
        store = JsonlDirStore(space.traces) if space.traces.exists() else None
        context = GateContext(
            environment,
            expected_hashes=recorded_hashes(space, env_name),
            hashes_from=str(lock_path(space, env_name)),
            # A document that does not parse fails `validate` before any gate reads a probe: the probe
            # runs (v0 on the training scenarios) are not made, so their trouble cannot hide its error.
            probes=[] if isinstance(document, Unparsed) else probe_requests(environment, scenarios, store),
            scenarios=scenarios,
            gates=gates_for(space),
        )
        results = run_gates(document, context, source)
        ok = passed(results)
        if as_json:
            emit_json({"policy": source, "ok": ok, "gates": [r.to_json() for r in results]})
        else:
            for r in results:
                mark = ("pass", "green") if r.ok else ("FAIL", "red")
                out.print(styled(mark, f" {r.name}: "), end="")
                out.print(r.detail if r.ok else _located(r.detail, Path(source)), markup=False)
            skipped = [gate.name for gate in context.gates[len(results) :]]
            if skipped:
                out.print(f"not run: {', '.join(skipped)}")
        if not ok:
            raise typer.Exit(EXIT_FAILED)


def vocabulary_command(
    env: Annotated[str | None, EnvOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """List every name a policy may use, read off the environment.

    Example:

        improve vocabulary --env refunds --json
    """
    from improve.runtime import vocabulary

    with handled():
        space = workspace(ws)
        words = vocabulary(space.environment(env))
        if as_json:
            emit_json(words.to_json())
            return
        for d in words.decisions:
            out.print(styled(("decision", "bold"), f" {d.name} (state {d.state})"))
            for event, fields in d.events.items():
                # A field the machine offers as constants shows them: a branch answers one of them.
                offered = d.choices.get(event, {})
                payload = ", ".join(
                    f"{f}: one of {', '.join(json.dumps(v) for v in offered[f])}"
                    if f in offered
                    else f"{f}: {k}"
                    for f, k in fields.items()
                )
                out.print(f"  event {event}" + (f" {{{payload}}}" if payload else ""), markup=False)
            for path, kind in d.facts.items():
                # As declared (`int:days`), or one unit the machine shows by comparing two facts.
                given = d.units.get(path, "")
                unit = (
                    f" (one unit with {given[3:]})"
                    if given.startswith("as ")
                    else f":{given}"
                    if given
                    else ""
                )
                shown = f"one of {', '.join(map(str, d.values[path]))}" if path in d.values else kind + unit
                out.print(f"  fact  {path}: {shown}", markup=False)
        out.print(f"request fields: {', '.join(words.request_fields)}", markup=False)
        out.print(f"actors: {', '.join(words.actors)}   model refs: {', '.join(words.models)}", markup=False)
        out.print(f"named guards: {', '.join(words.guards) or 'none'}", markup=False)


def explore_command(
    target: Annotated[
        str | None, typer.Option("--target", "-t", help="A state to reach (default: the sentinels).")
    ] = None,
    input_json: Annotated[
        str | None,
        typer.Option("--input", "-i", help="The machine input as JSON (default: every probe input)."),
    ] = None,
    env: Annotated[str | None, EnvOption] = None,
    max_paths: Annotated[int, typer.Option("--max-paths", help="Transitions to try at most.")] = 200_000,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Explore the environment's state space: is a state reachable, and is the search a proof?

    The world is the environment's probe: payload values at the rules' boundaries, every output each
    tool may give, tools that fail. "Unreachable" with complete=true is a proof relative to it. Exits 1
    when the target is reachable (a witness path is printed). It also proves the resume paths within
    their budgets: with a fresh budget per resume (the environment's resume_budget), the resumes along
    every path must be finitely many; an unbounded resume loop is printed and exits 1 too.

    Example:

        improve explore --env refunds --target illegallyIssued --input \\
            '{"ticket":"x","customerId":"C-1","orderId":"O-1","amount":240}'
    """
    from improve.machine import ExploreOptions, beyond_choice, can_reach, check_target, explore_paths
    from improve.runtime import resume_proof

    with handled():
        space = workspace(ws)
        environment = space.environment(env)
        targets = [target] if target else environment.config.sentinels()
        if not targets:
            raise WorkspaceError("the environment has no sentinel state; give --target")
        inputs = [_json_arg(input_json)] if input_json else environment.probe_inputs
        if not inputs:
            raise WorkspaceError("give --input: the environment declares no probe inputs")
        base = environment.probe or ExploreOptions()
        options = ExploreOptions(
            base.payloads, base.outputs, base.errors, base.decide_errors, None, base.max_depth, max_paths
        )
        rows = []
        reachable = False
        # One full exploration per input answers every target it never reached (the same search
        # `can_reach` would make, to the same end) and gives the resume bound; only a target it reached
        # is searched again, for the shortest way there.
        for goal in targets:
            check_target(environment.machine, goal)
        explored = [explore_paths(environment.machine, inp, options) for inp in inputs]
        for goal in targets:
            for inp, full in zip(inputs, explored, strict=True):
                result = can_reach(environment.machine, goal, inp, options) if goal in full.reached else full
                if result.reachable:
                    full = result
                reachable |= result.reachable
                rows.append(
                    {
                        "target": goal,
                        "input": inp,
                        **result.to_json(),
                        "witness_states": _states_along(environment.machine, inp, result.witness or []),
                        "terminals": full.terminals,
                        "states": full.states,
                        "transitions": full.transitions,
                        "beyond_choice": beyond_choice(environment.machine, inp, result.witness or []),
                    }
                )
        proof = resume_proof(environment, list(zip(inputs, explored, strict=True)))
        run_budget = space.config.objective.max_model_calls
        if as_json:
            emit_json(
                {
                    "environment": environment.name,
                    "results": rows,
                    "resumes": {**proof.to_json(), "most_model_calls": proof.most_calls(run_budget)},
                }
            )
        else:
            from rich.table import Table

            table = Table(title=f"exploring {environment.name}")
            for column in ("target", "input", "reachable", "proof", "states", "terminals"):
                table.add_column(column, overflow="fold")
            for r in rows:
                table.add_row(
                    r["target"],
                    json.dumps(r["input"]),
                    str(r["reachable"]),
                    str(r["proof"]),
                    str(r["states"]),
                    json.dumps(r["terminals"]),
                )
            out.print(table)
            for r in rows:
                if r["reachable"]:
                    out.print(
                        f"witness for {r['target']} (the state each event came to, then the event):",
                        markup=False,
                    )
                    states = r["witness_states"]
                    for i, step in enumerate(r["witness"] or []):
                        where = f"in '{states[i]}': " if i < len(states) else ""
                        out.print(f"  {where}{json.dumps(step)}", markup=False)
                    for note in r["beyond_choice"]:
                        out.print(
                            f"  note: {note}: a decider's answer of it is refused as invalid, but the guard lets "
                            f"it through, so a decider that ignores the closed choice (or a person's event) "
                            f"reaches {r['target']}; the guard should refuse it too",
                            markup=False,
                        )
            mark = "" if proof.holds else "FAILED: "
            out.print(f"resumes: {mark}{proof.summary(run_budget)}", markup=False)
        if reachable or not proof.holds:
            raise typer.Exit(EXIT_FAILED)


def _states_along(machine: Any, input: Any, witness: list[dict[str, Any]]) -> list[str]:
    """The state each event of a witness came to (a decision's answer, a tool's output, a person's
    event), by stepping the machine along it; as far as it steps."""
    from improve.errors import ImproveError
    from improve.machine import initial, transition

    states: list[str] = []
    try:
        snapshot = initial(machine, input)
        for event in witness:
            states.append(str(snapshot.value))
            snapshot = transition(machine, snapshot, event)
    except ImproveError:
        pass
    return states


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise WorkspaceError(f"--input is not JSON (column {error.colno}): {error.msg}") from None


def schema_command(
    what: Annotated[
        str, typer.Argument(help="policy (the policy format) or machine (the same format).")
    ] = "policy",
) -> None:
    """Print the JSON Schema of the policy format (the pydantic models are its source).

    Example:

        improve schema policy > policy.schema.json
    """
    from improve.machine import MachineConfig

    with handled():
        if what not in ("policy", "machine"):
            raise WorkspaceError(f"unknown schema {what!r}; use policy or machine")
        schema = MachineConfig.model_json_schema(by_alias=True)
        schema["title"] = "improve policy" if what == "policy" else "improve machine"
        emit_json(schema)


def lock_command(
    env: Annotated[str | None, EnvOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Record the environment's file hashes in policies/<env>/environment.lock.json.

    `improve verify` then fails its first gate when the environment changes under the policies.

    Example:

        improve lock --env refunds
    """
    from improve.files import write_atomic

    with handled():
        space = workspace(ws)
        env_name = space.env_name(env)
        environment: Environment = space.environment(env_name)
        path = lock_path(space, env_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "environment": env_name,
            "machine": f"{environment.config.id}@{environment.config.version}",
            "files": environment.file_hashes(),
        }
        write_atomic(path, json.dumps(doc, indent=2) + "\n")
        err.print(f"wrote {path}")
        if as_json:
            emit_json({"path": str(path), **doc})
