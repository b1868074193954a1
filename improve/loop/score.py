"""Scoring a policy version from its recorded runs (`improve score`): per split, its scorecard from
the threads verified in the warehouse, the paired comparison with another version, where the held-out
set stands (the rounds that read it, from the CHANGELOG), and the sealed test split, unsealed and
recorded, when asked.

Only recorded runs are scored, never an agent's own report; a thread that does not verify is set
aside. The test split's runs are made here (k from improve.toml, the recorded ones reused): no round
ever runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from improve.errors import ScenarioError, SealedSplitError, WorkspaceError
from improve.evals import (
    OPEN_SPLITS,
    SEALED_SPLIT,
    SPLITS,
    UNSEAL_HOW,
    UNSEALINGS_FILE,
    Comparison,
    Ledger,
    OutcomeRow,
    Recorded,
    ScenarioSet,
    Scorecard,
    UnsealedScore,
    Unsealing,
    VersionScore,
    Workspace,
    check_unsealable,
    compare,
    describe_model,
    kept_aside,
    open_fanout,
    policy_hash,
    policy_label,
    refused_scripts,
    scorecard,
    scorecard_markdown,
    stale,
    suite_spec,
    unseal,
    unsealings_so_far,
    write_threads,
)
from improve.log import ThreadId, model_slug
from improve.loop.changelog import CHANGELOG, Changelog, HeldOutStatus
from improve.loop.discards import discarded_path, read_discarded
from improve.machine import RESUMABLE_STATUSES, MachineConfig
from improve.runtime import Environment, refused_at_end

Say = Callable[[str], None]
SIDES = ("old", "new")


@dataclass(frozen=True)
class ScoreRequest:
    """What `improve score` scores: `policy` (and `vs`, to compare with) on `split` with `model`'s runs."""

    policy: str
    vs: str | None = None
    split: str = "all"
    model: str = "naive"
    unseal: bool = False
    """Score the sealed test split too (making its runs), and record the unsealing."""
    env: str | None = None
    executor: str | None = None
    """Where the test split's runs go (`--executor`); None: improve.toml's, else here."""
    described: bool = False
    """Describe the model the runs used (for the markdown scorecard: its stamp and fingerprints)."""

    def check(self) -> None:
        """Refuse a split that does not exist, and the sealed split without `unseal` (or the reverse)."""
        if self.split != "all" and self.split not in SPLITS:
            raise WorkspaceError(f"unknown split {self.split!r}; use {', '.join(SPLITS)} or all")
        if self.unseal and self.split not in (SEALED_SPLIT, "all"):
            raise WorkspaceError(
                f"--unseal unseals the sealed test split; pass --split {SEALED_SPLIT} (or all) with it, or "
                f"leave --unseal out to score {self.split}"
            )
        if self.split == SEALED_SPLIT and not self.unseal:
            raise SealedSplitError(f"--split {SEALED_SPLIT}: {UNSEAL_HOW}")

    @property
    def command(self) -> str:
        """The command, as an unsealing records it."""
        vs = f" --vs {self.vs}" if self.vs else ""
        return f"improve score --policy {self.policy}{vs} --model {self.model} --split {self.split} --unseal"


@dataclass(frozen=True)
class Unscored:
    """A split's scenarios a scorecard leaves out: no run of the version and model recorded from what is
    there now (labelled after the runs, or their runs recorded before a change)."""

    split: str
    policy: str
    model: str
    scenarios: tuple[str, ...]
    of: int
    """How many scenarios the split has."""

    def message(self, env: str) -> str:
        shown = ", ".join(self.scenarios[:3]) + (", ..." if len(self.scenarios) > 3 else "")
        return (
            f"warning: {self.split}: {len(self.scenarios)} of {self.of} scenarios have no current recorded run "
            f"of {self.policy} with model {self.model} ({shown}): the scorecard is of the other "
            f"{self.of - len(self.scenarios)}. `improve run --env {env} --policy {self.policy} --model "
            f"{self.model} --split {self.split}` runs them (recorded runs are reused)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "policy": self.policy,
            "model": self.model,
            "scenarios": list(self.scenarios),
            "of": self.of,
        }


