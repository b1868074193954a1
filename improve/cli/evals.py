"""`improve score` and `improve scenarios check` / `add`: honest numbers from recorded runs, and the
labelled scenarios they are measured against."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from improve.cli.common import (
    EXIT_FAILED,
    EnvOption,
    ExecutorOption,
    JsonOption,
    WorkspaceOption,
    emit_json,
    err,
    executor_for,
    handled,
    out,
    say,
    workspace,
)
from improve.cli.unseal import check_unsealing, record_unsealed, unsealings_so_far
from improve.errors import ScenarioError, SealedSplitError, WorkspaceError
from improve.evals import (
    OPEN_SPLITS,
    SEALED_SPLIT,
    SPLITS,
    UNSEAL_HOW,
    UNSEALINGS_FILE,
    Comparison,
    Ledger,
    PlannedRun,
    Recorded,
    ScenarioSet,
    Scorecard,
    SuiteSpec,
    UnsealedScore,
    Workspace,
    append_scenario,
    compare,
    describe_model,
    load_scenarios,
    load_thread,
    policy_hash,
    policy_label,
    scenario_from_thread,
    scorecard,
    scorecard_markdown,
    set_key,
    split_warnings,
    write_threads,
)
from improve.log import ThreadId, model_slug
from improve.loop import held_out_status, policy_history, read_entries
from improve.machine import MachineConfig, run_rule_evals, uncovered
from improve.runtime import Environment, read_thread


def score_command(
    policy: Annotated[str, typer.Option("--policy", "-p", help="The version to score (v1) or a .json path.")],
    vs: Annotated[
        str | None, typer.Option("--vs", help="Compare against this version, scenario by scenario.")
    ] = None,
    split: Annotated[
        str,
        typer.Option(
            "--split",
            "-s",
            help="train, held-out, test (sealed: needs --unseal) or all (each split scored apart; test only "
            "with --unseal).",
        ),
    ] = "all",
    model: Annotated[
        str, typer.Option("--model", "-m", help="The model whose recorded runs are scored.")
    ] = "naive",
    unseal: Annotated[
        bool,
        typer.Option(
            "--unseal",
            help="Score the sealed test split (with --split test or all), making its k runs that are not "
            "recorded yet; the unsealing is recorded in the policies' test-unsealings.jsonl.",
        ),
    ] = False,
    env: Annotated[str | None, EnvOption] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="table or markdown (the PR body's scorecard).")
    ] = "table",
    executor: Annotated[str | None, ExecutorOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Score a policy version from its recorded runs (replayed, never the agent's report).

    Per split: each scenario's pass fraction over its k runs, their mean (the objective), violations
    and cost. With --vs: paired per-scenario differences, the exact stratified test of the gain (the
    promotion rule's test, one-sided), wins / ties / losses, the scenarios that changed with the exact
    test of each drop, and a descriptive bootstrap interval of the mean difference (its seed from
    improve.toml, printed); --json adds the sign and Wilcoxon tests.

    The sealed test split (`split: test` in the scenario file) is never read by a round; it is scored
    only here, with --unseal, and each unsealing is recorded (who, when, which policy version, the
    scores) in the policies' test-unsealings.jsonl. Its runs are made here (k from improve.toml; the
    recorded ones are reused). Unseal it for a final number: a change made because of a test score
    makes the test split one more reused held-out set. Scoring held-out warns when the rounds that
    read it (counted in the CHANGELOG) are more than its size supports. The runs --unseal makes go
    to --executor (a Dask cluster with dask://HOST:PORT).

    Example:

        improve score --policy v1 --vs v0 --split held-out --format markdown
        improve score --policy v3 --vs v0 --split test --unseal
    """
    with handled():
        if fmt not in ("table", "markdown"):
            raise WorkspaceError(f"unknown format {fmt!r}; use table or markdown")
        if split != "all" and split not in SPLITS:
            raise WorkspaceError(f"unknown split {split!r}; use {', '.join(SPLITS)} or all")
        if unseal and split not in (SEALED_SPLIT, "all"):
            raise WorkspaceError(
                f"--unseal unseals the sealed test split; pass --split {SEALED_SPLIT} (or all) with it, or "
                f"leave --unseal out to score {split}"
            )
        if split == SEALED_SPLIT and not unseal:
            raise SealedSplitError(f"--split {SEALED_SPLIT}: {UNSEAL_HOW}")
        space = workspace(ws)
        env_name = space.env_name(env)
        environment = space.environment(env_name)
        scenario_set = space.scenarios(env_name)
        scenarios = scenario_set.scenarios
        if unseal and not scenario_set.sealed:
            raise ScenarioError(
                f"{scenario_set.source}: no scenario has `split: {SEALED_SPLIT}`, so there is nothing to "
                f"unseal; label some with `split: {SEALED_SPLIT}` (or `improve scenarios add --split "
                f"{SEALED_SPLIT}`) before any round chooses a policy, and score them once at the end"
            )
        objective = space.config.objective
        if unseal:
            check_unsealing(space, env_name)
        with space.writing(say), Ledger(space, environment) as ledger:
            store = ledger.store
            known = {s.id for s in scenarios}
            splits = [*OPEN_SPLITS, *([SEALED_SPLIT] if unseal else [])] if split == "all" else [split]
            if split == "all" and not unseal and scenario_set.sealed:
                err.print(
                    f"the sealed test split ({len(scenario_set.sealed)} scenarios) is not scored; "
                    f"`--split {SEALED_SPLIT} --unseal` scores it (and records the unsealing)",
                    markup=False,
                )
            configs = {"new": space.load_policy(env_name, policy)}
            if vs:
                configs["old"] = space.load_policy(env_name, vs)
            cards: list[Scorecard] = []
            comparisons: list[Comparison] = []
            thread_ids: list[str] = []
            for part in splits:
                pair: dict[str, Scorecard] = {}
                for side in ("old", "new"):
                    if side not in configs:
                        continue
                    label = policy_label(configs[side])
                    # The recorded threads of this version and model, verified in the warehouse: a thread
                    # that does not verify is set aside, never scored.
                    rewritten: list[str] = []
                    if part == SEALED_SPLIT:
                        # Unsealing is one command: the test set's k runs are made (or reused) here, never
                        # by a round, and exactly the current test set is scored.
                        plan = _run_sealed(
                            space, environment, scenario_set, configs[side], model, ledger, executor
                        )
                        ids = [p.thread_id for p in plan]
                        rewritten = [p.thread_id for p in plan if not p.reused]
                    else:
                        ids = [
                            tid
                            for tid in ledger.recorded(f"{part}:{label}:{model_slug(model)}:")
                            if (parsed := ThreadId.parse(tid)) is not None and parsed.scenario in known
                        ]
                    recorded = (
                        ledger.record(ids, say=lambda m: err.print(m, markup=False), rewritten=rewritten)
                        if ids
                        else Recorded()
                    )
                    rows = recorded.rows
                    if not rows:
                        raise WorkspaceError(
                            f"no recorded runs of {label} with model {model} on {part} in {space.traces}; run "
                            f"`improve run --env {env_name} --policy {label} --model {model} --split {part} "
                            f"--k {objective.k}` first"
                        )
                    pair[side] = scorecard(rows, label, part)
                    thread_ids += [r.thread_id for r in rows]
                cards += [pair[s] for s in ("old", "new") if s in pair]
                if "old" in pair:
                    comparisons.append(
                        compare(
                            pair["old"],
                            pair["new"],
                            confidence=objective.confidence,
                            resamples=objective.bootstrap_resamples,
                            seed=objective.seed,
                            tolerance=objective.tolerance,
                        )
                    )
            held_out_reads = (
                held_out_status(
                    space.policies_dir(env_name) / "CHANGELOG.md",
                    scenario_set.split("held-out"),
                    objective.held_out_bias,
                )
                if "held-out" in splits
                else None
            )
            if held_out_reads and held_out_reads["warning"]:
                err.print(f"warning: {held_out_reads['warning']}", markup=False)
            unsealing = None
            if unseal:
                # Recorded before anything is shown: a look at the test scores is never unrecorded.
                sides = [configs[s] for s in ("old", "new") if s in configs]
                test_cards = [c for c in cards if c.split == SEALED_SPLIT]
                test_comparison = next((c for c in comparisons if c.split == SEALED_SPLIT), None)
                unsealing = record_unsealed(
                    space,
                    env_name,
                    scenario_set,
                    model,
                    [UnsealedScore.of(c, policy_hash(cfg)) for cfg, c in zip(sides, test_cards, strict=True)],
                    command=f"improve score --policy {policy}{f' --vs {vs}' if vs else ''} --model {model} "
                    f"--split {split} --unseal",
                    comparison=test_comparison.to_json() if test_comparison else None,
                    ledger=ledger,
                    thread_ids=thread_ids,
                )
            if as_json:
                emit_json(
                    {
                        "seed": objective.seed,
                        "scorecards": [c.to_json() for c in cards],
                        "comparisons": [c.to_json() for c in comparisons],
                        "sealed": {
                            "test_scenarios": len(scenario_set.sealed),
                            "unsealed": unseal,
                            "unsealings": unsealings_so_far(space, env_name, scenario_set),
                        },
                        "unsealing": unsealing.to_json() if unsealing else None,
                        "held_out_reads": held_out_reads,
                    }
                )
                return
            if fmt == "markdown":
                title = f"Scorecard: {policy_label(configs['new'])}" + (f" vs {vs}" if vs else "")
                threads = [store.read(tid) for tid in thread_ids[:1]]
                stamp = dict(threads[0][0].metadata or {}) if threads and threads[0] else {}
                prints = sorted(
                    {
                        str(e.event["fingerprint"])
                        for tid in (thread_ids if stamp.get("modelSpec") else [])
                        for e in store.read(tid)
                        if e.event.get("fingerprint")
                    }
                )
                # The versions that led to the scored one, as the rounds recorded them in the CHANGELOG.
                history = policy_history(
                    read_entries(space.policies_dir(env_name) / "CHANGELOG.md"), policy_label(configs["new"])
                )
                sys.stdout.write(
                    scorecard_markdown(
                        cards,
                        comparisons,
                        title=title,
                        old_policy=configs.get("old"),
                        new_policy=configs["new"] if vs else None,
                        seed=objective.seed,
                        model=describe_model(stamp, prints) if stamp else None,
                        history=history,
                    )
                )
                if unsealing:
                    # A scorecard pasted into a review says that its test numbers were an unsealing.
                    sys.stdout.write(
                        f"\nThe test split was unsealed for this scorecard: unsealing {unsealing.number} of test "
                        f"set `{unsealing.test_set}` ({unsealing.test_scenarios} scenarios) by {unsealing.who} "
                        f"at {unsealing.at}, recorded in `{UNSEALINGS_FILE}`.\n"
                    )
                return
            _print_tables(cards, comparisons, objective.seed)


