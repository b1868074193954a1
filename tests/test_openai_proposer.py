"""The openai proposer against a fake OpenAI-compatible server on 127.0.0.1 (no network), its cache
(live / record / replay), the json_schema -> json_object fallback, and a recorded fixture.

Re-record the fixture under tests/fixtures/openai/ after a change to the prompt or the policy schema:
`IMPROVE_RECORD_OPENAI_FIXTURES=1 .venv/bin/pytest tests/test_openai_proposer.py -k fixture`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from improve.errors import ProposerEndpointError
from improve.llm import ResponseCache, request_key
from improve.loop.gates import GateContext, GateResult, run_gates
from improve.loop.proposers import Proposal, ProposalError, ProposalRequest
from improve.loop.proposers.openai import (
    OpenAIProposer,
    estimated_tokens,
    json_object_format,
    json_schema_format,
    propose_messages,
    response_schema,
)
from improve.machine import parse_machine
from improve.runtime import load_environment
from improve.runtime.policy import load_policy
from improve.runtime.vocabulary import DecisionWords, Vocabulary, vocabulary
from tests.helpers import REPO

from .fake_openai import MODEL, FakeEndpoint, Reply, Script, completion

FIXTURES = REPO / "tests" / "fixtures" / "openai"
SECRET = "sk-test-0123456789-do-not-leak"

# --- a fake OpenAI-compatible endpoint (tests/fake_openai.py) ------------------------------------------


def reply_with(document: Any, rationale: str = "one branch") -> Reply:
    return completion(json.dumps({"policy": document, "rationale": rationale}))


def proposer(
    endpoint_url: str, cache: ResponseCache | None = None, api_key: str | None = None
) -> OpenAIProposer:
    return OpenAIProposer(
        MODEL,
        base_url=endpoint_url,
        api_key=api_key,
        cache=cache,
        timeout=5.0,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(trust_env=False),  # never a proxy from the environment
    )


# --- the request and two candidates ----------------------------------------------------------------------

V0 = json.loads((REPO / "policies" / "refunds" / "v0.json").read_text())


def candidate(guard: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(V0))
    doc["version"] = "1"
    doc["initial"] = "route"
    doc["states"]["route"] = {
        "type": "choice",
        "choice": [{"guard": guard, "target": "escalate"}, {"target": "ask_model"}],
    }
    return doc


INVALID = candidate("facts.customer.vip")  # not a fact path: the vocabulary gate refuses it
VALID = candidate("facts.customer.refundsLast90d >= 3")
DETAIL = (
    "names outside the vocabulary:\n"
    "- $.states.route.choice[0].guard: unknown fact path 'facts.customer.vip'; facts are "
    "['facts.customer.refundsLast90d', \"facts.order.refundable\"] {braces} & <angles> — ünïcode"
)
FAILURE = GateResult("vocabulary", False, DETAIL)


def refunds_request() -> ProposalRequest:
    env = load_environment("refunds")
    return ProposalRequest(
        environment="refunds",
        goal=env.config.description,
        policy=load_policy(REPO / "policies" / "refunds" / "v0.json"),
        new_version="1",
        vocabulary=vocabulary(env),
        objective={"pass_rate": 0.7, "violations": 0, "model_calls_per_run": 1.0, "k": 3},
        diagnosis={
            "chosen": {
                "kind": "wrong-terminal",
                "key": "escalated->issued",
                "threads": ["train:v0:fraud-01:r1"],
            },
            "hypothesis": {
                "cause": "the decider pays customers with three or more recent refunds",
                "evidence": ["train:v0:fraud-01:r1", "train:v0:fraud-02:r2"],
                "change": "one choice branch that escalates when the facts show this case",
            },
        },
        examples=[
            {
                "facts": {"customer": {"refundsLast90d": 4}},
                "options": [{"type": "ESCALATE"}],
                "answered": {"type": "REFUND"},
                "expected": "escalated",
            }
        ],
    )


def cache_texts(directory: Path) -> list[str]:
    return [p.read_text(encoding="utf-8") for p in sorted(directory.glob("*.json"))]


# --- 1. propose, then repair with the gate's detail ------------------------------------------------------


def test_propose_then_repair_over_http(
    serve: Callable[[list[Reply]], FakeEndpoint], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # the default source of the key
    endpoint = serve([reply_with(INVALID, "escalate VIPs"), reply_with(VALID, "escalate repeat refunds")])
    cache = ResponseCache(tmp_path / "cache", "record", miss=ProposalError)
    prop = proposer(endpoint.url, cache)
    request = refunds_request()

    first = prop.propose(request)
    assert first == Proposal(document=INVALID, rationale="escalate VIPs", proposer="openai", calls=1)
    second = prop.repair(request, first, FAILURE)
    assert second == Proposal(document=VALID, rationale="escalate repeat refunds", proposer="openai", calls=1)
    assert len(endpoint.requests) == 2

    body = endpoint.requests[0]["body"]
    assert body["model"] == MODEL and body["temperature"] == 0
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "policy"
    schema = fmt["json_schema"]["schema"]
    assert schema == response_schema()
    assert {"id", "version", "initial", "states"} <= set(schema["properties"]["policy"]["properties"])
    assert schema["required"] == ["policy", "rationale"] and "StateConfig" in schema["$defs"]
    system, user = (m["content"] for m in body["messages"])
    assert "ONE smallest change" in system and "offered" in system
    assert request.goal in user
    assert json.dumps(request.vocabulary.to_json(), indent=1, sort_keys=True) in user
    assert "train:v0:fraud-02:r2" in user and "three or more recent refunds" in user
    assert '"refundsLast90d": 4' in user and '"pass_rate": 0.7' in user
    assert 'set `version` to "1"' in user and '"refunds-policy"' in user

    repair = endpoint.requests[1]["body"]
    assert repair["messages"][:2] == body["messages"]
    assistant, feedback = repair["messages"][2:]
    assert assistant["role"] == "assistant" and json.loads(assistant["content"])["policy"] == INVALID
    assert feedback["role"] == "user" and DETAIL in feedback["content"]
    assert "`vocabulary`" in feedback["content"]

    # The key travels only in the Authorization header: not in another header, a body, a file or a repr.
    for sent in endpoint.requests:
        assert sent["headers"]["authorization"] == f"Bearer {SECRET}"
        others = {k: v for k, v in sent["headers"].items() if k.lower() != "authorization"}
        assert SECRET not in json.dumps(others) and SECRET not in json.dumps(sent["body"])
    texts = cache_texts(tmp_path / "cache")
    # The two calls, and what the server said of its context window (nothing: the fake has no /props).
    assert len(texts) == 3 and not any(SECRET in t for t in texts)
    assert SECRET not in repr(prop) and SECRET not in repr(first) + repr(second)


def test_the_scripted_candidates_are_what_the_gates_say() -> None:
    """The invalid candidate fails the vocabulary gate (its detail is what a repair carries)."""
    ctx = GateContext(load_environment("refunds"))
    failed = run_gates(INVALID, ctx)[-1]
    assert failed.name == "vocabulary" and not failed.ok and "facts.customer.vip" in failed.detail
    assert all(r.ok for r in run_gates(VALID, ctx))


# --- 2. record, replay, miss -----------------------------------------------------------------------------


def test_record_then_replay_without_the_endpoint(
    serve: Callable[[list[Reply]], FakeEndpoint], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = serve([reply_with(INVALID), reply_with(VALID)])
    directory = tmp_path / "cache"
    request = refunds_request()
    recorder = proposer(endpoint.url, ResponseCache(directory, "record", miss=ProposalError), api_key=SECRET)
    first = recorder.propose(request)
    second = recorder.repair(request, first, FAILURE)

    files = [
        p for p in sorted(directory.glob("*.json")) if "messages" in json.loads(p.read_text())["request"]
    ]
    assert len(files) == 2
    for path in files:
        entry = json.loads(path.read_text())
        assert path.stem == entry["key"] == request_key(entry["request"])
        assert set(entry["request"]) == {"model", "messages", "response_format", "temperature"}
        assert entry["response"]["usage"] == {
            "prompt_tokens": 321,
            "completion_tokens": 54,
            "total_tokens": 375,
        }
        assert json.loads(entry["response"]["content"])["policy"] in (INVALID, VALID)
        assert SECRET not in path.read_text() and endpoint.url not in path.read_text()

    url = endpoint.url
    endpoint.stop()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # replay needs no key
    replayer = proposer(url, ResponseCache(directory, "replay", miss=ProposalError))
    again = replayer.propose(request)
    assert again == Proposal(document=first.document, rationale=first.rationale, proposer="openai", calls=0)
    repaired = replayer.repair(request, again, FAILURE)
    assert (repaired.document, repaired.rationale, repaired.calls) == (second.document, second.rationale, 0)
    assert len(endpoint.requests) == 2

    other = dataclasses.replace(request, new_version="2")
    key = request_key(
        {
            "model": MODEL,
            "messages": propose_messages(other),
            "response_format": json_schema_format(),
            "temperature": 0.0,
        }
    )
    with pytest.raises(ProposalError, match=f"no recorded response for request {key}.*record it first"):
        replayer.propose(other)


def test_live_mode_stores_nothing_and_needs_a_key(
    serve: Callable[[list[Reply]], FakeEndpoint], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = serve([reply_with(VALID), reply_with(VALID)])
    live = proposer(
        endpoint.url, ResponseCache(tmp_path / "cache", "live", miss=ProposalError), api_key=SECRET
    )
    assert live.propose(refunds_request()).calls == 1
    assert live.propose(refunds_request()).calls == 1  # live never reads a cache
    assert not (tmp_path / "cache").exists()

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProposerEndpointError, match="OPENAI_API_KEY"):
        proposer(endpoint.url).propose(refunds_request())
    assert len(endpoint.requests) == 2
    with pytest.raises(ValueError, match="needs a directory"):
        ResponseCache(None, "replay", miss=ProposalError)


# --- 3. the json_schema -> json_object fallback ----------------------------------------------------------


def no_json_schema(body: dict[str, Any]) -> Reply:
    if body["response_format"]["type"] == "json_schema":
        return Reply(
            400,
            {
                "error": {
                    "message": "response_format type 'json_schema' is not supported by this server",
                    "type": "invalid_request_error",
                    "param": "response_format",
                }
            },
        )
    return reply_with(VALID, "fallback")


def test_json_schema_rejection_falls_back_to_json_object(
    serve: Callable[[Script], FakeEndpoint], tmp_path: Path
) -> None:
    endpoint = serve(no_json_schema)
    directory = tmp_path / "cache"
    prop = proposer(endpoint.url, ResponseCache(directory, "record", miss=ProposalError), api_key=SECRET)
    request = refunds_request()
    first = prop.propose(request)
    assert (first.document, first.rationale, first.calls) == (VALID, "fallback", 2)
    kinds = [r["body"]["response_format"] for r in endpoint.requests]
    assert kinds[0]["type"] == "json_schema" and kinds[1] == {
        "type": "json_object",
        "schema": response_schema(),
    }
    system = endpoint.requests[1]["body"]["messages"][0]["content"]
    assert "matches this JSON Schema" in system and json.dumps(response_schema(), sort_keys=True) in system

    # Once rejected, json_object straight away.
    assert prop.repair(request, first, FAILURE).calls == 1
    assert [r["body"]["response_format"]["type"] for r in endpoint.requests[2:]] == ["json_object"]

    # The rejection is recorded too: a fresh replay takes the same path without a call.
    rejected = [json.loads(t) for t in cache_texts(directory) if '"rejected"' in t]
    assert len(rejected) == 1 and rejected[0]["response"]["rejected"]["status"] == 400
    endpoint.stop()
    replay = proposer(endpoint.url, ResponseCache(directory, "replay", miss=ProposalError))
    again = replay.propose(request)
    assert (again.document, again.calls) == (VALID, 0) and not replay.json_schema_supported


def test_other_endpoint_errors_do_not_fall_back_and_never_show_the_key(
    serve: Callable[[list[Reply]], FakeEndpoint],
) -> None:
    endpoint = serve(
        [
            Reply(
                400,
                {"error": {"message": "maximum context length exceeded", "type": "invalid_request_error"}},
            ),
            Reply(401, {"error": {"message": f"Incorrect API key provided: {SECRET}", "type": "auth"}}),
        ]
    )
    prop = proposer(endpoint.url, api_key=SECRET)
    # The endpoint failed, not the model's proposal: no proposal was made (the round stops, exit 3).
    with pytest.raises(ProposerEndpointError, match=r"HTTP 400: .*maximum context length"):
        prop.propose(refunds_request())
    with pytest.raises(ProposerEndpointError, match="HTTP 401") as err:
        prop.propose(refunds_request())
    assert SECRET not in str(err.value) and "[redacted]" in str(err.value)
    assert [r["body"]["response_format"]["type"] for r in endpoint.requests] == ["json_schema"] * 2


# --- 4. a recorded fixture -------------------------------------------------------------------------------


def fixture_request(spec: dict[str, Any]) -> ProposalRequest:
    raw = spec["request"]
    words = raw["vocabulary"]
    vocab = Vocabulary(
        environment=words["environment"],
        decisions=[DecisionWords(**d) for d in words["decisions"]],
        guards=words["guards"],
        judgments=words["judgments"],
        models=words["models"],
    )
    return ProposalRequest(
        environment=raw["environment"],
        goal=raw["goal"],
        policy=parse_machine(raw["policy"], source="fixture"),
        new_version=raw["new_version"],
        vocabulary=vocab,
        objective=raw["objective"],
        diagnosis=raw["diagnosis"],
        examples=raw["examples"],
    )


def record_fixture(spec: dict[str, Any], directory: Path) -> None:
    """Re-record the fixture's cache with the fake endpoint answering its scripted replies."""
    shutil.rmtree(directory, ignore_errors=True)
    endpoint = FakeEndpoint([completion(json.dumps(r)) for r in spec["replies"]])
    try:
        prop = OpenAIProposer(
            spec["model"],
            base_url=endpoint.url,
            api_key=SECRET,
            cache=ResponseCache(directory, "record", miss=ProposalError),
            max_retries=0,
            http_client=openai.DefaultHttpxClient(trust_env=False),
        )
        request = fixture_request(spec)
        failure = GateResult(**spec["failure"])
        prop.repair(request, prop.propose(request), failure)
    finally:
        endpoint.stop()


