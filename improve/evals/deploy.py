"""A deployed agent: the workspace's environment run with one policy version and one model on live traffic,
each run journaled as a thread that `improve ingest` reads as production (no scenario, no label).

    agent = deploy(Workspace.load("improve.toml"), "v3", model="smol")
    result = agent.run({"ticket": ..., "accountId": ...}, world)   # world: your World, on your systems

Its threads go to `traces/production/` (a `JsonlDirStore`) unless another store is given; `improve ingest
traces/production` puts them in the warehouse, where `improve diagnose --source production` clusters them,
`improve scenarios add --from-thread` labels one, and a round's impact preview replays its candidate over
the newest of them. Each thread's entry 0 carries the stamp a scenario run's does, without the scenario:
the environment, the policy (id, version, hash), the model (and how it is reached, without its key), and
the digest of the environment's files.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from improve.evals.suite import SuiteSpec, suite_spec
from improve.evals.workspace import PRODUCTION_DIR  # where a deployed agent journals, by default
from improve.log import JsonlDirStore, Store
from improve.runtime import PolicyDecider, ResumeResult, RunResult, World, compile_policy, resume, run

if TYPE_CHECKING:
    from improve.evals.workspace import Workspace
    from improve.llm import Meter
    from improve.machine import Machine
    from improve.runtime import Environment, ModelFactory


@dataclass
class Agent:
    """One environment, one policy version, one model: `run` handles one case of live traffic."""

    env: Environment
    spec: SuiteSpec
    store: Store
    models: ModelFactory
    """The model of each run (one session for a model behind an endpoint: its client, its way of asking)."""
    _policy: Machine | None = field(default=None, repr=False)

    def run(
        self,
        input: Mapping[str, Any],
        world: World,
        *,
        thread_id: str | None = None,
        people: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    ) -> RunResult:
        """Run the agent once from `input` against `world` (your `World`, reaching your systems), journaling
        the thread `thread_id` (default: `prod-` and a random id). `people`: scripted answers of the
        people it may wait for; without them a run that waits ends `waiting`, for `resume`."""
        thread = thread_id or f"prod-{uuid.uuid4().hex[:16]}"
        return run(
            self.env,
            input=dict(input),
            world=world,
            people=people or {},
            decider=self._decider(thread),
            store=self.store,
            thread_id=thread,
            stamp=self.spec.live_stamp(self.env),
            max_model_calls=self.spec.max_model_calls,
        )

    def resume(
        self, thread_id: str, event: Mapping[str, Any], world: World, *, event_id: str | None = None
    ) -> ResumeResult:
        """Go on with a run of this agent that stopped waiting (for an approval, an answer): `event` is what
        it waits for (`{"type": "APPROVE", "approver": "dana"}`), checked against what its state accepts
        and journaled before anything acts on it; the same `event_id` twice changes nothing
        (`improve.runtime.resume`, docs/contracts.md, Suspend and resume)."""
        return resume(
            self.env,
            store=self.store,
            thread_id=thread_id,
            event=dict(event),
            decider=self._decider(thread_id),
            world=world,
            event_id=event_id,
        )

    def _decider(self, thread_id: str) -> PolicyDecider:
        if self._policy is None:
            self._policy = compile_policy(self.spec.policy, self.env.judgments, self.env.policy_guards)
        return PolicyDecider(self._policy, {"decider": self.models(thread_id)}, self.env.judgments)


def deploy(
    space: Workspace,
    version: str,
    *,
    model: str,
    env: str | None = None,
    store: Store | None = None,
    meter: Meter | None = None,
) -> Agent:
    """The workspace's environment (`env`, default its own) with policy `version` and `model` (a stand-in,
    a `[models.NAME]` of improve.toml, or `openai:MODEL`), journaling into `store` (default
    `traces/production/`). Raises `WorkspaceError` for a version or model the workspace does not have."""
    name = space.env_name(env)
    environment = space.environment(name)
    spec = suite_spec(space, environment, space.load_policy(name, version), model)
    # A model name the workspace does not know is refused here; an endpoint is not asked until a run
    # needs it (one that does not answer then leaves each decision to the policy's onError, journaled).
    models = spec.model_factory(environment, meter)
    return Agent(environment, spec, store or JsonlDirStore(space.traces / PRODUCTION_DIR), models)
