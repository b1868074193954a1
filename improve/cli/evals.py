"""`improve score` and `improve scenarios check` / `add`: honest numbers from recorded runs, and the
labelled scenarios they are measured against."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from improve.cli.common import (
    EXIT_FAILED,
    CacheMode,
    CacheOption,
    EnvOption,
    ExecutorOption,
    JsonOption,
    WorkspaceOption,
    emit_json,
    err,
    handled,
    out,
    say,
    styled,
    workspace,
)
from improve.cli.help import Command, Group
from improve.errors import MachineError, ScenarioError, WorkspaceError

if TYPE_CHECKING:
    from improve.evals import Comparison, OutOfSample, Scorecard


ScoredPolicyOption = typer.Option("--policy", "-p", help="The version to score (v1) or a .json path.")
VsOption = typer.Option("--vs", help="Compare against this version, scenario by scenario.")
ScoreSplitOption = typer.Option(
    "--split",
    "-s",
    help="train, held-out, test (sealed: needs --unseal) or all (each split scored apart; test only with --unseal).",
)
ScoredModelOption = typer.Option("--model", "-m", help="The model whose recorded runs are scored.")
UnsealOption = typer.Option(
    "--unseal",
    help="Score the sealed test split (with --split test or all), making its k runs that are not recorded "
    "yet; the unsealing is recorded in the policies' test-unsealings.jsonl.",
)
ScoreFormatOption = typer.Option("--format", "-f", help="table or markdown (the PR body's scorecard).")


def score_command(
    policy: Annotated[str, ScoredPolicyOption],
    vs: Annotated[str | None, VsOption] = None,
    split: Annotated[str, ScoreSplitOption] = "all",
    model: Annotated[str, ScoredModelOption] = "naive",
    unseal: Annotated[bool, UnsealOption] = False,
    env: Annotated[str | None, EnvOption] = None,
    fmt: Annotated[str, ScoreFormatOption] = "table",
    executor: Annotated[str | None, ExecutorOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Score a policy version from its recorded runs (replayed, never the agent's report).

    Per split: each scenario's pass fraction over its k runs, their mean (the objective), violations
    and cost. With --vs: paired differences, the promotion rule's exact test of the gain, wins / ties /
    losses, the scenarios that changed with the exact test of each drop, a bootstrap interval of the
    mean difference (seeded from improve.toml); --json adds the sign and Wilcoxon tests. Scoring
    held-out warns when more rounds read it than its size supports. The sealed test split is scored only
    with --unseal (its missing runs made, to --executor when given), each unsealing recorded in the
    policies' test-unsealings.jsonl: unseal it once, for a final number.

    Example:

        improve score --policy v1 --vs v0 --split held-out --format markdown
        improve score --policy v3 --vs v0 --split test --unseal
    """
    from improve.loop import ScoreRequest, score_policy  # imported when run: --help stays fast

    with handled():
        if fmt not in ("table", "markdown"):
            raise WorkspaceError(f"unknown format {fmt!r}; use table or markdown")
        request = ScoreRequest(policy, vs, split, model, unseal, env, executor, described=fmt == "markdown")
        scores = score_policy(workspace(ws), request, say=say)
        if as_json:
            emit_json(scores.to_json())
        elif fmt == "markdown":
            sys.stdout.write(scores.markdown(vs))
        else:
            _print_tables(scores.cards, scores.comparisons, scores.seed)