def test_recorded_fixture_replays() -> None:
    spec = json.loads((FIXTURES / "request.json").read_text(encoding="utf-8"))
    directory = FIXTURES / "cache"
    if os.environ.get("IMPROVE_RECORD_OPENAI_FIXTURES") == "1":
        record_fixture(spec, directory)
    request = fixture_request(spec)
    prop = OpenAIProposer(
        spec["model"], cache=ResponseCache(directory, "replay", miss=ProposalError), api_key=None
    )
    try:
        first = prop.propose(request)
        second = prop.repair(request, first, GateResult(**spec["failure"]))
    except ProposalError as err:
        pytest.fail(
            f"{err}\nThe prompt or the policy schema changed: re-record with "
            "IMPROVE_RECORD_OPENAI_FIXTURES=1 .venv/bin/pytest tests/test_openai_proposer.py -k fixture"
        )
    assert [first.document, second.document] == [r["policy"] for r in spec["replies"]]
    assert [first.rationale, second.rationale] == [r["rationale"] for r in spec["replies"]]
    assert first.calls == second.calls == 0
    assert not any(SECRET in t for t in cache_texts(directory))


def test_declared_units_are_in_the_vocabulary_the_proposer_reads() -> None:
    """Money declared in dollars: the vocabulary types the facts as numbers and says their unit, so a
    proposer knows which two it may compare; a vocabulary without units says nothing of them (the
    recorded fixture's prompt is unchanged)."""
    env = load_environment("refunds")
    types = dict(env.fact_types["chooseResolution"])
    assert "units" not in json.dumps(vocabulary(env).to_json())
    types.update({"requested": "number:usd", "order.refundable": "number:usd"})
    words = vocabulary(dataclasses.replace(env, fact_types={"chooseResolution": types}))
    assert words.fact_units == {"facts.requested": "usd", "facts.order.refundable": "usd"}
    assert words.fact_paths["facts.requested"] == words.fact_paths["facts.order.refundable"] == "number"
    request = dataclasses.replace(refunds_request(), vocabulary=words)
    prompt = propose_messages(request, False, 5)[-1]["content"]
    assert '"units": {' in prompt and '"facts.requested": "usd"' in prompt
    # The units a machine shows (tool-loop's guards compare its counters with their limits) are there
    # too, undeclared.
    shown = vocabulary(load_environment("tool-loop")).fact_units
    assert shown["facts.turn.used"] == shown["facts.turn.max"] != shown["facts.tokens.used"], shown


