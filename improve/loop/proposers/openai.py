"""The `openai` proposer: one small policy change from a model behind any OpenAI-compatible endpoint.

It talks to `POST {base_url}/chat/completions` through the official `openai` SDK (OpenAI, vLLM,
llama.cpp, Ollama, LiteLLM, ... anything that speaks the chat completions API).

**Output format.** The reply is asked as structured JSON:
`response_format = {"type": "json_schema", "json_schema": {"name": "policy", "schema": S, "strict": false}}`
where `S` is `{"policy": <MachineConfig's JSON schema>, "rationale": string}` (see `response_schema`).
The policy schema is `MachineConfig.model_json_schema(by_alias=True)` made portable: `title` and
`default` keywords are dropped (token noise, and `default` is refused by some schema subsets) and so is
the optional `$schema` property. It cannot be made *strict* (OpenAI's strict structured outputs): the
policy format is maps keyed by names the policy chooses (`states`, `on`, `context`) and expression
trees of any JSON type, while strict mode needs `additionalProperties: false` and every property
required on every object. So the schema is sent with `strict: false`: endpoints with grammar-constrained
decoding (vLLM, llama.cpp, SGLang) enforce it, the others use it as guidance, and the gates validate
the candidate either way.

**Fallback.** An endpoint that does not support `json_schema` answers the request with HTTP 400 or 422
(`openai.BadRequestError` / `UnprocessableEntityError`). Such an error is taken as a rejection of the
response format when its message, body or `param` mentions `response_format`, `response format` or
`schema`; any other error is an endpoint failure (`ProposalError`). On a rejection the proposer
repeats the request with `{"type": "json_object"}` and the schema written into the system message, and
keeps using `json_object` for the rest of its life. In `record` mode the rejection itself is stored
under the json_schema request's hash, so a replay takes the same path without any call.

**Safety.** The reply's content is parsed as JSON (a surrounding Markdown code fence is tolerated),
never evaluated; the candidate is data that the gates validate. Unparsable content raises
`ProposalError`, which the round records as a failed candidate. The API key comes from the
constructor or `OPENAI_API_KEY`; it travels only in the SDK's `Authorization` header and is kept out
of the cache (the hashed request is model, messages, response_format, temperature), of proposals, of
exception messages (redacted if an endpoint echoes it) and of `repr`.

Every request goes through the shared cache of model calls (`improve.llm.ResponseCache`): `live`,
`record` or `replay`; the HTTP side is `improve.llm.Endpoint`, shared with the decider.
`Proposal.calls` counts the HTTP requests this proposer issued (a replayed response counts 0; the
SDK's own retries, `max_retries`, are not counted separately).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import openai
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat.completion_create_params import ResponseFormat
from openai.types.shared_params import ResponseFormatJSONObject, ResponseFormatJSONSchema
from openai.types.shared_params.response_format_json_schema import JSONSchema

from improve.errors import ProposalError
from improve.llm import API_KEY_ENV, Endpoint, ResponseCache, safe_url
from improve.loop.gates import GateResult
from improve.loop.proposers.base import Proposal, ProposalRequest
from improve.machine import MachineConfig

PROPOSER_NAME = "openai"
MAX_EXAMPLES = 20
"""Training examples written into the prompt (the first ones; the prompt says how many were left out)."""

Message = dict[str, str]
"""A chat message as hashed and cached: `{"role": ..., "content": ...}`."""


# --- the schema ------------------------------------------------------------------------------------------


def _portable(node: Any) -> Any:
    """A JSON schema without `title` / `default` keywords (property names are kept, whatever they are)."""
    if isinstance(node, list):
        return [_portable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "default"):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: _portable(sub) for name, sub in value.items()}
        else:
            out[key] = _portable(value)
    return out


def policy_schema() -> dict[str, Any]:
    """The policy format's JSON schema (MachineConfig), portable across structured-output backends."""
    schema: dict[str, Any] = _portable(MachineConfig.model_json_schema(by_alias=True))
    schema.get("properties", {}).pop("$schema", None)
    return schema


