"""A round record as people read it: the pull request's body (also the report's `scorecard.md`) and
the lines `improve round` prints. The CHANGELOG entry is `changelog.entry_text`, the HTML page
`report_page.round_page`; all four read the record and nothing else."""

from __future__ import annotations

from urllib.parse import urlsplit

from improve.evals import scorecard_markdown
from improve.llm import local_url
from improve.log import ThreadId
from improve.loop.round_record import PROPOSED, Impact, ModelInfo, RoundRecord

REPLAYS_SHOWN = 6
"""Candidate threads the body lists as `improve replay` commands."""


def pr_body(record: RoundRecord) -> str:
    """The pull request's body: the hypothesis, the scorecard with its charts and the promotion rule,
    the held-out reuse, the model, the gates, and how to replay the candidate's runs."""
    # A round that ran no candidate names the policy it ran against: the version it took (a nothing-left
    # round asked the proposer under one) is no policy, and read as one that never existed.
    title = (
        f"policy {record.candidate_version}"
        if record.status in ("recommended", "discarded") and record.candidate_version
        else f"round against {record.baseline_version}, no candidate"
    )
    lines = [f"# {record.environment}: {title} ({record.status})", ""]
    h = record.hypothesis
    if h:
        lines += [
            "## Hypothesis",
            "",
            f"- **Cluster**: `{record.cluster}`",
            f"- **Cause**: {h.cause}",
            f"- **Change**: {record.rationale or h.change}",
            f"- **Expected to move**: {h.metric}",
            f"- **Risk**: {h.risk}",
            f"- **Evidence** (training threads): {', '.join(f'`{t}`' for t in h.evidence[:8])}",
            "",
        ]
    decision = record.decision
    drawn = record.candidate_policy if decision is not None else None
    lines.append(
        scorecard_markdown(
            record.scorecards,
            [decision.train, decision.held_out] if decision else [],
            title=f"Scorecard (k = {record.k} runs per scenario, model `{record.model}`)",
            old_policy=record.baseline_policy if drawn else None,
            new_policy=drawn,
            decision=decision,
            seed=record.seed,
            history=record.history or (),
            stand_in=record.stand_in,
        )
    )
    if record.held_out:
        lines += ["## Held-out reuse", "", record.held_out.sentence, ""]
        if record.held_out.warning:
            lines += [f"**Warning**: {record.held_out.warning}.", ""]
    if record.impact:
        lines += ["## Production impact preview", "", *impact_markdown(record.impact), ""]
    if record.cases and record.candidate_policy is not None:
        lines += ["## Out of sample", "", out_of_sample_markdown(record), ""]
    if record.model_info:
        lines += ["## Model", "", model_markdown(record.model_info), ""]
    if record.gates:
        lines += ["## Gates", "", "| gate | result | detail |", "|---|---|---|"]
        for g in record.gates:
            detail = g.detail.replace("\n", " ").replace("|", "\\|")[:300]
            lines.append(f"| {g.name} | {'pass' if g.ok else '**fail**'} | {detail} |")
        lines += ["", f"Repairs used: {record.repairs}.", ""]
    if record.candidate_threads:
        lines += replay_section(record)
    lines += ["---", "Opened by `improve round`. A person reviews and merges; the tool never merges.", ""]
    return "\n".join(lines)


OUT_OF_SAMPLE = (
    "The scorecard is the labelled scenarios'. A learned branch answers wherever its condition holds, which "
    "can reach past what they show; to see where, on cases the environment's generator draws (with "
    "`careful`: a branch's answer where careful's was right; with your model: how much of its gap the "
    "branches close), run the command below. `drafts.yaml` then holds the cases the candidate ended "
    "otherwise than labelled, as scenarios to check and add."
)
"""What the pull request and the report page say of checking a candidate out of sample."""


def out_of_sample_command(record: RoundRecord, unmerged: bool = False) -> str:
    """The command that checks the round's candidate against its baseline on generated cases. On the
    review branch the candidate is its version; `unmerged` (the working tree the round left, its
    report): the candidate's file in the round's report, which is there before anyone merges."""
    candidate = f"{record.report}/{PROPOSED}" if unmerged and record.report else record.candidate_version
    versions = [record.baseline_version, candidate]
    check, same = record.out_of_sample, ""
    if check is not None:
        # The round's own check again: its cases (count and seed), labelled by the same version's runs
        # (the first version given labels them), with careful.
        if check.reference and check.reference != record.baseline_version:
            versions.insert(0, check.reference)
        same = f" --cases {check.cases} --seed {check.seed} -m careful"
    return (
        f"improve out-of-sample {' '.join(str(v) for v in versions)}{same} --env "
        f"{record.environment} --scenarios drafts.yaml"
    )


def out_of_sample_markdown(record: RoundRecord) -> str:
    """What the round's own check on generated cases found, and how a reviewer checks further."""
    found = record.out_of_sample
    lines = []
    if found is not None:
        lines.append(f"The round checked it {found.summary()}.")
        lines += [f"- `{e}`" for e in found.examples]
        lines.append("")
    lines += [OUT_OF_SAMPLE, "", f"    {out_of_sample_command(record)}"]
    return "\n".join(lines)


