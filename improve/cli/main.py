"""`improve`: run agents as state machines, replay their threads, and improve their policies."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from improve.cli.common import (
    EXIT_FAILED,
    CacheMode,
    CacheOption,
    JsonOption,
    ModelOption,
    WorkspaceOption,
    emit_json,
    err,
    handled,
    out,
    workspace,
)
from improve.cli.demo import demo_command
from improve.cli.evals import rules_command, scenarios_app, score_command
from improve.cli.init import init_command
from improve.cli.loop import diagnose_command, round_command
from improve.cli.parity import app as parity_app
from improve.cli.policy import (
    explore_command,
    lock_command,
    schema_command,
    verify_command,
    vocabulary_command,
)
from improve.cli.tape import tape_app
from improve.cli.unseal import record_unsealing_of
from improve.cli.warehouse import export_command, ingest_command, sql_command
from improve.errors import DivergenceError, LogError, SealedSplitError, TamperError, WorkspaceError
from improve.evals import SEALED_SPLIT, UNSEAL_HOW, Ledger, OutcomeRow, SuiteSpec, Workspace, write_threads
from improve.llm import Meter
from improve.log import EntryView, JsonlDirStore, gc_paused, head, read_file_threads
from improve.log import replay as replay_thread
from improve.machine import describe_mermaid, describe_text, diff_states, to_xstate
from improve.runtime import Environment

app = typer.Typer(
    name="improve",
    help="Make LLM agents reliable: run them as state machines, replay their traces, improve their policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command("run")
def run_command(
    env: Annotated[
        str | None, typer.Option("--env", "-e", help="Environment (default from improve.toml).")
    ] = None,
    policy: Annotated[
        str, typer.Option("--policy", "-p", help="Policy version (v0) or a .json path.")
    ] = "v0",
    model: Annotated[str, ModelOption] = "naive",
    split: Annotated[
        str,
        typer.Option(
            "--split",
            "-s",
            help="train, held-out, test (sealed: needs --unseal) or all (test only with --unseal).",
        ),
    ] = "all",
    k: Annotated[
        int | None, typer.Option("--k", min=1, help="Runs per scenario (default from improve.toml).")
    ] = None,
    scenario: Annotated[list[str] | None, typer.Option("--scenario", help="Only these scenario ids.")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Run again even when threads are recorded.")] = False,
    cache: Annotated[CacheMode, CacheOption] = CacheMode.record,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Runs in flight at once.")] = 8,
    unseal: Annotated[
        bool,
        typer.Option(
            "--unseal",
            help="Run the sealed test split's scenarios too (--split test or all): the outcomes are shown, "
            "and the unsealing is recorded in the policies' test-unsealings.jsonl.",
        ),
    ] = False,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Run the scenarios of a split with a policy and a model, journaling one thread per run.

    Threads are written to the workspace's traces/ as `split:version:model:scenario:rK.jsonl`;
    threads already recorded with the same policy and model are reused, so an interrupted run
    resumes. A model behind an endpoint has its calls recorded under .improve/cache (--cache), and
    the progress lines count its calls, tokens, USD and retries. The sealed test split is left out
    of --split all, and refused alone, unless --unseal (recorded, as `improve score --unseal` is).

    Example:

        improve run --env refunds --policy v0 --model naive --split train --k 3
        improve run --model openai:gpt-4.1-mini --k 3 --cache record
    """
    with handled():
        space = workspace(ws)
        env_name = space.env_name(env)
        environment = space.environment(env_name)
        scenario_set = space.scenarios(env_name)
        chosen = scenario_set.split(split, unseal=unseal)
        if scenario:
            known = scenario_set.by_id()
            missing = [s for s in scenario if s not in known]
            if missing:
                raise WorkspaceError(f"unknown scenario id(s) {missing}; see {scenario_set.source}")
            sealed = [s for s in scenario if known[s].split == SEALED_SPLIT]
            if sealed and not unseal:
                raise SealedSplitError(f"--scenario {', '.join(sealed)}: {UNSEAL_HOW}")
            chosen = [s for s in chosen if s.id in set(scenario)]
        elif split == "all" and not unseal and scenario_set.sealed:
            err.print(
                f"the sealed test split ({len(scenario_set.sealed)} scenarios) is left out; --unseal runs it "
                "(and records the unsealing)",
                markup=False,
            )
        policy_config = space.load_policy(env_name, policy)
        spec = SuiteSpec(
            policy=policy_config,
            model=model,
            k=k or space.config.objective.k,
            max_model_calls=space.config.objective.max_model_calls,
            model_spec=space.model_spec(model, environment),
            cache_dir=str(space.cache_dir),
            cache_mode=cache.value,
        )
        meter = Meter()
        store = JsonlDirStore(space.traces)
        err.print(
            f"running {len(chosen)} scenarios x {spec.k} on {env_name} with policy "
            f"{policy_config.id}@{policy_config.version}, model {model} -> {space.traces}"
        )

        def ran(done: int, total: int) -> None:
            if spec.model_spec is not None and (done == total or done % 10 == 0):
                err.print(f"  {done}/{total} runs: {meter.summary()}", markup=False)

        plan = write_threads(
            environment, chosen, spec, store, fresh=fresh, concurrency=concurrency, ran=ran, meter=meter
        )
        # Every thread is recorded in the warehouse and read back from there, verified.
        with Ledger(space, environment) as ledger:
            recorded = ledger.record(
                [p.thread_id for p in plan],
                say=lambda m: err.print(m, markup=False),
                rewritten=[p.thread_id for p in plan if not p.reused],
            )
        rows = recorded.rows
        for done, row in enumerate(rows, start=1):
            mark = "[green]pass[/]" if row.passed else "[red]FAIL[/]"
            err.print(f"  [{done}/{len(rows)}] {row.thread_id} {mark} {row.final_state}", markup=True)
        reused_count = sum(p.reused for p in plan)
        if reused_count:
            err.print(f"reused {reused_count} recorded threads (--fresh runs them again)")
        summary = summarize(rows)
        unsealed = [r for r in rows if r.split == SEALED_SPLIT]
        unsealing = (
            record_unsealing_of(
                space,
                env_name,
                scenario_set,
                policy_config,
                model,
                unsealed,
                command=f"improve run --policy {policy} --model {model} --split {split} --k {spec.k} --unseal",
            )
            if unsealed
            else None
        )
        if as_json:
            emit_json(
                {
                    "environment": env_name,
                    "policy": policy_config.version,
                    "model": model,
                    "k": spec.k,
                    "summary": summary,
                    "quarantined": [asdict(q) for q in recorded.quarantined],
                    "unsealing": unsealing.to_json() if unsealing else None,
                    **({"model_calls": meter.to_json()} if spec.model_spec is not None else {}),
                    "scenarios": per_scenario(rows),
                    "threads": [r.to_json() for r in rows],
                }
            )
        else:
            out.print(outcome_table(rows))
            out.print(
                f"pass rate {summary['pass_rate']:.3f} ({summary['passed']}/{summary['runs']} runs), "
                f"violations {summary['violations']}, model calls {summary['model_calls']}, "
                f"tokens {summary['tokens']}"
            )


