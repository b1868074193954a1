"""lint(): the bundled documents are clean, and each code fires exactly where a small broken document is
broken (and not once it is fixed)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from improve.machine import parse_machine
from improve.machine.lint import Kind, Lint, has_errors, lint

REPO = Path(__file__).resolve().parents[1]
BUNDLED: list[tuple[str, Kind]] = [
    ("improve/examples/refunds/machine.json", "environment"),
    ("improve/examples/refund_approval/machine.json", "environment"),
    ("policies/refunds/v0.json", "policy"),
    ("policies/refund-approval/v0.json", "policy"),
]

DONE = {"type": "final", "output": {"outcome": "'done'"}}
OTHER = {"type": "final", "output": {"outcome": "'other'"}}
SENTINEL = {"type": "final", "description": "SENTINEL: must never happen", "output": {"outcome": "'bad'"}}
ANSWER = {"type": "final", "output": "event.output"}
ESCALATE = {"type": "final", "output": {"type": "'ESCALATE'"}}
ASK = {
    "invoke": {
        "src": "model.decide",
        "input": {"model": "'decider'"},
        "onDone": {"target": "answer"},
        "onError": {"target": "escalate"},
    }
}


def env(states: dict[str, Any], initial: str = "start", **extra: Any) -> dict[str, Any]:
    return {"id": "t", "version": "1", "initial": initial, "states": states, **extra}


def policy(states: dict[str, Any], initial: str = "ask") -> dict[str, Any]:
    return {"id": "p", "version": "1", "initial": initial, "states": states}


def decide(events: list[str], **input_: Any) -> dict[str, Any]:
    return {
        "src": "agent.decide",
        "input": {"name": "'pick'", "allowedEvents": events, **input_},
        "onError": {"target": "done"},
    }


def run(doc: dict[str, Any], kind: Kind) -> list[Lint]:
    return lint(parse_machine(doc), kind)


# --- the bundled documents --------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "kind"), BUNDLED, ids=[p for p, _ in BUNDLED])
def test_bundled_documents_lint_clean(path: str, kind: Kind) -> None:
    found = run(json.loads((REPO / path).read_text()), kind)
    for item in found:
        print(item)  # shown with -s: what a reviewer of this document would read
    assert not has_errors(found), [str(item) for item in found if item.severity == "error"]
    # No warnings either: every bundled final has an output and every invoke an onError.
    assert found == []


def test_an_environment_read_as_a_policy_is_not_a_policy() -> None:
    found = run(json.loads((REPO / BUNDLED[1][0]).read_text()), "policy")
    assert has_errors(found)
    codes = {item.code for item in found}
    assert {"decide-in-policy", "policy-on-event", "policy-output-not-event"} <= codes
    assert ("decide-in-policy", "$.states.classifying.invoke.src") in [(i.code, i.path) for i in found]
    # The agent.decide state's `on` is covered by decide-in-policy, not reported twice.
    assert ("policy-on-event", "$.states.classifying.on") not in [(i.code, i.path) for i in found]


# --- one broken document per code -------------------------------------------------------------------

CASES: list[Any] = [
    pytest.param(
        "unknown-initial",
        "environment",
        env({"start": DONE}, initial="begin"),
        env({"start": DONE}),
        ["$.initial"],
        "error",
        id="unknown-initial",
    ),
    pytest.param(
        "unknown-target",
        "environment",
        env(
            {
                "start": {"on": {"GO": [{"guard": "event.ok", "target": "done"}, {"target": "dne"}]}},
                "done": DONE,
            }
        ),
        env(
            {
                "start": {"on": {"GO": [{"guard": "event.ok", "target": "done"}, {"target": "done"}]}},
                "done": DONE,
            }
        ),
        ["$.states.start.on.GO[1]"],
        "error",
        id="unknown-target",
    ),
    pytest.param(
        "invalid-expression",
        "environment",
        env({"start": {"on": {"GO": {"target": "done", "guard": "event.amount >"}}}, "done": DONE}),
        env({"start": {"on": {"GO": {"target": "done", "guard": "event.amount > 0"}}}, "done": DONE}),
        ["$.states.start.on.GO.guard"],
        "error",
        id="invalid-expression-guard",
    ),
    pytest.param(
        "invalid-expression",
        "environment",
        env({"start": {"on": {"GO": "done"}}, "done": DONE}, context={"n": "inputs.n"}),
        env({"start": {"on": {"GO": "done"}}, "done": DONE}, context={"n": "input.n"}),
        ["$.context.n"],
        "error",
        id="invalid-expression-context",
    ),
    pytest.param(
        "invalid-expression",
        "policy",
        policy({"ask": ASK, "answer": ANSWER, "escalate": {"type": "final", "output": {"type": "ESCALATE"}}}),
        policy({"ask": ASK, "answer": ANSWER, "escalate": ESCALATE}),
        ["$.states.escalate.output.type"],
        "error",
        id="invalid-expression-unquoted-event",
    ),
    pytest.param(
        "invalid-expression",
        "environment",
        env(
            {
                "start": {
                    "invoke": decide(["GO"], facts={"a": {"b": ["context.x", "context."]}}),
                    "on": {"GO": "done"},
                },
                "done": DONE,
            }
        ),
        env(
            {
                "start": {
                    "invoke": decide(["GO"], facts={"a": {"b": ["context.x", "context.y"]}}),
                    "on": {"GO": "done"},
                },
                "done": DONE,
            }
        ),
        ["$.states.start.invoke.input.facts.a.b[1]"],
        "error",
        id="invalid-expression-decision-facts",
    ),
    pytest.param(
        "unreachable-state",
        "policy",
        policy(
            {
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
                "refuse": {"type": "final", "output": {"type": "'REFUSE'"}},
            }
        ),
        policy({"ask": ASK, "answer": ANSWER, "escalate": ESCALATE}),
        ["$.states.refuse"],
        "error",
        id="unreachable-state-policy",
    ),
    pytest.param(
        "unreachable-state",
        "environment",
        env({"start": {"on": {"GO": "done"}}, "done": DONE, "other": OTHER}),
        env({"start": {"on": {"GO": "done", "ALT": "other"}}, "done": DONE, "other": OTHER}),
        ["$.states.other"],
        "warning",
        id="unreachable-state-environment",
    ),
    pytest.param(
        "dead-end",
        "environment",
        env(
            {"start": {"on": {"GO": "wait", "STOP": "done"}}, "wait": {"description": "waits"}, "done": DONE}
        ),
        env({"start": {"on": {"GO": "wait", "STOP": "done"}}, "wait": {"on": {"GO": "done"}}, "done": DONE}),
        ["$.states.wait"],
        "error",
        id="dead-end-empty",
    ),
    pytest.param(
        "dead-end",
        "environment",
        env(
            {
                "start": {"on": {"GO": "wait", "STOP": "done"}},
                "wait": {"on": {"PING": {"assign": {"n": "1"}}}},
                "done": DONE,
            }
        ),
        env(
            {
                "start": {"on": {"GO": "wait", "STOP": "done"}},
                "wait": {"on": {"PING": {"target": "done", "assign": {"n": "1"}}}},
                "done": DONE,
            }
        ),
        ["$.states.wait"],
        "error",
        id="dead-end-targetless",
    ),
    pytest.param(
        "no-way-to-finish",
        "environment",
        env(
            {
                "start": {"on": {"GO": "a", "STOP": "done"}},
                "a": {"on": {"NEXT": "b"}},
                "b": {"on": {"NEXT": "a"}},
                "done": DONE,
            }
        ),
        env(
            {
                "start": {"on": {"GO": "a", "STOP": "done"}},
                "a": {"on": {"NEXT": "b"}},
                "b": {"on": {"NEXT": "a", "STOP": "done"}},
                "done": DONE,
            }
        ),
        ["$.states.a", "$.states.b"],
        "warning",
        id="no-way-to-finish-environment",
    ),
    pytest.param(
        "no-way-to-finish",
        "policy",
        policy(
            {
                "ask": {"invoke": {"src": "judge.a", "onDone": "again", "onError": "again"}},
                "again": {"invoke": {"src": "judge.b", "onDone": "ask", "onError": "ask"}},
            }
        ),
        policy(
            {
                "ask": {"invoke": {"src": "judge.a", "onDone": "again", "onError": "again"}},
                "again": {"invoke": {"src": "judge.b", "onDone": "ask", "onError": "answer"}},
                "answer": ANSWER,
            }
        ),
        ["$.states.again", "$.states.ask"],
        "error",
        id="no-way-to-finish-policy",
    ),
    pytest.param(
        "final-with-exit",
        "environment",
        env(
            {
                "start": {"on": {"GO": "done", "BAD": "bad"}},
                "done": DONE,
                "bad": SENTINEL | {"on": {"RETRY": "start"}},
            }
        ),
        env({"start": {"on": {"GO": "done", "BAD": "bad"}}, "done": DONE, "bad": SENTINEL}),
        ["$.states.bad.on"],
        "error",
        id="final-with-exit-sentinel",
    ),
    pytest.param(
        "final-without-output",
        "policy",
        policy({"ask": ASK, "answer": {"type": "final"}, "escalate": ESCALATE}),
        policy({"ask": ASK, "answer": ANSWER, "escalate": ESCALATE}),
        ["$.states.answer"],
        "error",
        id="final-without-output-policy",
    ),
    pytest.param(
        "final-without-output",
        "environment",
        env({"start": {"on": {"GO": "done"}}, "done": {"type": "final"}}),
        env({"start": {"on": {"GO": "done"}}, "done": DONE}),
        ["$.states.done"],
        "warning",
        id="final-without-output-environment",
    ),
    pytest.param(
        "invoke-without-on-done",
        "environment",
        env({"start": {"invoke": {"src": "tools.pay", "onError": "done"}}, "done": DONE}),
        env({"start": {"invoke": {"src": "tools.pay", "onDone": "done", "onError": "done"}}, "done": DONE}),
        ["$.states.start.invoke"],
        "error",
        id="invoke-without-on-done",
    ),
    pytest.param(
        "invoke-without-on-error",
        "policy",
        policy(
            {
                "ask": {
                    "invoke": {"src": "model.decide", "input": {"model": "'decider'"}, "onDone": "answer"}
                },
                "answer": ANSWER,
            }
        ),
        policy(
            {
                "ask": {
                    "invoke": {
                        "src": "model.decide",
                        "input": {"model": "'decider'"},
                        "onDone": "answer",
                        "onError": "answer",
                    }
                },
                "answer": ANSWER,
            }
        ),
        ["$.states.ask.invoke"],
        "error",
        id="invoke-without-on-error-policy",
    ),
    pytest.param(
        "invoke-without-on-error",
        "environment",
        env({"start": {"invoke": {"src": "tools.pay", "onDone": "done"}}, "done": DONE}),
        env({"start": {"invoke": {"src": "tools.pay", "onDone": "done", "onError": "done"}}, "done": DONE}),
        ["$.states.start.invoke"],
        "warning",
        id="invoke-without-on-error-environment",
    ),
    pytest.param(
        "decide-without-events",
        "environment",
        env({"start": {"invoke": decide([]), "on": {"GO": "done"}}, "done": DONE}),
        env({"start": {"invoke": decide(["GO"]), "on": {"GO": "done"}}, "done": DONE}),
        ["$.states.start.invoke.input.allowedEvents"],
        "error",
        id="decide-without-events-agent",
    ),
    pytest.param(
        "decide-without-events",
        "environment",
        env(
            {
                "start": {
                    "invoke": {"src": "agent.decide", "input": {"name": "'pick'"}, "onError": "done"},
                    "on": {"GO": "done"},
                },
                "done": DONE,
            }
        ),
        env({"start": {"invoke": decide(["GO"]), "on": {"GO": "done"}}, "done": DONE}),
        ["$.states.start.invoke.input"],
        "error",
        id="decide-without-events-missing",
    ),
    pytest.param(
        "decide-without-events",
        "policy",
        policy(
            {
                "ask": {
                    "invoke": {
                        "src": "model.decide",
                        "input": {"model": "'decider'"},
                        "onDone": {},
                        "onError": "escalate",
                    }
                },
                "escalate": ESCALATE,
            }
        ),
        policy(
            {
                "ask": {
                    "invoke": {
                        "src": "model.decide",
                        "input": {"model": "'decider'"},
                        "onDone": "answer",
                        "onError": "escalate",
                    }
                },
                "escalate": ESCALATE,
                "answer": ANSWER,
            }
        ),
        ["$.states.ask.invoke.onDone"],
        "error",
        id="decide-without-events-model-targetless",
    ),
    pytest.param(
        "decide-without-events",
        "policy",
        policy(
            {
                "ask": {
                    "invoke": {"src": "model.decide", "input": {"model": "'decider'"}, "onError": "escalate"}
                },
                "escalate": ESCALATE,
            }
        ),
        policy(
            {
                "ask": {
                    "invoke": {
                        "src": "model.decide",
                        "input": {"model": "'decider'"},
                        "onDone": "escalate",
                        "onError": "escalate",
                    }
                },
                "escalate": ESCALATE,
            }
        ),
        ["$.states.ask.invoke"],
        "error",
        id="decide-without-events-model-no-on-done",
    ),
    pytest.param(
        "decide-event-unhandled",
        "environment",
        env({"start": {"invoke": decide(["GO", "STOP"]), "on": {"GO": "done"}}, "done": DONE}),
        env(
            {"start": {"invoke": decide(["GO", "STOP"]), "on": {"GO": "done", "STOP": "done"}}, "done": DONE}
        ),
        ["$.states.start.invoke.input.allowedEvents[1]"],
        "error",
        id="decide-event-unhandled",
    ),
    pytest.param(
        "invalid-decide-input",
        "environment",
        env(
            {
                "start": {
                    "invoke": {"src": "agent.decide", "input": {"allowedEvents": ["GO"]}, "onError": "done"},
                    "on": {"GO": "done"},
                },
                "done": DONE,
            }
        ),
        env({"start": {"invoke": decide(["GO"]), "on": {"GO": "done"}}, "done": DONE}),
        ["$.states.start.invoke.input.name"],
        "error",
        id="invalid-decide-input-name",
    ),
    pytest.param(
        "invalid-decide-input",
        "environment",
        env(
            {
                "start": {
                    "invoke": decide(["GO"], payloads={"STOP": {"why": "'text'"}}),
                    "on": {"GO": "done"},
                },
                "done": DONE,
            }
        ),
        env(
            {
                "start": {"invoke": decide(["GO"], payloads={"GO": {"why": "'text'"}}), "on": {"GO": "done"}},
                "done": DONE,
            }
        ),
        ["$.states.start.invoke.input.payloads.STOP"],
        "error",
        id="invalid-decide-input-payloads",
    ),
    pytest.param(
        "choice-without-branches",
        "policy",
        policy(
            {
                "route": {"type": "choice", "always": "ask"},
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="route",
        ),
        policy(
            {
                "route": {"type": "choice", "choice": [{"target": "ask"}]},
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="route",
        ),
        ["$.states.route"],
        "error",
        id="choice-without-branches",
    ),
    pytest.param(
        "choice-without-branches",
        "policy",
        policy({"route": {"type": "choice"}}, initial="route"),
        policy(
            {"route": {"type": "choice", "choice": [{"target": "escalate"}]}, "escalate": ESCALATE},
            initial="route",
        ),
        ["$.states.route"],
        "error",
        id="choice-without-branches-no-exit",
    ),
    pytest.param(
        "choice-without-default",
        "policy",
        policy(
            {
                "route": {
                    "type": "choice",
                    "choice": [
                        {"guard": "facts.n >= 3", "target": "escalate"},
                        {"guard": "facts.n < 3", "target": "ask"},
                    ],
                },
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="route",
        ),
        policy(
            {
                "route": {
                    "type": "choice",
                    "choice": [{"guard": "facts.n >= 3", "target": "escalate"}, {"target": "ask"}],
                },
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="route",
        ),
        ["$.states.route.choice[1]"],
        "error",
        id="choice-without-default",
    ),
    pytest.param(
        "choice-with-other-exits",
        "policy",
        policy(
            {
                "route": {"type": "choice", "choice": [{"target": "ask"}], "always": "escalate"},
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="route",
        ),
        policy(
            {
                "route": {
                    "type": "choice",
                    "choice": [{"guard": "facts.n > 3", "target": "escalate"}, {"target": "ask"}],
                },
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="route",
        ),
        ["$.states.route.always"],
        "error",
        id="choice-with-other-exits-always",
    ),
    pytest.param(
        "choice-with-other-exits",
        "environment",
        env(
            {
                "start": {"type": "choice", "choice": [{"target": "done"}], "on": {"GO": "other"}},
                "done": DONE,
                "other": OTHER,
            }
        ),
        env(
            {
                "start": {
                    "type": "choice",
                    "choice": [{"guard": "input.go", "target": "wait"}, {"target": "done"}],
                },
                "wait": {"on": {"GO": "other"}},
                "done": DONE,
                "other": OTHER,
            }
        ),
        ["$.states.start.on"],
        "error",
        id="choice-with-other-exits-on",
    ),
    pytest.param(
        "shadowed-transition",
        "environment",
        env(
            {
                "start": {"on": {"GO": ["done", {"guard": "event.alt", "target": "other"}]}},
                "done": DONE,
                "other": OTHER,
            }
        ),
        env(
            {
                "start": {"on": {"GO": [{"guard": "event.alt", "target": "other"}, "done"]}},
                "done": DONE,
                "other": OTHER,
            }
        ),
        ["$.states.start.on.GO[1]"],
        "warning",
        id="shadowed-transition-on",
    ),
    pytest.param(
        "shadowed-transition",
        "policy",
        policy(
            {
                "route": {
                    "type": "choice",
                    "choice": [{"target": "ask"}, {"guard": "facts.n > 3", "target": "escalate"}],
                },
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="route",
        ),
        policy(
            {
                "route": {
                    "type": "choice",
                    "choice": [{"guard": "facts.n > 3", "target": "escalate"}, {"target": "ask"}],
                },
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="route",
        ),
        ["$.states.route.choice[1]"],
        "warning",
        id="shadowed-transition-choice",
    ),
    pytest.param(
        "self-loop-always",
        "environment",
        env({"start": {"always": "start", "on": {"GO": "done"}}, "done": DONE}),
        env({"start": {"on": {"GO": "done"}}, "done": DONE}),
        ["$.states.start.always"],
        "error",
        id="self-loop-always-unguarded",
    ),
    pytest.param(
        "self-loop-always",
        "environment",
        env(
            {"start": {"always": [{"guard": "context.n < 3", "target": "start"}, "done"]}, "done": DONE},
            context={"n": "0"},
        ),
        env(
            {
                "start": {
                    "always": [
                        {"guard": "context.n < 3", "target": "start", "assign": {"n": "context.n + 1"}},
                        "done",
                    ]
                },
                "done": DONE,
            },
            context={"n": "0"},
        ),
        ["$.states.start.always[0]"],
        "error",
        id="self-loop-always-guarded-without-assign",
    ),
    pytest.param(
        "always-cycle",
        "environment",
        env({"start": {"always": "back", "on": {"GO": "done"}}, "back": {"always": "start"}, "done": DONE}),
        env(
            {
                "start": {"always": "back", "on": {"GO": "done"}},
                "back": {"on": {"AGAIN": "start"}},
                "done": DONE,
            }
        ),
        ["$.states.start.always"],
        "error",
        id="always-cycle",
    ),
    pytest.param(
        "policy-on-event",
        "policy",
        policy(
            {"wait": {"on": {"GO": "ask"}}, "ask": ASK, "answer": ANSWER, "escalate": ESCALATE},
            initial="wait",
        ),
        policy(
            {
                "wait": {"type": "choice", "choice": [{"target": "ask"}]},
                "ask": ASK,
                "answer": ANSWER,
                "escalate": ESCALATE,
            },
            initial="wait",
        ),
        ["$.states.wait.on"],
        "error",
        id="policy-on-event",
    ),
    pytest.param(
        "decide-in-policy",
        "policy",
        policy(
            {
                "ask": {
                    "invoke": {
                        "src": "agent.decide",
                        "input": {"name": "'x'", "allowedEvents": ["A"]},
                        "onError": "escalate",
                    },
                    "on": {"A": "escalate"},
                },
                "escalate": ESCALATE,
            }
        ),
        policy(
            {
                "ask": {
                    "invoke": {
                        "src": "model.decide",
                        "input": {"model": "'decider'"},
                        "onDone": "escalate",
                        "onError": "escalate",
                    }
                },
                "escalate": ESCALATE,
            }
        ),
        ["$.states.ask.invoke.src"],
        "error",
        id="decide-in-policy",
    ),
    pytest.param(
        "policy-output-not-event",
        "policy",
        policy(
            {"ask": ASK, "answer": ANSWER, "escalate": {"type": "final", "output": {"event": "'ESCALATE'"}}}
        ),
        policy({"ask": ASK, "answer": ANSWER, "escalate": ESCALATE}),
        ["$.states.escalate.output"],
        "error",
        id="policy-output-not-event-no-type",
    ),
    pytest.param(
        "policy-output-not-event",
        "policy",
        policy({"ask": ASK, "answer": ANSWER, "escalate": {"type": "final", "output": "'ESCALATE'"}}),
        policy({"ask": ASK, "answer": ANSWER, "escalate": ESCALATE}),
        ["$.states.escalate.output"],
        "error",
        id="policy-output-not-event-string",
    ),
    pytest.param(
        "policy-output-not-event",
        "policy",
        policy({"ask": ASK, "answer": ANSWER, "escalate": {"type": "final", "output": {"type": 3}}}),
        policy({"ask": ASK, "answer": ANSWER, "escalate": ESCALATE}),
        ["$.states.escalate.output.type"],
        "error",
        id="policy-output-not-event-type",
    ),
    pytest.param(
        "policy-output-not-event",
        "policy",
        policy({"ask": ASK, "answer": ANSWER, "escalate": {"type": "final", "output": True}}),
        policy({"ask": ASK, "answer": ANSWER, "escalate": ESCALATE}),
        ["$.states.escalate.output"],
        "error",
        id="policy-output-not-event-literal",
    ),
]


@pytest.mark.parametrize(("code", "kind", "broken", "fixed", "paths", "severity"), CASES)
def test_each_code_fires_exactly_where_the_document_is_broken(
    code: str, kind: Kind, broken: dict[str, Any], fixed: dict[str, Any], paths: list[str], severity: str
) -> None:
    found = run(broken, kind)
    assert [(item.code, item.path) for item in found] == [(code, path) for path in paths], [
        str(i) for i in found
    ]
    assert {item.severity for item in found} == {severity}
    assert has_errors(found) == (severity == "error")
    assert run(fixed, kind) == [], [str(i) for i in run(fixed, kind)]


def test_every_documented_code_has_a_case() -> None:
    # The package face exports the function `lint`, which shadows the subpackage's name.
    module = importlib.import_module("improve.machine.lint")

    documented = {
        line.split()[0]
        for line in (module.__doc__ or "").split("Codes:")[1].splitlines()
        if line.startswith("    ") and not line.startswith("     ")
    }
    assert documented == {p.values[0] for p in CASES}


# --- messages, paths, order ------------------------------------------------------------------------


def test_messages_name_the_state_and_the_fix() -> None:
    broken = policy(
        {"ask": ASK, "answer": ANSWER, "escalate": {"type": "final", "output": {"type": "ESCALATE"}}}
    )
    (item,) = run(broken, "policy")
    assert "state 'escalate'" in item.message
    assert "output.type" in item.message
    assert "unknown variable 'ESCALATE'" in item.message
    assert "\"'ESCALATE'\"" in item.message  # the fix, ready to paste

    (dead,) = run(next(c for c in CASES if c.id == "dead-end-empty").values[2], "environment")
    assert dead.code == "dead-end"
    assert dead.message.startswith("State 'wait' is not final but has no way out")
    assert "Add a transition to another state" in dead.message


def test_sentinels_are_exempt_from_unreachable_and_output_warnings() -> None:
    sentinel = {"type": "final", "description": "SENTINEL: never paid twice"}
    assert (
        run(env({"start": {"on": {"GO": "done"}}, "done": DONE, "paidTwice": sentinel}), "environment") == []
    )
    # The same state without the SENTINEL: prefix is an ordinary (unreachable, outputless) final.
    plain = {"type": "final", "description": "paid twice"}
    found = run(env({"start": {"on": {"GO": "done"}}, "done": DONE, "paidTwice": plain}), "environment")
    assert [(i.code, i.path) for i in found] == [
        ("final-without-output", "$.states.paidTwice"),
        ("unreachable-state", "$.states.paidTwice"),
    ]


def test_paths_bracket_keys_that_are_not_identifiers() -> None:
    found = run(
        policy({"ask-model": ASK, "answer": ANSWER, "escalate": ESCALATE}, initial="ask-model"), "policy"
    )
    assert found == []
    broken = policy(
        {"ask-model": {"invoke": {"src": "model.decide", "onDone": "answer"}}, "answer": ANSWER},
        initial="ask-model",
    )
    (item,) = run(broken, "policy")
    assert (item.code, item.path) == ("invoke-without-on-error", "$.states['ask-model'].invoke")
    assert "State 'ask-model'" in item.message


def test_results_are_ordered_by_path_naturally() -> None:
    events = [f"E{i}" for i in range(12)]
    broken = env(
        {"start": {"invoke": decide(events), "on": {"E0": "done"}}, "done": DONE, "zz": {"type": "final"}}
    )
    found = run(broken, "environment")
    paths = [item.path for item in found]
    assert paths[:11] == [f"$.states.start.invoke.input.allowedEvents[{i}]" for i in range(1, 12)]
    assert paths[11:] == ["$.states.zz", "$.states.zz"]
    assert [i.code for i in found[11:]] == ["final-without-output", "unreachable-state"]


def test_lint_is_frozen_and_serialises() -> None:
    item = Lint("dead-end", "error", "$.states.wait", "State 'wait' ...")
    assert item.to_json() == {
        "code": "dead-end",
        "severity": "error",
        "path": "$.states.wait",
        "message": "State 'wait' ...",
    }
    assert json.loads(json.dumps(item.to_json()))["path"] == "$.states.wait"
    assert str(item) == "error dead-end at $.states.wait: State 'wait' ..."
    with pytest.raises(AttributeError):
        item.code = "other"  # type: ignore[misc]
    assert not has_errors([Lint("shadowed-transition", "warning", "$", "m")])
    assert has_errors([Lint("shadowed-transition", "warning", "$", "m"), item])
    assert not has_errors([])


def test_a_literal_true_guard_counts_as_no_guard() -> None:
    always_true = env(
        {
            "start": {"on": {"GO": [{"guard": " true ", "target": "done"}, "other"]}},
            "done": DONE,
            "other": OTHER,
        }
    )
    assert [(i.code, i.path) for i in run(always_true, "environment")] == [
        ("shadowed-transition", "$.states.start.on.GO[1]")
    ]
    default = policy(
        {
            "route": {
                "type": "choice",
                "choice": [
                    {"guard": "facts.n > 3", "target": "escalate"},
                    {"guard": "true", "target": "escalate"},
                ],
            },
            "escalate": ESCALATE,
        },
        initial="route",
    )
    assert run(default, "policy") == []