def _print_tables(cards: list[Scorecard], comparisons: list[Comparison], seed: int) -> None:
    from rich.table import Table

    from improve.evals import gain_phrase, p_value

    table = Table(title="scorecards (pass rate = mean of per-scenario pass fractions)")
    # Decisions the policy's onError answered because a model call failed: shown where there are any, as
    # such a pass rate measures the endpoint as much as the model.
    fell_back = any(c.fallbacks for c in cards)
    columns = [
        "split",
        "version",
        "scenarios",
        "k",
        "pass rate",
        "violations",
        "model calls/run",
        "tokens/run",
    ]
    for column in [*columns, *(["fell back"] if fell_back else [])]:
        table.add_column(column)
    for c in cards:
        runs = c.runs or 1
        table.add_row(
            c.split,
            c.policy_version,
            str(len(c.scenarios)),
            c.runs_per_scenario,
            f"{c.pass_rate:.3f}",
            str(c.violations),
            f"{c.model_calls / runs:.2f}",
            f"{c.tokens / runs:.0f}",
            *([f"{c.fallbacks}/{c.decisions}"] if fell_back else []),
        )
    out.print(table)
    for c in cards:
        if c.fallbacks:
            err.print(
                f"warning: {c.split} {c.policy_version}: {c.fallbacks} of {c.decisions} model decisions fell back "
                "to the policy's onError (a failed model call): that pass rate is not the model's alone; run "
                "`improve run --fresh` again once the endpoint answers",
                markup=False,
            )
    for cmp in comparisons:
        out.print(
            f"{cmp.split}: {cmp.baseline} {cmp.baseline_rate:.3f} -> {cmp.candidate} {cmp.candidate_rate:.3f}, "
            f"mean diff {cmp.mean_diff:+.3f}, {gain_phrase(cmp)} (one-sided, the promotion rule's test), "
            f"wins/ties/losses {cmp.wins}/{cmp.ties}/{cmp.losses}; descriptive only: {cmp.confidence:.0%} "
            f"bootstrap CI [{cmp.ci_low:+.3f}, {cmp.ci_high:+.3f}] ({cmp.method}, {cmp.resamples} resamples, "
            f"seed {seed})",
            markup=False,
        )
        varied = any(
            "-" in c.runs_per_scenario
            for c in cards
            if c.split == cmp.split and c.policy_version in (cmp.baseline, cmp.candidate)
        )
        if varied:
            # A user saw 4.2e-10 here and 4.5e-08 in the round's PR for the same runs, and no reason.
            out.print(
                "  (p takes each scenario's runs as one fixed design; some scenarios have more runs than "
                "others, the reruns of a round, and a round's test conditions on when they stopped, so "
                "its p for the same runs is larger)",
                markup=False,
            )
        for ch in cmp.changed:
            drop = f" (drop test p = {p_value(ch.p_drop)})" if ch.diff < 0 else ""
            out.print(f"  {ch.scenario}: {ch.counts}{drop}", markup=False)


scenarios_app = typer.Typer(
    cls=Group,
    rich_markup_mode=None,
    help=(
        "Scenario files: validate them, add a labelled one from a thread.\n\nExample:\n\n"
        "    improve scenarios check --env refunds\n"
        "    improve scenarios add --from-thread THREAD --expect STATE --split held-out"
    ),
    no_args_is_help=True,
    add_completion=False,
)


def _untyped(environment: Any) -> list[str]:
    """The facts a decision gives that no declared type covers, as warnings (`untyped_facts`)."""
    from improve.runtime import untyped_facts

    return [
        f"decision '{decision}' gives facts with no declared type ({', '.join(paths)}): read as `any`, "
        "which a policy may read but the rule miner never tests; declare each in the environment's "
        "fact_types (docs/extending.md)"
        for decision, paths in untyped_facts(environment).items()
    ]