def summarize(rows: list[OutcomeRow]) -> dict[str, Any]:
    runs = len(rows)
    passed = sum(r.passed for r in rows)
    return {
        "runs": runs,
        "passed": passed,
        "pass_rate": passed / runs if runs else 0.0,
        "violations": sum(len(r.violations) for r in rows),
        "model_calls": sum(r.model_calls for r in rows),
        "tokens": sum(r.tokens for r in rows),
        "failed_attempts": sum(r.failed_attempts for r in rows),
    }


def per_scenario(rows: list[OutcomeRow]) -> list[dict[str, Any]]:
    grouped: dict[str, list[OutcomeRow]] = defaultdict(list)
    for row in rows:
        grouped[row.scenario].append(row)
    result = []
    for scenario_id, group in grouped.items():
        outcomes: dict[str, int] = defaultdict(int)
        for r in group:
            outcomes[r.final_state] += 1
        result.append(
            {
                "scenario": scenario_id,
                "category": group[0].category,
                "split": group[0].split,
                "expected": group[0].expected_outcome,
                "outcomes": dict(outcomes),
                "passed": sum(r.passed for r in group),
                "runs": len(group),
                "pass_fraction": sum(r.passed for r in group) / len(group),
                "violations": sum(len(r.violations) for r in group),
                "reasons": sorted({r.reason for r in group if not r.passed}),
            }
        )
    return result