def _run_sealed(
    space: Workspace,
    environment: Environment,
    scenario_set: ScenarioSet,
    policy: MachineConfig,
    model: str,
    ledger: Ledger,
    executor: str | None = None,
) -> list[PlannedRun]:
    """Run the k runs of the test split's scenarios that are not recorded yet (the recorded ones are
    reused), with the cache recording what is new; the thread ids of all of them."""
    objective = space.config.objective
    spec = SuiteSpec(
        policy,
        model,
        objective.k,
        objective.max_model_calls,
        space.model_spec(model, environment),
        str(space.cache_dir),
        "record",
    )
    with executor_for(space, executor) as fanout:
        plan = write_threads(
            environment, scenario_set.sealed, spec, ledger.store, concurrency=8, executor=fanout
        )
    ran = sum(1 for p in plan if not p.reused)
    err.print(
        f"test split: {len(scenario_set.sealed)} scenarios x {spec.k} with {policy_label(policy)}, model "
        f"{model} ({ran} runs made now, {len(plan) - ran} reused)",
        markup=False,
    )
    return plan


def _print_tables(cards: list[Scorecard], comparisons: list[Comparison], seed: int) -> None:
    from improve.evals import gain_phrase, p_value

    table = Table(title="scorecards (pass rate = mean of per-scenario pass fractions)")
    for column in (
        "split",
        "version",
        "scenarios",
        "k",
        "pass rate",
        "violations",
        "model calls/run",
        "tokens/run",
    ):
        table.add_column(column)
    for c in cards:
        runs = c.runs or 1
        table.add_row(
            c.split,
            c.policy_version,
            str(len(c.scenarios)),
            str(c.k),
            f"{c.pass_rate:.3f}",
            str(c.violations),
            f"{c.model_calls / runs:.2f}",
            f"{c.tokens / runs:.0f}",
        )
    out.print(table)
    for cmp in comparisons:
        out.print(
            f"{cmp.split}: {cmp.baseline} {cmp.baseline_rate:.3f} -> {cmp.candidate} {cmp.candidate_rate:.3f}, "
            f"mean diff {cmp.mean_diff:+.3f}, {gain_phrase(cmp)} (one-sided, the promotion rule's test), "
            f"wins/ties/losses {cmp.wins}/{cmp.ties}/{cmp.losses}; descriptive only: {cmp.confidence:.0%} "
            f"bootstrap CI [{cmp.ci_low:+.3f}, {cmp.ci_high:+.3f}] ({cmp.method}, {cmp.resamples} resamples, "
            f"seed {seed})",
            markup=False,
        )
        for ch in cmp.changed:
            drop = f" (drop test p = {p_value(ch.p_drop)})" if ch.diff < 0 else ""
            out.print(f"  {ch.scenario}: {ch.counts}{drop}", markup=False)


