"""The workspace: `improve.toml` and the directories it names.

    [workspace]
    environment = "support-desk"     # the default --env (default: the only [environments] entry)
    traces = "traces"                # JSONL threads, one file per thread
    warehouse = "traces/traces.duckdb"
    reports = "reports"
    executor = "local"               # or "dask://HOST:PORT": where runs go (--executor; docs/scale-out.md)

    [environments.support-desk]
    module = "support_desk.env:environment"   # optional: a bundled or installed one needs none
    scenarios = "scenarios/support-desk.yaml" # the default
    policies = "policies/support-desk"        # the default: v0.json, v1.json, ... and CHANGELOG.md

    [gates.no-weekend-refunds]       # likewise [proposers.NAME] and [importers.NAME]
    module = "support_desk.gates:NoWeekendRefunds"

    [models.fast]                    # a model behind an OpenAI-compatible endpoint (see improve.llm.spec)
    model = "gpt-4.1-mini"
    price = { input_per_mtok = 0.40, output_per_mtok = 1.60 }

    [objective]
    k = 3                            # runs per scenario
    max_model_calls = 100            # budget per run
    max_violations = 0               # the hard constraint
    cost = "model_calls"             # or "tokens", or "usd": tie-breaker and budget
    cost_budget = 1.5                # a candidate may cost at most 1.5x the baseline
    min_gain = 0.0                   # the held-out mean gain must exceed this (and be significant)
    confidence = 0.95                # the tests run at alpha = 1 - confidence
    tolerance = 0.0                  # a significant drop of a scenario no larger than this is allowed
    max_extra_runs = 6               # reruns of a changed scenario, per policy (0: no reruns)
    max_extra_runs_total = 300       # reruns of a round, both policies and every scenario
    seed = 20261130                  # resampling seed, printed with every scorecard
    held_out_bias = 0.1              # reuse: n held-out scenarios support 1 + floor(2 n 0.1^2 / ln 2) rounds

    [otlp]
    project = "support-desk"         # the Phoenix project exported traces go to (default: the environment's name)

Paths are relative to the directory holding `improve.toml`, and that directory is importable, so a
`module` may name a package that sits next to it. Without an `improve.toml`, the current directory is
the workspace and `--env` must name the environment.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from improve.errors import ScenarioError, WorkspaceError, did_you_mean
from improve.evals.cluster import LOCAL, ExecutorChoice, parse_executor
from improve.evals.scenarios import ScenarioLines, ScenarioSet, load_scenarios, people_problems
from improve.files import locked
from improve.llm import ASKS_FILE, CACHE_DIR, AskMemory, ModelSpec
from improve.log import JsonlDirStore
from improve.machine import JsonPath, MachineConfig, canonical_json
from improve.registry import check_slug
from improve.runtime import ENVIRONMENTS, Environment, load_environment, load_policy

PRODUCTION_DIR = "production"
"""The folder of the workspace's traces a deployed agent journals into (`deploy`)."""

CONFIG_NAME = "improve.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def label_problem(outcome: str, finals: set[str], sentinels: set[str], env: str) -> str | None:
    """What is wrong with a scenario's expected outcome, or None: it must be a final state of the machine
    (a run ends nowhere else), and not a sentinel (a run that reaches one breaks a rule: such a label
    could never pass)."""
    if outcome not in finals:
        labels = sorted(finals - sentinels)
        return (
            f"expected.outcome '{outcome}' is not a final state of {env}{did_you_mean(outcome, labels)}"
            f"; the outcomes a scenario can expect are {labels}"
            + (f" (and the sentinel {sorted(sentinels)}, which a run must never reach)" if sentinels else "")
        )
    if outcome in sentinels:
        return (
            f"expected.outcome '{outcome}' is a sentinel state of {env}, which a run must never reach (it "
            f"counts a violation), so the scenario could never pass; label what the desk should do: one of "
            f"{sorted(finals - sentinels)}"
        )
    return None


