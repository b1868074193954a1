"""`improve round` and `improve diagnose`: the improvement loop from the command line."""

from __future__ import annotations

import os
from contextlib import ExitStack
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from improve.cli.common import (
    EXIT_FAILED,
    EXIT_INFRA,
    CacheMode,
    CacheOption,
    EnvOption,
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
    workspace,
)
from improve.errors import WorkspaceError

if TYPE_CHECKING:
    from improve.evals import Workspace
    from improve.loop import RoundRecord


GUARD_SHOWN = 72
"""The most of a refusing guard's text `diagnose --source production` shows in its table."""


def round_command(
    policy: Annotated[
        str, typer.Option("--policy", "-p", help="The current policy version (v3) or a .json path.")
    ],
    env: Annotated[str | None, EnvOption] = None,
    k: Annotated[
        int | None, typer.Option("--k", min=1, help="Runs per scenario (default from improve.toml).")
    ] = None,
    proposer: Annotated[
        str,
        typer.Option(
            "--proposer",
            help="rules (no model needed), openai, or one registered by a package or in improve.toml [proposers].",
        ),
    ] = "rules",
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=1,
            help="Candidates to try, each aimed at the next cause, until one is recommended (the next "
            "round starts from it once a person merges it); it stops after 3 rounds in a row that recommend "
            "nothing (a candidate discarded, or nothing left to try; run it again to go on).",
        ),
    ] = 1,
    model: Annotated[str, ModelOption] = "naive",
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Runs in flight at once.")] = 8,
    executor: Annotated[str | None, ExecutorOption] = None,
    max_usd: Annotated[
        float | None,
        typer.Option(
            "--max-usd",
            min=0,
            help="Spend limit: no run starts once the round's model calls cost this much (USD, from the "
            "model's price table); the runs under way finish, and the round stops with what was spent.",
        ),
    ] = None,
    proposer_model: Annotated[
        str | None,
        typer.Option(
            "--proposer-model", "--openai-model", help="The proposer's model (with --proposer openai)."
        ),
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="OpenAI-compatible endpoint (key from OPENAI_API_KEY).")
    ] = None,
    cache: Annotated[CacheMode, CacheOption] = CacheMode.record,
    full_runs: Annotated[
        bool,
        typer.Option(
            "--full-runs",
            help="Run every candidate run from its start, asking the model at each decision, instead of "
            "starting it from the baseline's recorded run of the same scenario (replay-first, the default: "
            "[objective] replay_first). For a model whose answer depends on anything besides the request.",
        ),
    ] = False,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Run the baseline (and every run of the round) again instead of reusing the threads the "
            "workspace recorded with the same stamp: policy, environment files, scenario, run and model "
            "(an earlier round's candidate, `improve run`). For a model that changed behind the same name.",
        ),
    ] = False,
    allow_insecure_github: Annotated[
        bool,
        typer.Option(
            "--allow-insecure-github",
            envvar="IMPROVE_ALLOW_INSECURE_GITHUB",
            help="Send the GitHub token even when the push URL or GITHUB_API_URL is plain http:// (a local "
            "GitHub Enterprise test; also IMPROVE_ALLOW_INSECURE_GITHUB=1 for a workflow run there). "
            "Without it such a round leaves the branch local and says why: the token would travel in clear text.",
        ),
    ] = False,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Improve a policy from its traces, one reviewed pull request at a time (never merges).

    Each round diagnoses the training failures, proposes one change, gates it, replays it on train
    then held-out k times, applies the promotion rule, records the CHANGELOG entry, and opens a pull
    request for a recommended candidate (or leaves a branch and reports/<round>/pr.md). Each candidate
    run starts from the baseline's recorded run of the same scenario and sample, and asks the model
    only where its path departs from it (replay-first; --full-runs turns it off). A run the
    workspace already recorded with the same stamp (an earlier round's candidate, now the baseline;
    `improve run`) is read rather than run again (--fresh runs it again). After a discarded
    candidate, the next round aims at the next cluster or a narrower rule (or, when none is left, one
    of another cause), or tries the same rule
    behind the policy's branches when, there, it no longer answers the held-out decisions it took
    wrongly; after one whose branch gained nothing because a later decision still failed its runs, it
    runs that candidate again and adds a branch for the later decision: both one candidate. The sealed
    test split is never read. Each entry counts the rounds that read the held-out set ("held-out read N
    times", per set: a changed held-out set starts again), and warns past the reads n held-out
    scenarios support, 1 + floor(2 n eps^2 / ln 2) with eps = held_out_bias of improve.toml's
    objective (docs/contracts.md, held-out reuse). With out_of_sample_cases in the objective (100
    by default), each candidate also runs with careful on cases the environment's generator draws:
    a new branch that answers one otherwise than labelled, where careful was right, fails the
    out-of-sample gate, and the PR says what the recommended one agreed.

    Exit 0 when a candidate is recommended, or none was discarded because the goal already holds or
    nothing was left to try (every failure cluster was tried and the one tried longest ago came round
    again with no candidate that passes the gates: it spends no CHANGELOG entry); 1 when candidates
    were discarded and none recommended (whatever the later rounds of --rounds found), the round was
    blocked (the environment needs a person), or the spend limit stopped it; 2 on usage errors, 3 when a run, git or the
    endpoint failed. With --executor dask://HOST:PORT the suites' runs go to a Dask cluster's
    workers in batches (diagnosis and the gates stay here); the decision is the same as a local
    round's (docs/scale-out.md).

    Example:

        improve round --policy v0 --env refunds --k 3 --rounds 3
        improve round --policy v3 --model fast --max-usd 2 --cache record
        improve round --policy v0 --k 10 --executor dask://127.0.0.1:8786
        improve round --policy v3 --model local-llm --full-runs
    """
    from improve.loop import RoundOptions, round_failed, round_lines, run_rounds

    with handled(), ExitStack() as stack:
        space = workspace(ws)
        fanout = stack.enter_context(executor_for(space, executor))
        options = RoundOptions(
            env=env,
            policy=policy,
            k=k,
            model=model,
            proposer=proposer,
            concurrency=concurrency,
            executor=fanout,
            proposer_model=proposer_model,
            proposer_base_url=base_url,
            cache=cache.value,
            max_usd=max_usd,
            allow_insecure_github=allow_insecure_github,
            replay_first=False if full_runs else None,
            fresh=fresh,
        )
        records = run_rounds(space, options, rounds, say=say)
        if as_json:
            emit_json({"rounds": [r.to_json() for r in records]})
        else:
            for line in (line for r in records for line in round_lines(r)):
                out.print(line, markup=False)
        _step_summary(space.root, records)
        failed = [r.pr.error for r in records if r.pr and r.pr.error]
        if failed:
            # Each error says where the branch is (not created, kept locally, or pushed): the prefix must
            # not claim one of those itself.
            err.print("the pull request could not be opened: " + "; ".join(failed), markup=False)
            raise typer.Exit(EXIT_INFRA)
        if round_failed(records):
            raise typer.Exit(EXIT_FAILED)


def _step_summary(root: Path, records: list[RoundRecord]) -> None:
    """Under GitHub Actions, append each round's scorecard to the job summary."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if os.environ.get("GITHUB_ACTIONS") != "true" or not target:
        return
    with open(target, "a", encoding="utf-8") as summary:
        for r in records:
            scorecard = root / r.report / "scorecard.md" if r.report else None
            if scorecard is not None and scorecard.exists():
                summary.write(scorecard.read_text(encoding="utf-8") + "\n")
            else:
                summary.write(f"### {r.round_id}: {r.status}\n\n{r.decision_detail}\n\n")


class Source(StrEnum):
    scenarios = "scenarios"
    production = "production"


def diagnose_command(
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            "-p",
            help="The policy version to diagnose (scenarios); with --source production, only its threads.",
        ),
    ] = None,
    source: Annotated[
        Source,
        typer.Option(
            "--source",
            help="scenarios: the policy's labelled training runs; production: ingested threads of a deployed "
            "agent, without labels.",
        ),
    ] = Source.scenarios,
    env: Annotated[str | None, EnvOption] = None,
    k: Annotated[
        int | None, typer.Option("--k", min=1, help="Runs per scenario (default from improve.toml).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="The model whose runs to diagnose (scenarios; default naive); with --source production, "
            "only the threads it decided (default: every model's, each its own clusters).",
        ),
    ] = None,
    cache: Annotated[CacheMode, CacheOption] = CacheMode.record,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Diagnose failures: clusters in order, the one to fix, the hypothesis; with the SQL it ran.

    --source scenarios (the default) reads (or records) the policy's train runs only, verified in the
    warehouse; held-out failures never shape a change. --source production clusters the ingested
    threads of a deployed agent (no scenario, no label; --policy and --model keep one version's and one
    model's) by model, policy version, decision, answer, refusal, guard and final state, with counts,
    violations, failed model calls, cost and example threads; turn a cluster into scenarios with `improve
    scenarios add --from-thread`. --json includes the SQL, so an analyst can run it with `improve sql`.

    Example:

        improve diagnose --policy v0 --json
        improve ingest prod/ && improve diagnose --source production
    """
    from improve.loop import diagnose_policy

    with handled():
        space = workspace(ws)
        if source == Source.production:
            _diagnose_production(space, env, policy, model, as_json)
            return
        if policy is None:
            raise WorkspaceError("--policy is needed with --source scenarios, e.g. --policy v0")
        model = model or "naive"
        found = diagnose_policy(space, env, policy, model, k, cache=cache.value, say=say)
        if as_json:
            emit_json(found.to_json())
            return
        result = found.diagnosis
        out.print(
            f"{found.policy} with {model} on train: pass rate {result.train_pass_rate:.3f} over "
            f"{result.train_runs} runs",
            markup=False,
        )
        for c in result.clusters:
            mark = "->" if result.chosen and c.id == result.chosen.id else "  "
            out.print(
                f"{mark} {c.kind:<20} {c.key:<28} effect {c.effect:.3f}  {c.title} ({', '.join(c.categories)})",
                markup=False,
            )
        if result.blocked:
            out.print(f"blocked: {result.blocked}", markup=False)
        if result.hypothesis:
            h = result.hypothesis
            out.print(
                f"cause: {h.cause}\nchange: {h.change}\nmetric: {h.metric}\nrisk: {h.risk}\n"
                f"evidence: {', '.join(h.evidence[:6])}",
                markup=False,
            )


def _diagnose_production(
    space: Workspace, env: str | None, policy: str | None, model: str | None, as_json: bool
) -> None:
    from improve.evals import PRODUCTION_DIR, Ledger, policy_label
    from improve.llm import usd_text
    from improve.loop import diagnose_production

    environment = space.environment(env)
    version = None
    if policy is not None:
        version = policy_label(space.load_policy(environment.name, policy))  # an unknown version: refused
    if not space.warehouse.exists():
        # A read creates no warehouse (an empty one would say "no threads" forever after): as `improve
        # sql` and `improve waiting` say it, with the exit code of a missing input.
        raise WorkspaceError(
            f"no warehouse at {space.warehouse}: ingest a deployed agent's threads first "
            f"(`improve ingest {space.traces / PRODUCTION_DIR}`)"
        )
    with Ledger(space, environment) as ledger:
        ledger.refresh()  # threads ingested but not yet replayed, or rows an older improve wrote
        found = diagnose_production(ledger.con, environment.name, version, model)
    if as_json:
        emit_json(found.to_json())
        return
    of = "".join(
        f" {what} {value}" for what, value in (("of policy", version), ("decided by", model)) if value
    )
    if not found.clusters:
        if found.present:
            # There are production threads, only none of this model or version: say which there are.
            out.print(
                f"no production threads of {environment.name}{of} in {space.warehouse}; its production "
                f"threads are of {found.present_text()}: give one of those to --model / --policy, or neither",
                markup=False,
            )
        else:
            out.print(
                f"no production threads of {environment.name}{of} in {space.warehouse}: ingest a deployed "
                f"agent's threads first (`improve ingest {space.traces / PRODUCTION_DIR}`)",
                markup=False,
            )
        return
    from rich.table import Table

    table = Table(title=f"{environment.name}: {found.threads} production thread(s){of}, by what happened")
    columns = ("threads", "model", "policy", "decision", "answer", "refused before", "final state", "status")
    for column in (*columns, "violations", "failed calls", "USD/thread"):
        table.add_column(column, overflow="fold")
    table.add_column("examples", overflow="fold", max_width=48)
    for c in found.clusters:
        # The guard as the table can hold it (whole in --json and in the SQL): at 80 columns a long one
        # wrapped into twenty lines a row.
        guard = c.guard if len(c.guard) <= GUARD_SHOWN else c.guard[: GUARD_SHOWN - 1] + "…"
        refused = f"{c.refusal}: {guard}" if c.guard else c.refusal
        table.add_row(
            str(c.threads),
            c.model or "-",
            c.policy_version or "-",
            c.decision,
            c.answer,
            refused or "-",
            c.final_state,
            c.status,
            str(c.violations),
            str(c.model_errors),
            usd_text(c.cost_usd_per_thread),
            ", ".join(c.examples),
        )
    out.print(table)
    if found.set_aside:
        err.print(
            f"{found.set_aside} production thread(s) of {environment.name} set aside, in no cluster: they do "
            'not verify or have no end entry yet (`improve sql "SELECT * FROM quarantine"` says why)',
            markup=False,
        )


def report_command(
    round_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[ROUND]",
            help="A round id (its report folder's name, or a unique prefix of it); the latest round when left out.",
        ),
    ] = None,
    html: Annotated[
        bool,
        typer.Option(
            "--html",
            help="Write a self-contained HTML page (scorecards, charts, the policy diagram, the failing runs); "
            "nothing is fetched when it is viewed.",
        ),
    ] = False,
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Where to write the HTML page (default: report.html in the round's folder)."
        ),
    ] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Show a round's report: its scorecard as markdown, or with --html a page for a browser.

    The round is read from its report folder (reports/<round>/: round.json, scorecards.json,
    policy.json) and the policies' CHANGELOG (the pass rate of each version that led to it).

    Example:

        improve report --html

        improve report 20261130-155524-refunds-v3 --html --out build/v3.html
    """
    from improve.loop import find_round, write_round_page

    with handled():
        space = workspace(ws)
        if out_file is not None and not html:
            raise WorkspaceError("--out names the HTML page's file; pass --html with it")
        if not html:
            folder = find_round(space.reports, round_id)
            markdown = folder / "scorecard.md"
            if as_json:
                emit_json({"round": folder.name, "folder": str(folder), "html": None})
                return
            if not markdown.is_file():
                raise WorkspaceError(
                    f"{markdown} is missing; `improve report {folder.name} --html` reads round.json"
                )
            out.print(markdown.read_text(encoding="utf-8"), markup=False, end="")
            return
        page = write_round_page(space, round_id, out_file)
        for note in page.notes:
            err.print(f"note: {note}", markup=False)
        if as_json:
            emit_json({"round": page.folder.name, "folder": str(page.folder), "html": str(page.path)})
            return
        out.print(f"wrote {page.path}", markup=False)