@dataclass
class Scores:
    """What `improve score` shows: the scorecards, the comparisons, and what the sealed and held-out
    splits have been through."""

    seed: int
    policies: dict[str, MachineConfig]
    """`new`, the version scored, and `old`, the one it is compared with."""
    cards: list[Scorecard] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    test_scenarios: int = 0
    unsealed: bool = False
    unsealings: int = 0
    unsealing: Unsealing | None = None
    held_out: HeldOutStatus | None = None
    history: list[VersionScore] = field(default_factory=list)
    model: str | None = None
    """The model as its runs' stamps describe it (with `ScoreRequest.described`)."""
    stand_in: bool = True
    """The runs' model is a stand-in (its stamp has no `modelSpec`), not one behind an endpoint."""
    unscored: list[Unscored] = field(default_factory=list)
    """The split's scenarios left out of a scorecard for want of a current recorded run."""

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "scorecards": [c.to_json() for c in self.cards],
            "comparisons": [c.to_json() for c in self.comparisons],
            "sealed": {
                "test_scenarios": self.test_scenarios,
                "unsealed": self.unsealed,
                "unsealings": self.unsealings,
            },
            "unsealing": self.unsealing.to_json() if self.unsealing else None,
            "held_out_reads": self.held_out.to_json() if self.held_out else None,
            "unscored": [u.to_json() for u in self.unscored],
        }

    def markdown(self, vs: str | None) -> str:
        """The scorecard as the PR body shows it; an unsealing says so under it."""
        new = self.policies["new"]
        text = scorecard_markdown(
            self.cards,
            self.comparisons,
            title=f"Scorecard: {policy_label(new)}" + (f" vs {vs}" if vs else ""),
            old_policy=self.policies.get("old"),
            new_policy=new if vs else None,
            seed=self.seed,
            model=self.model,
            history=self.history,
            stand_in=self.stand_in,
        )
        for left in self.unscored:
            # A count column alone hid the scenarios left out: a reviewer reads the card as the split's.
            text += (
                f"\n{left.split}: {len(left.scenarios)} of {left.of} scenarios have no recorded run of "
                f"{left.policy} with {left.model} and are not in this scorecard: "
                + ", ".join(f"`{s}`" for s in left.scenarios[:10])
                + (f" and {len(left.scenarios) - 10} more" if len(left.scenarios) > 10 else "")
                + ".\n"
            )
        u = self.unsealing
        if u:
            # A scorecard pasted into a review says that its test numbers were an unsealing.
            text += (
                f"\nThe test split was unsealed for this scorecard: unsealing {u.number} of test set "
                f"`{u.test_set}` ({u.test_scenarios} scenarios) by {u.who} at {u.at}, recorded in "
                f"`{UNSEALINGS_FILE}`.\n"
            )
        return text


def score_policy(space: Workspace, request: ScoreRequest, say: Say = lambda m: None) -> Scores:
    """Score `request.policy` (and compare with `request.vs`) split by split, from the runs recorded in
    the workspace's warehouse; the sealed split is scored, and the unsealing recorded before anything
    shows it, only with `request.unseal`."""
    env_name = space.env_name(request.env)
    scenario_set = space.scenarios(env_name)
    if request.split == SEALED_SPLIT and not scenario_set.sealed:
        # Said first: asked for the test split without --unseal, the advice to add --unseal only led
        # to this message.
        raise ScenarioError(_no_test_split(scenario_set))
    request.check()
    scoring = _Scoring(space, request, space.environment(env_name), scenario_set, say)
    if request.unseal:
        check_unsealable(space, scoring.scenario_set)
    # One writer of the workspace's threads at a time: the sealed split's runs are made here.
    with space.writing(say), Ledger(space, scoring.env, say) as scoring.ledger:
        return scoring.run()


def _no_test_split(scenario_set: ScenarioSet) -> str:
    return (
        f"{scenario_set.source}: no scenario has `split: {SEALED_SPLIT}`, so there is nothing to unseal; "
        f"label some with `split: {SEALED_SPLIT}` (or `improve scenarios add --split {SEALED_SPLIT}`) "
        "before any round chooses a policy, and score them once at the end"
    )


