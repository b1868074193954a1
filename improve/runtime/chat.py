"""The decider on a real model: a decision request as a chat completions request.

The conversation is the environment's decision prompt, its facts and the offered options; the options
are the only possible answers, asked for one of three ways (a model's `ask` in improve.toml; `auto`,
the default, takes whichever the endpoint answers):

1. `tools`: one function per offered event type, its payload fields a JSON Schema with `enum` of the
   offered values (free-text fields as strings), and `tool_choice: "required"`;
2. `json_schema`: a response format whose `answer` is `oneOf` the options;
3. `json_object`: `response_format: {"type": "json_object", "schema": ...}` (llama.cpp's server,
   llama-cpp-python and LM Studio turn the schema into a grammar; others ignore it) and the same schema
   written into the system message.

In `auto`, an endpoint that refuses a way (an error naming tools, tool choice or the response format, of
any status: `llm/endpoint.py`) or ignores it (tools: a 200 without a tool call; json_schema: an answer
that is not JSON) moves every later call of that model to the next way, and the call is asked again the
next way; the session says so once (`Meter.note`). The way a live call is answered by is remembered by
the workspace for the endpoint and model (`improve.llm.asks`, `Ways`): later sessions start from it, and
one that finds it refused or ignored tries the ways again from the first. In `record` mode each answer is
stored, so a replay takes the same path.
A refused answer comes back through the decision protocol as an attempt: the previous answer and the
refusal's reason are sent as the next messages. The answer is parsed as JSON, never evaluated; an
answer that cannot be parsed is no answer, which the protocol refuses and retries.

Every call goes through the shared cache (`improve.llm.ResponseCache`), keyed by the request plus its
*sample* (the run's seed and the call's number in the run), so k runs are k samples and a recorded
round replays exactly. A call that fails after the SDK's retries is a `ModelCallError`, which the
policy's `onError` handles; the key never reaches a message, a cache file or a thread.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import httpx2 as httpx

from improve.errors import MissingKeyError, ModelAnswerError, ModelCallError
from improve.llm import (
    ASKS_FILE,
    REFUSAL_WORDS,
    WAYS,
    AskMemory,
    Endpoint,
    Kind,
    Meter,
    ModelSpec,
    ResponseCache,
    ask_key,
    usage_dict,
)
from improve.machine import FREE_TEXT
from improve.runtime.decision import DecisionRequest
from improve.runtime.judgment import ModelJudgment
from improve.runtime.models import ModelReply

MODES = WAYS["decide"]
REJECTABLE = {
    "tools": REFUSAL_WORDS["tools"],
    "json_schema": REFUSAL_WORDS["response_format"],
    "json_object": REFUSAL_WORDS["response_format"],
}
"""What an error mentions when the endpoint refuses a way of asking (then, in `auto`, the next is tried)."""

SYSTEM_PROMPT = (
    "You are the decision step of an agent whose control flow is a state machine written by people. "
    "At this step the environment asks for one decision and offers the only answers it will accept "
    "right now. Read the facts, follow the instructions, and answer with exactly one of the offered "
    "options. If an answer is refused, the reason follows: answer again."
)
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(?P<body>.*)\n\s*```\s*$", re.DOTALL)


# --- the request ---------------------------------------------------------------------------------------


def _fields(request: DecisionRequest, event_type: str) -> tuple[dict[str, Any], list[str]]:
    """An event type's payload properties (enums of the offered values, strings for free text) and the
    required ones."""
    offered = [o for o in request.options if o["type"] == event_type]
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, values in (request.payloads.get(event_type) or {}).items():
        if values == FREE_TEXT:
            properties[name] = {"type": "string"}
            continue
        choices: list[Any] = []
        for option in offered:
            if name in option and option[name] not in choices:
                choices.append(option[name])
        properties[name] = {"enum": choices}
        required.append(name)
    return properties, required


def event_types(request: DecisionRequest) -> list[str]:
    return list(dict.fromkeys(o["type"] for o in request.options))


def tool_name(event_type: str) -> str:
    """An event type as a function name the API accepts (`^[A-Za-z0-9_-]{1,64}$`)."""
    return _TOOL_NAME.sub("_", event_type)[:64] or "_"


def tools(request: DecisionRequest) -> list[dict[str, Any]]:
    """One function per offered event type."""
    out = []
    for event_type in event_types(request):
        properties, required = _fields(request, event_type)
        out.append(
            {
                "type": "function",
                "function": {
                    "name": tool_name(event_type),
                    "description": f"Answer {event_type}.",
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": required,
                        "additionalProperties": False,
                    },
                },
            }
        )
    return out


def answer_schema(request: DecisionRequest) -> dict[str, Any]:
    """`{"answer": <one of the options>}`: the root is an object, as every structured-output API wants."""
    options = []
    for event_type in event_types(request):
        properties, required = _fields(request, event_type)
        options.append(
            {
                "type": "object",
                "properties": {"type": {"const": event_type}, **properties},
                "required": ["type", *required],
                "additionalProperties": False,
            }
        )
    return {
        "type": "object",
        "properties": {"answer": {"oneOf": options}},
        "required": ["answer"],
        "additionalProperties": False,
    }


def messages(request: DecisionRequest, mode: str) -> list[dict[str, str]]:
    """The conversation: instructions, the decision, and each refused answer with its reason."""
    system = SYSTEM_PROMPT
    if mode == "json_object":
        system += (
            ' Reply with one JSON object {"answer": <one option>} that matches this JSON Schema:\n'
            + json.dumps(answer_schema(request), sort_keys=True)
        )
    elif mode == "json_schema":
        system += ' Reply with one JSON object: {"answer": <one option>}.'
    else:
        system += " Answer by calling the function of the option you choose."
    parts = [f"Decision: {request.name}"]
    if request.prompt:
        parts.append(str(request.prompt))
    parts.append("Facts:\n" + json.dumps(request.facts, indent=1, sort_keys=True, ensure_ascii=False))
    parts.append(
        "Options (answer exactly one):\n" + json.dumps(request.options, indent=1, ensure_ascii=False)
    )
    conversation = [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]
    for attempt in request.attempts:
        conversation.append({"role": "assistant", "content": json.dumps(attempt.event, ensure_ascii=False)})
        conversation.append({"role": "user", "content": f"Refused: {attempt.reason}\nAnswer again."})
    return conversation


def chat_body(request: DecisionRequest, mode: str, spec: ModelSpec) -> dict[str, Any]:
    """The chat completions request for one decision."""
    body: dict[str, Any] = {
        "model": spec.model,
        "messages": messages(request, mode),
        "temperature": spec.temperature,
    }
    if spec.seed is not None:
        body["seed"] = spec.seed
    if spec.max_output_tokens is not None:
        body["max_tokens"] = spec.max_output_tokens
    if mode == "tools":
        body["tools"] = tools(request)
        body["tool_choice"] = "required"
    elif mode == "json_schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": answer_schema(request), "strict": False},
        }
    else:
        body["response_format"] = {"type": "json_object", "schema": answer_schema(request)}
    return body


JUDGE_PROMPT = (
    "You answer one question about a case an agent is deciding, from the facts given, with one JSON "
    "object and nothing else."
)


def judge_body(
    name: str, judgment: ModelJudgment, request: DecisionRequest, mode: str, spec: ModelSpec
) -> dict[str, Any]:
    """The chat completions request that asks a judgment's question about a decision's facts."""
    schema = judgment.schema()
    system = JUDGE_PROMPT
    if mode == "json_object":
        system += " It must match this JSON Schema:\n" + json.dumps(schema, sort_keys=True)
    user = f"Question ({name}): {judgment.question}\n\nFacts:\n" + json.dumps(
        request.facts, indent=1, sort_keys=True, ensure_ascii=False
    )
    body: dict[str, Any] = {
        "model": spec.model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "temperature": spec.temperature,
    }
    if spec.seed is not None:
        body["seed"] = spec.seed
    if spec.max_output_tokens is not None:
        body["max_tokens"] = spec.max_output_tokens
    body["response_format"] = (
        {"type": "json_schema", "json_schema": {"name": "judgment", "schema": schema, "strict": False}}
        if mode == "json_schema"
        else {"type": "json_object", "schema": schema}
    )
    return body


# --- the answer ----------------------------------------------------------------------------------------


def _json_object(content: Any) -> dict[str, Any] | None:
    """The JSON object in a reply's content (a Markdown fence tolerated), or None."""
    if not isinstance(content, str):
        return None
    fenced = _FENCE.match(content)
    try:
        data = json.loads(fenced.group("body") if fenced else content)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def parse_answer(response: dict[str, Any], request: DecisionRequest) -> dict[str, Any] | None:
    """The event a response answers, or None: JSON only, never evaluated."""
    by_tool = {tool_name(t): t for t in event_types(request)}
    for call in response.get("tool_calls") or []:
        event_type = by_tool.get(str(call.get("name")), str(call.get("name")))
        try:
            arguments = json.loads(call.get("arguments") or "{}")
        except json.JSONDecodeError:
            return None
        return {**arguments, "type": event_type} if isinstance(arguments, dict) else None
    data = _json_object(response.get("content"))
    if data is not None and isinstance(data.get("answer"), dict):
        data = data["answer"]
    return data if data is not None and isinstance(data.get("type"), str) else None


