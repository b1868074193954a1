"""The decider on a model behind an OpenAI-compatible endpoint: what the adapter costs per decision,
against a bare HTTP post of the same request to the same server, and how runs waiting on a slow model
overlap (the refund desk's v0 policy through `run_suite` at concurrency 1, 8 and 32).

The server is `tests/fake_openai.py`'s, answering like the desk's naive model, in a process of its own
(its Python work does not share the GIL with the runs being measured) on 127.0.0.1. Every client is
made with `trust_env=False`: no proxy, no network beyond the loopback."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2 as httpx
import openai

from bench.corpus import REPO
from improve.evals import Scenario, load_scenarios
from improve.evals.suite import SuiteSpec, run_scenario, run_suite
from improve.llm import Meter, ModelSpec, ResponseCache
from improve.log import MemoryStore
from improve.machine import MachineConfig
from improve.runtime import (
    ChatSession,
    Decision,
    DecisionRequest,
    Environment,
    PolicyDecider,
    compile_policy,
    load_environment,
    load_policy,
)
from improve.runtime.chat import chat_body
from tests.fake_openai import FakeEndpoint, Reply, completion, tool_answer

KEY_ENV = "IMPROVE_BENCH_CHAT_KEY"
KEY = "bench-dummy-key"
MODEL = "bench-model"
SCENARIO = "small-refund-01"
"""The decision the overhead is measured on: the desk's first decision of this scenario."""
SLOW_SECONDS = 0.2
RUNS = 64
CONCURRENCIES = (1, 8, 32)
GOAL_SPEEDUP = 20.0


# --- the server (in its own process) -------------------------------------------------------------------


def _desk(delay: float, body: dict[str, Any]) -> Reply:
    """The desk's naive model as a server: refunds what is asked; refused, escalates."""
    text = body["messages"][1]["content"]
    facts = json.loads(text.split("Facts:\n", 1)[1].split("\n\nOptions (answer exactly one):\n", 1)[0])
    refused = any(m["role"] == "user" for m in body["messages"][2:])
    event = {"type": "ESCALATE"} if refused else {"type": "REFUND", "amount": facts["requested"]}
    reply = tool_answer(event) if "tools" in body else completion(json.dumps({"answer": event}))
    return dataclasses.replace(reply, delay=delay)


def serve(delay: float) -> None:
    """Serve the desk on a free port of 127.0.0.1, print its base URL, and stop when stdin closes."""
    server = FakeEndpoint(functools.partial(_desk, delay))
    print(server.url, flush=True)
    sys.stdin.read()
    server.stop()


@contextlib.contextmanager
def _endpoint(delay: float) -> Iterator[str]:
    """The base URL of a fake endpoint answering after `delay` seconds, served by a child process."""
    code = f"from bench.chat_bench import serve; serve({delay!r})"
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdin is not None and process.stdout is not None
        try:
            url = process.stdout.readline().strip()
            if not url.startswith("http://127.0.0.1:"):
                raise RuntimeError(f"the fake endpoint did not start (it printed {url!r})")
            yield url
        finally:
            process.stdin.close()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


@contextlib.contextmanager
def _dummy_key() -> Iterator[None]:
    """The key variable the specs name, set for the section only (the fake endpoint takes any key)."""
    before = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = KEY
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = before


def _spec(url: str, concurrency: int = max(CONCURRENCIES)) -> ModelSpec:
    # No retries: a failed call must not hide as a slower one.
    return ModelSpec(
        model=MODEL, base_url=url, api_key_env=KEY_ENV, timeout_s=30, max_retries=0, concurrency=concurrency
    )


def _session(spec: ModelSpec) -> ChatSession:
    """A session as `run_suite` makes one (the SDK's default HTTP client), but reading no proxy."""
    return ChatSession(
        "bench", spec, ResponseCache(None, "live"), Meter(), openai.DefaultHttpxClient(trust_env=False)
    )


# --- 1. the adapter's overhead per decision ------------------------------------------------------------


class _Capture:
    """A decider that keeps the requests it is asked, and answers with another."""

    def __init__(self, inner: PolicyDecider) -> None:
        self.inner = inner
        self.requests: list[DecisionRequest] = []

    def decide(self, request: DecisionRequest) -> Decision:
        self.requests.append(request)
        return self.inner.decide(request)


def _decision_request(env: Environment, scenario: Scenario, policy: MachineConfig) -> DecisionRequest:
    """The first decision request of a real run of the desk."""
    naive = env.models["naive"]("bench")
    capture = _Capture(
        PolicyDecider(
            compile_policy(policy, env.judgments, env.policy_guards), {"decider": naive}, env.judgments
        )
    )
    run_scenario(env, scenario, capture, MemoryStore(), "bench:chat:capture")
    return capture.requests[0]