@scenarios_app.command("check", cls=Command)
def scenarios_check(
    env: Annotated[str | None, EnvOption] = None,
    path: Annotated[
        Path | None, typer.Option("--file", help="A scenario file (default: the workspace's).")
    ] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Check a scenario file: valid fields, unique ids, every category in both train and held-out,
    expected outcomes that name final states of the environment, and inputs the environment's machine
    can start with (its context reads each key it names) and whose values a decision's declared
    fact takes as given are of its type, people scripts whose fields are of the types
    the machine's meta.payloads declares, and decisions whose facts are of their declared
    types, and runs that stop (each scenario run once with careful, in memory: an enumerated value
    misspelt, or a tool that crashes on the scenario's world, is named; a label careful does not
    reach is a warning, and so is a people script's answer careful's run never gives that its
    state's rules refuse in every context of that run). Each problem names the file, the line of
    the field it is about and the scenario. Exit 1 on any problem. The sealed
    `test` split is optional and counted apart (a category may be in it alone).

    Example:

        improve scenarios check --env refunds
    """
    from improve.evals import (
        OPEN_SPLITS,
        SEALED_SPLIT,
        ScenarioLines,
        ScenarioSet,
        alike_warnings,
        category_splits,
        input_problems,
        label_problem,
        load_scenarios,
        people_problems,
        reference_check,
        set_key,
        valid_scenarios,
    )
    from improve.machine import initial

    with handled():
        space = workspace(ws)
        env_name = space.env_name(env)
        source = path or space.scenarios_path(env_name)
        if not source.is_file():  # nothing to check: a usage error (exit 2), as `improve run` says it
            raise WorkspaceError(
                f"{source}: no such scenario file"
                + (
                    ""
                    if path is None
                    else f" (without --file, the workspace's: {space.scenarios_path(env_name)})"
                )
            )
        problems: list[str] = []
        summary: dict[str, Any] = {"file": str(source)}
        environment = space.environment(env_name)
        scenario_set: ScenarioSet | None = None
        try:
            scenario_set = load_scenarios(source, env_name)
            scenarios = scenario_set.scenarios
        except ScenarioError as error:
            problems = str(error).splitlines()
            # The scenarios that are valid on their own are checked further all the same: every problem
            # of the file at once, not one kind per try.
            scenarios = valid_scenarios(source)
        finals, sentinels = set(environment.config.final_states()), set(environment.config.sentinels())
        categories: dict[str, set[str]] = {}
        # Each problem said at the line of the field it is about (`pets: hamster`), not the scenario's first.
        lines = ScenarioLines.read(source)
        unreached: list[str] = []
        for s in scenarios:
            if s.split != SEALED_SPLIT:
                categories.setdefault(s.category, set()).add(s.split)
            if problem := label_problem(s.expected.outcome, finals, sentinels, environment.name):
                problems.append(f"{lines.where(s.id, ('expected', 'outcome'))}: scenario '{s.id}': {problem}")
            # The machine's first step reads the input alone (its context, its first choices): a key
            # spelled otherwise is found here, not when a run of the whole suite stops on it.
            try:
                initial(environment.machine, s.input)
            except MachineError as error:
                problems.append(
                    f"{lines.where(s.id, ('input',))}: scenario '{s.id}': input: {environment.name}'s machine "
                    f"cannot start with it: {error}"
                )
                continue
            # What people answer, against the types the machine declares: a run stops on a wrong one deep
            # in a guard (a CEL overload error), so the run below would only say that again, less clearly.
            answered = people_problems(environment.config, s)
            # And the input's values that a decision's declared fact is, as given.
            answered += input_problems(environment, s)
            problems += [f"{lines.where(s.id, field)}: scenario '{s.id}': {what}" for field, what in answered]
            if answered:
                continue
            # Its decisions' facts, as a run with careful makes them, against their declared types.
            # And a label the environment's own reference does not reach: said, not refused (the label
            # is the person's), as `scenarios add` says it of the one it adds. One run tells both.
            checked = reference_check(environment, s)
            if checked.stopped:
                problems.append(
                    f"{lines.where(s.id, checked.stopped_at)}: scenario '{s.id}': {checked.stopped}"
                )
            problems += [
                f"{lines.where(s.id, wrong.field(lines, s.id))}: scenario '{s.id}': {wrong}"
                for wrong in checked.mistyped
            ]
            if checked.unreached is not None and s.split != SEALED_SPLIT:
                unreached.append(
                    f"scenario '{s.id}' (line {lines.line(s.id) or '?'}): careful, the environment's reference, "
                    f"does not reach its label: {checked.unreached}"
                )
            # An answer careful's path never asks for, refused wherever it would be asked: said, not
            # refused (careful's runs pass), for the runs of a model that waits there.
            unreached += [
                f"scenario '{s.id}' (line {lines.line(s.id, ('people', r.state, r.index)) or '?'}): "
                f"{r.sentence()} in every context careful's run passed through (it never waits there): a run "
                "that waits there (a model taking another path) ends there, failed"
                for r in checked.refusable
            ]
        if scenario_set is not None and not [s for s in scenario_set.scenarios if s.split != SEALED_SPLIT]:
            # Nothing to run or score: every later command would report 0/0 runs and pass.
            problems.append(
                f"{source}: no scenario in train or held-out: a round needs labelled scenarios in both "
                "(write them as docs/extending.md shows, or label a recorded run: `improve scenarios add --from-thread`)"
            )
        # A file that does not load is checked for its categories too, over its items as written.
        covered = categories if scenario_set is not None else category_splits(source)
        for category, splits in sorted(covered.items()):
            missing = sorted(set(OPEN_SPLITS) - splits)
            if missing and splits - {SEALED_SPLIT}:
                problems.append(f"{source}: category '{category}' has no scenario in {', '.join(missing)}")
        if scenario_set is not None:
            summary |= {
                "environment": scenario_set.environment,
                "scenarios": len(scenario_set.scenarios),
                "categories": len(categories),
                "train": len(scenario_set.split("train")),
                "held_out": len(scenario_set.split("held-out")),
                "test": len(scenario_set.sealed),
                "held_out_set": set_key(scenario_set.split("held-out")),
                "test_set": set_key(scenario_set.sealed) if scenario_set.sealed else None,
                "warnings": alike_warnings(scenario_set) + unreached + _untyped(environment),
            }
        for warning in summary.get("warnings", []) if not as_json else []:
            err.print(f"warning: {source}: {warning}", markup=False)
        if as_json:
            emit_json(summary | {"ok": not problems, "problems": problems})
        elif problems:
            for problem in _grouped(problems):
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


def _grouped(problems: list[str]) -> list[str]:
    """The problems as printed: one that three or more scenarios share (an expression of the machine
    that fails on any data, a tool that crashes on every world) said once, with the first scenario's
    line, what it says there and how many more; `--json` keeps each. Shared means word for word, but
    for the values an expression failed with (` failed with ...`), which differ from scenario to
    scenario (one misspelt key in a guard was said 32 times)."""
    shape = re.compile(r"^(?P<where>.*?: scenario '(?P<id>[^']*)'): (?P<what>.*)$", re.S)

    def same(found: re.Match[str]) -> str:
        return found["what"].split(" failed with ", 1)[0]

    by_what: dict[str, list[re.Match[str]]] = {}
    for problem in problems:
        found = shape.match(problem)
        if found:
            by_what.setdefault(same(found), []).append(found)
    out: list[str] = []
    said: set[str] = set()
    for problem in problems:
        found = shape.match(problem)
        shared = by_what.get(same(found), []) if found else []
        if not found or len(shared) < 3:
            out.append(problem)
        elif same(found) not in said:
            said.add(same(found))
            ids = ", ".join(f"'{m['id']}'" for m in shared[:3])
            out.append(
                f"{found['where']} and {len(shared) - 1} more scenario(s) ({ids}, ...): {found['what']} "
                "(the same in each: look at the machine or the tool before the scenarios)"
            )
    return out


@scenarios_app.command("add", cls=Command)
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
    only one split is a warning: `improve scenarios check` fails until the other split has one. So is a
    label `careful`, the environment's reference, does not reach (an effect's id mistyped).

    Example:

        improve scenarios add --from-thread train:v0:naive:small-refund-01:r1 \\
            --expect issued --split held-out --category small-refund \\
            --effect '{"kind": "refund", "orderId": "O-5001", "amount": 23.5}'
    """
    from improve.evals import (
        alike_warnings,
        append_scenario,
        find_thread,
        reference_disagrees,
        scenario_from_thread,
        split_warnings,
    )
    from improve.runtime import recorded_thread

    with handled():
        if effect and no_effects:
            raise ScenarioError("--effect and --no-effects say different things; pass one of them")
        space = workspace(ws)
        env_name = space.env_name(env)
        environment = space.environment(env_name)
        thread_id, entries = find_thread(from_thread, space)
        thread = recorded_thread(environment.machine, entries, thread_id)
        expected_effects = [] if no_effects else _parse_effects(effect, thread.effects) if effect else None
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
        recorded = {"final_state": thread.final_state, "status": thread.status, "effects": thread.effects}
        path = space.scenarios_path(env_name)
        scenarios = append_scenario(
            path,
            scenario,
            env_name,
            comment=f"From thread {thread_id} (improve scenarios add --from-thread).",
        )
        warnings = split_warnings(scenarios.open_scenarios, scenario.category) + alike_warnings(
            scenarios, scenario
        )
        disagrees = reference_disagrees(environment, scenario)
        if disagrees is not None:
            warnings.append(
                f"careful, the environment's reference, does not reach this label: {disagrees}. Check the "
                "label (an effect's id or amount, the final state) before a round learns from it"
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


def _parse_effects(raw: list[str], recorded: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The `--effect` objects; `recorded`, the thread's own effects, give the example a mistake is shown
    (the refund desk's was shown on every desk)."""
    effects: list[dict[str, Any]] = []
    for number, text in enumerate(raw, start=1):
        try:
            value = json.loads(text)
        except ValueError as error:
            value = error
        if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
            example = (
                f"as the thread recorded one: '{json.dumps(recorded[0])}'"
                if recorded
                else """e.g. '{"kind": "refund", "orderId": "O-5001", "amount": 40}'"""
            )
            raise ScenarioError(
                f"--effect #{number} {text!r} is not a JSON object with a `kind`; write one as the world "
                f"records it, {example}"
            )
        effects.append(value)
    return effects


def rules_command(
    env: Annotated[str | None, EnvOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Run the environment's rule evals: its guards tested on the interpreter, no model called.

    Each eval names the states it covers; guarded states no eval covers are listed (a state is guarded
    when any of its transitions is: an event's, an `always`, a tool's onDone or onError). Exit 1 when an
    eval fails or a guarded state is uncovered.

    Example:

        improve rules --env refunds
    """
    from improve.machine import run_rule_evals, uncovered
    from improve.runtime import written_at

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
                mark = ("pass", "green") if r.ok else ("FAIL", "red")
                out.print(styled(mark, f" {r.name} (covers {', '.join(r.covers)}): "), end="")
                # A failing eval names where it is written (its name's line), for an editor to jump to.
                where = "" if r.ok else written_at(environment, r.name).removesuffix(": ")
                out.print(r.detail + (f" ({where})" if where else ""), markup=False)
            if gaps:
                out.print(
                    "  a state is guarded when any of its transitions is (an event's, an `always`, a tool's "
                    "onDone or onError): name each in the `covers` of a RuleEval that drives the machine "
                    "there (its `events`, then `state`, `accepts` and `refuses`: docs/extending.md)",
                    markup=False,
                )
        if gaps or not all(r.ok for r in results):
            raise typer.Exit(EXIT_FAILED)


OosCasesOption = typer.Option(
    "--cases", "-n", help="How many cases to draw from the environment's generator."
)
OosModelOption = typer.Option(
    "--model",
    "-m",
    help="A model to run each policy with: a stand-in, openai:MODEL or a [models.NAME] (every case of "
    "every policy asks it); repeat for several (default: careful and naive).",
)
OosSeedOption = typer.Option("--seed", help="The generator's seed: the same seed draws the same cases.")
OosScenariosOption = typer.Option(
    "--scenarios",
    help="Write the cases the last version ended otherwise than labelled (at most 10 per model: half "
    "answered by a learned branch, half by the model, where both are many) to this new file as scenarios to "
    "check: labelled as the check labelled them, in train. Move those whose label is right into the "
    "environment's scenario file; the next round learns from them.",
    metavar="FILE",
)


def out_of_sample_command(
    versions: Annotated[
        list[str],
        typer.Argument(
            help="Policy versions (v0 v3); the first labels cases the generator leaves unlabelled.",
            metavar="VERSION",
        ),
    ],
    cases: Annotated[int, OosCasesOption] = 400,
    models: Annotated[list[str] | None, OosModelOption] = None,
    seed: Annotated[int | None, OosSeedOption] = None,
    drafts: Annotated[Path | None, OosScenariosOption] = None,
    cache: Annotated[CacheMode, CacheOption] = CacheMode.record,
    env: Annotated[str | None, EnvOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Check policies on plausible cases no round has seen, drawn from the environment's generator.

    Each policy runs once per case with each model. A case agrees when it ends as labelled: by the
    generator's own labels when it has them (a handbook in code), else by careful's run of the first
    version. With careful, agreement below 1.000 counts right answers a learned branch overrode; with a
    weaker stand-in or your real model, how much of its gap the branches close. A model behind an
    endpoint is asked every case of every policy (start with --cases 40; its answers are recorded, so the
    same check again asks nothing: --cache live asks anew); when it never answers, or its calls fail
    for more of its decisions than the objective's max_fallback_share, the command says so and exits 3,
    since the figures would measure the policy's onError. The environment
    needs a generator (Environment.cases; docs/extending.md, "Plausible cases"). A case the last version
    ends otherwise than labelled is a rule reaching past its evidence (a learned branch answered it
    otherwise than careful would: "overridden by a branch") or a
    gap the labelled scenarios do not show (the model answered it): --scenarios writes such cases as
    scenarios, so that a person checks their labels and adds them for the next round to learn from.

    Example:

        improve out-of-sample v0 v5 --cases 400
        improve out-of-sample v0 v5 -m careful -m naive --json
        improve out-of-sample v0 v5 -m openai:smollm2 --cases 40
        improve out-of-sample v0 v5 --scenarios drafts.yaml
    """
    from improve.errors import EndpointError
    from improve.evals import check_out_of_sample  # imported when run: --help stays fast
    from improve.llm import Meter

    with handled():
        chosen = models or ["careful", "naive"]
        meter = Meter(say=say)
        # Refused before the cases run (a real model's answers take minutes), not after.
        if drafts is not None and drafts.exists():
            raise ScenarioError(
                f"{drafts}: already exists; --scenarios writes a new file (name another, or move this one away)"
            )
        if drafts is not None and not drafts.parent.is_dir():
            raise ScenarioError(
                f"{drafts}: no directory {drafts.parent} to write it in; create it, or name another"
            )
        space = workspace(ws)
        found = check_out_of_sample(
            space, env, versions, chosen, n=cases, seed=seed, say=say, meter=meter, cache=cache.value
        )
        _print_out_of_sample(found, as_json)
        _write_drafts(found, drafts, as_json)
        for a in found.agreements:
            if a.fell_back.fallbacks and not a.fell_back.never_answered:
                err.print(f"warning: {a.policy} with {a.model}: {a.fell_back.sentence()}", markup=False)
            if a.skipped:
                err.print(
                    f"warning: {a.policy} with {a.model}: {a.skipped} generated case(s) could not run, left out "
                    f"of its agreement (fix the environment's generator, Environment.cases): {a.skipped_reason}",
                    markup=False,
                )
        silent = found.never_answered()
        if silent:
            first = silent[0]
            raise EndpointError(
                f"model {first.model} never answered ({first.policy}: {first.fell_back.sentence()}): its "
                "agreement measures the policy's onError, not the model; fix the endpoint and run again"
            )
        most = space.config.objective.max_fallback_share
        mixed = [a for a in found.agreements if a.fell_back.past(most)]
        if mixed:
            first = mixed[0]
            raise EndpointError(
                f"model {first.model} ({first.policy}): {first.fell_back.beyond(most)}: its agreement mixes "
                "the model's answers with the policy's onError; fix the "
                "endpoint and run again (recorded answers are not asked again)"
            )


def _write_drafts(found: OutOfSample, path: Path | None, as_json: bool) -> None:
    """The cases the last version ended otherwise than labelled: written as scenarios when `path` is
    given, else a hint that they can be (said on stderr, so --json stays one document)."""
    from improve.evals import DRAFTS, write_drafts

    drafts = found.drafts()
    last = found.agreements[-1].policy if found.agreements else "the last version"
    # The drafts are a few of the cases it ended otherwise (the table counts them all): said as such.
    few = f"{len(drafts)} of the cases {last} ended otherwise than labelled (at most {DRAFTS} a model, half a learned branch's where both are many)"
    if not drafts:
        if path is not None:
            err.print(f"{last} ended every case as labelled: {path} not written", markup=False)
        return
    if path is None:
        if not as_json:
            err.print(
                f"{few}: --scenarios FILE writes them as scenarios to check and add, so the next round learns "
                "from them",
                markup=False,
            )
        return
    write_drafts(path, found.environment, drafts)
    err.print(
        f"wrote {few} to {path}: check each label (a "
        "comment says who answered and who labelled it), give some the held-out split, then move them into "
        "the environment's scenario file (`improve scenarios check`)",
        markup=False,
    )


def _print_out_of_sample(found: OutOfSample, as_json: bool) -> None:
    """The agreements as one JSON document, or as a table."""
    if as_json:
        emit_json(found.to_json())
        return
    from rich.table import Table

    table = Table(
        title=f"{found.environment}: {found.cases} generated cases (seed {found.seed}), labelled by {found.labelled_by}"
    )
    for column in (
        "policy",
        "model",
        "agreed",
        "agreement",
        "overridden by a branch",
        "worst categories",
    ):
        table.add_column(column)
    for a in found.agreements:
        worst = sorted(
            (
                (agreed / total, category)
                for category, (agreed, total) in a.by_category.items()
                if agreed < total
            )
        )[:3]
        table.add_row(
            a.policy,
            a.model,
            f"{a.agreed}/{a.cases}",
            f"{a.rate:.3f}",
            str(a.by_rule) + "".join(f"\n{name} {n}" for name, n in list(a.branches.items())[:3]),
            ", ".join(f"{c} {r:.2f}" for r, c in worst) or "-",
        )
    out.print(table)
