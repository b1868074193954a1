"""Running a machine: environments, the decision protocol, models, policies, journaled runs."""

from improve.runtime.decision import Decider, Decision, DecisionRequest, Usage, build_request, check_answer
from improve.runtime.environment import ActorFailure, Environment, World
from improve.runtime.models import Model, ModelCallError, ModelReply, StandInModel, stand_in
from improve.runtime.policy import MODEL_DECIDE, PolicyDecider, compile_policy, load_policy
from improve.runtime.run import Journal, RunResult, run

__all__ = [
    "MODEL_DECIDE",
    "ActorFailure",
    "Decider",
    "Decision",
    "DecisionRequest",
    "Environment",
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
    "load_policy",
    "run",
    "stand_in",
]