def outcome_table(rows: list[OutcomeRow]) -> Table:
    table = Table(title="outcomes against expected (full reasons with --json)")
    for column in ("scenario", "split", "expected", "outcomes", "pass"):
        table.add_column(column, no_wrap=True)
    table.add_column("why not (first reason)", no_wrap=True, overflow="ellipsis", max_width=56)
    for item in per_scenario(rows):
        outcomes = ", ".join(f"{state} x{n}" for state, n in item["outcomes"].items())
        style = "green" if item["passed"] == item["runs"] else ("red" if item["passed"] == 0 else "yellow")
        why = item["reasons"][0].split("; ")[0] if item["reasons"] else ""
        table.add_row(
            item["scenario"],
            item["split"],
            item["expected"],
            outcomes,
            f"[{style}]{item['passed']}/{item['runs']}[/]",
            why,
        )
    return table


# --- replay ---------------------------------------------------------------------------------------


def _threads_from(args: list[str], traces: Path) -> Iterator[tuple[str, Sequence[EntryView]]]:
    """Files (one thread or many with `threadId`), directories of them, or thread ids in traces/,
    checked up front and then read one thread at a time through the bulk decode path, so replaying a
    million entries holds about one thread of them at once."""
    sources: list[tuple[str, str]] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            sources.append(("dir", arg))
        elif path.is_file():
            sources.append(("file", arg))
        elif (traces / f"{arg}.jsonl").is_file():
            sources.append(("thread", arg))
        else:
            raise WorkspaceError(f"{arg}: no such file, directory, or thread in {traces}")
    found = 0
    for kind, source in sources:
        if kind == "dir":
            store = JsonlDirStore(source)
            for tid in store.list_threads(limit=1_000_000).thread_ids:
                found += 1
                yield tid, store.read_bulk(tid)
        elif kind == "file":
            for thread in read_file_threads(Path(source)):
                found += 1
                yield thread
        else:
            found += 1
            yield source, JsonlDirStore(traces).read_bulk(source)
    if not found:  # a directory with no thread in it: nothing replayed must not read as a pass
        raise WorkspaceError(f"no thread found in {', '.join(args)}: nothing to replay")


def _paused(threads: Iterator[tuple[str, Sequence[EntryView]]]) -> Iterator[tuple[str, Sequence[EntryView]]]:
    """Each thread read with the cyclic collector paused (see `gc_paused`); replay runs with it on."""
    while True:
        with gc_paused():
            thread = next(threads, None)
        if thread is None:
            return
        yield thread


def _environment_for(
    space: Workspace, machine_id: str, given: str | None, cache: dict[str, Environment]
) -> Environment:
    if given:
        if given not in cache:
            cache[given] = space.environment(given)
        return cache[given]
    if not cache:
        cache.update(space.environments_by_machine_id())
    if machine_id not in cache:
        raise WorkspaceError(
            f"no registered environment has machine id {machine_id!r} (known: {', '.join(sorted(cache))}); pass --env"
        )
    return cache[machine_id]


