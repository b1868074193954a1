"""`improve run`: run a split's scenarios with a policy and a model, one journaled thread per run."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from improve.cli.common import (
    CacheMode,
    CacheOption,
    ExecutorOption,
    JsonOption,
    ModelOption,
    WorkspaceOption,
    emit_json,
    err,
    executor_for,
    handled,
    out,
    say,
    styled,
    warn_unknown_names,
    workspace,
)
from improve.errors import EndpointError, ImproveError, SealedSplitError, WorkspaceError

if TYPE_CHECKING:
    from rich.table import Table

    from improve.evals import OutcomeRow, Scenario, SuiteSpec, Workspace
    from improve.runtime import Environment


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
    suspend: Annotated[
        bool,
        typer.Option(
            "--suspend",
            help="Nobody answers waiting states (the scenarios' people scripts are not read): each run stops "
            "at its first wait, status waiting, for `improve resume` to continue. A thread left waiting is "
            "reused by later --suspend runs as it stands; a run that reads the people scripts (without "
            "--suspend, or a round) runs it again, its script answering the wait, unless a person resumed it.",
        ),
    ] = False,
    cache: Annotated[CacheMode, CacheOption] = CacheMode.record,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Runs in flight at once.")] = 8,
    executor: Annotated[str | None, ExecutorOption] = None,
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
    resumes. A recorded thread whose file does not verify (as `improve replay --verify` checks it) is
    never reused as it is: its file is kept in .improve/damaged/, and the warehouse's verified copy is
    restored in its place, or else the scenario runs again. A model behind an endpoint has its calls recorded under .improve/cache (--cache), and
    the progress lines count its calls, tokens, USD and retries. The sealed test split is left out
    of --split all, and refused alone, unless --unseal (recorded, as `improve score --unseal` is).
    With --executor dask://HOST:PORT the runs go to a Dask cluster's workers in batches, and their
    threads come back here to be written and recorded (docs/scale-out.md). A model call that fails
    (the endpoint down, a timeout) leaves the decision to the policy's onError: the run exits 3 when
    the model never answered, or when more of its decisions than the objective's max_fallback_share
    fell back so, as the pass rate then measures the endpoint; the threads are kept either way.
    A run whose scenario's people script answers a wait with an event the machine's rules refuse
    there (the model took a path the script did not foresee) ends there, a failure of its scenario,
    said with the answer and the script's line; the other runs go on.
    Otherwise it exits 0 whatever the runs scored, violations (a sentinel reached) included: it
    measures. A round is blocked by violations (exit 1), and `improve explore` proves whether a
    sentinel can be reached at all.

    Example:

        improve run --env refunds --policy v0 --model naive --split train --k 3
        improve run --model openai:gpt-4.1-mini --k 3 --cache record
        improve run --env refund-approval --scenario large-approved-01 --k 1 \\
            --suspend
        improve run --split train --k 10 --executor dask://127.0.0.1:8786
    """
    from improve.evals import (
        SEALED_SPLIT,
        UNSEAL_HOW,
        Ledger,
        UnsealedScore,
        check_unsealable,
        fallbacks,
        mistyped_warnings,
        policy_label,
        refused_scripts,
        scorecard,
        split_warnings,
        suite_spec,
        write_threads,
    )
    from improve.evals import unseal as unseal_test
    from improve.llm import Meter
    from improve.log import JsonlDirStore
    from improve.machine import RESUMABLE_STATUSES

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
        warn_unknown_names(policy, policy_config, environment)  # run as asked, but not without saying so
        for warning in mistyped_warnings(environment, chosen, Path(scenario_set.source)):
            say(warning)
        for category in sorted({s.category for s in chosen}):  # said, as a round says it
            for warning in split_warnings(scenario_set.open_scenarios, category):
                say(f"warning: {warning}")
        spec = suite_spec(
            space, environment, policy_config, model, k=k, cache=cache.value, people=not suspend
        )
        meter = Meter(say=lambda m: err.print(m, markup=False))
        store = JsonlDirStore(space.traces)
        err.print(
            f"running {len(chosen)} scenarios x {spec.k} on {env_name} with policy "
            f"{policy_config.id}@{policy_config.version}, model {model} -> {space.traces}"
        )

        def ran(done: int, total: int) -> None:
            if spec.model_spec is not None and (done == total or done % 10 == 0):
                err.print(f"  {done}/{total} runs: {meter.summary()}", markup=False)

        if unseal and any(s.split == SEALED_SPLIT for s in chosen):
            check_unsealable(space, scenario_set)
        # One writer of the workspace's threads at a time: another run, a round or a resume waits.
        with space.writing(say):
            started = time.time_ns()  # a file written since is this command's (see `_keep_finished`)
            try:
                # The warehouse is opened only if a recorded thread's file does not verify (its copy there
                # may be whole): a run that reuses sound threads reads nothing more.
                with executor_for(space, executor) as fanout, Ledger(space, environment, say) as originals:
                    plan = write_threads(
                        environment,
                        chosen,
                        spec,
                        store,
                        fresh=fresh,
                        concurrency=concurrency,
                        executor=fanout,
                        ran=ran,
                        meter=meter,
                        keep=originals.keep(),
                    )
            except ImproveError:
                _keep_finished(space, environment, chosen, spec, started)
                raise
            # Every thread is recorded in the warehouse and read back from there, verified.
            with Ledger(space, environment, say) as ledger:
                recorded = ledger.record(
                    [p.thread_id for p in plan],
                    say=say,
                    rewritten=[p.thread_id for p in plan if not p.reused],
                )
                rows = recorded.rows
                for done, row in enumerate(rows, start=1):
                    mark = ("pass", "green") if row.passed else ("FAIL", "red")
                    err.print(styled(f"  [{done}/{len(rows)}] {row.thread_id} ", mark, f" {row.final_state}"))
                reused_count = sum(p.reused for p in plan)
                if reused_count:
                    err.print(f"reused {reused_count} recorded threads (--fresh runs them again)")
                restored = [p for p in plan if p.restored is not None]
                if restored:
                    say(
                        f"restored {len(restored)} recorded thread(s) whose file did not verify from the "
                        "warehouse's verified copy, not run again: "
                        + "; ".join(f"{p.thread_id}: {p.restored}" for p in restored[:3])
                        + (f"; and {len(restored) - 3} more" if len(restored) > 3 else "")
                    )
                again = [p for p in plan if p.replaced is not None]
                if again:
                    say(
                        f"ran {len(again)} recorded thread(s) again, each replaced: "
                        + "; ".join(f"{p.thread_id}: {p.replaced}" for p in again[:3])
                        + (f"; and {len(again) - 3} more" if len(again) > 3 else "")
                    )
                # Under --suspend no script is read: a run a script's refusal left at its first wait is
                # that wait, reused, and not scored as failed here.
                for note in [] if suspend else refused_scripts(plan, Path(scenario_set.source)):
                    say(note)
                # Under --suspend a run that stopped at its wait has no outcome yet: the pass rate is of
                # the runs that ended (it read 0.000 for a run only waiting for a person).
                waiting = [r for r in rows if suspend and r.status in RESUMABLE_STATUSES]
                summary = summarize(rows)
                if waiting:
                    ended = summarize([r for r in rows if r not in waiting])
                    summary.update(
                        runs=ended["runs"],
                        passed=ended["passed"],
                        pass_rate=ended["pass_rate"],
                        waiting=len(waiting),
                    )
                    say(
                        f"{len(waiting)} of {len(rows)} run(s) wait for a person (--suspend), not scored: "
                        f"`improve resume {waiting[0].thread_id} --event '{{...}}'` goes on with one"
                    )
                fell_back = fallbacks(rows)
                if fell_back.never_answered:
                    # No decision was the model's: a pass rate here would be the onError path's, read
                    # as the model's by a script that reads no further (the exit code says so too).
                    summary.update(pass_rate=None, on_error_pass_rate=summary["pass_rate"])
                unsealed = [r for r in rows if r.split == SEALED_SPLIT]
                unsealing = None
                if unsealed:
                    card = scorecard(unsealed, policy_label(policy_config), SEALED_SPLIT)
                    command = (
                        f"improve run --policy {policy} --model {model} --split {split} --k {spec.k} --unseal"
                    )
                    recorded_unsealing = unseal_test(
                        space,
                        scenario_set,
                        model,
                        [UnsealedScore.of(card, spec.policy_hash)],
                        command,
                        forget=lambda: ledger.forget([r.thread_id for r in unsealed]),
                    )
                    say(recorded_unsealing.message())
                    unsealing = recorded_unsealing.unsealing
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
            rate = (
                f"{summary['pass_rate']:.3f}" if summary["runs"] and summary["pass_rate"] is not None else "-"
            )
            if fell_back.never_answered:
                rate += f" (model {model} never answered: its runs took the policy's onError)"
            out.print(
                f"pass rate {rate} ({summary['passed']}/{summary['runs']} runs"
                + (f", {summary['waiting']} waiting for a person" if summary.get("waiting") else "")
                + "), "
                f"violations {summary['violations']}, model calls {summary['model_calls']}, "
                f"tokens {summary['tokens']}, model decisions {fell_back.decisions}, fell back "
                f"{fell_back.fallbacks}",
                markup=False,
            )
        if fell_back.fallbacks:
            err.print(f"warning: {fell_back.sentence()}", markup=False)
        if fell_back.never_answered:
            raise EndpointError(
                f"model {model} never answered: {fell_back.sentence()}. No pass rate is the model's (the "
                "runs above measure the policy's onError): fix the endpoint (its URL, key, server, or the way of "
                "asking: `ask` in [models.NAME]) and run again with --fresh"
            )
        most = space.config.objective.max_fallback_share
        if fell_back.past(most):
            raise EndpointError(
                f"model {model}: {fell_back.beyond(most)}. The pass rate above mixes the model's "
                "answers with the policy's onError: fix the endpoint (its URL, key, server, or the way of "
                "asking: `ask` in [models.NAME]) and run again with --fresh (recorded answers are not asked "
                "again)"
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
        "decisions": sum(r.decisions for r in rows),
        "fallbacks": sum(r.fallbacks for r in rows),
        "fallback_reason": next((r.fallback_reason for r in rows if r.fallback_reason), None),
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


def _keep_finished(
    space: Workspace, environment: Environment, chosen: list[Scenario], spec: SuiteSpec, started: int
) -> None:
    """After a run stopped on an error (a tool that crashed, a scenario its machine cannot take), the
    threads that finished are recorded in the warehouse all the same, so `improve sql` sees them: each
    thread is written whole or not at all, and those written since the command started are this run's
    (their earlier copies leave the warehouse). A failure to record them is said, never raised over the
    error that stopped the run."""
    from improve.evals import Ledger

    ids = [spec.thread_id(sc, n) for sc in chosen for n in range(1, spec.k + 1)]
    paths = {tid: space.thread_store(tid).path(tid) for tid in ids}
    written = [tid for tid, path in paths.items() if path.is_file()]
    if not written:
        return
    rewritten = [tid for tid in written if paths[tid].stat().st_mtime_ns >= started]
    try:
        with Ledger(space, environment) as ledger:
            ledger.record(written, rewritten=rewritten)
    except ImproveError as error:
        err.print(
            f"warning: the finished threads could not be recorded in the warehouse: {error}", markup=False
        )
        return
    if rewritten:  # threads of earlier runs are no news: a run stopped before its first says nothing
        err.print(
            f"recorded the {len(rewritten)} thread(s) this run finished in the warehouse before stopping",
            markup=False,
        )


def outcome_table(rows: list[OutcomeRow]) -> Table:
    from rich.table import Table

    table = Table(title="outcomes against expected (full reasons with --json)")
    # Piped, the table is 80 columns wide: every column but the pass fraction wraps (rich gave columns
    # that may not wrap no width at all, the pass column among them).
    table.add_column("scenario", overflow="fold", min_width=12)
    table.add_column("split", no_wrap=True, min_width=8)
    table.add_column("expected", overflow="fold", min_width=8)
    table.add_column("outcomes", overflow="fold", min_width=10)
    table.add_column("pass", no_wrap=True, min_width=5)
    table.add_column("why not (first reason)", overflow="fold", min_width=10, max_width=56)
    for item in per_scenario(rows):
        outcomes = ", ".join(f"{state} x{n}" for state, n in item["outcomes"].items())
        style = "green" if item["passed"] == item["runs"] else ("red" if item["passed"] == 0 else "yellow")
        why = item["reasons"][0].split("; ")[0] if item["reasons"] else ""
        table.add_row(
            item["scenario"],
            item["split"],
            item["expected"],
            outcomes,
            styled((f"{item['passed']}/{item['runs']}", style)),
            why,
        )
    return table