def response_schema() -> dict[str, Any]:
    """The reply's schema: `{"policy": <policy>, "rationale": "..."}`, with the policy's `$defs` at the root."""
    policy = policy_schema()
    defs = policy.pop("$defs", {})
    return {
        "type": "object",
        "properties": {
            "policy": policy,
            "rationale": {"type": "string", "description": "One paragraph: what changed and why."},
        },
        "required": ["policy", "rationale"],
        "additionalProperties": False,
        "$defs": defs,
    }


def json_schema_format() -> ResponseFormatJSONSchema:
    return ResponseFormatJSONSchema(
        type="json_schema", json_schema=JSONSchema(name="policy", schema=response_schema(), strict=False)
    )


def json_object_format() -> ResponseFormatJSONObject:
    return ResponseFormatJSONObject(type="json_object")


# --- the prompt ------------------------------------------------------------------------------------------

SYSTEM_PROMPT = """\
You improve the policy of an agent whose control flow is a state machine. The environment (its states, \
the guards that encode its rules, its tools) is written by people and never changes. The policy is data: \
a JSON state machine that answers the environment's decision requests by choosing one of the offered \
events. It is validated and explored before it runs; it is never executed as code.

The policy format (a subset of XState v5 JSON):
- Top level: `id`, `version` (a string), `description`, `initial`, `states`, optional `context`.
- The policy's input is the decision request: `input.name`, `input.options` (the offered events, each \
`{"type": EVENT, ...payload}`), `input.facts`, `input.attempts`; `facts` is also a variable of its own.
- Every expression position (guards, `output`, invoke `input` values, `assign`, `context`) holds a CEL \
expression; a literal string is quoted inside the CEL, e.g. "'ESCALATE'". CEL here has no comprehensions.
- A choice state branches at once; the first branch whose guard holds wins and the last is unguarded: \
{"type": "choice", "choice": [{"guard": "<CEL over facts>", "target": "<state>"}, {"target": "<state>"}]}
- A model request lets a model pick among the offered options: {"invoke": {"src": "model.decide", \
"input": {"model": "'<model ref>'"}, "onDone": {"target": "answer"}, "onError": {"target": "<a final>"}}} \
with "answer": {"type": "final", "output": "event.output"}. Judgment actors of the vocabulary are invoked \
the same way, with their name as `src`.
- A final state answers an event: {"type": "final", "output": {"type": "'ESCALATE'"}}; a payload field is \
a CEL expression too, e.g. {"type": "'REFUND'", "amount": "facts.order.refundable"}.

Rules for the change you propose:
1. ONE smallest change that addresses the one diagnosed cause; everything else stays as it is.
2. Keep the policy's `id` and `description` exactly; set `version` to the new version you are given.
3. Use only names from the vocabulary: its events and their payload fields, fact paths, request fields, \
named guards, judgment actors and model refs. No other name.
4. No literal from the scenarios or the examples (ticket text, ids, the amount of one case): a condition \
must be a general rule that the goal and the facts justify.
5. Every final output must be one of the options offered in `input.options`, on every path, including \
when a model call fails: a `choice` branch with a CEL guard over `facts` leading to a final whose output \
is an event the decision offers in that case, or narrowing what the model may answer.
6. Reply with one JSON object and nothing else: {"policy": <the complete candidate policy>, \
"rationale": "<one paragraph: what changed and why>"}."""

FALLBACK_SCHEMA_NOTE = "Your reply must be one JSON object that matches this JSON Schema:\n"


def _dump(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False, default=str)


def _policy_json(config: MachineConfig) -> Any:
    return config.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)


def _diagnosis_text(diagnosis: Mapping[str, Any]) -> str:
    cluster = diagnosis.get("chosen", diagnosis.get("cluster"))
    hypothesis = diagnosis.get("hypothesis")
    if cluster is None and hypothesis is None:
        return _dump(dict(diagnosis))
    evidence: Any = diagnosis.get("evidence")
    if evidence is None and isinstance(hypothesis, Mapping):
        evidence = hypothesis.get("evidence")
    if evidence is None and isinstance(cluster, Mapping):
        evidence = cluster.get("threads")
    parts = [f"Cluster:\n{_dump(cluster)}", f"Hypothesis:\n{_dump(hypothesis)}"]
    if evidence is not None:
        parts.append(f"Evidence thread ids: {_dump(evidence)}")
    return "\n\n".join(parts)