def _per_call_us(call: Callable[[], object], n: int) -> float:
    """The median wall time of one of `n` calls, in microseconds."""
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def _overhead(request: DecisionRequest, calls: int, repeat: int) -> dict[str, Any]:
    with _endpoint(0.0) as url:
        spec = _spec(url)
        session = _session(spec)
        model = session.model("bench")
        body = chat_body(request, "tools", spec)
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(trust_env=False, timeout=30) as client:

            def adapter() -> object:
                return model.answer(request)

            def bare() -> dict[str, Any]:
                response = client.post(f"{url}/chat/completions", json=body, headers=headers)
                response.raise_for_status()
                answer: dict[str, Any] = response.json()
                return answer

            # Warm-up, and a check that both sides get the answer.
            for _ in range(max(20, calls // 10)):
                reply = model.answer(request)
                assert reply.event == {"type": "REFUND", "amount": request.facts["requested"]}, reply
                assert bare()["choices"][0]["message"]["tool_calls"]
            ours, floor = [], []
            for rep in range(repeat):
                # Side by side, the order alternating, so a drift of the machine hits both.
                if rep % 2:
                    floor.append(_per_call_us(bare, calls))
                    ours.append(_per_call_us(adapter, calls))
                else:
                    ours.append(_per_call_us(adapter, calls))
                    floor.append(_per_call_us(bare, calls))
        assert session.meter.failed == 0 and session.mode == "tools"
    ours_us, floor_us = statistics.median(ours), statistics.median(floor)
    return {
        "calls_per_repetition": calls,
        "repetitions": repeat,
        "request_bytes": len(json.dumps(body)),
        "adapter_us_per_call": round(ours_us),
        "bare_post_us_per_call": round(floor_us),
        "overhead_us_per_decision": round(ours_us - floor_us),
        "adapter_over_bare": round(ours_us / floor_us, 2),
        "note": "one refund-desk decision at concurrency 1 against a local server answering at once with "
        "a tool call: ChatModel.answer (request built, live cache key, openai SDK, answer parsed) vs a "
        "bare httpx2 post of the same chat_body and .json(); per-call medians, median of the repetitions",
    }


# --- 2. runs waiting on a slow model, overlapped -------------------------------------------------------


def _suite(
    env: Environment, scenarios: list[Scenario], policy: MachineConfig, url: str, concurrency: int
) -> dict[str, Any]:
    spec = _spec(url)
    session = _session(spec)
    suite = SuiteSpec(policy=policy, model="bench", k=1, model_spec=spec)
    start = time.perf_counter()
    rows = run_suite(env, scenarios, suite, MemoryStore(), concurrency=concurrency, models=session.model)
    seconds = time.perf_counter() - start
    assert session.meter.failed == 0, session.meter
    return {
        "seconds": seconds,
        "runs": len(rows),
        "calls": session.meter.live,
        "passed": sum(row.passed for row in rows),
    }


def _throughput(
    env: Environment, scenarios: list[Scenario], policy: MachineConfig, repeat: int
) -> dict[str, Any]:
    with _endpoint(SLOW_SECONDS) as url:
        _suite(env, scenarios[:8], policy, url, 8)  # warm-up: the client's pool, the imports
        results = {}
        for concurrency in CONCURRENCIES:
            # Concurrency 1 is long and steady: one pass; the short ones: the median of `repeat`.
            passes = [
                _suite(env, scenarios, policy, url, concurrency)
                for _ in range(1 if concurrency == 1 else repeat)
            ]
            results[concurrency] = sorted(passes, key=lambda r: r["seconds"])[len(passes) // 2]
    base = results[CONCURRENCIES[0]]
    assert all(r["calls"] == base["calls"] for r in results.values()), results  # the same work
    rate = {c: r["runs"] / r["seconds"] for c, r in results.items()}
    speedup = {c: rate[c] / rate[CONCURRENCIES[0]] for c in CONCURRENCIES}
    top = max(CONCURRENCIES)
    ideal = {c: math.ceil(base["calls"] / c) * SLOW_SECONDS for c in (1, *CONCURRENCIES)}
    return {
        "runs": base["runs"],
        "model_calls": base["calls"],
        "passed": base["passed"],
        "seconds": {str(c): round(r["seconds"], 2) for c, r in results.items()},
        "runs_per_s": {str(c): round(rate[c], 1) for c in CONCURRENCIES},
        "speedup_vs_concurrency_1": {str(c): round(speedup[c], 1) for c in CONCURRENCIES},
        # The least wall time: the calls, each 200 ms, packed c at a time.
        "ideal_seconds": {str(c): round(ideal[c], 2) for c in CONCURRENCIES},
        "ideal_speedup": {str(c): round(ideal[1] / ideal[c], 1) for c in CONCURRENCIES},
        "goal": f">= {GOAL_SPEEDUP:g}x at concurrency {top} against 1",
        "goal_met": speedup[top] >= GOAL_SPEEDUP,
        "note": f"run_suite of the refund desk's v0 policy, {base['runs']} runs (k=1), the decider a "
        f"ChatModel behind a local endpoint that waits {SLOW_SECONDS * 1000:g} ms per call "
        f"(ModelSpec.concurrency {top}); wall seconds per concurrency, the shorter ones the median of "
        "several passes; speedup in runs/s",
    }


def chat_figures(repeat: int, calls: int = 200) -> dict[str, Any]:
    env = load_environment("refunds")
    scenarios = load_scenarios(REPO / "scenarios" / "refunds.yaml").scenarios
    policy = load_policy(REPO / "policies" / "refunds" / "v0.json")
    scenario = next(s for s in scenarios if s.id == SCENARIO)
    with _dummy_key():
        overhead = _overhead(_decision_request(env, scenario, policy), calls, max(repeat, 3))
        throughput = _throughput(env, list(scenarios[:RUNS]), policy, max(repeat, 3))
    return {"adapter_overhead": overhead, "slow_model_200ms": throughput}