@app.command("replay")
def replay_command(
    targets: Annotated[list[str], typer.Argument(help="JSONL files, directories, or thread ids in traces/.")],
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Check each thread's hash chain, its state hashes and its end entry."),
    ] = False,
    require_chain: Annotated[
        bool,
        typer.Option(
            "--require-chain", help="With --verify: fail on unchained (schemaVersion 1) threads too."
        ),
    ] = False,
    env: Annotated[
        str | None, typer.Option("--env", "-e", help="Environment (default: by machine id).")
    ] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Replay threads against the pinned environment: no model, tool or person is called.

    Prints each thread's final state and output. With --verify, checks each chained thread's hash
    chain (every entry's entryHash: an edited, removed, inserted or reordered entry is named), every
    journaled snapshot hash, and that the thread ends with its run's @agent.end entry; exits 1 when a
    thread is tampered, diverged or incomplete. Threads of the older, unchained form (schemaVersion 1)
    are checked as far as their state hashes go and reported as unchained, not as a failure (unless
    --require-chain).

    Example:

        improve replay train:v0:naive:small-refund-01:r1 --verify
    """
    with handled():
        space = workspace(ws)
        threads = _paused(_threads_from(targets, space.traces))
        cache: dict[str, Environment] = {}
        results: list[dict[str, Any]] = []
        failed: dict[str, int] = {"tampered": 0, "diverged": 0, "incomplete": 0, "unchained": 0}
        for thread_id, entries in threads:
            if not entries:
                raise LogError(f"thread {thread_id} is empty")
            environment = _environment_for(space, entries[0].machineId, env, cache)
            try:
                result = replay_thread(environment.machine, entries, verify=verify, thread_id=thread_id)
            except TamperError as error:
                failed["tampered"] += 1
                results.append(
                    {"thread": thread_id, "tampered": str(error), "entry": error.index, "kind": error.kind}
                )
                err.print(f"[red]TAMPERED[/] {escape(str(error))}", markup=True)
                continue
            except DivergenceError as error:
                failed["diverged"] += 1
                results.append({"thread": thread_id, "diverged": str(error)})
                err.print(f"[red]DIVERGED[/] {escape(thread_id)}: {escape(str(error))}", markup=True)
                continue
            if result.verification == "incomplete":
                failed["incomplete"] += 1
                err.print(
                    f"[red]INCOMPLETE[/] {escape(thread_id)}: its {len(entries)} entries chain, but it has "
                    f"no @agent.end entry after entry {len(entries) - 1}: the run stopped before it ended, "
                    "or its last entries were removed",
                    markup=True,
                )
            elif result.verification == "unchained":
                failed["unchained"] += 1
            results.append(
                {
                    "thread": thread_id,
                    "final_state": result.final_state,
                    "status": result.status,
                    "output": result.snapshot.output,
                    "entries": result.entries,
                    "model_calls": result.model_calls,
                    "verified": verify,
                    "verification": result.verification,
                    "head": head(entries),
                }
            )
        if failed["unchained"]:
            note = "fail: --require-chain" if require_chain else "not an error"
            err.print(
                f"{failed['unchained']} thread(s) are unchained (schemaVersion 1): their state hashes were "
                f"checked, the rest of their content cannot be ({note})"
            )
        if as_json:
            emit_json({"threads": results, **failed})
        else:
            title = f"replayed {len(results)} thread(s)" + (" (chain and hashes verified)" if verify else "")
            table = Table(title=title)
            for column in ("thread", "final state", "status", "output"):
                table.add_column(column, overflow="fold")
            if verify:
                table.add_column("verification", overflow="fold")
            for item in results:
                bad = next((key for key in ("tampered", "diverged") if key in item), None)
                if bad:
                    table.add_row(
                        item["thread"], f"[red]{bad}[/]", "", escape(item[bad]), *([""] if verify else [])
                    )
                    continue
                row = [item["thread"], item["final_state"], item["status"], escape(str(item["output"]))]
                if verify:
                    style = {"verified": "green", "unchained": "yellow"}.get(item["verification"], "red")
                    row.append(f"[{style}]{item['verification']}[/]")
                table.add_row(*row)
            out.print(table)
        if failed["tampered"] or failed["diverged"] or failed["incomplete"]:
            raise typer.Exit(EXIT_FAILED)
        if require_chain and failed["unchained"]:
            raise typer.Exit(EXIT_FAILED)


# --- describe -------------------------------------------------------------------------------------


@app.command("describe")
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
        config = space.load_policy(env_name, policy) if policy else space.environment(env_name).config
        if fmt == "text":
            out.print(describe_text(config), markup=False)
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


app.command("ingest")(ingest_command)
app.command("sql")(sql_command)
app.command("export")(export_command)
app.command("verify")(verify_command)
app.command("vocabulary")(vocabulary_command)
app.command("explore")(explore_command)
app.command("schema")(schema_command)
app.command("lock")(lock_command)
app.command("score")(score_command)
app.command("rules")(rules_command)
app.command("round")(round_command)
app.command("diagnose")(diagnose_command)
app.command("demo")(demo_command)
app.command("init")(init_command)
app.add_typer(tape_app, name="tape")
app.add_typer(scenarios_app, name="scenarios")
app.add_typer(parity_app, name="parity")
