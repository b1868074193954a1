"""Running a machine: environments, the decision protocol, models, policies, journaled runs, resumes."""

from improve.errors import ActorFailure, ModelCallError, WorldFromThreadError
from improve.runtime.chat import ChatModel, ChatSession
from improve.runtime.decision import (
    MAX_FREE_TEXT,
    Decider,
    Decision,
    DecisionRequest,
    Usage,
    build_request,
    check_answer,
)
from improve.runtime.environment import (
    ENVIRONMENTS,
    Actor,
    CaseGenerator,
    Environment,
    EnvironmentRef,
    FactType,
    World,
    WorldFromThread,
    load_environment,
    load_machine,
)
from improve.runtime.judgment import Judgment, ModelJudgment
from improve.runtime.models import (
    Model,
    ModelFactory,
    ModelReply,
    StandInModel,
    first_option,
    option,
    stand_in,
)
from improve.runtime.policy import (
    MODEL_DECIDE,
    PolicyDecider,
    compile_policy,
    load_json,
    load_policy,
    read_document_text,
)
from improve.runtime.recorded import ActorCall, PersonAnswer, RecordedThread, recorded_thread
from improve.runtime.resume import ResumeResult, WaitingThread, fold_thread, resume, world_at
from improve.runtime.resume_bound import ResumeProof, prove_resumes, resume_proof
from improve.runtime.run import DEFAULT_MAX_MODEL_CALLS, Journal, RunResult, run
from improve.runtime.vocabulary import Vocabulary, vocabulary

__all__ = [
    "DEFAULT_MAX_MODEL_CALLS",
    "ENVIRONMENTS",
    "MAX_FREE_TEXT",
    "MODEL_DECIDE",
    "Actor",
    "ActorCall",
    "ActorFailure",
    "CaseGenerator",
    "ChatModel",
    "ChatSession",
    "Decider",
    "Decision",
    "DecisionRequest",
    "Environment",
    "EnvironmentRef",
    "FactType",
    "Journal",
    "Judgment",
    "Model",
    "ModelCallError",
    "ModelFactory",
    "ModelJudgment",
    "ModelReply",
    "PersonAnswer",
    "PolicyDecider",
    "RecordedThread",
    "ResumeProof",
    "ResumeResult",
    "RunResult",
    "StandInModel",
    "Usage",
    "Vocabulary",
    "WaitingThread",
    "World",
    "WorldFromThread",
    "WorldFromThreadError",
    "build_request",
    "check_answer",
    "compile_policy",
    "first_option",
    "fold_thread",
    "load_environment",
    "load_json",
    "load_machine",
    "load_policy",
    "option",
    "prove_resumes",
    "read_document_text",
    "recorded_thread",
    "resume",
    "resume_proof",
    "run",
    "stand_in",
    "vocabulary",
    "world_at",
]