class WorkspaceSection(_Section):
    environment: str | None = Field(
        default=None,
        description="The environment used when --env is not given (default: the only [environments] entry).",
    )
    traces: str = Field(default="traces", description="Directory of JSONL threads.")
    warehouse: str = Field(default="traces/traces.duckdb", description="The DuckDB trace warehouse.")
    reports: str = Field(default="reports", description="Directory of generated reports.")
    executor: str = Field(
        default=LOCAL,
        description="Where run, score, round and parity compare run scenarios when --executor is not given: "
        "`local` (threads of this process) or `dask://HOST:PORT` (a Dask scheduler; docs/scale-out.md).",
    )

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, value: str) -> str:
        try:
            parse_executor(value, "executor")
        except WorkspaceError as error:  # pydantic adds the file and the path
            raise ValueError(str(error)) from None
        return value


class EnvironmentSection(_Section):
    module: str | None = Field(
        default=None,
        description="`package.module:function` returning the Environment, importable from the workspace root; "
        "not needed for a bundled environment or one an installed package registers.",
    )
    scenarios: str | None = Field(
        default=None, description="Its scenario file (default scenarios/NAME.yaml)."
    )
    policies: str | None = Field(
        default=None,
        description="The directory of its policy versions and CHANGELOG.md (default policies/NAME).",
    )


class ExtensionSection(_Section):
    module: str = Field(
        description="`package.module:attribute` naming the extension, importable from the workspace root."
    )


class ObjectiveSection(_Section):
    """How runs are scored and when a candidate may be promoted (docs/contracts.md, workspace and objective)."""

    primary: Literal["pass_rate"] = Field(
        default="pass_rate",
        description="The primary metric: the mean over scenarios of the fraction of k runs whose outcome and "
        "every effect match the labels (model-written text compared by presence).",
    )
    max_violations: int = Field(default=0, ge=0, description="Hard constraint: invariant violations allowed.")
    cost: Literal["model_calls", "tokens", "usd"] = Field(
        default="model_calls",
        description="The cost term: tie-breaker, and the budget below (usd needs a price on the model).",
    )
    cost_budget: float = Field(
        default=1.5, gt=0, description="A candidate may cost at most this multiple of the baseline's cost."
    )
    k: int = Field(default=3, ge=1, le=100, description="Runs per scenario.")
    max_model_calls: int = Field(default=100, ge=1, description="Model-call budget per run.")
    min_gain: float = Field(
        default=0.0,
        ge=0,
        description="Promotion needs the held-out mean gain (of per-scenario pass fractions) above this, "
        "besides the exact stratified test of the gain at alpha = 1 - confidence.",
    )
    confidence: float = Field(
        default=0.95,
        gt=0.5,
        lt=1,
        description="The promotion rule's tests run at alpha = 1 - confidence: the held-out gain's exact "
        "stratified test, and the per-scenario drop tests (corrected for their number); also the level of "
        "the descriptive bootstrap interval.",
    )
    tolerance: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="A scenario whose drop is significant still does not count as a regression when its pass "
        "fraction drops by at most this much; 0 means every significant drop is one.",
    )
    max_fallback_share: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="A round compares and promotes nothing (exit 3) when more than this share of either side's "
        "model decisions fell back to the policy's onError because a model call failed (an HTTP error, a "
        "timeout, a refused request): a failing endpoint must never read as a bad policy or a good one.",
    )
    max_extra_runs: int = Field(
        default=6,
        ge=0,
        le=1000,
        description="Sequential reruns: after the first k runs, a scenario whose pass fraction differs between "
        "baseline and candidate runs k more times under each policy, until the change is clear or gone, at "
        "most this many extra runs per scenario per policy; 0 turns reruns off.",
    )
    max_extra_runs_total: int = Field(
        default=300,
        ge=0,
        description="The round's cap on reruns, both policies and every scenario together (held-out scenarios "
        "are served first); the scorecard reports the extra runs made.",
    )
    replay_first: bool = Field(
        default=True,
        description="A candidate's run of a scenario starts from the baseline's recorded run of the same "
        "scenario and sample: where the candidate asks a model the very request the baseline asked, the "
        "recorded answer is the answer (the same draw: the paired comparison shares its random numbers), "
        "and the model is asked only what the baseline never asked. Turn it off (false, or `improve round "
        "--full-runs`) for a model whose answer depends on anything besides the request (docs/contracts.md, "
        "replay-first runs).",
    )
    run_ahead: bool = Field(
        default=True,
        description="Where a round's runs wait on a model together (concurrency above 1), run the reruns the "
        "sequential rule may ask ahead of need, in the background, and drop unwritten what it never asks "
        "for: less waiting, the same threads and decision, and the model calls of dropped runs spent "
        "(docs/contracts.md, waiting together). false: every rerun is run when asked, no call spent ahead.",
    )
    out_of_sample_cases: int = Field(
        default=100,
        ge=0,
        le=10_000,
        description="Each candidate is run with the `careful` stand-in on this many cases drawn by the "
        "environment's generator (Environment.cases), labelled as `improve out-of-sample` labels them: the "
        "`out-of-sample` gate refuses one whose new branch answers a case otherwise than careful, where "
        "careful's answer was right, and the pull request shows what the recommended one agreed. Skipped "
        "without a generator or a careful stand-in, and with 0. With stand-ins a round is seconds, and 100 "
        "cases add about a quarter to it; with a model behind an endpoint they add no call (careful runs them).",
    )
    bootstrap_resamples: int = Field(
        default=5000,
        ge=0,
        description="Resamples of the bootstrap interval of the mean gain, a descriptive figure beside the "
        "exact tests (the promotion rule does not read it); 0 skips it.",
    )
    seed: int = Field(default=20261130, description="Seed of every resampling, printed with each scorecard.")
    held_out_bias: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Held-out reuse: the most the held-out pass rates a round compares may be biased by the "
        "earlier rounds' decisions (epsilon). A set of n held-out scenarios supports 1 + floor(2 n epsilon^2 / "
        "ln 2) rounds; past that, each round warns (docs/contracts.md, held-out reuse).",
    )