# --- 5. replies that are not a candidate -----------------------------------------------------------------


def test_unparsable_content_is_a_proposal_error(serve: Callable[[list[Reply]], FakeEndpoint]) -> None:
    endpoint = serve(
        [
            completion('Sure! Here is the policy: {"policy": {states: ...'),
            completion('Sure! Here is the policy again: {"policy": {states: ...'),
            completion(""),
            completion('{"policy": {"id": "p"', finish_reason="length"),
            completion('{"policy": {"id": "p"', finish_reason="length"),
            completion("```json\n" + json.dumps({"policy": VALID, "rationale": "fenced"}) + "\n```"),
            completion(json.dumps({"policy": VALID, "rationale": "<what changed and why>"})),
            completion("{policy: VALID}"),
            completion(json.dumps({"policy": VALID, "rationale": "second try"})),
        ]
    )
    prop = proposer(endpoint.url, api_key=SECRET)
    # A reply that does not parse is asked once more, with what is wrong with it; then it is an error.
    with pytest.raises(
        ProposalError, match=r"not valid JSON \(line 1, column 1.*'Sure! Here is the policy again"
    ) as raised:
        prop.propose(refunds_request())
    assert raised.value.calls == 2  # spent, though no proposal came of them: a round counts them
    assert "its second reply: the first was not valid JSON either" in str(raised.value)
    told = endpoint.requests[1]["body"]["messages"]
    assert told[-2] == {"role": "assistant", "content": 'Sure! Here is the policy: {"policy": {states: ...'}
    assert "That reply is not valid JSON (line 1, column 1: Expecting value)" in told[-1]["content"]
    with pytest.raises(ProposalError, match="returned no content"):
        prop.propose(refunds_request())
    with pytest.raises(ProposalError, match=r"finish_reason 'length'.*not valid JSON"):
        prop.propose(refunds_request())
    fenced = prop.propose(refunds_request())
    assert (fenced.document, fenced.rationale) == (VALID, "fenced")
    # SmolLM2 echoed the prompt's placeholder as its rationale: recorded as none, not as a rationale.
    echoed = prop.propose(refunds_request())
    assert (echoed.document, echoed.rationale) == (VALID, "")
    # Asked once more, a small model gave JSON: the proposal counts both calls.
    again = prop.propose(refunds_request())
    assert (again.document, again.rationale, again.calls) == (VALID, "second try", 2)


