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

**Fallback.** An endpoint that does not support `json_schema` refuses it with an error naming the
response format (400, 422, or 500 from llama-cpp-python: `improve.llm.endpoint`); any other error is an
endpoint failure (`ProposalError`). On a refusal the proposer repeats the request with `{"type":
"json_object", "schema": S}` (llama.cpp's server and llama-cpp-python constrain the reply with the
schema) and the schema written into the system message, keeps using `json_object` for the rest of its
life, and says so once. In `record` mode the refusal itself is stored under the json_schema request's
hash, so a replay takes the same path without any call.

**Fitting the context.** The request is sized to the model's context window: `context_tokens` of its
`[models.NAME]`, else what the server reports (`Endpoint.context_window`, recorded like a call), else
learned from the first context-length error. A quarter of the window (at least 512 tokens, at most
4096) is kept for the reply (`max_tokens`); the rest must hold the request, estimated at three
characters a token. A request too long loses, in this order, the schema written into the prompt (the
response format still carries it), then training examples (20, 10, 5, 2, 1); what was left out is
reported (`Proposal.notes`). A request that does not fit even so is a `ProposalError` that says how
large the context would have to be.

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
from openai.types.shared_params import ResponseFormatJSONSchema
from openai.types.shared_params.response_format_json_schema import JSONSchema

from improve.errors import ProposalError, ProposerEndpointError, ReplayMissError
from improve.llm import API_KEY_ENV, REFUSAL_WORDS, Endpoint, ResponseCache, safe_url
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


def json_object_format() -> dict[str, Any]:
    """`json_object` with the schema beside it: llama.cpp's server, llama-cpp-python and LM Studio
    constrain the reply with `schema`; other servers ignore the field."""
    return {"type": "json_object", "schema": response_schema()}


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


def _user_prompt(request: ProposalRequest, most: int = MAX_EXAMPLES) -> str:
    examples = request.examples[:most]
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


def propose_messages(
    request: ProposalRequest, schema_in_prompt: bool = False, examples: int = MAX_EXAMPLES
) -> list[Message]:
    """The conversation that asks for a candidate (with at most `examples` training examples)."""
    return [
        {"role": "system", "content": _system_prompt(schema_in_prompt)},
        {"role": "user", "content": _user_prompt(request, examples)},
    ]