class OtlpSection(_Section):
    """How `improve export --format otlp` labels what it sends (docs/interop.md)."""

    project: str | None = Field(
        default=None,
        min_length=1,
        description="The project Arize Phoenix files the traces under (the resource attribute "
        "`openinference.project.name`), when --project is not given; default: each environment's name.",
    )


class WorkspaceConfig(_Section):
    workspace: WorkspaceSection = Field(default_factory=WorkspaceSection)
    environments: dict[str, EnvironmentSection] = Field(default_factory=dict)
    models: dict[str, ModelSpec] = Field(
        default_factory=dict,
        description="Models behind OpenAI-compatible endpoints, by the name --model uses.",
    )
    proposers: dict[str, ExtensionSection] = Field(default_factory=dict)
    gates: dict[str, ExtensionSection] = Field(default_factory=dict)
    importers: dict[str, ExtensionSection] = Field(default_factory=dict)
    objective: ObjectiveSection = Field(default_factory=ObjectiveSection)
    otlp: OtlpSection = Field(default_factory=OtlpSection)


def _meant(loc: tuple[int | str, ...]) -> str:
    """` (did you mean 'environments'?)` for a key improve.toml does not take at `loc`, when one it takes
    there is close; the tables and keys found by walking the config's models."""
    model: Any = WorkspaceConfig
    for part in loc[:-1]:
        field = (
            model.model_fields.get(str(part))
            if isinstance(model, type) and issubclass(model, BaseModel)
            else None
        )
        if field is not None:
            model = field.annotation
        elif get_origin(model) is dict:
            model = get_args(model)[1]  # a name of the user's ([environments.NAME]): its section
        else:
            return ""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    return did_you_mean(str(loc[-1]), model.model_fields)


_TOML_AT = re.compile(r"(?P<what>.*) \(at line (?P<line>\d+), column (?P<column>\d+)\)", re.S)
_TOML_TWICE = ("Cannot overwrite a value", "Cannot declare")
"""How tomllib begins its refusal of a key, or a table, given twice (it keeps neither)."""


def _toml_error(path: Path, err: tomllib.TOMLDecodeError) -> str:
    """`FILE:LINE:COLUMN: invalid TOML: ...`, where tomllib says where; a key or table given twice is
    told how to fix (tomllib's own words say neither that it is a repeat nor what to do)."""
    at = _TOML_AT.fullmatch(str(err))
    if at is None:
        return f"{path}: invalid TOML: {err}"
    fix = (
        ": a key or a table is given twice, and TOML takes each once: keep one, or merge them"
        if at["what"].startswith(_TOML_TWICE)
        else ""
    )
    return f"{path}:{at['line']}:{at['column']}: invalid TOML: {at['what']}{fix}"