def test_response_formats_are_plain_json() -> None:
    # json_object carries the schema too: llama.cpp's server and llama-cpp-python constrain the reply with it.
    assert json_object_format() == {"type": "json_object", "schema": response_schema()}
    fmt = json_schema_format()
    assert fmt["json_schema"]["strict"] is False
    text = json.dumps(fmt)
    assert '"title"' not in text and '"default"' not in text and "$schema" not in text


# --- 5. a small model's context ----------------------------------------------------------------------------


def test_a_request_too_long_for_the_models_context_is_trimmed_to_fit_and_says_what_it_left_out(
    serve: Callable[[Script], FakeEndpoint], tmp_path: Path
) -> None:
    """A server like llama-cpp-python: no word of its context until a request is too long, then 400
    `context_length_exceeded` with the size. The proposer fits the request to it and asks again; the
    reply's room (`max_tokens`) is kept; what was left out is in the proposal's notes."""
    # Twenty long examples: whole, the request is too long for the window; with five it fits (and the
    # repair, which carries the candidate and the gate's detail too, with fewer).
    example = {**refunds_request().examples[0], "ticket": "I want my money back. " * 27}
    request = dataclasses.replace(refunds_request(), examples=[example] * 20)
    window = estimated_tokens(propose_messages(request, False, 5)) * 4 // 3 + 4
    assert estimated_tokens(propose_messages(request, False, 20)) > window

    def small_model(body: dict[str, Any]) -> Reply:
        tokens = estimated_tokens(body["messages"])
        if tokens + int(body.get("max_tokens") or 0) > window:
            message = (
                f"This model's maximum context length is {window} tokens. However, you requested "
                f"{tokens} tokens ({tokens} in the messages, 0 in the completion)."
            )
            return Reply(
                400,
                {
                    "error": {
                        "message": message,
                        "type": "invalid_request_error",
                        "code": "context_length_exceeded",
                    }
                },
            )
        return reply_with(VALID, "fits")

    endpoint = serve(small_model)
    prop = proposer(
        endpoint.url, ResponseCache(tmp_path / "cache", "record", miss=ProposalError), api_key=SECRET
    )
    first = prop.propose(request)
    assert (first.document, first.rationale) == (VALID, "fits")
    assert len(endpoint.requests) == 2 and "max_tokens" not in endpoint.requests[0]["body"]
    fitted = endpoint.requests[1]["body"]
    assert fitted["max_tokens"] == max(512, window // 4)  # a quarter of the window kept for the reply
    assert len(json.dumps(fitted["messages"])) < len(json.dumps(endpoint.requests[0]["body"]["messages"]))
    (note,) = first.notes
    assert f"trimmed to fit {MODEL}'s context of {window} tokens" in note
    assert "training examples beyond the first 5" in note
    # Learned once: the repair is fitted from the start, with no second refusal.
    prop.repair(request, first, FAILURE)
    assert len(endpoint.requests) == 3
    # A context too small for even the smallest request says how large it would have to be.
    tiny = proposer(endpoint.url, api_key=SECRET)
    tiny.context_tokens, tiny._asked_window = 600, True
    with pytest.raises(ProposalError, match=r"give the model a context of at least [\d,]+ tokens"):
        tiny.propose(request)


def test_a_round_whose_proposer_endpoint_fails_stops_with_exit_3_and_spends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens where the proposer is asked: no proposal was made, so the round is no discarded
    candidate (exit 1, which CI reads as "nothing better this time"): it stops with exit 3, and neither
    a CHANGELOG entry, a version nor the cluster is spent."""
    from typer.testing import CliRunner

    from improve.cli.main import app
    from tests.helpers import copy_workspace

    ws = copy_workspace(tmp_path / "ws")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with socket.socket() as held:  # a port nothing listens at, held so no one else takes it
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}/v1"
        args = [
            "round",
            "-w",
            str(ws),
            "--policy",
            "v0",
            "--k",
            "1",
            "--proposer",
            "openai",
            "--base-url",
            url,
            "--proposer-model",
            "local",
        ]
        result = CliRunner().invoke(app, [*args, "--cache", "live"])
        # Nor is a reply the recording does not hold (`--cache replay` before `--cache record`): it was
        # a discarded candidate, and its cluster counted as tried, so the next rounds found nothing left.
        unrecorded = CliRunner().invoke(app, [*args, "--cache", "replay"])
    assert result.exit_code == 3, result.output
    assert "could not reach the endpoint" in result.stderr
    assert unrecorded.exit_code == 3, unrecorded.output
    assert "no recorded response for request" in unrecorded.stderr
    changelog = (ws / "policies" / "refunds" / "CHANGELOG.md").read_text()
    assert "(discarded)" not in changelog
    assert not (ws / ".improve" / "discarded" / "refunds.jsonl").exists()
    # Without a model, or a key, the round is refused before anything runs (exit 2).
    monkeypatch.delenv("OPENAI_API_KEY")
    for missing in (args[:-2], args):
        refused = CliRunner().invoke(app, missing)
        assert refused.exit_code == 2 and "baseline:" not in refused.output, refused.output


def test_the_proposers_timeout_is_the_models_when_the_workspace_sets_it(tmp_path: Path) -> None:
    """A policy takes longer to write than a decision: the proposer waits at least 120 s, unless
    `[models.NAME] timeout_s` says otherwise (a hung endpoint then costs what the workspace chose)."""
    from improve.llm import ModelSpec
    from improve.loop.proposers.base import ProposerSetup
    from improve.loop.proposers.registry import openai_proposer
    from improve.runtime import load_environment

    env = load_environment("refunds")
    setup = ProposerSetup(env, [], tmp_path, model="local", base_url="http://127.0.0.1:9/v1", cache="live")
    made = {}
    for given in ({}, {"timeout_s": 5}):
        spec = ModelSpec.model_validate(
            {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", **given}
        )
        made[bool(given)] = openai_proposer(dataclasses.replace(setup, model_spec=spec))
    assert made[False].endpoint.timeout == 120.0 and made[True].endpoint.timeout == 5
