"""The one walk over a machine config: every expression once, with its position and a JSON path that
resolves in the document as written."""

from __future__ import annotations

from typing import Any

from improve.machine import Constant, expressions, literals, parse_machine

DOC: dict[str, Any] = {
    "id": "w",
    "version": "1",
    "initial": "route",
    "context": {"n": "input.n", "odd key": ["1", 2]},
    "states": {
        "route": {
            "type": "choice",
            "choice": [{"guard": "context.n > 3", "target": "ask-model"}, {"target": "decide"}],
        },
        "ask-model": {
            "invoke": {
                "src": "model.decide",
                "input": {"model": "'decider'"},
                "onDone": {"target": "done", "guard": "event.output.type == 'CLOSE'"},
                "onError": [{"target": "done", "assign": {"n": "context.n + 1"}}],
            }
        },
        "decide": {
            "invoke": {
                "src": "agent.decide",
                "input": {"name": "'pick'", "allowedEvents": ["GO"], "facts": {"n": "context.n"}},
                "onError": "done",
            },
            "on": {"GO": {"target": "done", "guard": "true"}},
        },
        "done": {"type": "final", "output": {"outcome": "'done'", "amount": 12.5}},
    },
}


def test_every_expression_once_with_its_path_and_position() -> None:
    found = [(e.path, e.position, e.state, e.source) for e in expressions(parse_machine(DOC))]
    assert found == [
        ("$.context.n", "context", None, "input.n"),
        ("$.context['odd key'][0]", "context", None, "1"),
        ("$.states.route.choice[0].guard", "guard", "route", "context.n > 3"),
        (
            "$.states['ask-model'].invoke.onDone.guard",
            "guard",
            "ask-model",
            "event.output.type == 'CLOSE'",
        ),
        ("$.states['ask-model'].invoke.onError[0].assign.n", "assign", "ask-model", "context.n + 1"),
        ("$.states['ask-model'].invoke.input.model", "invoke-input", "ask-model", "'decider'"),
        ("$.states.decide.on.GO.guard", "guard", "decide", "true"),
        # allowedEvents are event names, not CEL: never walked.
        ("$.states.decide.invoke.input.name", "decision-input", "decide", "'pick'"),
        ("$.states.decide.invoke.input.facts.n", "decision-input", "decide", "context.n"),
        ("$.states.done.output.outcome", "output", "done", "'done'"),
    ]


def test_literals_are_the_quoted_strings_and_numbers_inside_expressions() -> None:
    assert list(literals(parse_machine(DOC))) == [
        Constant("$.context['odd key'][0]", 1.0),
        Constant("$.states.route.choice[0].guard", 3.0),
        Constant("$.states['ask-model'].invoke.onDone.guard", "CLOSE"),
        Constant("$.states['ask-model'].invoke.onError[0].assign.n", 1.0),
        Constant("$.states['ask-model'].invoke.input.model", "decider"),
        Constant("$.states.decide.invoke.input.name", "pick"),
        Constant("$.states.done.output.outcome", "done"),
    ]