def refused(mode: str, response: dict[str, Any]) -> str:
    rejected = response["rejected"]
    said = " ".join(str(rejected.get("message") or "").split())  # one line: some servers send a traceback
    message = (said[:160] + "...") if len(said) > 160 else said or "with no message"
    return f"the endpoint refused {mode} (HTTP {rejected.get('status')}: {message})"


def unanswered(mode: str, response: dict[str, Any]) -> str | None:
    """Why the endpoint did not answer the way it was asked (it refused it, or ignored it), or None.
    Ignored is told by what comes back: no tool call to a request whose tool_choice is required; an
    answer that is not JSON to a request for a JSON schema (a server that applies the schema returns
    JSON whatever the model)."""
    if "rejected" in response:
        return refused(mode, response)
    if mode == "tools" and not response.get("tool_calls"):
        return "the endpoint ignored tools (HTTP 200 without a tool call)"
    if mode == "json_schema" and _json_object(response.get("content")) is None:
        return "the endpoint ignored the JSON schema (HTTP 200, the answer is not a JSON object)"
    return None


# --- the model -----------------------------------------------------------------------------------------


class ChatSession:
    """One model of a command: its endpoint, the way of asking it takes, its concurrency cap, the cache
    and the meter; shared by every run, each of which gets its own `ChatModel`. `memory`: the ways the
    workspace remembers its endpoints to answer (`improve.llm.asks`), where an `auto` model starts."""

    def __init__(
        self,
        name: str,
        spec: ModelSpec,
        cache: ResponseCache,
        meter: Meter | None = None,
        http_client: httpx.Client | None = None,
        gate: AbstractContextManager[Any] | None = None,
        memory: AskMemory | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.cache = cache
        self.meter = meter if meter is not None else Meter()
        self.endpoint = Endpoint(
            base_url=spec.endpoint(),
            api_key=spec.api_key(),
            timeout=spec.timeout_s,
            max_retries=spec.max_retries,
            error=ModelCallError,
            no_key=f"model {name!r} has no API key: set {spec.api_key_env} (any non-empty value for a "
            "local endpoint that needs none), or replay recorded calls (--cache replay). No run that "
            "needed a call was recorded",
            http_client=http_client,
            no_key_error=MissingKeyError,
        )
        self.meter.watch(lambda: self.endpoint.retries)
        self.auto = spec.ask == "auto"
        """Whether the way of asking is learned from the endpoint (else the model's `ask` is kept)."""
        # A configured `ask` wins over the memory. A replay asks no endpoint, and its recordings say how
        # each call was asked: starting from a remembered way would miss the ones asked an earlier way.
        self.memory = memory if self.auto and cache.mode != "replay" else None
        self.key = ask_key(spec.endpoint(), spec.model)
        """What the memory keeps this model's ways under: its endpoint and its name there."""
        self.decide = Ways(self, "decide", MODES[0] if spec.ask == "auto" else spec.ask)
        self.judge = Ways(self, "judge", "json_object" if spec.ask == "json_object" else "json_schema")
        """Judgments ask for JSON only: `json_schema`, or `json_object` once the endpoint refused it."""
        # The meter's set: sessions of one meter (and the workers it absorbs) report one set.
        self.fingerprints: set[str] = self.meter.fingerprints
        # Each call holds the gate while in flight: this process's cap, or (a worker of a cluster) one
        # shared by every worker, so the model sees `concurrency` calls at most either way.
        self._gate: AbstractContextManager[Any] = (
            gate if gate is not None else threading.BoundedSemaphore(spec.in_flight())
        )

    @property
    def mode(self) -> str:
        """The way decisions are asked now."""
        return self.decide.mode

    @property
    def judge_mode(self) -> str:
        """The way judgments are asked now."""
        return self.judge.mode

    def model(self, seed: str) -> ChatModel:
        return ChatModel(self, seed)

    def send(
        self, body: dict[str, Any], rejectable: Sequence[str], turn: Turn | None = None
    ) -> dict[str, Any]:
        """`body`'s response from the endpoint, sent once a place under the concurrency cap is free.
        `turn`: what the session learns from the call, decided while the place is held (see `Turn`)."""
        with self._gate:
            if turn is not None:
                if turn.stale():
                    raise Relearned
                turn.ways.announce(turn.mode)
            try:
                response = self.endpoint.complete(body, rejectable)
            except ModelCallError:
                self.meter.fail()
                raise
            if turn is not None:
                turn.heard(response)
            return response


class Ways:
    """How one kind of a session's calls (decisions, judgments) is asked: the way it asks now and, in
    `auto`, what it learns from the endpoint. A way the endpoint refuses or ignores moves every later call
    to the next way; the way a live call is answered by is remembered (the session's `memory`), and the
    next session starts from it. A remembered way found refused or ignored is forgotten and the ways are
    tried again from the first: the *generation* moves on, and what calls asked before it teach nothing
    (calls in flight asked the remembered way too)."""

    def __init__(self, session: ChatSession, kind: Kind, start: str) -> None:
        self.session = session
        self.kind: Kind = kind
        self.ways = WAYS[kind]
        memory = session.memory
        self.remembered = memory.recall(session.key, kind) if memory is not None else None
        """The way the memory named, while no call has found it wanting."""
        self.now: tuple[str, int] = (self.remembered or start, 0)
        """The way asked now and its generation, read and replaced together."""
        self._kept = self.remembered
        """The way the memory holds, as far as this session knows: one answer is enough to write it."""
        self._lock = threading.Lock()

    @property
    def mode(self) -> str:
        return self.now[0]

    def stale(self, mode: str, generation: int) -> bool:
        """Whether a call about to ask `mode` (in `generation`) should not: the session asks past it now,
        or tries the ways again from the first."""
        now, current = self.now
        return current != generation or self.ways.index(now) > self.ways.index(mode)

    def announce(self, mode: str) -> None:
        """A call is about to ask the remembered way: said once a command (kept in each meter's notes)."""
        session = self.session
        if mode != self.remembered or session.memory is None:
            return
        judged = " judgments" if self.kind == "judge" else ""
        session.meter.note(
            f"{session.name}: asking{judged} by {mode}, the way this endpoint answered before (remembered in "
            f'{ASKS_FILE}: delete it to find the way again, or set ask = "{mode}" in its [models.NAME])',
            loud=session.memory.first(f"{session.key} {self.kind}"),
        )

    def fallback(self, mode: str, why: str, generation: int, *, live: bool = True) -> str:
        """`mode` was refused or ignored (`why`): the way to ask next, which later calls ask too (said
        once). It may be one the caller asked already (no way is left): the caller stops then."""
        session = self.session
        with self._lock:
            now, current = self.now
            if current != generation:
                return now  # asked before the ways were tried again: it teaches nothing now
            if mode == self.remembered:
                self.remembered = self._kept = None
                self.now = (self.ways[0], current + 1)
                following, again = self.ways[0], True
            elif mode == self.ways[-1]:
                return now
            else:
                following, again = self.ways[self.ways.index(mode) + 1], False
                if self.ways.index(now) <= self.ways.index(mode):
                    self.now = (following, current)
        if again:
            # Only what the endpoint says now unsettles the memory, never a recording of it.
            if live and session.memory is not None:
                session.memory.forget(session.key, self.kind)
            session.meter.note(
                f"{session.name}: {why}; the way remembered for this endpoint no longer answers: asking by "
                f"{following} again"
            )
        elif self.kind == "judge":
            session.meter.note(f"{session.name}: {why}; asking judgments by {following}")
        else:
            session.meter.note(f"{session.name}: {why}; asking by {following}")
        return following

    def heard(self, mode: str, generation: int, response: dict[str, Any]) -> None:
        """A live call asked `mode`: learn the next way when it was refused or ignored, and remember it
        when it was answered (an error raises before this: a failing endpoint teaches nothing)."""
        why = unanswered(mode, response)
        if why is not None:
            self.fallback(mode, why, generation)
            return
        session = self.session
        with self._lock:
            if self.now[1] != generation or self._kept == mode:
                return
            self._kept = mode
        if session.auto and self.kind != "judge" and mode != self.ways[0]:
            # Said once the way answers, not when it is only the next to try (it may be refused too). The
            # workspace remembers it; a model defined with it skips the search.
            session.meter.note(
                f'{session.name}: the endpoint answers by {mode} (ask = "{mode}" in its [models.NAME] asks '
                "so from the first call)"
            )
        if session.memory is not None:
            session.memory.keep(session.key, self.kind, mode)


@dataclass(frozen=True)
class Turn:
    """A call's way of asking, checked and learned from while the call holds its place under the cap. A
    local server answers one call at a time: runs that start together would otherwise each spend a whole
    call (a long ignored answer) finding out what the first one already did. So a call whose way the
    session learned to be refused or ignored while it waited is not sent (`stale`), and what a call's
    response teaches is learned before the next call takes the place (`heard`)."""

    ways: Ways
    mode: str
    generation: int

    def stale(self) -> bool:
        return self.ways.stale(self.mode, self.generation)

    def heard(self, response: dict[str, Any]) -> None:
        self.ways.heard(self.mode, self.generation, response)


class Relearned(Exception):
    """A call that waited for its turn was not sent: meanwhile the session learned that its way of asking
    is refused or ignored. Internal to this module: the caller asks again the way now learned."""


class ChatModel:
    """The model for one run: every call is a new sample (`seed#n`), answered live or from the cache."""

    def __init__(self, session: ChatSession, seed: str) -> None:
        self.session = session
        self.name = session.name
        self.seed = seed
        self.calls = 0

    def answer(self, request: DecisionRequest) -> ModelReply:
        session = self.session
        response, source, mode, why = self._asked(
            lambda m: chat_body(request, m, session.spec), session.decide
        )
        if "rejected" in response:
            raise ModelCallError(f"model {self.name!r}: {why or refused(mode, response)}")
        return self._reply(response, parse_answer(response, request), source)

    def judge(self, name: str, judgment: ModelJudgment, request: DecisionRequest) -> ModelReply:
        """The judgment's answer about the decision's facts, checked against its closed fields; an answer
        that is not one is a failed call (the policy's `onError`)."""
        session = self.session
        response, source, mode, _ = self._asked(
            lambda m: judge_body(name, judgment, request, m, session.spec), session.judge
        )
        if "rejected" in response:
            raise ModelCallError(f"model {self.name!r}: the judgment {name}: {refused(mode, response)}")
        reply = self._reply(response, _json_object(response.get("content")), source)
        problem = judgment.check(reply.event)
        if problem is not None:
            raise ModelAnswerError(f"model {self.name!r} answered the judgment {name} wrongly: {problem}")
        return reply

    def _asked(
        self, body: Callable[[str], dict[str, Any]], ways: Ways
    ) -> tuple[dict[str, Any], Literal["live", "recorded", "repeated"], str, str | None]:
        """One call, asked the way `ways` asks now and, while the endpoint refuses or ignores it, the next
        (which `ways` learns for the session): the response, where it came from, the way that got it, and
        why the last way was not answered either (None when it was). The call ends when the next way is
        one it asked already."""
        session = self.session
        sample = self._sample()
        mode, generation = ways.now
        tried: list[str] = []
        while True:
            mode = self._way(body, ways, mode, tried, sample)
            turn = Turn(ways, mode, generation) if session.auto else None
            try:
                response, source = self._fetch(
                    body(mode), sample, REJECTABLE[mode] if session.auto else (), turn
                )
            except Relearned:
                mode, generation = ways.now
                continue
            why = unanswered(mode, response) if session.auto else None
            if why is None:
                return response, source, mode, None
            tried.append(mode)
            # From the cache, the endpoint was not asked now: said so (with it stopped, the note read as
            # if it had answered).
            live = source == "live"
            following = ways.fallback(mode, why if live else f"{why}, as recorded", generation, live=live)
            if following in tried:
                return response, source, mode, why
            if live:
                session.meter.reask()
            mode, generation = following, ways.now[1]

    def advance(self, request: DecisionRequest, number: int) -> None:
        """The run's call `number` was answered from a recording of the run this one started from
        (replay-first): later samples are numbered after it, so no recorded sample answers twice."""
        self.calls = max(self.calls, number)

    def _sample(self) -> str:
        """This run's next sample: a call's identity in the cache, with its request."""
        self.calls += 1
        return f"{self.seed}#{self.calls}"

    def _way(
        self, body: Callable[[str], dict[str, Any]], ways: Ways, mode: str, tried: Sequence[str], sample: str
    ) -> str:
        """The way to ask `sample` now, from `mode` on. Runs in flight together learn a fallback in
        another order than when the calls were recorded, so a recorded sample is asked the next way it
        was recorded (one this call has not asked); any other, the later of `mode` and the way the
        session asks now (another run may have learned one since)."""
        cache = self.session.cache
        order = ways.ways
        if cache.mode != "live":
            for way in order[order.index(mode) :]:
                if (
                    way not in tried
                    and cache.load(cache.key({"request": body(way), "sample": sample})) is not None
                ):
                    return way
        current = ways.mode
        return current if self.session.auto and order.index(current) > order.index(mode) else mode

    def _fetch(
        self, body: dict[str, Any], sample: str, rejectable: Sequence[str], turn: Turn | None
    ) -> tuple[dict[str, Any], Literal["live", "recorded", "repeated"]]:
        """The response to `body` as `sample`, and where it came from; `Relearned` when the call, once
        its turn came, was no longer worth sending (`turn`)."""
        session = self.session
        keyed = {"request": body, "sample": sample}
        response, live = session.cache.fetch(
            keyed, functools.partial(session.send, body, rejectable, turn), secrets=session.endpoint.secrets
        )
        if live:
            return response, "live"
        return response, "repeated" if session.cache.key(keyed) in session.cache.written else "recorded"

    def _reply(
        self,
        response: dict[str, Any],
        event: dict[str, Any] | None,
        source: Literal["live", "recorded", "repeated"],
    ) -> ModelReply:
        try:
            usage = usage_dict(response.get("usage") or {})
        except ValueError as problem:  # a recording edited, or made by an older version without the check
            raise ModelCallError(f"model {self.name!r}: the answer {source} holds {problem}") from None
        tokens_in, tokens_out = usage["prompt_tokens"], usage["completion_tokens"]
        if source == "live" and not tokens_in and not tokens_out:
            self.session.meter.note(
                f"{self.name}: the endpoint reports no token usage (missing or zero); its tokens and cost count as 0"
            )
        cost = self.session.spec.cost(tokens_in, tokens_out)
        self.session.meter.add(source=source, input_tokens=tokens_in, output_tokens=tokens_out, usd=cost)
        fingerprint = response.get("system_fingerprint")
        if fingerprint:
            self.session.fingerprints.add(str(fingerprint))
        return ModelReply(
            event=event,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cost_usd=cost,
            recorded=source != "live",
            fingerprint=str(fingerprint) if fingerprint else None,
        )
