"""The interpreter, table-driven: each row is a machine, an input, events, and where it must end."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from improve.errors import (
    EvaluationError,
    ExpressionError,
    MachineConfigError,
    MachineError,
    UnknownNameError,
)
from improve.machine import (
    can,
    compile_expr,
    compile_machine,
    fold_of,
    initial,
    json_lines,
    line_of,
    loads_document,
    parse_json_path,
    parse_machine,
    transition,
)
from improve.machine.snapshot import (
    Invocation,
    Snapshot,
    canonical_bytes,
    canonical_json,
    decoded_canonical_bytes,
    snapshot_of,
)
from tests.helpers import fold_against_interpreter

EXAMPLES = Path(__file__).resolve().parents[1] / "improve" / "examples"


def approval_machine() -> Any:
    return compile_machine(
        parse_machine(json.loads((EXAMPLES / "refund_approval" / "machine.json").read_text()))
    )


CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], str, str, dict[str, Any] | None]] = [
    # (name, input, events, final value, status, output)
    (
        "small issue",
        {"amount": 40, "reason": "broken"},
        [{"type": "ISSUE"}],
        "issued",
        "done",
        {"outcome": "issued", "amount": 40, "approved": False},
    ),
    (
        "large issue is refused by the guard",
        {"amount": 150, "reason": "broken"},
        [{"type": "ISSUE"}],
        "classifying",
        "active",
        None,
    ),
    (
        "escalate then approve",
        {"amount": 150, "reason": "x"},
        [{"type": "ESCALATE"}, {"type": "APPROVE", "approver": "dana"}],
        "issued",
        "done",
        {"outcome": "issued", "amount": 150, "approved": True},
    ),
    (
        "escalate then reject",
        {"amount": 150, "reason": "x"},
        [{"type": "ESCALATE"}, {"type": "REJECT", "reason": "no"}],
        "rejected",
        "done",
        {"outcome": "rejected", "amount": 150, "approved": False},
    ),
    (
        "refuse with reasoning",
        {"amount": 10, "reason": "x"},
        [{"type": "REFUSE", "reasoning": "dup"}],
        "refused",
        "done",
        {"outcome": "refused", "amount": 10, "approved": False},
    ),
    (
        "unknown event is ignored",
        {"amount": 10, "reason": "x"},
        [{"type": "NOPE"}],
        "classifying",
        "active",
        None,
    ),
    (
        "decision exhausted takes onError",
        {"amount": 10, "reason": "x"},
        [{"type": "xstate.error.actor", "actorId": "classifying", "error": {"kind": "decision-exhausted"}}],
        "refused",
        "done",
        {"outcome": "refused", "amount": 10, "approved": False},
    ),
    (
        "events after done are ignored",
        {"amount": 10, "reason": "x"},
        [{"type": "ISSUE"}, {"type": "ESCALATE"}],
        "issued",
        "done",
        {"outcome": "issued", "amount": 10, "approved": False},
    ),
    (
        "boundary 100 is issuable",
        {"amount": 100, "reason": "x"},
        [{"type": "ISSUE"}],
        "issued",
        "done",
        {"outcome": "issued", "amount": 100, "approved": False},
    ),
]


@pytest.mark.parametrize(
    ("name", "inp", "events", "value", "status", "output"), CASES, ids=[c[0] for c in CASES]
)
def test_refund_approval_table(
    name: str, inp: dict[str, Any], events: list[dict[str, Any]], value: str, status: str, output: Any
) -> None:
    machine = approval_machine()
    snap = initial(machine, inp)
    for event in events:
        snap = transition(machine, snap, event)
    assert snap.value == value
    assert snap.status == status
    assert snap.output == output


def test_initial_stops_at_decision_with_evaluated_input() -> None:
    snap = initial(approval_machine(), {"amount": 150, "reason": "broken"})
    assert snap.invoke is not None
    assert snap.invoke.src == "agent.decide"
    assert snap.invoke.input["name"] == "classify"
    assert snap.invoke.input["facts"] == {"amount": 150, "reason": "broken"}
    assert snap.invoke.input["payloads"] == {"REFUSE": {"reasoning": "text"}}


def test_can_matches_guards() -> None:
    machine = approval_machine()
    big = initial(machine, {"amount": 101, "reason": "x"})
    small = initial(machine, {"amount": 99, "reason": "x"})
    assert not can(machine, big, {"type": "ISSUE"})
    assert can(machine, small, {"type": "ISSUE"})
    assert can(machine, big, {"type": "ESCALATE"})
    assert not can(machine, big, {"type": "APPROVE"})


def test_sentinel_reached_when_guard_loosened() -> None:
    config = json.loads((EXAMPLES / "refund_approval" / "machine.json").read_text())
    config["states"]["classifying"]["on"]["ISSUE"]["guard"] = "true"
    machine = compile_machine(parse_machine(config))
    snap = transition(machine, initial(machine, {"amount": 500, "reason": "x"}), {"type": "ISSUE"})
    assert snap.value == "illegallyIssued"
    assert machine.config.states["illegallyIssued"].is_sentinel


def test_a_sentinel_is_a_final_state_tagged_sentinel_or_described_the_old_way() -> None:
    def states(**extra: Any) -> dict[str, Any]:
        return {"id": "m", "version": "1", "initial": "a", "states": {"a": {"on": {"GO": "b"}}, "b": extra}}

    assert parse_machine(states(type="final", tags=["sentinel"])).sentinels() == ["b"]
    assert parse_machine(states(type="final", description="SENTINEL: never")).sentinels() == ["b"]
    assert parse_machine(states(type="final", tags=["done"])).sentinels() == []
    with pytest.raises(MachineConfigError, match=r"\$\.states\.b\.tags: .*must be final"):
        parse_machine(states(tags=["sentinel"]))
    # A near miss would leave the state an ordinary final one, proven and counted as nothing.
    for typo in ("sentinal", "Sentinel", "sentinels"):
        with pytest.raises(
            MachineConfigError, match=rf'\$\.states\.b\.tags: .*tag "{typo}" is not "sentinel"'
        ):
            parse_machine(states(type="final", tags=[typo]))
    assert parse_machine(states(type="final", tags=["terminal", "sent"])).sentinels() == []


def test_snapshot_json_round_trip_and_hash_is_canonical() -> None:
    machine = approval_machine()
    snap = transition(machine, initial(machine, {"amount": 150, "reason": "x"}), {"type": "ESCALATE"})
    again = Snapshot.from_json(json.loads(canonical_json(snap.to_json())))
    assert again == snap
    assert again.hash() == snap.hash()
    other = transition(machine, snap, {"type": "APPROVE", "approver": "kim"})
    assert other.hash() != snap.hash()


def test_a_snapshot_built_field_by_field_is_the_dataclass_s_own() -> None:
    """`snapshot_of` (the fold's and the interpreter's constructor, which skips the frozen dataclass's
    `__init__`) sets every field in the dataclass's order, and what it builds is equal, hashes alike and
    stays frozen."""
    import dataclasses

    assert tuple(f.name for f in dataclasses.fields(Snapshot)) == (
        "value",
        "context",
        "status",
        "input",
        "output",
        "error",
        "invoke",
    )
    invoke = Invocation("a", "agent.decide", {"n": 1})
    values = ("s", {"k": [1]}, "done", {"in": 2}, {"out": 3}, {"kind": "x"}, invoke)
    built = snapshot_of(*values)
    assert built == Snapshot(*values)
    assert tuple(getattr(built, f.name) for f in dataclasses.fields(Snapshot)) == values
    assert built.hash() == Snapshot(*values).hash()
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.value = "t"  # type: ignore[misc]


def test_an_owed_actor_s_input_is_evaluated_in_the_scope_of_its_step() -> None:
    """The input of the actor a snapshot owes is evaluated on first read, in the scope it was entered with
    (built then, not when the snapshot was), by the interpreter and by the fold alike."""
    machine = approval_machine()
    snap = initial(machine, {"amount": 150, "reason": "x"})
    fold = fold_of(machine)
    folded = fold.snapshot(fold.start({"amount": 150, "reason": "x"}))
    assert snap.invoke is not None and folded.invoke is not None
    assert folded.invoke.input == snap.invoke.input


def _tiny(states: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": "t", "version": "1", "initial": next(iter(states)), "states": states, **extra}


def test_choice_state_picks_first_matching_branch() -> None:
    config = _tiny(
        {
            "route": {
                "type": "choice",
                "choice": [
                    {"guard": "input.n > 10", "target": "big"},
                    {"guard": "input.n > 5", "target": "medium"},
                    {"target": "small"},
                ],
            },
            "big": {"type": "final", "output": "'big'"},
            "medium": {"type": "final", "output": "'medium'"},
            "small": {"type": "final", "output": "'small'"},
        }
    )
    machine = compile_machine(parse_machine(config))
    assert [initial(machine, {"n": n}).output for n in (20, 7, 1)] == ["big", "medium", "small"]


def test_choice_without_match_is_an_error() -> None:
    config = _tiny(
        {
            "route": {"type": "choice", "choice": [{"guard": "false", "target": "end"}]},
            "end": {"type": "final"},
        }
    )
    with pytest.raises(MachineError, match="no choice branch matched"):
        initial(compile_machine(parse_machine(config)), {})


def test_eventless_loop_is_reported() -> None:
    config = _tiny({"a": {"always": {"target": "b"}}, "b": {"always": {"target": "a"}}})
    with pytest.raises(MachineError, match="did not settle"):
        initial(compile_machine(parse_machine(config)), {})


def test_assign_sees_the_context_before_the_step() -> None:
    config = _tiny(
        {"s": {"on": {"GO": {"target": "s", "assign": {"a": "context.b", "b": "context.a"}}}}},
        context={"a": "1", "b": "2"},
    )
    machine = compile_machine(parse_machine(config))
    snap = transition(machine, initial(machine, {}), {"type": "GO"})
    assert snap.context == {"a": 2, "b": 1}


def test_actor_done_and_error_routes() -> None:
    config = _tiny(
        {
            "work": {
                "invoke": {
                    "src": "tool",
                    "onDone": [{"guard": "event.output.ok", "target": "good"}, "bad"],
                    "onError": "broken",
                }
            },
            "good": {"type": "final"},
            "bad": {"type": "final"},
            "broken": {"type": "final"},
        }
    )
    machine = compile_machine(parse_machine(config), actors={"tool"})
    start = initial(machine, {})
    assert start.invoke is not None and start.invoke.id == "work"
    done = {"type": "xstate.done.actor", "actorId": "work"}
    assert transition(machine, start, {**done, "output": {"ok": True}}).value == "good"
    assert transition(machine, start, {**done, "output": {"ok": False}}).value == "bad"
    assert transition(machine, start, {"type": "xstate.error.actor", "actorId": "work"}).value == "broken"
    # A completion for another actor is not this state's business.
    assert transition(machine, start, {**done, "actorId": "other", "output": {"ok": True}}) is start


def test_error_without_on_error_sets_error_status() -> None:
    config = _tiny({"work": {"invoke": {"src": "tool", "onDone": "end"}}, "end": {"type": "final"}})
    machine = compile_machine(parse_machine(config), actors={"tool"})
    snap = transition(machine, initial(machine, {}), {"type": "xstate.error.actor", "error": {"code": "x"}})
    assert snap.status == "error"
    assert snap.error == {"code": "x"}


def test_named_guard_is_called_with_context_event_and_params() -> None:
    seen: list[Any] = []

    def over(context: Any, event: Any, params: Any) -> bool:
        seen.append((dict(context), event["type"], dict(params)))
        return bool(context["n"] > params["limit"])

    config = _tiny(
        {
            "s": {"on": {"GO": [{"guard": {"type": "over", "params": {"limit": 3}}, "target": "hi"}, "lo"]}},
            "hi": {"type": "final"},
            "lo": {"type": "final"},
        },
        context={"n": "input.n"},
    )
    machine = compile_machine(parse_machine(config), guards={"over": over})
    assert transition(machine, initial(machine, {"n": 5}), {"type": "GO"}).value == "hi"
    assert transition(machine, initial(machine, {"n": 1}), {"type": "GO"}).value == "lo"
    assert seen[0] == ({"n": 5}, "GO", {"limit": 3})


# --- errors name the place ---------------------------------------------------------------------------


def test_bad_target_lists_valid_targets() -> None:
    config = _tiny({"a": {"on": {"GO": "nowhere"}}, "b": {"type": "final"}})
    with pytest.raises(
        MachineConfigError,
        match=r"state 'a'.on.GO\[0\]: target 'nowhere' does not exist; "
        r"valid targets are \['a', 'b'\]",
    ):
        compile_machine(parse_machine(config))


def test_cel_syntax_error_names_state_transition_and_column() -> None:
    config = _tiny({"a": {"on": {"GO": {"target": "b", "guard": "context.x >"}}}, "b": {"type": "final"}})
    with pytest.raises(ExpressionError, match=r"state 'a'.on.GO\[0\].guard: CEL syntax error at column 12"):
        compile_machine(parse_machine(config))


def test_unknown_named_guard_lists_registered_ones() -> None:
    config = _tiny({"a": {"on": {"GO": {"target": "b", "guard": {"type": "nope"}}}}, "b": {"type": "final"}})
    with pytest.raises(
        UnknownNameError, match=r"named guard 'nope' is not registered; registered guards are \['yes'\]"
    ):
        compile_machine(parse_machine(config), guards={"yes": lambda c, e, p: True})


def test_unknown_actor_lists_registered_ones() -> None:
    config = _tiny({"a": {"invoke": {"src": "ghost", "onDone": "b"}}, "b": {"type": "final"}})
    with pytest.raises(
        UnknownNameError, match=r"actor 'ghost' is not registered; registered actors are \['tool'\]"
    ):
        compile_machine(parse_machine(config), actors={"tool"})


def test_config_errors_carry_json_paths() -> None:
    with pytest.raises(MachineConfigError) as info:
        parse_machine({"id": "t", "version": 1, "initial": "a", "states": {"a": {"type": "weird"}}})
    message = str(info.value)
    assert "$.version" in message
    assert "$.states.a.type" in message


def test_config_errors_carry_the_line_of_their_json_path_given_the_text() -> None:
    text = '{"id": "t",\n "version": 1,\n "initial": "a",\n "states": {\n  "a": {"type": "weird"}}}'
    with pytest.raises(MachineConfigError) as info:
        parse_machine(json.loads(text), source="m.json", text=text)
    assert str(info.value).splitlines() == [
        'm.json:2: $.version: Value error, version must be a string, e.g. "1"',
        "m.json:5: $.states.a.type: Input should be 'atomic', 'final' or 'choice'",
    ]


def test_a_key_of_unicode_digits_is_located_as_a_key() -> None:
    # '²' is a digit to str.isdigit and no int: the validate gate crashed on a policy with such a key.
    from improve.machine.locate import json_lines, line_of

    lines = json_lines('{"a": {"²": 1}}')
    assert line_of(lines, ["a", "²"]) == 1 and line_of(lines, ["a", "²", "x"]) == 1


def test_a_union_field_s_error_is_said_once_where_the_value_has_it() -> None:
    """A transition is a target, an object or a list of them: a misspelt key in one was said three times,
    two of them about shapes it never had (`...GO.str: Input should be a valid string`)."""

    def said(go: Any) -> list[str]:
        doc = {
            "id": "t",
            "version": "1",
            "initial": "a",
            "states": {"a": {"on": {"GO": go}}, "b": {"type": "final"}},
        }
        with pytest.raises(MachineConfigError) as info:
            parse_machine(doc, source="m.json")
        return str(info.value).splitlines()

    assert said({"targt": "b"}) == ["m.json: $.states.a.on.GO.targt: Extra inputs are not permitted"]
    assert said([{"target": "b", "gaurd": "true"}]) == [
        "m.json: $.states.a.on.GO[0].gaurd: Extra inputs are not permitted"
    ]
    (only,) = said(5)
    assert only.startswith("m.json: $.states.a.on.GO: not a value of any shape it may take (as str: "), only
    assert "as TransitionConfig: " in only


def _json_paths(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _json_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _json_paths(item, (*path, index))
    return found


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(_json_values, st.sampled_from([None, 0, 1, "\t"]))
def test_every_path_of_a_json_text_is_located_on_the_line_its_value_or_key_is_on(
    value: Any, indent: int | str | None
) -> None:
    text = json.dumps(value, indent=indent)
    lines = json_lines(text)
    assert set(lines) == set(_json_paths(value))
    rows = text.splitlines()
    for path, line in lines.items():
        if indent is None:
            assert line == 1
        elif path and isinstance(path[-1], str):  # one member a line, starting with its key
            assert rows[line - 1].lstrip().startswith(json.dumps(path[-1]) + ":"), (path, rows[line - 1])


def test_a_json_path_is_located_at_its_deepest_written_part() -> None:
    text = '{"states": {\n  "ask-me": {"on": [\n    1,\n    {"guard": "x"}]}},\n "tab":\t["\\ud83d\\ude00"]}'
    lines = json_lines(text)
    assert line_of(lines, parse_json_path("$.states['ask-me'].on[1].guard")) == 4
    # pydantic's loc names the member of a union it tried; a missing field is at the object lacking it.
    assert line_of(lines, ("states", "ask-me", "on", 1, "TransitionConfig", "guard")) == 4
    assert line_of(lines, ("states", "ask-me", "missing")) == 2
    assert line_of(lines, ("tab", 0)) == 5
    assert parse_json_path("$.a['it\\'s'][12].b") == ("a", "it's", 12, "b")
    assert json_lines('{"a": 1} trailing') == {} and json_lines("") == {}


def test_a_key_given_twice_in_one_object_is_refused_at_its_line_and_json_path() -> None:
    # json.loads keeps the last key without a word: a second, unguarded "REFILL" under `on` dropped the
    # guarded first one, and with it a rule of the business, while every check passed.
    text = (
        '{"id": "t", "version": "1", "initial": "a", "states": {"a": {"on": {\n'
        '  "REFILL": {"guard": "context.ok", "target": "a"},\n'
        '  "ESCALATE": "a",\n'
        '  "REFILL": "a"}},\n'
        ' "ask-me": {"meta": {"x": 1, "x": 2}}}}'
    )
    with pytest.raises(MachineConfigError) as info:
        loads_document(text, source="m.json")
    assert str(info.value).splitlines() == [
        "m.json:4: $.states.a.on.REFILL: the key 'REFILL' is given twice in one object (first on line 2); "
        "JSON keeps only the last, dropping the first without a word: list the transitions under one key "
        '(`"REFILL": [{"guard": ...}, {...}]`, the first whose guard passes wins), or remove the one you '
        "did not mean",
        "m.json:5: $.states['ask-me'].meta.x: the key 'x' is given twice in one object (first on line 5); "
        "JSON keeps only the last, dropping the first without a word: merge the two, or remove the one you "
        "did not mean",
    ]
    # Only a key within one object: the members of a repeated key's two values share their paths, and
    # objects side by side may share keys. A key escaped otherwise is the same key to JSON.
    from improve.machine.locate import duplicate_keys, json_path

    assert duplicate_keys('{"a": {"x": 1},\n "a": {"x": 2}}') == [(("a",), 1, 2)]
    assert duplicate_keys('{"\\u0041": 1,\n "A": 2}') == [(("A",), 1, 2)]
    assert duplicate_keys('[{"x": 1}, {"x": 2}, {"y": {"x": 3}}]') == []
    assert loads_document('[{"x": 1}, {"x": 2}]') == [{"x": 1}, {"x": 2}]
    assert json_path(("states", "ask-me", "on", "GO", 0, "it's")) == "$.states['ask-me'].on.GO[0]['it\\'s']"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=4) | st.integers(min_value=0, max_value=99), max_size=5))
def test_a_json_path_is_read_back_as_it_was_written(path: list[str | int]) -> None:
    from improve.machine.locate import json_path

    assert parse_json_path(json_path(path)) == tuple(path)


def test_decide_allowed_event_without_transition_is_rejected() -> None:
    config = _tiny(
        {
            "d": {
                "invoke": {"src": "agent.decide", "input": {"name": "'x'", "allowedEvents": ["GO", "STOP"]}},
                "on": {"GO": "end"},
            },
            "end": {"type": "final"},
        }
    )
    with pytest.raises(MachineConfigError, match="event 'STOP' has no transition"):
        compile_machine(parse_machine(config))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("[1, 2].exists(x, x > 1)", "comprehension macro `exists` is not allowed"),
        ("context.items.map(i, i)", "comprehension macro `map` is not allowed"),
        ("secrets.key == 'x'", "unknown variable 'secrets'"),
        ("a" * 600, "at most 512 are allowed"),
        ("   ", "empty expression"),
    ],
)
def test_expression_allowlist(source: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        compile_expr(source, "here")


def test_macro_names_inside_strings_are_not_macros() -> None:
    expr = compile_expr("context.note == '.exists(x, y)'", "here")
    assert expr.paths == (("context", "note"),)


def test_guard_must_return_bool() -> None:
    config = _tiny(
        {"a": {"on": {"GO": {"target": "b", "guard": "context.n"}}}, "b": {"type": "final"}},
        context={"n": "1"},
    )
    machine = compile_machine(parse_machine(config))
    with pytest.raises(EvaluationError, match="returned int 1, expected a bool"):
        transition(machine, initial(machine, {}), {"type": "GO"})


def test_missing_field_at_run_time_names_the_expression() -> None:
    config = _tiny(
        {"a": {"on": {"GO": {"target": "b", "guard": "event.amount > 1"}}}, "b": {"type": "final"}}
    )
    machine = compile_machine(parse_machine(config))
    with pytest.raises(EvaluationError, match=r"state 'a'.on.GO\[0\].guard: `event.amount > 1` failed"):
        transition(machine, initial(machine, {}), {"type": "GO"})
    # It also says which values it read, with their CEL types: an int beside a double names its input.
    config = _tiny(
        {
            "a": {"on": {"GO": {"target": "b", "guard": "event.amount <= context.limit - context.paid"}}},
            "b": {"type": "final"},
        },
        context={"limit": "1000", "paid": "0.5"},
    )
    machine = compile_machine(parse_machine(config))
    with pytest.raises(EvaluationError) as failed:
        transition(machine, initial(machine, {}), {"type": "GO", "amount": 2.5})
    assert (
        "failed with event.amount = 2.5 (double), context.limit = 1000 (int), context.paid = 0.5 (double): "
        "No such overload"
    ) in str(failed.value)
    with pytest.raises(EvaluationError, match=r"failed with event\.amount absent, "):
        transition(machine, initial(machine, {}), {"type": "GO"})
    # A key misspelt: the map read has the key meant.
    with pytest.raises(EvaluationError, match=r"event\.amount absent \(did you mean 'amuont'\?\)"):
        transition(machine, initial(machine, {}), {"type": "GO", "amuont": 2})
    # A field selected on a string: the string has no fields, whatever the key.
    noted = _tiny(
        {"a": {"on": {"GO": {"target": "b", "guard": "context.note.count > 0"}}}, "b": {"type": "final"}},
        context={"note": "'refill please'"},
    )
    noted_machine = compile_machine(parse_machine(noted))
    with pytest.raises(
        EvaluationError,
        match=r"context\.note\.count absent \(context\.note is a string, which has no fields\)",
    ):
        transition(noted_machine, initial(noted_machine, {}), {"type": "GO"})


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"type": "final", "on": {"GO": "a"}}, "a final state cannot have `on`, `always` or `invoke`"),
        (
            {"type": "final", "always": [{"target": "a"}]},
            "a final state cannot have `on`, `always` or `invoke`",
        ),
        ({"type": "choice", "choice": []}, "a choice state needs a non-empty `choice` list"),
    ],
)
def test_states_that_cannot_work_are_refused_when_compiled(state: dict[str, Any], message: str) -> None:
    config = parse_machine(
        {"id": "m", "version": "1", "initial": "a", "states": {"a": {"on": {"GO": "b"}}, "b": state}}
    )
    with pytest.raises(MachineConfigError, match=message):
        compile_machine(config)


def test_an_eventless_loop_names_its_last_eight_states() -> None:
    config = _tiny({"a": {"always": {"target": "b"}}, "b": {"always": {"target": "a"}}})
    with pytest.raises(MachineError, match="did not settle") as info:
        initial(compile_machine(parse_machine(config)), {})
    assert str(info.value).endswith(": a -> b -> a -> b -> a -> b -> a -> b") or str(info.value).endswith(
        ": b -> a -> b -> a -> b -> a -> b -> a"
    )
    assert str(info.value).split(": ", 1)[1].count(" -> ") == 7


def test_a_machine_names_its_id_version_and_idle_states() -> None:
    config = _tiny(
        {
            "waiting": {"on": {"GO": "working"}},
            "working": {"invoke": {"src": "tool"}, "on": {"CANCEL": "end"}},
            "stalled": {"invoke": {"src": "tool"}},
            "end": {"type": "final"},
        },
    )
    machine = compile_machine(parse_machine(config))
    assert (machine.id, machine.version) == (config["id"], config["version"])
    idle = {name: state.idle for name, state in machine.states.items()}
    assert idle == {"waiting": True, "working": False, "stalled": False, "end": False}


def test_refusing_guard_names_the_first_candidate_that_refused() -> None:
    from improve.machine import refusing_guard

    config = _tiny(
        {
            "s": {
                "on": {
                    "GO": {"target": "end", "guard": "event.n > 2"},
                    "NAMED": {"target": "end", "guard": {"type": "no"}},
                    "FREE": "end",
                }
            },
            "end": {"type": "final"},
        }
    )
    machine = compile_machine(parse_machine(config), guards={"no": lambda c, e, p: False})
    snapshot = initial(machine, {})
    assert refusing_guard(machine, snapshot, {"type": "GO", "n": 1}) == "'s'.on.GO[0]: event.n > 2"
    assert refusing_guard(machine, snapshot, {"type": "NAMED"}) == "'s'.on.NAMED[0]: guard:no"
    assert refusing_guard(machine, snapshot, {"type": "GO", "n": 3}) is None
    assert refusing_guard(machine, snapshot, {"type": "FREE"}) is None
    assert refusing_guard(machine, snapshot, {"type": "ELSE"}) is None


def test_nothing_can_happen_once_a_machine_is_done() -> None:
    config = _tiny({"s": {"on": {"GO": "end"}}, "end": {"type": "final"}})
    machine = compile_machine(parse_machine(config))
    done = transition(machine, initial(machine, {}), {"type": "GO"})
    assert done.status == "done" and not can(machine, done, {"type": "GO"})
    errored = Snapshot(value="s", context={}, status="error", error="boom")
    assert not can(machine, errored, {"type": "GO"})


def test_eventless_steps_are_capped_at_exactly_max_microsteps() -> None:
    MAX_MICROSTEPS = 100  # improve/machine/interpreter.py: an eventless loop longer than this is an error

    def chain(length: int) -> dict[str, Any]:
        states: dict[str, Any] = {f"s{i}": {"always": {"target": f"s{i + 1}"}} for i in range(length)}
        states[f"s{length}"] = {"type": "final"}
        return _tiny(states)

    # Entering the first state and each of the following ones is one microstep.
    assert initial(compile_machine(parse_machine(chain(MAX_MICROSTEPS - 1))), {}).status == "done"
    with pytest.raises(MachineError, match=f"did not settle after {MAX_MICROSTEPS} steps"):
        initial(compile_machine(parse_machine(chain(MAX_MICROSTEPS))), {})


def test_a_named_guard_that_raises_or_returns_a_non_bool_is_named() -> None:
    def boom(c: Any, e: Any, p: Any) -> bool:
        raise KeyError("amount")

    config = _tiny(
        {
            "a": {
                "on": {
                    "GO": {"target": "b", "guard": {"type": "boom"}},
                    "TRY": {"target": "b", "guard": {"type": "one"}},
                }
            },
            "b": {"type": "final"},
        }
    )
    machine = compile_machine(parse_machine(config), guards={"boom": boom, "one": lambda c, e, p: 1})
    with pytest.raises(EvaluationError, match=r"named guard 'boom' raised KeyError\('amount'\)"):
        transition(machine, initial(machine, {}), {"type": "GO"})
    with pytest.raises(EvaluationError, match="named guard 'one' returned 1, expected a bool"):
        transition(machine, initial(machine, {}), {"type": "TRY"})


def test_a_malformed_decide_input_is_a_config_error() -> None:
    config = _tiny(
        {
            "d": {"invoke": {"src": "agent.decide", "input": {"name": "'x'"}}, "on": {"GO": "end"}},
            "end": {"type": "final"},
        }
    )
    with pytest.raises(MachineConfigError, match="allowedEvents"):
        compile_machine(parse_machine(config))


def test_a_free_text_payload_field_does_not_hide_the_next_one() -> None:
    config = _tiny(
        {
            "d": {
                "invoke": {
                    "src": "agent.decide",
                    "input": {
                        "name": "'x'",
                        "allowedEvents": ["NOTE"],
                        "payloads": {"NOTE": {"text": "'text'", "tag": "['a', 'b', 'a']"}},
                    },
                },
                "on": {"NOTE": "end"},
            },
            "end": {"type": "final"},
        }
    )
    snapshot = initial(compile_machine(parse_machine(config)), {})
    assert snapshot.invoke is not None
    assert snapshot.invoke.input["payloads"] == {"NOTE": {"text": "text", "tag": ["a", "b"]}}


def test_compiled_parts_are_frozen() -> None:
    import dataclasses

    config = _tiny(
        {
            "d": {"invoke": {"src": "tool"}, "on": {"GO": "end"}},
            "end": {"type": "final"},
        }
    )
    machine = compile_machine(parse_machine(config))
    state = machine.states["d"]
    assert state.invoke is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.final = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.invoke.src = "other"  # type: ignore[misc]


# --- the fold (`fold_of(machine)`, replay's fast path) against the interpreter ------------------------------

# Guards, assigns and outputs for generated machines: mostly the plain case, then values outside the fast
# path's domain (a big int, a uint literal only cel evaluates) and every way an expression can fail (a
# missing key, a non-bool guard, an overflow, a string where a number is expected), less often, so that
# runs go on for a few steps before one fails.
PLAIN_GUARDS: list[Any] = [
    "context.n > 2",
    "context.n <= 1",
    "has(event.v) && event.v == 1",
    "has(event.v)",
    "has(event.f) && event.f > 1.5",
    "size(context.s) > 2",
    "context.flag",
    "input.k == 'a'",
    {"type": "odd"},
]
ODD_GUARDS: list[Any] = [
    "context.n",
    "event.missing > 0",
    "1u == 1u",
    "has(event.v) && event.v > 0",
    {"type": "boom"},
    {"type": "one"},
]
GUARDS = PLAIN_GUARDS * 3 + ODD_GUARDS
PLAIN_ASSIGNS: list[dict[str, Any]] = [
    {"n": "context.n + 1"},
    {"s": "context.s + 'x'"},
    {"flag": "true"},
    {"o": "{'a': context.n, 'b': [context.s]}"},
    {"o": "has(event.o) ? event.o : {}"},
    {"t": "has(event.v) ? event.v : 0", "n": "context.n * 2"},
    {"n": "context.n + 1", "previous": "context.n"},
]
ODD_ASSIGNS: list[dict[str, Any]] = [
    {"n": "event.v"},
    {"o": "event.o"},
    {"n": "context.n + 9223372036854775800"},
]
ASSIGNS = PLAIN_ASSIGNS * 4 + ODD_ASSIGNS
OUTPUTS: list[Any] = [
    {"n": "context.n", "s": "context.s"},
    "context.o",
    None,
    {"list": ["context.n", 1, None]},
]
EVENT_TYPES = ["A", "B", "C"] * 3 + ["xstate.done.actor", "xstate.error.actor"]


def _odd(context: Any, event: Any, params: Any) -> bool:
    return isinstance(context.get("n"), int) and context["n"] % 2 == 1


def _boom(context: Any, event: Any, params: Any) -> bool:
    if "boom" in event:
        raise RuntimeError("boom")
    return True


def _one(context: Any, event: Any, params: Any) -> Any:
    return 1 if context.get("flag") else False


NAMED_GUARDS = {"odd": _odd, "boom": _boom, "one": _one}


def _leaf(rng: random.Random) -> Any:
    """A JSON value for an event field: mostly a small int, sometimes what the fast path hands to cel."""
    return rng.choice(
        [
            lambda: rng.randint(-5, 5),
            lambda: rng.randint(-5, 5),
            lambda: None,
            lambda: rng.random() < 0.5,
            lambda: rng.randint(2**63 - 3, 2**64),
            lambda: rng.uniform(-1e6, 1e6),
            lambda: rng.choice(["", "a", "é", "\ud800", "1"]),
            lambda: [rng.randint(0, 3)],
        ]
    )()


def _transitions(rng: random.Random, targets: list[str], least: int = 0) -> list[dict[str, Any]]:
    out = []
    for _ in range(rng.randint(least, 3)):
        t: dict[str, Any] = {}
        target = rng.choice([*targets, None])
        if target is not None:
            t["target"] = target
        if rng.random() < 1 / 3:
            t["guard"] = rng.choice(GUARDS)
        if rng.random() < 1 / 2:
            t["assign"] = rng.choice(ASSIGNS)
        out.append(t)
    return out


def generated_run(rng: random.Random) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """A machine of a few states of every kind, an input, and events to fold through it."""
    names = [f"s{i}" for i in range(rng.randint(1, 4))]
    finals = ["end", "stop"]
    targets = names * 3 + finals  # a run should take a few steps before it ends
    states: dict[str, Any] = {}
    for name in names:
        kind = rng.choice(["on", "choice", "always", "invoke", "decide"])
        accepted = rng.sample("ABC", rng.randint(2, 3))
        state: dict[str, Any] = {"on": {e: _transitions(rng, targets, 1) for e in accepted}}
        if kind == "choice":
            state = {"type": "choice", "choice": _transitions(rng, targets, 1)}
        elif kind == "always":
            state["always"] = _transitions(rng, targets, 1)
        elif kind == "invoke":
            state["invoke"] = {
                "src": "tool",
                "input": {"n": "context.n", "x": rng.choice(["context.s", "event.missing", "event.type"])},
                "onDone": _transitions(rng, targets),
                "onError": _transitions(rng, targets),
            }
        elif kind == "decide":
            state["invoke"] = {
                "src": "agent.decide",
                "input": {"name": "'pick'", "allowedEvents": sorted(accepted), "facts": {"n": "context.n"}},
            }
        states[name] = state
    for name in finals:
        output = rng.choice(OUTPUTS)
        states[name] = {"type": "final", **({"output": output} if output is not None else {})}
    config = _tiny(states, context={"n": "input.n", "s": "''", "flag": "false", "o": "{}", "k": "input.k"})
    n = rng.randint(-3, 5) if rng.random() < 0.8 else rng.randint(2**63 - 2, 2**64)
    inp: dict[str, Any] = {"n": n, "k": rng.choice("ab")}
    events = []
    for _ in range(rng.randint(1, 12)):
        event: dict[str, Any] = {"type": rng.choice(EVENT_TYPES)}
        if rng.random() < 0.5:
            event["v"] = _leaf(rng)
        if rng.random() < 0.3:
            event["f"] = rng.choice([0.5, 2.0, float("nan"), float("inf"), 3])
        if rng.random() < 0.3:
            event["o"] = {rng.choice("ab"): _leaf(rng) for _ in range(rng.randint(0, 2))}
        if event["type"].startswith("xstate.") and rng.random() < 0.5:
            event["actorId"] = rng.choice([*names, "other"])
        if rng.random() < 0.05:
            event["boom"] = True
        events.append(event)
    return config, inp, events


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_the_fold_reaches_what_the_interpreter_reaches_on_generated_machines(seed: int) -> None:
    """Replay folds with `fold_of(machine)`: after every event, the same snapshot, the same `not taken`, the
    same error, whatever the machine, the values and the failures. (Hypothesis draws a seed, a case is
    made from it: drawing each part of a machine through hypothesis cost seconds per hundred cases.)"""
    config, inp, events = generated_run(random.Random(seed))
    machine = compile_machine(parse_machine(config), guards=NAMED_GUARDS)
    for expected, found in fold_against_interpreter(machine, inp, events):
        assert found == expected


@pytest.mark.parametrize("odd", [1e16, 1e-5, -2.5e-7, 1.5e300])
def test_the_folds_hash_notices_a_float_written_otherwise_in_a_value_that_replaced_another(
    odd: float,
) -> None:
    """The fold's hash asks again only of context values it has not found plain before: a value assigned
    over a plain one (a map, a list, a float) with a float msgspec writes otherwise than json is noticed,
    and the hash is the interpreter's."""
    config = _tiny(
        {
            "a": {"on": {"GO": {"target": "b", "assign": {"o": "event.o", "l": "event.l", "f": "event.f"}}}},
            "b": {"on": {"GO": {"target": "a", "assign": {"o": "event.o", "l": "event.l", "f": "event.f"}}}},
        },
        context={"o": "{'x': 1.5}", "l": "[1.5]", "f": "1.5", "i": "input"},
    )
    machine = compile_machine(parse_machine(config))
    events = [
        {"type": "GO", "o": {"x": 2.5}, "l": [2.5], "f": 2.5},
        {"type": "GO", "o": {"x": odd}, "l": [2.5], "f": 2.5},
        {"type": "GO", "o": {"x": 2.5}, "l": [odd], "f": 2.5},
        {"type": "GO", "o": {"x": 2.5}, "l": [2.5], "f": odd},
        {"type": "GO", "o": {"x": 2.5}, "l": [2.5], "f": 2.5},
    ]
    for inp in ({"x": 2.5}, {"x": [odd]}):
        pairs = fold_against_interpreter(machine, inp, events)
        assert len(pairs) == len(events) + 1
        for expected, found in pairs:
            assert found == expected