scenarios_app = typer.Typer(
    help="Scenario files: validate them, add a labelled one from a thread.", no_args_is_help=True
)


@scenarios_app.command("check")
def scenarios_check(
    env: Annotated[str | None, EnvOption] = None,
    path: Annotated[
        Path | None, typer.Option("--file", help="A scenario file (default: the workspace's).")
    ] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Check a scenario file: valid fields, unique ids, every category in both train and held-out, and
    expected outcomes that name final states of the environment. Exit 1 on any problem. The sealed
    `test` split is optional and counted apart (a category may be in it alone).

    Example:

        improve scenarios check --env refunds
    """
    with handled():
        space = workspace(ws)
        env_name = space.env_name(env)
        source = path or space.scenarios_path(env_name)
        problems: list[str] = []
        summary: dict[str, Any] = {"file": str(source)}
        environment = space.environment(env_name)
        try:
            scenario_set = load_scenarios(source, env_name)
        except ScenarioError as error:
            problems = str(error).splitlines()
        else:
            finals = set(environment.config.final_states())
            categories: dict[str, set[str]] = {}
            for s in scenario_set.scenarios:
                if s.split != SEALED_SPLIT:
                    categories.setdefault(s.category, set()).add(s.split)
                if s.expected.outcome not in finals:
                    problems.append(
                        f"{source}: scenario '{s.id}': expected.outcome '{s.expected.outcome}' is not a final "
                        f"state of {environment.name}; final states are {sorted(finals)}"
                    )
            for category, splits in sorted(categories.items()):
                missing = sorted(set(OPEN_SPLITS) - splits)
                if missing:
                    problems.append(
                        f"{source}: category '{category}' has no scenario in {', '.join(missing)}"
                    )
            summary |= {
                "environment": scenario_set.environment,
                "scenarios": len(scenario_set.scenarios),
                "categories": len(categories),
                "train": len(scenario_set.split("train")),
                "held_out": len(scenario_set.split("held-out")),
                "test": len(scenario_set.sealed),
                "held_out_set": set_key(scenario_set.split("held-out")),
                "test_set": set_key(scenario_set.sealed) if scenario_set.sealed else None,
            }
        if as_json:
            emit_json(summary | {"ok": not problems, "problems": problems})
        elif problems:
            for problem in problems:
                err.print(problem, markup=False)
        else:
            sealed = f" / {summary['test']} test (sealed)" if summary["test"] else ""
            out.print(
                f"{source}: {summary['scenarios']} scenarios in {summary['categories']} categories, "
                f"{summary['train']} train / {summary['held_out']} held-out{sealed}, every category in both "
                "train and held-out",
                markup=False,
            )
        if problems:
            raise typer.Exit(EXIT_FAILED)


@scenarios_app.command("add")
def scenarios_add(
    from_thread: Annotated[
        str,
        typer.Option(
            "--from-thread",
            help="The thread: an id in the workspace's traces/ or a path to a .jsonl file of one thread.",
        ),
    ],
    expect: Annotated[str, typer.Option("--expect", help="The label: the final state the run must end in.")],
    split: Annotated[
        str,
        typer.Option(
            "--split", help="train, held-out or test (the sealed split no round reads; fixed in the file)."
        ),
    ],
    effect: Annotated[
        list[str] | None,
        typer.Option(
            "--effect",
            help="An expected effect as a JSON object with its `kind` (repeat for each); none: the outcome "
            "alone is compared.",
        ),
    ] = None,
    no_effects: Annotated[
        bool, typer.Option("--no-effects", help="Label that the run records no effect at all (effects: []).")
    ] = False,
    category: Annotated[
        str | None, typer.Option("--category", help="Its category (default: the --expect state).")
    ] = None,
    scenario_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="Its id (default: <category>-<the thread's scenario>, or <category>-<hash> for a thread "
            "that came from no scenario).",
        ),
    ] = None,
    env: Annotated[str | None, EnvOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Add a labelled scenario made from a recorded thread to the environment's scenario file.

    The input and the people's answers are the thread's; the world is rebuilt from the tools' recorded
    answers by the environment's `world_from_thread` and checked to make every tool answer as it did,
    so the same situation replays against any policy. The label is yours: --expect a final state, and
    each expected effect with --effect (without one, the outcome alone is compared). The item is
    appended as text at the end of the `scenarios:` list, and read back before the file is replaced;
    a bad label, a taken id or a result that would not load writes nothing (exit 2). A category in
    only one split is a warning: `improve scenarios check` fails until the other split has one.

    Example:

        improve scenarios add --from-thread train:v0:naive:small-refund-01:r1 \\
            --expect issued --split held-out --category small-refund \\
            --effect '{"kind": "refund", "orderId": "O-5001", "amount": 23.5}'
    """
    with handled():
        if effect and no_effects:
            raise ScenarioError("--effect and --no-effects say different things; pass one of them")
        space = workspace(ws)
        env_name = space.env_name(env)
        environment = space.environment(env_name)
        expected_effects = [] if no_effects else _parse_effects(effect) if effect else None
        thread_id, entries = load_thread(from_thread, space.traces)
        scenario = scenario_from_thread(
            environment,
            entries,
            expect=expect,
            effects=expected_effects,
            split=split,
            category=category,
            id=scenario_id,
            thread_id=thread_id,
        )
        thread = read_thread(environment.machine, entries, thread_id)
        recorded = {"final_state": thread.final_state, "status": thread.status, "effects": thread.effects}
        path = space.scenarios_path(env_name)
        scenarios = append_scenario(
            path,
            scenario,
            env_name,
            comment=f"From thread {thread_id} (improve scenarios add --from-thread).",
        )
        warnings = split_warnings(scenarios, scenario.category)
        if expect in environment.config.sentinels():
            warnings.append(
                f"--expect {expect!r} is a sentinel of {env_name}, a state that must never be reached; a "
                "scenario labelled with it passes only when the rule is broken"
            )
        if as_json:
            emit_json(
                {
                    "file": str(path),
                    "thread": thread_id,
                    "scenario": scenario.model_dump(mode="json", exclude_none=True),
                    "recorded": recorded,
                    "warnings": warnings,
                }
            )
        else:
            out.print(
                f"added scenario '{scenario.id}' (category {scenario.category}, {scenario.split}) to {path}, "
                f"from thread {thread_id}",
                markup=False,
            )
            err.print(
                f"the thread itself ended in '{thread.final_state}' ({thread.status}) with effects "
                f"{json.dumps(thread.effects)}; labelled '{expect}'",
                markup=False,
            )
        for warning in warnings:
            err.print(f"warning: {warning}", markup=False)


def _parse_effects(raw: list[str]) -> list[dict[str, Any]]:
    effects: list[dict[str, Any]] = []
    for number, text in enumerate(raw, start=1):
        try:
            value = json.loads(text)
        except ValueError as error:
            value = error
        if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
            raise ScenarioError(
                f"--effect #{number} {text!r} is not a JSON object with a `kind`; write one as the world "
                """records it, e.g. '{"kind": "refund", "orderId": "O-5001", "amount": 40}'"""
            )
        effects.append(value)
    return effects


def rules_command(
    env: Annotated[str | None, EnvOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Run the environment's rule evals: its guards tested on the interpreter, no model called.

    Each eval names the states it covers; guarded states no eval covers are listed. Exit 1 when an
    eval fails or a guarded state is uncovered.

    Example:

        improve rules --env refunds
    """
    with handled():
        environment = workspace(ws).environment(env)
        results = run_rule_evals(environment.machine, environment.rule_evals)
        gaps = uncovered(environment.machine, results)
        if as_json:
            emit_json(
                {
                    "environment": environment.name,
                    "results": [r.to_json() for r in results],
                    "uncovered": gaps,
                }
            )
        else:
            for r in results:
                mark = "[green]pass[/]" if r.ok else "[red]FAIL[/]"
                out.print(f"{mark} {r.name} (covers {', '.join(r.covers)}): ", end="")
                out.print(r.detail, markup=False)
            out.print(f"guarded states not covered: {', '.join(gaps) or 'none'}", markup=False)
        if gaps or not all(r.ok for r in results):
            raise typer.Exit(EXIT_FAILED)
