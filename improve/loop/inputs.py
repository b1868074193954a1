"""What a round takes: its options, and the inputs it locates and checks before anything runs (the
workspace, the environment, the policy and its history, the scenarios)."""

from __future__ import annotations

import re
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from improve.errors import WorkspaceError
from improve.evals import CONFIG_NAME, Fanout, Scenario, Workspace, policy_label
from improve.llm import Meter
from improve.loop.changelog import CHANGELOG, Memory, read_memory
from improve.loop.counterfactuals import Counterfactuals
from improve.loop.discards import discarded_path
from improve.loop.proposers import Proposer
from improve.machine import MachineConfig
from improve.runtime import Environment, vocabulary


@dataclass
class RoundOptions:
    env: str | None = None
    policy: str = "v0"
    k: int | None = None
    model: str = "naive"
    """The model bound to the policy's `decider` ref: a stand-in, `openai:MODEL` or `[models.NAME]`."""
    proposer: str | Proposer = "rules"
    """A registered proposer's name (`rules`, `openai`, a workspace's or a package's), or a Proposer
    object (a test seam)."""
    concurrency: int = 8
    executor: Executor | Fanout | None = None
    """Where the suites' runs go (a process pool, or a Dask cluster's `Fanout`); None: threads here."""
    proposer_model: str | None = None
    """The proposer's own model, for one that asks a model (`openai`)."""
    proposer_base_url: str | None = None
    cache: Literal["live", "record", "replay"] = "record"
    """Model calls, the decider's and the proposer's: live, record (what is missing) or replay."""
    max_usd: float | None = None
    """Stop starting runs once the round's model calls cost this much (needs a price on the model)."""
    meter: Meter | None = None
    """Counts the round's model calls (a caller's own, to share one across rounds); default a new one."""
    counterfactuals: Counterfactuals | None = None
    """What the diagnosis's counterfactual runs found (a caller's own, to share one across rounds: a
    stand-in's runs are not run again); default a new one."""
    open_pr: bool = True
    allow_insecure_github: bool = False
    """Send the GitHub token even when the push URL or GITHUB_API_URL is plain `http://` (a local GitHub
    Enterprise test); otherwise the round leaves the branch local and says why."""
    skip: list[str] = field(default_factory=list)
    """Cluster ids already tried against this policy (each round aims at the next cause)."""
    fresh: bool = False
    """Run every run of the round again, the baseline's too, instead of reusing a thread the workspace
    recorded with the same stamp (`SuiteSpec.stamp`: policy, environment files, scenario, run, model)."""
    replay_first: bool | None = None
    """Start each candidate run from the baseline's recorded run of the same scenario and sample
    (`[objective] replay_first`, the default); False runs every candidate run from scratch."""


@dataclass(frozen=True)
class Inputs:
    """What a round needs, located and checked before anything runs."""

    space: Workspace
    env: Environment
    env_name: str
    policy: MachineConfig
    policy_path: Path
    scenarios: list[Scenario]
    """Train and held-out: never the sealed test split (`ScenarioSet.open_scenarios`)."""
    policies_dir: Path
    memory: Memory
    """What the round knows from the policies' CHANGELOG, read once."""
    env_hashes: dict[str, str]
    train: list[Scenario]
    held_out: list[Scenario]
    goal: float | None
    """The held-out pass rate the policy's goal asks for (`goal_threshold`), when it says one."""


def review_branch(env_name: str, version: str) -> str:
    """The branch a recommended candidate is committed to: `improve/<environment>-<version>`."""
    return f"improve/{env_name}-{version}"


def locate(space: Workspace, env: str | None, policy: str) -> Inputs:
    """Every input of a round, or a clear message naming what is missing."""
    missing: list[str] = []
    if not (space.root / CONFIG_NAME).is_file():
        missing.append(f"the objective: no {CONFIG_NAME} in {space.root} (see README, 'The workspace')")
    env_name = space.env_name(env)
    # Before anything is written: a name git refuses would leave a recommended candidate without a branch.
    from improve.loop.publish import check_branch_name

    check_branch_name(review_branch(env_name, "v1"))
    # A round reads the policies and the CHANGELOG and writes its entry there: in the middle of a merge,
    # they may hold conflict markers or either side, and the entry would overwrite what the person resolved.
    from improve.loop.publish.git import unfinished_operation

    unfinished = unfinished_operation(space.root)
    if unfinished is not None:
        raise WorkspaceError(
            f"a round cannot start: the repository is in the middle of {unfinished}, then run the round again"
        )
    environment = space.environment(env_name)
    scenarios_path = space.scenarios_path(env_name)
    if not scenarios_path.is_file():
        missing.append(f"the scenarios and split: {scenarios_path} does not exist")
    policies_dir = space.policies_dir(env_name)
    changelog = policies_dir / CHANGELOG
    if not policies_dir.is_dir():
        missing.append(f"the policy history: {policies_dir} does not exist")
    elif not changelog.is_file():
        missing.append(
            f"the policy history: {changelog} does not exist (create it with a '# CHANGELOG' line)"
        )
    policy_path = space.policy_path(env_name, policy)
    if not policy_path.is_file():
        missing.append(f"the policy: {space.policy_not_found(env_name, policy, policy_path)}")
    if missing:
        raise WorkspaceError("a round cannot start; missing:\n" + "\n".join(f"- {m}" for m in missing))
    config = space.load_policy(env_name, policy)
    if not config.description.strip():
        raise WorkspaceError(
            f"the goal is missing: {policy_path} has no `description` (the goal with measurable success criteria)"
        )
    if not vocabulary(environment).decisions:
        raise WorkspaceError(
            f"environment {env_name} has no decision (agent.decide): nothing for a policy to do"
        )
    # A baseline that reads a fact (or sends an event) its environment does not offer ends those
    # decisions in policy-error: the round would run every baseline run, diagnose the errors as the
    # agent's failures and stop on them. Said before anything runs, with the file.
    from improve.loop.gates.vocabulary import vocabulary_problems

    unknown = vocabulary_problems(config, environment)
    if unknown:
        raise WorkspaceError(
            f"{policy_path}: a round cannot start from this policy: it uses names {env_name} does not offer: "
            + "; ".join(unknown[:5])
            + f". Fix the policy (`improve verify {policy}` runs every gate on it), or start from another version"
        )
    scenario_set = space.scenarios(env_name)
    space.traces.mkdir(parents=True, exist_ok=True)
    held_out = scenario_set.split("held-out")
    bias = space.config.objective.held_out_bias
    return Inputs(
        space,
        environment,
        env_name,
        config,
        policy_path,
        # The sealed test split stops here: nothing the round hands on (the baseline, diagnosis, evidence,
        # proposers, gates and their probes, the overfit gate's literals) can read it.
        scenario_set.open_scenarios,
        policies_dir,
        read_memory(
            changelog,
            policies_dir,
            policy_label(config),
            held_out,
            bias,
            discarded_path(space.root, env_name),
        ),
        environment.file_hashes(),
        scenario_set.split("train"),
        held_out,
        goal_threshold(config.description),
    )


def goal_threshold(description: str) -> float | None:
    """The held-out pass-rate criterion written in the goal, e.g. 'held-out pass rate ... >= 0.95'."""
    match = re.search(r"held-out pass rate[^.]*?(?:>=|≥|at least)\s*([01](?:\.\d+)?)", description, re.I)
    return float(match.group(1)) if match else None