def test_the_fold_takes_the_fast_path_on_plain_steps_and_the_reference_on_the_rest() -> None:
    """The fast path is the one taken where nothing is unusual, so the differential tests test it; a
    value outside its domain (a big int) or a failing guard hands the step to the interpreter."""
    machine = approval_machine()
    fold = fold_of(machine)
    before = fold.fallbacks
    run = fold.start({"amount": 150, "reason": "x"})
    assert fold.step(run, {"type": "ESCALATE"}) and fold.step(run, {"type": "APPROVE", "approver": "d"})
    assert fold.snapshot(run).value == "issued" and fold.fallbacks == before
    big = fold.start({"amount": 2**64, "reason": "x"})
    assert fold.step(big, {"type": "ISSUE"}) is False  # the guard reads the big int: cel decides
    assert fold.fallbacks == before + 1


FOLD_CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]]]] = [
    # (name, states, input, events): each odd path of a step once, where the fast path must bail
    (
        "a guard returns an int",
        {"a": {"on": {"GO": {"target": "b", "guard": "context.n"}}}},
        {"n": 1},
        [{"type": "GO"}],
    ),
    (
        "a named guard returns an int",
        {"a": {"on": {"GO": {"target": "b", "guard": {"type": "one"}}}}},
        {"n": 1},
        [{"type": "GO"}],
    ),
    (
        "a named guard raises",
        {"a": {"on": {"GO": {"target": "b", "guard": {"type": "boom"}}}}},
        {"n": 1},
        [{"type": "GO", "boom": 1}],
    ),
    (
        "a guard reads a missing key",
        {"a": {"on": {"GO": {"target": "b", "guard": "event.x > 1"}}}},
        {"n": 1},
        [{"type": "GO"}],
    ),
    (
        "a big int goes to cel",
        {"a": {"on": {"GO": {"target": "b", "assign": {"n": "event.v"}}}}},
        {"n": 1},
        [{"type": "GO", "v": 2**64}],
    ),
    (
        "cel alone evaluates it",
        {"a": {"on": {"GO": {"target": "b", "guard": "1u == 1u"}}}},
        {"n": 1},
        [{"type": "GO"}],
    ),
    (
        "no choice branch matches",
        {"a": {"type": "choice", "choice": [{"target": "b", "guard": "context.n > 5"}]}},
        {"n": 1},
        [],
    ),
    ("an eventless loop", {"a": {"always": {"target": "c"}}, "c": {"always": {"target": "a"}}}, {"n": 1}, []),
    (
        "an actor fails, no onError",
        {"a": {"invoke": {"src": "t"}}},
        {"n": 1},
        [{"type": "xstate.error.actor", "error": "x"}],
    ),
    (
        "another actor's answer",
        {"a": {"invoke": {"src": "t", "onDone": "b"}}},
        {"n": 1},
        [{"type": "xstate.done.actor", "actorId": "z"}],
    ),
    (
        "a targetless assign keeps the owed actor",
        {
            "a": {
                "invoke": {"src": "t", "input": {"n": "context.n"}},
                "on": {"UP": {"assign": {"n": "context.n + 1"}}},
            }
        },
        {"n": 1},
        [{"type": "UP"}, {"type": "UP"}],
    ),
    ("an event without a type", {"a": {"on": {"GO": "b"}}}, {"n": 1}, [{"v": 1}]),
    ("events after the end", {"a": {"on": {"GO": "b"}}}, {"n": 1}, [{"type": "GO"}, {"type": "GO"}]),
]