def _task(request: ProposalRequest) -> str:
    return (
        f"Keep `id` ({json.dumps(request.policy.id)}) and `description` unchanged and set `version` to "
        f"{json.dumps(request.new_version)}."
    )


def _user_prompt(request: ProposalRequest) -> str:
    examples = request.examples[:MAX_EXAMPLES]
    left_out = len(request.examples) - len(examples)
    more = f" (the first {len(examples)} of {len(request.examples)})" if left_out > 0 else ""
    return "\n\n".join(
        [
            f"## Goal of the environment '{request.environment}'\n{request.goal}",
            f"## The current policy (version {request.policy.version})\n{_dump(_policy_json(request.policy))}",
            f"## Vocabulary: the only names a policy may use\n{_dump(request.vocabulary.to_json())}",
            f"## Objective on the train split\n{_dump(request.objective)}",
            f"## Diagnosis: the one cause to address\n{_diagnosis_text(request.diagnosis)}",
            f"## Training examples of this cluster{more}\n{_dump(examples)}",
            "## Your task\nPropose ONE smallest change to the current policy that addresses this cause. "
            f"{_task(request)} Reply with one JSON object: "
            '{"policy": <the complete candidate policy>, "rationale": "<what changed and why>"}.',
        ]
    )


def _system_prompt(schema_in_prompt: bool) -> str:
    if not schema_in_prompt:
        return SYSTEM_PROMPT
    return f"{SYSTEM_PROMPT}\n\n{FALLBACK_SCHEMA_NOTE}{json.dumps(response_schema(), sort_keys=True)}"


def propose_messages(request: ProposalRequest, schema_in_prompt: bool = False) -> list[Message]:
    """The conversation that asks for a candidate."""
    return [
        {"role": "system", "content": _system_prompt(schema_in_prompt)},
        {"role": "user", "content": _user_prompt(request)},
    ]


def repair_messages(
    request: ProposalRequest, previous: Proposal, failure: GateResult, schema_in_prompt: bool = False
) -> list[Message]:
    """The follow-up conversation: the previous candidate, then the failing gate's name and detail verbatim."""
    candidate = json.dumps(
        {"policy": previous.document, "rationale": previous.rationale}, indent=1, ensure_ascii=False
    )
    feedback = (
        f"The candidate failed the gate `{failure.name}`. The gate's detail, verbatim, between the markers:\n"
        f"BEGIN GATE DETAIL\n{failure.detail}\nEND GATE DETAIL\n\n"
        "Correct the candidate so that this gate passes: the same one change, fixed where the detail says, "
        f"following every rule above. {_task(request)} Reply with the complete corrected policy as one JSON "
        'object: {"policy": <the complete corrected policy>, "rationale": "<what changed and why>"}.'
    )
    return [
        *propose_messages(request, schema_in_prompt),
        {"role": "assistant", "content": candidate},
        {"role": "user", "content": feedback},
    ]


def _sdk_messages(messages: Sequence[Message]) -> list[ChatCompletionMessageParam]:
    out: list[ChatCompletionMessageParam] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            out.append(ChatCompletionSystemMessageParam(role="system", content=content))
        elif role == "assistant":
            out.append(ChatCompletionAssistantMessageParam(role="assistant", content=content))
        else:
            out.append(ChatCompletionUserMessageParam(role="user", content=content))
    return out


# --- the reply -------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(?P<body>.*)\n\s*```\s*$", re.DOTALL)


