"""Running a machine: environments, the decision protocol, models, policies, journaled runs."""

from improve.errors import ActorFailure, ModelCallError
from improve.runtime.decision import Decider, Decision, DecisionRequest, Usage, build_request, check_answer
from improve.runtime.environment import (
    ENVIRONMENTS,
    Environment,
    EnvironmentRef,
    World,
    load_environment,
    load_machine,
)
from improve.runtime.models import (
    Model,
    ModelReply,
    StandInModel,
    first_option,
    option,
    stand_in,
)
from improve.runtime.policy import MODEL_DECIDE, PolicyDecider, compile_policy, load_policy
from improve.runtime.run import Journal, RunResult, run

__all__ = [
    "ENVIRONMENTS",
    "MODEL_DECIDE",
    "ActorFailure",
    "Decider",
    "Decision",
    "DecisionRequest",
    "Environment",
    "EnvironmentRef",
    "Journal",
    "Model",
    "ModelCallError",
    "ModelReply",
    "PolicyDecider",
    "RunResult",
    "StandInModel",
    "Usage",
    "World",
    "build_request",
    "check_answer",
    "compile_policy",
    "first_option",
    "load_environment",
    "load_machine",
    "load_policy",
    "option",
    "run",
    "stand_in",
]