@pytest.mark.parametrize(
    ("states", "inp", "events"), [c[1:] for c in FOLD_CASES], ids=[c[0] for c in FOLD_CASES]
)
def test_the_fold_hands_each_odd_step_to_the_interpreter(
    states: dict[str, Any], inp: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    config = _tiny({**states, "b": {"type": "final", "output": {"n": "context.n"}}}, context={"n": "input.n"})
    machine = compile_machine(parse_machine(config), guards=NAMED_GUARDS)
    for expected, found in fold_against_interpreter(machine, inp, events):
        assert found == expected


# --- canonical bytes: msgspec's text where it is json.dumps's, the json way elsewhere -------------------

floats = st.one_of(
    st.floats(),
    st.floats(min_value=1e-6, max_value=2e-4),
    st.floats(min_value=1e15, max_value=1e17),
    st.sampled_from([1e-5, 1e-4, 1e16, -0.0, 5e-324, float("nan"), float("inf")]),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), floats, st.text(max_size=4), st.just("\ud800")
)
odd = st.one_of(
    st.tuples(st.integers()),
    st.frozensets(st.integers(), max_size=2),
    st.binary(max_size=2),
    st.datetimes(),
    st.dictionaries(st.integers(), st.integers(), max_size=2),
)
values = st.recursive(
    st.one_of(scalars, odd),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


def _json_way(value: Any) -> Any:
    try:
        return canonical_json(value).encode("utf-8")
    except Exception as error:
        return type(error)


def _fast_way(encode: Any, value: Any) -> Any:
    try:
        return encode(value)
    except Exception as error:
        return type(error)


@settings(max_examples=500, deadline=None)
@given(values)
def test_canonical_bytes_are_the_canonical_json_or_its_error(value: Any) -> None:
    """Hashes are taken over `canonical_bytes`: exactly `canonical_json`'s text, or its error, for any
    value (floats where msgspec and Python write them differently, NaN, tuples, sets, bytes, dates, keys
    that are not strings, a lone surrogate)."""
    assert _fast_way(canonical_bytes, value) == _json_way(value)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=10,
    )
)
def test_decoded_canonical_bytes_of_what_msgspec_decodes(value: Any) -> None:
    """A log entry's content, as msgspec decodes it, is hashed the same fast way without reading it back."""
    import msgspec

    try:
        decoded = msgspec.json.decode(json.dumps(value, allow_nan=False))
    except (ValueError, msgspec.DecodeError, UnicodeEncodeError):
        return  # not JSON, or not a line msgspec reads: never a bulk entry
    assert _fast_way(decoded_canonical_bytes, decoded) == _json_way(decoded)