def parse_reply(content: str, where: str) -> tuple[Any, str]:
    """The candidate document and rationale in a reply's content (JSON only; never evaluated)."""
    fenced = _FENCE.match(content)
    text = fenced.group("body") if fenced else content
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        start = content[:200] + ("..." if len(content) > 200 else "")
        raise ProposalError(
            f"{where}: the model's reply is not valid JSON (line {err.lineno}, column {err.colno}: "
            f"{err.msg}); it starts {start!r}"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("policy"), dict):
        rationale = data.get("rationale")
        return data["policy"], rationale if isinstance(rationale, str) else ""
    # A bare policy (or anything else): the validate gate says what is wrong with it.
    return data, ""


SCHEMA_WORDS = ("response_format", "response format", "schema")
"""A 400 or 422 mentioning one of these refused the `json_schema` response format."""


class OpenAIProposer:
    """Proposes one policy change by asking a model through an OpenAI-compatible endpoint."""

    name = PROPOSER_NAME

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        cache: ResponseCache | None = None,
        temperature: float = 0,
        timeout: float = 120.0,
        max_retries: int = 2,
        http_client: openai.DefaultHttpxClient | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.cache = cache if cache is not None else ResponseCache(miss=ProposalError)
        self.temperature = float(temperature)
        self.endpoint = Endpoint(
            base_url=base_url,
            api_key=api_key if api_key else os.environ.get(API_KEY_ENV) or None,
            timeout=timeout,
            max_retries=max_retries,
            error=ProposalError,
            no_key=f"the openai proposer has no API key: set {API_KEY_ENV} (any non-empty value for a local "
            "endpoint that needs none), or replay recorded responses (--cache replay)",
            http_client=http_client,
        )
        self.json_schema_supported = True
        """Set to False once the endpoint rejected `json_schema`; then `json_object` is asked."""

    def __repr__(self) -> str:
        return (
            f"OpenAIProposer(model={self.model!r}, base_url={safe_url(self.base_url)!r}, "
            f"cache={self.cache!r}, api_key={'set' if self.endpoint.secrets else 'unset'})"
        )

    # -- the Proposer protocol --

    def propose(self, request: ProposalRequest) -> Proposal:
        return self._complete(lambda schema_in_prompt: propose_messages(request, schema_in_prompt))

    def repair(self, request: ProposalRequest, previous: Proposal, failure: GateResult) -> Proposal:
        return self._complete(
            lambda schema_in_prompt: repair_messages(request, previous, failure, schema_in_prompt)
        )

    # -- the calls --

    def _complete(self, conversation: Callable[[bool], list[Message]]) -> Proposal:
        calls = 0
        if self.json_schema_supported:
            response, called = self._request(conversation(False), json_schema_format())
            calls += called
            if "rejected" not in response:
                return self._proposal(response, calls)
            self.json_schema_supported = False
        response, called = self._request(conversation(True), json_object_format())
        calls += called
        if "rejected" in response:  # only a json_schema request is ever stored as rejected
            raise ProposalError(f"response {response['key']}: the endpoint rejected the request")
        return self._proposal(response, calls)

    def _request(
        self, messages: list[Message], response_format: ResponseFormat
    ) -> tuple[dict[str, Any], int]:
        """The response (with its cache `key` added) and the number of endpoint calls made (0 or 1)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "response_format": response_format,
            "temperature": self.temperature,
        }
        rejectable = SCHEMA_WORDS if response_format["type"] == "json_schema" else ()
        response, called = self.cache.fetch(
            body,
            lambda: self.endpoint.complete({**body, "messages": _sdk_messages(messages)}, rejectable),
            secrets=self.endpoint.secrets,
        )
        return {**response, "key": self.cache.key(body)}, int(called)

    def _proposal(self, response: Mapping[str, Any], calls: int) -> Proposal:
        where = f"response {response.get('key', '?')}"
        content = response.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ProposalError(
                f"{where}: the model returned no content (finish_reason {response.get('finish_reason')!r}, "
                f"refusal {response.get('refusal')!r})"
            )
        if response.get("finish_reason") == "length":
            where += " (cut off at the token limit: finish_reason 'length')"
        document, rationale = parse_reply(content, where)
        return Proposal(document=document, rationale=rationale, proposer=self.name, calls=calls)