def _toml_line(text: str, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line of improve.toml that a validation problem at `loc` (`("objective", "k")`) is
    about: the key's line in its table, else the table's header; None when neither is found (a key the
    file does not have, as a missing field)."""
    names = tuple(str(part) for part in loc)
    table: tuple[str, ...] = ()
    header: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line.startswith("["):
            table = tuple(part.strip().strip("\"'") for part in line.strip("[]").split("."))
            # The table itself, one it is in, or, for a table the config does not know
            # (`[enviroments.refunds]`), the first table under that name.
            if header is None and table and (names[: len(table)] == table or table[: len(names)] == names):
                header = number
            continue
        if "=" in line:
            key = tuple(part.strip().strip("\"'") for part in line.split("=", 1)[0].split("."))
            if (*table, *key) == names[: len(table) + len(key)]:
                return number
    return header


class Workspace:
    """A directory with `improve.toml`, `scenarios/`, `policies/`, `traces/` and `reports/`."""

    def __init__(self, root: Path, config: WorkspaceConfig) -> None:
        self.root = root
        self.config = config
        self.asks = AskMemory(root / ASKS_FILE)
        """The ways of asking its endpoints answer, remembered in its state directory: one object a
        command, so that a remembered way is said once however many sessions (rounds, phases) use it."""

    @classmethod
    def find(cls, start: Path | None = None) -> Workspace:
        """The nearest `improve.toml` at or above `start` (default: the current directory)."""
        here = (start or Path.cwd()).resolve()
        for folder in (here, *here.parents):
            candidate = folder / CONFIG_NAME
            if candidate.is_file():
                return cls.load(candidate)
        return cls(here, WorkspaceConfig())

    @classmethod
    def load(cls, path: Path | str) -> Workspace:
        """The workspace whose improve.toml is at `path`."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise WorkspaceError(
                f"{path}: no such file; pass the workspace's improve.toml (`improve init` writes one)"
            ) from None
        except tomllib.TOMLDecodeError as err:
            raise WorkspaceError(_toml_error(path, err)) from None
        try:
            config = WorkspaceConfig.model_validate(data)
        except ValidationError as err:
            text = path.read_text(encoding="utf-8")
            said = []
            for problem in err.errors():  # as `format_validation_error` says each, with its line
                where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problem["loc"])
                line = _toml_line(text, problem["loc"])
                meant = _meant(problem["loc"]) if problem["type"] == "extra_forbidden" else ""
                said.append(f"{path}{f':{line}' if line else ''}: {where}: {problem['msg']}{meant}")
            raise WorkspaceError("\n".join(said)) from None
        return cls(path.parent.resolve(), config)

    def path(self, relative: str) -> Path:
        """A path of the workspace, resolved; refused when it goes through a dangling symbolic link (a
        command writing there would make the link's target appear, wherever it points)."""
        path = self.root / relative
        for part in (path, *path.parents):
            if part == self.root:
                break
            if part.is_symlink() and not part.exists():
                raise WorkspaceError(
                    f"{path} goes through {part}, a symbolic link to {os.readlink(part)}, which does not exist; "
                    "create its target or remove the link"
                )
        return path.resolve()

    @property
    def traces(self) -> Path:
        return self.path(self.config.workspace.traces)

    @property
    def thread_dirs(self) -> tuple[Path, Path]:
        """Where the workspace's threads are, by id: traces/ (runs of scenarios), then the deployed
        agent's traces/production/ (`deploy`)."""
        return self.traces, self.traces / PRODUCTION_DIR

    def thread_store(self, thread_id: str) -> JsonlDirStore:
        """The store of `thread_dirs` that holds `thread_id` (traces/ when neither does: where a new one
        goes). A thread id that is not valid is refused (`LogError`)."""
        for directory in self.thread_dirs:
            store = JsonlDirStore(directory)
            if store.exists(thread_id):
                return store
        return JsonlDirStore(self.traces)

    @property
    def warehouse(self) -> Path:
        return self.path(self.config.workspace.warehouse)

    @property
    def reports(self) -> Path:
        return self.path(self.config.workspace.reports)

    @property
    def damaged(self) -> Path:
        """Where a command keeps a recorded thread file that does not verify before it runs the scenario
        again (`.improve/damaged/<UTC time>/<thread id>.jsonl`): outside traces/, so `improve ingest
        traces/` never reads it as the thread it claims to be, and outside git, as `.improve/` is."""
        return self.root / ".improve" / "damaged"

    def writing(self, say: Callable[[str], None] | None = None) -> AbstractContextManager[None]:
        """The lock a command holds while it writes the workspace's threads and records them in its
        warehouse (`run`, `score`, `round`, `resume`): two such commands at once take turns, so one
        never deletes, rewrites or half-reads the other's threads. `say` is told when it waits."""
        return locked(self.root / ".improve" / "threads.lock", f"the threads in {self.traces}", say=say)

    def env_name(self, given: str | None) -> str:
        """The environment a command works on: `--env`, else `[workspace] environment`, else the only one."""
        name = given or self.config.workspace.environment
        if name is None and len(self.config.environments) == 1:
            name = next(iter(self.config.environments))
        if name is None:
            where = self.root / CONFIG_NAME
            listed = sorted(self.config.environments) or ENVIRONMENTS.names(self.specs("environments"))
            # Outside any workspace there is no improve.toml to set it in: say so, not where to edit one.
            setting = (
                f"set [workspace] environment in {where}"
                if where.is_file()
                else f"run it in a workspace (no {CONFIG_NAME} here or above {self.root})"
            )
            raise WorkspaceError(
                f"which environment? pass --env NAME (one of {', '.join(listed) or 'none'}), or {setting}; "
                "`improve init` writes a workspace"
            )
        return check_slug(name, "environment")

    def specs(self, kind: Literal["environments", "proposers", "gates", "importers"]) -> dict[str, str]:
        """The workspace's own extensions of one kind: name -> `package.module:attribute`."""
        sections: dict[str, Any] = getattr(self.config, kind)
        return {name: s.module for name, s in sections.items() if s.module is not None}

    def environment(self, given: str | None = None) -> Environment:
        """The environment named by `--env` (or the workspace's default), loaded through the registry."""
        return load_environment(self.env_name(given), self.specs("environments"), self.root)

    def environments_by_machine_id(self) -> dict[str, Environment]:
        """Every registered environment (bundled, installed, the workspace's), by its machine's id:
        how a thread that names only its machine finds the environment that recorded it."""
        local = self.specs("environments")
        found: dict[str, Environment] = {}
        for name in ENVIRONMENTS.names(local):
            env = load_environment(name, local, self.root)
            found.setdefault(env.config.id, env)
        return found

    def executor(self, given: str | None = None) -> ExecutorChoice:
        """Where the command's runs go: `--executor`, else `[workspace] executor`, else `local`."""
        if given is not None:
            return parse_executor(given)
        return parse_executor(
            self.config.workspace.executor, f"{self.root / CONFIG_NAME} [workspace] executor"
        )

    @property
    def cache_dir(self) -> Path:
        """Where model calls are recorded (`--cache record`) and replayed from."""
        return self.root / CACHE_DIR

    def model_spec(self, name: str, env: Environment) -> ModelSpec | None:
        """How to reach the model `--model` names: None for one of the environment's stand-ins, the spec
        of a workspace's `[models.NAME]`, or of `openai:MODEL`."""
        defined = self.config.models.get(name)
        if defined is not None and name in env.models:
            raise WorkspaceError(
                f"model {name!r} is both a stand-in of {env.name} and [models.{name}] in "
                f"{self.root / CONFIG_NAME}; rename the one in improve.toml"
            )
        if defined is not None:
            return defined
        if name in env.models:
            return None
        spec = ModelSpec.from_name(name)
        if spec is None:
            defined_names = ", ".join(sorted(self.config.models)) or "none"
            raise WorkspaceError(
                f"environment {env.name} has no model {name!r}{did_you_mean(name, [*env.models, *self.config.models])}"
                + ": its stand-ins are "
                f"{', '.join(sorted(env.models))}; models in improve.toml: {defined_names}; or name a "
                "model behind an endpoint as openai:MODEL"
            )
        return spec

    def scenarios_path(self, env: str) -> Path:
        section = self.config.environments.get(env)
        return self.path(section.scenarios if section and section.scenarios else f"scenarios/{env}.yaml")

    def scenarios(self, env: str) -> ScenarioSet:
        """The environment's scenario file, checked to be about that environment, every label a final
        state of its machine (a run can end nowhere else: a misspelt label would fail every run of its
        scenario, as if the agent were wrong), and every people script's payload of the types the
        machine's `meta.payloads` declares (a run would fail on one deep inside a guard)."""
        path = self.scenarios_path(env)
        found = load_scenarios(path, env)
        config = self.environment(env).config
        finals, sentinels = set(config.final_states()), set(config.sentinels())
        wrong: list[tuple[str, JsonPath, str]] = []
        for s in found.scenarios:
            if problem := label_problem(s.expected.outcome, finals, sentinels, env):
                wrong.append((s.id, ("expected", "outcome"), problem))
            wrong += [(s.id, field, problem) for field, problem in people_problems(config, s)]
        if wrong:
            lines = ScenarioLines.read(path)
            raise ScenarioError(
                "\n".join(
                    f"{lines.where(sid, field)}: scenario '{sid}': {problem}" for sid, field, problem in wrong
                )
            )
        return found

    def policies_dir(self, env: str) -> Path:
        section = self.config.environments.get(env)
        return self.path(section.policies if section and section.policies else f"policies/{env}")

    def policy_path(self, env: str, ref: str) -> Path:
        """`v3` -> policies/<env>/v3.json; a path to a .json file is taken as it is, a relative one found
        from the current directory or else from the workspace's root (a round's report:
        `reports/<round>/policy.json`, whatever directory `-w` was given from)."""
        if ref.endswith(".json") or "/" in ref:
            path = Path(ref)
            if not path.is_absolute() and not path.exists() and (self.root / path).exists():
                return (self.root / path).resolve()
            return path.resolve()
        return self.policies_dir(env) / f"{ref}.json"

    def load_policy(self, env: str, ref: str) -> MachineConfig:
        path = self.policy_path(env, ref)
        if not path.exists():
            raise self.policy_not_found(env, ref, path)
        policy = load_policy(path)
        self.check_policy_name(env, path, policy.version)
        return policy

    def check_policy_name(self, env: str, path: Path, version: str) -> None:
        """A policy file of the environment's folder named for a version (`v5.json`) holds that version.
        Threads, reports and the CHANGELOG name a policy by its version: a copy of v4 saved as v5 ran as
        v4, its runs mixed with v4's, and `score --policy v5 --vs v4` compared v4 with itself."""
        stem = path.stem
        label = version if version.startswith("v") else f"v{version}"
        if (
            path.resolve().parent != self.policies_dir(env).resolve()
            or not (stem.startswith("v") and stem[1:].isascii() and stem[1:].isdigit())
            or label == stem
        ):
            return
        raise WorkspaceError(
            f'{path}: its "version" is {version!r}, but the file is {path.name}: runs are named by the '
            f'version, so this file\'s would be recorded as {label}\'s; set "version": "{stem[1:]}" (a '
            "changed policy is a new version)"
        )

    def policy_not_found(self, env: str, ref: str, path: Path) -> WorkspaceError:
        """The error for a policy that is not there, with the versions that are (in version order)."""
        found = [p.stem for p in self.policies_dir(env).glob("v*.json")]
        known = sorted(
            found, key=lambda v: (int(v[1:]) if v[1:].isascii() and v[1:].isdigit() else 1 << 30, v)
        )
        return WorkspaceError(f"policy {ref!r} not found at {path}; versions here: {known or 'none'}")


def policy_label(policy: MachineConfig) -> str:
    """The version as it appears in thread ids: `v3` for version "3"."""
    version = policy.version
    return version if version.startswith("v") else f"v{version}"


def policy_hash(policy: MachineConfig) -> str:
    data: dict[str, Any] = policy.model_dump(mode="json", by_alias=True, exclude_none=True)
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:16]


def policy_content(policy: MachineConfig) -> str:
    """What a policy holds, whatever version it is numbered: the hash of its document without `version`."""
    data: dict[str, Any] = policy.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.pop("version", None)
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:16]