class _Scoring:
    """One `improve score`: its inputs, and the ledger it reads the runs from."""

    def __init__(
        self, space: Workspace, request: ScoreRequest, env: Environment, scenario_set: ScenarioSet, say: Say
    ) -> None:
        self.space, self.request, self.env, self.scenario_set, self.say = (
            space,
            request,
            env,
            scenario_set,
            say,
        )
        self.known = {s.id for s in scenario_set.scenarios}
        self.by_id = {s.id: s for s in scenario_set.scenarios}
        self.ledger: Ledger

    def run(self) -> Scores:
        request, scenario_set = self.request, self.scenario_set
        if request.unseal and not scenario_set.sealed:
            raise ScenarioError(_no_test_split(scenario_set))
        policies = {"new": self.space.load_policy(self.env.name, request.policy)}
        if request.vs:
            policies["old"] = self.space.load_policy(self.env.name, request.vs)
        if request.split == "all" and not request.unseal and scenario_set.sealed:
            self.say(
                f"the sealed test split ({len(scenario_set.sealed)} scenarios) is not scored; "
                f"`--split {SEALED_SPLIT} --unseal` scores it (and records the unsealing)"
            )
        scores = Scores(self.space.config.objective.seed, policies, test_scenarios=len(scenario_set.sealed))
        threads = []
        for split in self._splits():
            given = {"new": request.policy, "old": request.vs or ""}
            rows = {
                side: self._rows(split, policies[side], given[side]) for side in SIDES if side in policies
            }
            cards = {
                side: scorecard(found.rows, policy_label(policies[side]), split)
                for side, found in rows.items()
            }
            scores.cards += [cards[side] for side in SIDES if side in cards]
            scores.unscored += [
                u
                for side in SIDES
                if side in rows and (u := self._unscored(split, policies[side], rows[side]))
            ]
            threads += [r.thread_id for found in rows.values() for r in found.rows]
            if "old" in cards:
                scores.comparisons.append(self._compare(cards["old"], cards["new"]))
        self._changelog(scores)
        if request.unseal:
            self._unseal(scores, threads)
        scores.unsealed = request.unseal
        scores.unsealings = unsealings_so_far(self.space, scenario_set)
        if request.described:
            scores.model, scores.stand_in = self._model(threads)
        return scores

    def _splits(self) -> list[str]:
        request = self.request
        if request.split != "all":
            return [request.split]
        return [*OPEN_SPLITS, *([SEALED_SPLIT] if request.unseal else [])]

    def _rows(self, split: str, policy: MachineConfig, given: str) -> Recorded:
        """The recorded threads of this version and model on `split`, verified in the warehouse (a thread
        that does not verify is set aside, never scored); the test split's are made here first. `given`:
        the policy as the command named it (a version, or a file's path, which `improve run` takes too)."""
        label, model = policy_label(policy), self.request.model
        rewritten: list[str] = []
        if split == SEALED_SPLIT:
            # Unsealing is one command: the test set's k runs are made (or reused) here, never by a
            # round, and exactly the current test set is scored.
            plan = self._run_sealed(policy)
            ids = [p.thread_id for p in plan]
            rewritten = [p.thread_id for p in plan if not p.reused]
        else:
            ids = self._current(split, label, model)
        found = self.ledger.record(ids, say=self.say, rewritten=rewritten) if ids else Recorded()
        waiting = [r.thread_id for r in found.rows if self._for_a_person(r)]
        if waiting:
            # A run nobody answered (`improve run --suspend`) has no outcome yet: not a failure.
            left_out = set(waiting)
            found.rows = [r for r in found.rows if r.thread_id not in left_out]
            self.say(
                f"{split}: {len(waiting)} run(s) of {label} with model {model} still wait for a person (e.g. "
                f"{waiting[0]}) and are left out: `improve resume` them, or `improve run --policy {label} "
                f"--model {model} --split {split}` runs them again, their scenarios' people answering"
            )
        if not found.rows:
            # The runs of every split scored, in one command (`run`'s default split is every open one).
            only = "" if self.request.split == "all" else f" --split {split}"
            raise WorkspaceError(
                f"no recorded runs of {label} with model {model} on {split} in {self.space.traces}; run "
                f"`improve run --env {self.env.name} --policy {given} --model {model}{only} "
                f"--k {self.space.config.objective.k}` first"
            )
        return found

    def _for_a_person(self, row: OutcomeRow) -> bool:
        """Whether the run waits for a person its scenario's people script would answer there: one
        `--suspend` left, no outcome yet. A wait the script does not answer is where the run ends for
        good, and is scored as `run` and a round score it (a failure, unless labelled so): leaving it out
        scored a desk whose referrals no pharmacist answered at 0.800 where they said 0.500."""
        if row.status not in RESUMABLE_STATUSES:
            return False
        scenario = self.by_id.get(row.scenario)
        if scenario is not None and not scenario.answers(row.final_state):
            return False
        # Its script answered there, and the machine refused the answer (a path the script did not
        # foresee): the run ended there for good, a failure, as `run` and a round score it. Read only for
        # the few waiting runs.
        return refused_at_end(self.ledger.store.read(row.thread_id)) is None

    def _unscored(self, split: str, policy: MachineConfig, found: Recorded) -> Unscored | None:
        """The split's scenarios the scorecard of `found` leaves out, said as a warning; None: none."""
        scored = {row.scenario for row in found.rows}
        every = [s.id for s in self.scenario_set.split(split, unseal=split == SEALED_SPLIT)]
        missing = tuple(sid for sid in every if sid not in scored)
        if not missing:
            return None
        unscored = Unscored(split, policy_label(policy), self.request.model, missing, len(every))
        self.say(unscored.message(self.env.name))
        return unscored

    def _current(self, split: str, label: str, model: str) -> list[str]:
        """The recorded threads of this version and model on an open split, of scenarios in the file, less
        those recorded from other inputs than a run would start from now (the environment's files or the
        scenario changed since: `improve run` and `round` run those again rather than reuse them), said
        with how many were left out."""
        by_id = self.scenario_set.by_id()
        ids, left_out = [], []
        for tid in self.ledger.recorded(f"{split}:{label}:{model_slug(model)}:"):
            parsed = ThreadId.parse(tid)
            if parsed is None or parsed.scenario not in self.known:
                continue
            if stale(self.env, self.ledger.store, tid, by_id[parsed.scenario]):
                left_out.append(tid)
            else:
                ids.append(tid)
        if left_out:
            self.ledger.not_current(left_out)
            self.say(
                f"{split}: {len(left_out)} recorded run(s) of {label} with model {model} are not scored: they "
                f"were recorded before the environment's files or their scenario changed (e.g. {left_out[0]}); "
                f"`improve run --policy {label} --model {model} --split {split}` records runs of what is there now"
            )
        return ids

    def _run_sealed(self, policy: MachineConfig) -> list[Any]:
        """The k runs of the test split's scenarios that are not recorded yet (the recorded ones are
        reused), the call cache recording what is new."""
        sealed, model = self.scenario_set.sealed, self.request.model
        spec = suite_spec(self.space, self.env, policy, model, cache="record")
        with open_fanout(self.space.executor(self.request.executor), self.space.root) as fanout:
            if fanout is not None:
                self.say(f"runs go to {fanout.where}")
            plan = write_threads(
                self.env,
                sealed,
                spec,
                self.ledger.store,
                concurrency=8,
                executor=fanout,
                keep=self.ledger.keep(),
            )
        source = Path(self.scenario_set.source) if self.scenario_set.source else None
        for note in kept_aside(plan) + refused_scripts(plan, source):
            self.say(note)
        ran = sum(1 for p in plan if not p.reused)
        self.say(
            f"test split: {len(sealed)} scenarios x {spec.k} with {policy_label(policy)}, model {model} "
            f"({ran} runs made now, {len(plan) - ran} reused)"
        )
        return plan

    def _compare(self, old: Scorecard, new: Scorecard) -> Comparison:
        objective = self.space.config.objective
        return compare(
            old,
            new,
            confidence=objective.confidence,
            resamples=objective.bootstrap_resamples,
            seed=objective.seed,
            tolerance=objective.tolerance,
        )

    def _changelog(self, scores: Scores) -> None:
        """Where the held-out set stands, and the versions that led to the scored one, as the rounds
        recorded them in the CHANGELOG (read once)."""
        changelog = Changelog.read(self.space.policies_dir(self.env.name) / CHANGELOG)
        if "held-out" in self._splits():
            objective = self.space.config.objective
            scores.held_out = changelog.held_out_status(
                self.scenario_set.split("held-out"),
                objective.held_out_bias,
                read_discarded(discarded_path(self.space.root, self.env.name)),  # as a round counts them
            )
            if scores.held_out.warning:
                self.say(f"warning: {scores.held_out.warning}")
        scores.history = changelog.history(policy_label(scores.policies["new"]))

    def _unseal(self, scores: Scores, threads: list[str]) -> None:
        """Record the unsealing before anything is shown: a look at the test scores is never unrecorded,
        and a test score whose unsealing could not be recorded leaves the warehouse again."""
        tests = [t for t in threads if (p := ThreadId.parse(t)) is not None and p.split == SEALED_SPLIT]
        sides = [scores.policies[s] for s in SIDES if s in scores.policies]
        cards = [c for c in scores.cards if c.split == SEALED_SPLIT]
        comparison = next((c for c in scores.comparisons if c.split == SEALED_SPLIT), None)
        unsealed = unseal(
            self.space,
            self.scenario_set,
            self.request.model,
            [UnsealedScore.of(card, policy_hash(policy)) for policy, card in zip(sides, cards, strict=True)],
            self.request.command,
            comparison.to_json() if comparison else None,
            forget=lambda: self.ledger.forget(tests),
        )
        scores.unsealing = unsealed.unsealing
        self.say(unsealed.message())

    def _model(self, threads: list[str]) -> tuple[str | None, bool]:
        """The model the runs used, from the first thread's stamp, with every fingerprint its calls saw,
        and whether it is a stand-in."""
        store = self.ledger.store
        first = store.read(threads[0]) if threads else []
        stamp = dict(first[0].metadata or {}) if first else {}
        if not stamp:
            return None, True
        # Fingerprints only for a model behind an endpoint (a stand-in has none): each thread read once.
        read = [first, *(store.read(tid) for tid in threads[1:])] if stamp.get("modelSpec") else []
        prints = sorted(
            {str(e.event["fingerprint"]) for entries in read for e in entries if e.event.get("fingerprint")}
        )
        return describe_model(stamp, prints), not stamp.get("modelSpec")
