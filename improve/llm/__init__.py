"""Models behind OpenAI-compatible endpoints: how a workspace names one (`ModelSpec`), the endpoint
the proposer and the decider share (`Endpoint`), recorded calls (`ResponseCache`) and what the calls
spent (`Meter`), and the ways of asking a workspace remembers its endpoints to answer (`AskMemory`)."""

from improve.llm.asks import ASKS_FILE, WAYS, AskMemory, Kind, ask_key
from improve.llm.cache import CACHE_DIR, CACHE_MODES, REDACTED, CacheMode, ResponseCache, request_key
from improve.llm.endpoint import MAX_ANSWER_BYTES, MAX_TOKENS, REFUSAL_WORDS, Endpoint, usage_dict
from improve.llm.local import LOCAL_KEY_ENV, LOCAL_MODEL, LocalServer, local_server
from improve.llm.meter import Meter, usd_text
from improve.llm.spec import API_KEY_ENV, BASE_URL_ENV, OPENAI_PREFIX, ModelSpec, Price, local_url, safe_url

__all__ = [
    "API_KEY_ENV",
    "ASKS_FILE",
    "BASE_URL_ENV",
    "CACHE_DIR",
    "CACHE_MODES",
    "LOCAL_KEY_ENV",
    "LOCAL_MODEL",
    "MAX_ANSWER_BYTES",
    "MAX_TOKENS",
    "OPENAI_PREFIX",
    "REDACTED",
    "REFUSAL_WORDS",
    "WAYS",
    "AskMemory",
    "CacheMode",
    "Endpoint",
    "Kind",
    "LocalServer",
    "Meter",
    "ModelSpec",
    "Price",
    "ResponseCache",
    "ask_key",
    "local_server",
    "local_url",
    "request_key",
    "safe_url",
    "usage_dict",
    "usd_text",
]