def impact_markdown(impact: Impact) -> list[str]:
    """The preview's sentence, and its changes as a table (decision, answered, would answer, threads)."""
    lines = [impact.summary()]
    if impact.changes:
        lines += [
            "",
            "| decision | answered | the candidate would answer | threads | for example |",
            "|---|---|---|---:|---|",
        ]
        for c in impact.changes:
            examples = [f"`{c.examples[0]}` ({c.example})", *(f"`{t}`" for t in c.examples[1:])]
            cells = [c.decision, f"`{c.before}`", f"`{c.after}`", str(c.threads), ", ".join(examples)]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    if impact.threads:
        lines += [
            "",
            "Read without calling anything: at each decision the candidate decides on the request the thread "
            "recorded, taking the thread's answer wherever it asks the model what the thread asked; a thread is "
            "read up to its first changed decision.",
        ]
    return lines


def replay_section(record: RoundRecord) -> list[str]:
    """How a reviewer with only the pull request's branch replays the candidate's runs: `traces/` is
    not in git, so the runs are made again first (a stand-in draws the same answers: the same threads),
    then replayed, which calls no model, tool or person."""
    shown = record.candidate_threads[:REPLAYS_SHOWN]
    ids = [i for i in map(ThreadId.parse, shown) if i is not None]
    scenarios = list(dict.fromkeys(i.scenario for i in ids))
    again = [
        f"improve run --env {record.environment} --policy {record.candidate_version} --model {record.model} "
        f"--k {max((i.run for i in ids), default=1)} " + " ".join(f"--scenario {s}" for s in scenarios)
    ]
    how = (
        "the stand-in draws the same answers, so each run decides as the round's did"
        if record.stand_in
        else "a model behind an endpoint is asked again unless its recordings (.improve/cache) come along: "
        "add `--cache replay` with them"
    )
    return [
        "## Replay it",
        "",
        "Every run is a journaled thread; replaying one calls no model, tool or person. The threads are "
        f"not in git (`traces/` is ignored): on this branch, make the runs again first ({how}), then "
        "replay them:",
        "",
        "```sh",
        *(again if ids else []),
        *(f"improve replay {t} --verify" for t in shown),
        "```",
        "",
        f'All {len(record.candidate_threads)} candidate threads: `improve sql "SELECT * FROM outcomes '
        f"WHERE policy_version = '{record.candidate_version}'\"` after `improve ingest traces/`.",
        "",
    ]


def model_markdown(info: ModelInfo) -> str:
    """Which model answered the round's runs, and how reproducible they are: one paragraph."""
    calls = info.calls
    reused = (
        f" Replay-first: {calls.reused} answers the candidate's runs took from the baseline's recorded runs "
        "instead of asking."
        if calls.reused
        else ""
    )
    if info.provider == "stand-in":
        return (
            f"Stand-in model `{info.name}`: deterministic, seeded per scenario and run, no endpoint.{reused}"
        )
    fingerprints = ", ".join(f"`{f}`" for f in info.fingerprints) or "none reported"
    # A server on this machine is recorded without its port (`ModelSpec.public`): said, so nobody reading
    # the report takes the address for one to reach it at.
    where = (
        f"{info.endpoint} (a server on this machine; its port, which may change between starts, is not recorded)"
        if local_url(info.endpoint) and urlsplit(info.endpoint).port is None
        else info.endpoint
    )
    text = (
        f"`{info.name}`: {info.provider} model `{info.model}` at {where}, temperature "
        f"{info.temperature}, seed {info.seed if info.seed is not None else 'not set'}; system fingerprint "
        f"{fingerprints}. {calls.calls} calls ({calls.recorded} from recordings, {calls.live} live, "
        f"{calls.failed} failed, {calls.retries} retries), {calls.input_tokens + calls.output_tokens:,} tokens, "
        + (f"${calls.usd:.4f}." if calls.usd is not None else "cost unknown (no price).")
        + reused
    )
    if info.mixed:
        text += (
            " **Mixed**: this round combined recorded and live calls, so a replay (`--cache replay`) needs "
            "the recordings of both."
        )
    return text


def round_lines(record: RoundRecord) -> list[str]:
    """What `improve round` prints for a round: its id and outcome, the decision, the held-out read,
    where its review is and where its report is."""
    held = record.scores.get("held-out")
    scores = f"held-out {held.before:.3f} -> {held.after:.3f}" if held else "no replay"
    # Only a recommended or discarded round made a candidate (its version is in the CHANGELOG); the others
    # used no version up, and naming one would read as if it existed.
    made = record.candidate_version if record.status in ("recommended", "discarded") else None
    lines = [
        f"{record.round_id}: {record.status} {made or ''} [{record.cluster or '-'}] {scores}",
        f"  {record.decision_detail}",
    ]
    read = record.held_out
    if read:
        lines.append(
            f"  held-out read {read.read} time{'' if read.read == 1 else 's'} (set {read.key}, {read.scenarios} scenarios; "
            f"supports {read.supported}; bias bound {read.bias_bound:.3f})"
        )
        if read.warning:
            lines.append(f"  warning: {read.warning}")
    if record.impact:
        lines.append(f"  production: {record.impact.summary()}")
    if record.out_of_sample:
        # A branch of the baseline's that overrides a right answer on a generated case is a warning beside
        # a recommendation (the gate refuses only new branches that do).
        flag = "warning: " if record.out_of_sample.by_branch else ""
        lines.append(f"  {flag}out of sample: {record.out_of_sample.summary()}")
        if record.out_of_sample.by_branch and record.candidate_policy is not None:
            lines.append(f"    to label some of them: {out_of_sample_command(record, unmerged=True)}")
    if record.pr:
        pr = record.pr
        lines.append(f"  pull request: {pr.pr_url or pr.instructions or pr.error or ''}")
    if record.report:
        lines.append(f"  report: {record.report}")
    return lines