def repair_messages(
    request: ProposalRequest,
    previous: Proposal,
    failure: GateResult,
    schema_in_prompt: bool = False,
    examples: int = MAX_EXAMPLES,
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
        *propose_messages(request, schema_in_prompt, examples),
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


_PLACEHOLDER = re.compile(r"^\s*<[^<>]*>\s*$")
"""A rationale that is only a placeholder in angle brackets, as the prompt writes its own."""


class UnparsableReply(ProposalError):
    """A reply that is not JSON: asked once more, with what was wrong (`OpenAIProposer._complete`)."""

    def __init__(self, message: str, content: str, detail: str) -> None:
        super().__init__(message)
        self.content = content
        self.detail = detail


def parse_reply(content: str, where: str) -> tuple[Any, str]:
    """The candidate document and rationale in a reply's content (JSON only; never evaluated)."""
    fenced = _FENCE.match(content)
    text = fenced.group("body") if fenced else content
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        start = content[:200] + ("..." if len(content) > 200 else "")
        detail = f"line {err.lineno}, column {err.colno}: {err.msg}"
        raise UnparsableReply(
            f"{where}: the model's reply is not valid JSON ({detail}); it starts {start!r}", content, detail
        ) from None
    if isinstance(data, dict) and isinstance(data.get("policy"), dict):
        rationale = data.get("rationale")
        if not isinstance(rationale, str) or _PLACEHOLDER.match(rationale):
            # A small model echoes the prompt's `"<what changed and why>"`: no rationale, not ours to
            # record as one (the CHANGELOG then states the round's hypothesis).
            return data["policy"], ""
        return data["policy"], rationale
    # A bare policy (or anything else): the validate gate says what is wrong with it.
    return data, ""


Conversation = Callable[[bool, int], list[Message]]
"""The messages of one request: whether the schema is written into the prompt, and how many examples."""

REPLY_SHOWN = 4000
"""Characters of an unparsable reply sent back with what is wrong with it."""


def _corrected(conversation: Conversation, error: UnparsableReply) -> Conversation:
    """`conversation`, then the reply that did not parse and what is wrong with it."""

    def messages(schema_in_prompt: bool, examples: int) -> list[Message]:
        return [
            *conversation(schema_in_prompt, examples),
            {"role": "assistant", "content": error.content[:REPLY_SHOWN]},
            {
                "role": "user",
                "content": f"That reply is not valid JSON ({error.detail}). Reply with exactly one JSON "
                'object and nothing else: {"policy": <the complete policy>, "rationale": "<what changed and '
                'why>"}.',
            },
        ]

    return messages


EXAMPLE_STEPS = (MAX_EXAMPLES, 10, 5, 2, 1)
"""How far a request too long for the context is cut down, examples first kept whole."""

CHARS_PER_TOKEN = 3
"""A request's size in tokens, estimated: JSON-heavy text runs at about 3 to 4 characters a token, so 3
over-counts a little, which is the safe side."""


def reply_reserve(window: int) -> int:
    """Tokens of the window kept for the reply (a whole policy)."""
    return max(512, min(4096, window // 4))


def estimated_tokens(messages: Sequence[Message]) -> int:
    return sum(len(m["content"]) + 8 for m in messages) // CHARS_PER_TOKEN


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
        context_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.cache = cache if cache is not None else ResponseCache()
        self.temperature = float(temperature)
        self.endpoint = Endpoint(
            base_url=base_url,
            api_key=api_key if api_key else os.environ.get(API_KEY_ENV) or None,
            timeout=timeout,
            max_retries=max_retries,
            error=ProposerEndpointError,
            no_key=f"the openai proposer has no API key: set {API_KEY_ENV} (any non-empty value for a local "
            "endpoint that needs none), or replay recorded responses (--cache replay)",
            http_client=http_client,
        )
        self.json_schema_supported = True
        """Set to False once the endpoint rejected `json_schema`; then `json_object` is asked."""
        self.context_tokens = context_tokens
        """The model's context window (None: not known yet; asked of the server on first use)."""
        self._asked_window = context_tokens is not None
        self.notes: list[str] = []
        """What the proposer learned about its endpoint, said once each (a refused format)."""

    def __repr__(self) -> str:
        return (
            f"OpenAIProposer(model={self.model!r}, base_url={safe_url(self.base_url)!r}, "
            f"cache={self.cache!r}, api_key={'set' if self.endpoint.secrets else 'unset'})"
        )

    # -- the Proposer protocol --

    def propose(self, request: ProposalRequest) -> Proposal:
        return self._complete(lambda schema, examples: propose_messages(request, schema, examples))

    def repair(self, request: ProposalRequest, previous: Proposal, failure: GateResult) -> Proposal:
        return self._complete(
            lambda schema, examples: repair_messages(request, previous, failure, schema, examples)
        )

    # -- the calls --

    def _complete(self, conversation: Conversation) -> Proposal:
        calls, told_context, told_json = 0, False, False
        try:
            while True:
                schema_mode = self.json_schema_supported
                messages, trimmed = self._fit(conversation, schema_in_prompt=not schema_mode)
                response, called = self._request(
                    messages, json_schema_format() if schema_mode else json_object_format()
                )
                calls += called
                if "rejected" in response and schema_mode:
                    self.json_schema_supported = False
                    said = " ".join(str(response["rejected"].get("message") or "").split())[:120]
                    self._note(f"the endpoint refused json_schema ({said})")
                    continue
                if "too_long" in response and not told_context:
                    # The server said how large its context is: fit the request to it and ask once more.
                    told_context = True
                    self.context_tokens = int(response["too_long"]["context"])
                    continue
                if "too_long" in response:
                    raise ProposalError(
                        f"response {response['key']}: the request is too long for {self.model}'s context of "
                        f"{self.context_tokens} tokens even trimmed: {response['too_long']['message']}"
                    )
                if "rejected" in response:  # only a json_schema request is ever stored as rejected
                    raise ProposalError(f"response {response['key']}: the endpoint rejected the request")
                try:
                    return self._proposal(response, calls, trimmed)
                except UnparsableReply as error:
                    if told_json:
                        raise ProposalError(
                            f"{error} (its second reply: the first was not valid JSON either, and it was asked "
                            "again with that reply and what was wrong with it)"
                        ) from None
                    # Asked once more, with its reply and what is wrong with it, as a failed gate's detail is
                    # sent back: a small model's reply that did not parse ended the round, with no repair.
                    told_json = True
                    conversation = _corrected(conversation, error)
        except ProposalError as error:
            error.calls = calls  # spent, though no proposal came of them: the round counts them
            raise

    def _note(self, what: str) -> None:
        note = f"{self.model}: {what}; asking by json_object"
        if note not in self.notes:
            self.notes.append(note)

    def _window(self) -> int | None:
        """The model's context: configured, else the server's word (recorded like a call, so a replay
        fits the request the same way without asking), else unknown."""
        if not self._asked_window:
            self._asked_window = True
            try:
                answer, _ = self.cache.fetch(
                    {"context_window_of": self.model},
                    lambda: {"context": self.endpoint.context_window()},
                    secrets=self.endpoint.secrets,
                )
            except (ProposalError, ReplayMissError):  # a recording made before windows were: unknown
                answer = {}
            found = answer.get("context")
            self.context_tokens = int(found) if isinstance(found, int) else None
        return self.context_tokens

    def _fit(self, conversation: Conversation, *, schema_in_prompt: bool) -> tuple[list[Message], list[str]]:
        """The request cut down to the model's context (see the module's "Fitting the context"), and
        what was left out."""
        full = conversation(schema_in_prompt, MAX_EXAMPLES)
        window = self._window()
        if window is None:
            return full, []
        budget = window - reply_reserve(window)
        schemas = [True, False] if schema_in_prompt else [False]
        for schema in schemas:
            for examples in EXAMPLE_STEPS:
                messages = conversation(schema, examples)
                if estimated_tokens(messages) <= budget:
                    left_out = []
                    if schema != schema_in_prompt:
                        left_out.append("the schema written into the prompt (the response format keeps it)")
                    if examples < MAX_EXAMPLES:
                        left_out.append(f"training examples beyond the first {examples}")
                    if not left_out:
                        return messages, []
                    return messages, [
                        f"the proposer's request was trimmed to fit {self.model}'s context of {window} tokens "
                        f"(about {estimated_tokens(full):,} tokens whole, {reply_reserve(window):,} kept for "
                        f"the reply): left out {' and '.join(left_out)}"
                    ]
        smallest = estimated_tokens(conversation(False, EXAMPLE_STEPS[-1]))
        raise ProposalError(
            f"the proposer's request needs about {smallest:,} tokens even trimmed (no schema in the prompt, one "
            f"example), more than {self.model}'s context of {window} tokens leaves for it ({budget:,} after "
            f"{reply_reserve(window):,} for the reply): give the model a context of at least "
            f"{smallest + reply_reserve(smallest * 2):,} tokens (llama-server -c, llama-cpp-python --n_ctx, "
            "Ollama num_ctx) or propose with `--proposer rules`"
        )

    def _request(
        self, messages: list[Message], response_format: ResponseFormat | dict[str, Any]
    ) -> tuple[dict[str, Any], int]:
        """The response (with its cache `key` added) and the number of endpoint calls made (0 or 1)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "response_format": response_format,
            "temperature": self.temperature,
        }
        window = self.context_tokens
        if window is not None:
            body["max_tokens"] = reply_reserve(window)
        rejectable = REFUSAL_WORDS["response_format"] if response_format["type"] == "json_schema" else ()
        response, called = self.cache.fetch(
            body,
            lambda: self.endpoint.complete(
                {**body, "messages": _sdk_messages(messages)}, rejectable, fits=True
            ),
            secrets=self.endpoint.secrets,
        )
        return {**response, "key": self.cache.key(body)}, int(called)

    def _proposal(self, response: Mapping[str, Any], calls: int, trimmed: Sequence[str]) -> Proposal:
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
        return Proposal(
            document=document,
            rationale=rationale,
            proposer=self.name,
            calls=calls,
            notes=(*self.notes, *trimmed),
        )
