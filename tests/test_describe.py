"""describe_text, describe_mermaid, to_xstate (and the export run in XState v5 by the JS host) and diff_states."""

from __future__ import annotations

import copy
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from improve.machine import MachineConfig, TransitionConfig, compile_machine, parse_machine
from improve.machine.describe import describe_mermaid, describe_text, diff_states, to_xstate

EXAMPLE = Path(__file__).resolve().parents[1] / "improve" / "examples" / "refund_approval" / "machine.json"
ISSUE_GUARD = "!(context.amount > 100 && !context.approved)"
ENTITY = re.compile(r"#\w+;")


@pytest.fixture
def raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXAMPLE.read_text())
    return data


@pytest.fixture
def refund(raw: dict[str, Any]) -> MachineConfig:
    return parse_machine(raw, str(EXAMPLE))


def _policy() -> MachineConfig:
    return parse_machine(
        {
            "id": "refunds-policy",
            "version": "1",
            "description": "Resolve refund tickets correctly.",
            "initial": "route",
            "states": {
                "route": {
                    "type": "choice",
                    "choice": [
                        {"guard": "facts.customer.refundsLast90d >= 3", "target": "escalate"},
                        {"guard": {"type": "isVip", "params": {"tier": 2}}, "target": "ask-model"},
                        {"target": "ask-model"},
                    ],
                },
                "escalate": {"type": "final", "output": {"type": "'ESCALATE'"}},
                "ask-model": {
                    "invoke": {
                        "src": "model.decide",
                        "input": {"model": "'decider'"},
                        "onDone": {"target": "answer"},
                        "onError": "escalate",
                    }
                },
                "answer": {"type": "final", "output": "event.output"},
            },
        }
    )


def _labels(mermaid: str) -> list[str]:
    return [line.split(" : ", 1)[1] for line in mermaid.splitlines() if " --> " in line and " : " in line]


# --- text -----------------------------------------------------------------------------------------


def test_text_starts_with_goal_and_lists_every_state(refund: MachineConfig) -> None:
    text = describe_text(refund)
    lines = text.splitlines()
    assert lines[0] == f"Goal: {refund.description}"
    assert lines[1] == "Machine: refund-approval@1 (initial: classifying)"
    headers = [line.split(" (")[0] for line in lines if line and not line.startswith(" ") and "(" in line]
    assert [h for h in headers if h in refund.states] == list(refund.states)
    assert "classifying (initial, decision)" in lines
    assert "approving (waits for a person)" in lines
    assert "issued (final)" in lines
    assert lines[-1] == (
        "7 states, 4 finals (issued, refused, rejected, illegallyIssued), 1 sentinel (illegallyIssued)."
    )


def test_text_shows_guards_assigns_decision_and_sentinel(refund: MachineConfig) -> None:
    lines = [line.strip() for line in describe_text(refund).splitlines()]
    assert f"ISSUE [{ISSUE_GUARD}] -> issuing" in lines
    assert "APPROVE -> issuing (assign approved, approver)" in lines
    assert "error -> refused" in lines
    assert "always -> issued" in lines
    assert "decision 'classify': events ISSUE | ESCALATE | REFUSE, maxRetries 3" in lines
    assert "facts: amount, reason" in lines
    assert "tags: awaiting-approval" in lines
    assert "illegallyIssued (sentinel, final, must be unreachable)" in lines


def test_text_shows_choice_actor_and_named_guards() -> None:
    lines = [line.strip() for line in describe_text(_policy()).splitlines()]
    assert "route (initial, choice)" in lines
    assert "choice [facts.customer.refundsLast90d >= 3] -> escalate" in lines
    assert "choice [guard:isVip] -> ask-model" in lines
    assert "ask-model (actor)" in lines
    assert "invokes model.decide" in lines
    assert "done -> answer" in lines
    assert "error -> escalate" in lines
    assert lines[-1] == "4 states, 2 finals (escalate, answer), 0 sentinels."


def test_text_shows_decision_payload_options() -> None:
    config = parse_machine(
        {
            "id": "m",
            "version": "1",
            "initial": "ask",
            "states": {
                "ask": {
                    "invoke": {
                        "src": "agent.decide",
                        "input": {
                            "name": "'resolve'",
                            "allowedEvents": ["PICK"],
                            "payloads": {"PICK": {"option": "context.options"}},
                        },
                    },
                    "on": {"PICK": "done"},
                },
                "done": {"type": "final"},
            },
        }
    )
    lines = [line.strip() for line in describe_text(config).splitlines()]
    assert "decision 'resolve': events PICK" in lines
    assert "payload PICK.option one of context.options" in lines
    assert "PICK -> done" in lines


# --- mermaid --------------------------------------------------------------------------------------


def test_mermaid_shape(refund: MachineConfig) -> None:
    out = describe_mermaid(refund)
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0] == "stateDiagram-v2"
    assert "[*] --> classifying" in lines
    issue = [line for line in lines if line.startswith("classifying --> issuing : ")]
    assert len(issue) == 1
    # The whole guard: 44 characters fit (once cut mid-name: `!(context.amount > 100 && !context.appr…`).
    assert issue[0] == "classifying --> issuing : ISSUE [!(context.amount #gt; 100 && !context.approved)]"
    assert "classifying --> refused : error" in lines
    assert "issuing --> issued : always 2" in lines  # after the sentinel's guarded `always 1`
    for final in refund.final_states():
        assert f"{final} --> [*]" in lines
    assert "classDef sentinel fill:#fdd,stroke:#c00" in lines
    assert "class illegallyIssued sentinel" in lines
    assert not any(line.startswith("classDef changed") for line in lines)


def test_mermaid_labels_have_no_raw_breaking_characters(refund: MachineConfig) -> None:
    data = refund.model_dump(by_alias=True, exclude_none=True)
    data["states"]["approving"]["on"]["APPROVE"]["guard"] = 'event.note != "a;b" && event.x < 1 || {}'
    labels = _labels(describe_mermaid(parse_machine(data)))
    assert len(labels) == 8
    for label in labels:
        bare = ENTITY.sub("", label)
        for ch in '";{}<>#|':
            assert ch not in bare, (ch, label)
    approve = next(lb for lb in labels if lb.startswith("APPROVE"))
    assert approve == "APPROVE [event.note != #quot;a#59;b#quot; && event.x #lt; 1 #124;#124; #123;#125;]"


def test_mermaid_choice_state_sanitised_ids_and_highlight() -> None:
    out = describe_mermaid(_policy(), highlight=["ask-model", "removed-state"])
    lines = [line.strip() for line in out.splitlines()]
    assert "state route <<choice>>" in lines
    assert "[*] --> route" in lines
    assert 'state "ask-model" as ask_model' in lines
    # The branches in the order they are checked: the first whose guard holds is taken.
    assert "route --> escalate : choice 1 [facts.customer.refundsLast90d #gt;= 3]" in lines
    assert "route --> ask_model : choice 2 [guard:isVip]" in lines
    assert "route --> ask_model : choice 3" in lines
    assert "ask_model --> answer : done" in lines
    assert "ask_model --> escalate : error" in lines
    assert "classDef changed fill:#ffd,stroke:#a80" in lines
    assert "class ask_model changed" in lines
    assert not any("sentinel" in line for line in lines)
    assert "ask-model" not in out.replace('"ask-model"', "")


def test_mermaid_sanitised_ids_do_not_collide() -> None:
    config = parse_machine(
        {
            "id": "m",
            "version": "1",
            "initial": "a-b",
            "states": {"a-b": {"on": {"GO": "a_b"}}, "a_b": {"on": {"GO": "end"}}, "end": {"type": "final"}},
        }
    )
    lines = [line.strip() for line in describe_mermaid(config).splitlines()]
    assert 'state "a-b" as a_b_2' in lines
    assert "[*] --> a_b_2" in lines
    assert "a_b_2 --> a_b : GO" in lines
    assert 'state "end" as s_end' in lines
    assert "a_b --> s_end : GO" in lines
    assert "s_end --> [*]" in lines


# --- XState ---------------------------------------------------------------------------------------


def test_to_xstate(refund: MachineConfig, raw: dict[str, Any]) -> None:
    x = to_xstate(refund)
    assert x["id"] == "refund-approval"
    assert x["version"] == "1"
    assert x["initial"] == "classifying"
    assert x["context"] == raw["context"]
    assert x["meta"]["improve"]["expressions"] == "cel"
    assert list(x["states"]) == list(raw["states"])
    cls = x["states"]["classifying"]
    assert cls["on"]["ISSUE"] == {
        "target": "issuing",
        "guard": {"type": "cel", "params": {"expr": ISSUE_GUARD}},
    }
    assert cls["on"]["ESCALATE"] == {"target": "approving"}
    assert cls["invoke"]["src"] == "agent.decide"
    assert cls["invoke"]["id"] == "classifying"  # the interpreter's actor id, which the log's events carry
    assert cls["invoke"]["input"] == raw["states"]["classifying"]["invoke"]["input"]
    assert cls["invoke"]["onError"] == {"target": "refused"}
    assert "maxRetries" not in cls["invoke"]
    assert cls["meta"] == {"maxRetries": 3}
    assert x["states"]["approving"]["on"]["APPROVE"]["actions"] == [
        {
            "type": "xstate.assign",
            "params": {"approved": "true", "approver": "has(event.approver) ? event.approver : ''"},
        }
    ]
    assert x["states"]["approving"]["tags"] == ["awaiting-approval"]
    assert x["states"]["issuing"]["always"][1] == {"target": "issued"}
    assert x["states"]["issued"] == {"type": "final", "output": raw["states"]["issued"]["output"]}
    sentinel = x["states"]["illegallyIssued"]
    assert sentinel["type"] == "final"
    assert sentinel["tags"] == ["sentinel"] and sentinel["description"].endswith("this must never happen")
    assert json.loads(json.dumps(x)) == x


def test_to_xstate_choice_becomes_always_and_named_guards_stay() -> None:
    x = to_xstate(_policy())
    route = x["states"]["route"]
    assert "type" not in route
    assert route["always"] == [
        {
            "target": "escalate",
            "guard": {"type": "cel", "params": {"expr": "facts.customer.refundsLast90d >= 3"}},
        },
        {"target": "ask-model", "guard": {"type": "isVip", "params": {"tier": 2}}},
        {"target": "ask-model"},
    ]
    assert x["states"]["ask-model"]["invoke"] == {
        "src": "model.decide",
        "id": "ask-model",
        "input": {"model": "'decider'"},
        "onDone": {"target": "answer"},
        "onError": {"target": "escalate"},
    }
    assert x["states"]["answer"] == {"type": "final", "output": "event.output"}


def test_to_xstate_self_transition_reenters_as_the_interpreter_does() -> None:
    """The interpreter enters a state again on a transition to itself (its actor is owed anew); XState
    keeps the running actor unless the transition says `reenter`."""
    config = parse_machine(
        {
            "id": "m",
            "version": "1",
            "initial": "a",
            "states": {
                "a": {"invoke": {"src": "work"}, "on": {"AGAIN": {"target": "a"}, "DONE": {"target": "b"}}},
                "b": {"type": "final"},
            },
        },
        "m.json",
    )
    on = to_xstate(config)["states"]["a"]["on"]
    assert on == {"AGAIN": {"target": "a", "reenter": True}, "DONE": {"target": "b"}}


def test_to_xstate_does_not_alias_the_config(refund: MachineConfig) -> None:
    x = to_xstate(refund)
    x["context"]["amount"] = "changed"
    x["states"]["approving"]["on"]["APPROVE"]["actions"][0]["params"]["approved"] = "false"
    assert refund.context["amount"] == "input.amount"
    approve = refund.states["approving"].on["APPROVE"]
    assert isinstance(approve, TransitionConfig)
    assert approve.assign == {"approved": "true", "approver": "has(event.approver) ? event.approver : ''"}


# --- XState host: the export run in XState v5 (Node), against the interpreter ----------------------


@pytest.fixture(scope="module")
def xstate_install() -> Path:
    """The pinned xstate + cel-js install in the cache; skipped without Node or without one (no download)."""
    from bench.xstate_node import NodeUnavailable, cache_dir, installed, node

    try:
        node()
    except NodeUnavailable as err:
        pytest.skip(str(err))
    folder = installed()
    if folder is None:
        pytest.skip(
            f"no cached XState install at {cache_dir()}: `make conformance` (or `make bench`) installs it "
            "once with npm; tests never download"
        )
    return folder


def _refund_thread(events: list[dict[str, Any]]) -> Any:
    from bench.xstate_conformance import Sequence

    return Sequence("by-hand", {"amount": 500, "reason": "broken on arrival"}, events)


def _xstate_fold(folder: Path, exported: dict[str, Any], seq: Any, guards: dict[str, bool]) -> dict[str, Any]:
    from bench.xstate_node import run_driver

    threads = [{"id": seq.id, "input": seq.input, "events": seq.events, "guards": guards}]
    answer: dict[str, Any] = run_driver(folder, {"mode": "conform", "machine": exported, "threads": threads})
    return answer["threads"][0]


def test_refund_approval_export_runs_in_xstate_as_in_python(xstate_install: Path) -> None:
    from bench.xstate_conformance import difference, python_fold
    from improve.runtime import load_environment

    env = load_environment("refund-approval")
    seq = _refund_thread([{"type": "ESCALATE"}, {"type": "APPROVE", "approver": "dana"}])
    ours = python_fold(env, seq)
    theirs = _xstate_fold(xstate_install, to_xstate(env.config), seq, ours.guards)
    assert theirs["steps"] == [["classifying", "active"], ["approving", "active"], ["issued", "done"]]
    assert theirs["context"] == {
        "amount": 500,
        "reason": "broken on arrival",
        "approved": True,
        "approver": "dana",
    }
    assert theirs["output"] == {"outcome": "issued", "amount": 500, "approved": True}
    assert ours.steps == theirs["steps"] and difference(seq, ours, theirs) is None


def test_xstate_conformance_reports_a_machine_that_runs_differently(xstate_install: Path) -> None:
    """Without APPROVE's assign (what XState did without the host's `xstate.assign`), XState pays an
    unapproved refund: the check names the event and both states."""
    from bench.xstate_conformance import difference, python_fold
    from improve.runtime import load_environment

    env = load_environment("refund-approval")
    seq = _refund_thread([{"type": "ESCALATE"}, {"type": "APPROVE"}])
    exported = to_xstate(env.config)
    del exported["states"]["approving"]["on"]["APPROVE"]["actions"]
    theirs = _xstate_fold(xstate_install, exported, seq, {})
    assert theirs["steps"][-1] == ["illegallyIssued", "done"]
    diff = difference(seq, python_fold(env, seq), theirs)
    assert diff == "after event 2 (APPROVE): python issued/done, xstate illegallyIssued/done"


def test_a_named_guard_python_never_asked_is_a_difference(xstate_install: Path) -> None:
    """Named guards are Python host code: XState gets Python's verdicts, and asking one elsewhere fails."""
    from bench.xstate_conformance import Sequence, difference, python_fold, record_threads, sequence
    from improve.log import MemoryStore
    from improve.runtime import load_environment

    env = load_environment("refunds")
    store = MemoryStore()
    seqs = [sequence(t, store.read(t)) for t in record_threads(env, store)]
    seq: Sequence = next(s for s in seqs if python_fold(env, s).guards)  # a thread that reaches the guard
    ours = python_fold(env, seq)
    assert (
        difference(seq, ours, _xstate_fold(xstate_install, to_xstate(env.config), seq, ours.guards)) is None
    )
    theirs = _xstate_fold(xstate_install, to_xstate(env.config), seq, {})
    assert "named guard 'illegalRefund' asked where the Python run never asked it" in theirs["failure"]
    assert difference(seq, ours, theirs) is not None


def test_a_policy_runs_in_xstate_with_its_request_bound_as_input(xstate_install: Path) -> None:
    """A policy's guards read its decision request (`facts`) after start, where XState keeps no input:
    the host binds it per machine, and the choice, the model's answer and the outputs agree."""
    from bench.xstate_conformance import Sequence, difference, fold_machine
    from bench.xstate_node import run_driver

    policy = parse_machine(
        {
            "id": "p",
            "version": "1",
            "initial": "route",
            "states": {
                "route": {
                    "type": "choice",
                    "choice": [
                        {"guard": "facts.customer.refundsLast90d >= 3", "target": "escalate"},
                        {"target": "ask"},
                    ],
                },
                "ask": {
                    "invoke": {
                        "src": "model.decide",
                        "input": {"model": "'decider'"},
                        "onDone": {"target": "answer"},
                    }
                },
                "answer": {"type": "final", "output": "event.output"},
                "escalate": {
                    "type": "final",
                    "output": {"type": "'ESCALATE'", "n": "facts.customer.refundsLast90d"},
                },
            },
        },
        "p.json",
    )
    done = {"type": "xstate.done.actor", "actorId": "ask", "output": {"type": "REFUND", "amount": 12.5}}
    seqs = [
        Sequence("repeat refunder", {"facts": {"customer": {"refundsLast90d": 4}}}, []),
        Sequence("first refund", {"facts": {"customer": {"refundsLast90d": 0}}}, [done]),
    ]
    folds = [fold_machine(policy, {}, {"model.decide"}, s) for s in seqs]
    threads = [{"id": s.id, "input": s.input, "events": s.events, "guards": {}} for s in seqs]
    answer = run_driver(
        xstate_install,
        {"mode": "conform", "machine": to_xstate(policy), "threads": threads, "bindInput": True},
    )["threads"]
    assert answer[0]["steps"] == [["escalate", "done"]] and answer[0]["output"] == {
        "type": "ESCALATE",
        "n": 4,
    }
    assert answer[1]["steps"][-1] == ["answer", "done"] and answer[1]["output"] == done["output"]
    assert [difference(s, f, a) for s, f, a in zip(seqs, folds, answer, strict=True)] == [None, None]


def test_bench_times_xstate_on_the_same_sequences(xstate_install: Path, tmp_path: Path) -> None:
    """`make bench`'s xstate section: the three rates from one set of sequences, and their ratios."""
    from bench.xstate_bench import ROUNDS, xstate_figures

    figures = xstate_figures(tmp_path, threads=60, repeat=1)
    assert figures["threads"] >= 60 and figures["entries"] > figures["events"] > figures["threads"]
    peer = figures["xstate"]["events_per_s"]
    assert peer > 0 and figures["interpreter_events_per_s"] > 0 and figures["replay_events_per_s"] > 0
    # XState stays up in one Node process and times a pass a round, interleaved with ours: at least
    # ROUNDS rounds, each ratio taken within its round, the figure their median.
    each = figures["replay_over_xstate_each_round"]
    assert len(each) == len(figures["xstate"]["events_per_s_each_round"]) == ROUNDS
    assert figures["replay_over_xstate"] == pytest.approx(statistics.median(each), abs=0.01)
    assert figures["goal_met"] == (figures["replay_over_xstate"] >= 3.0)


def test_bench_loses_no_finished_section(capsys: pytest.CaptureFixture[str]) -> None:
    """`make bench` runs its sections one after another: one that raises or exits is reported with its
    error and the others still give their figures; an interrupt stops the run, and what finished before
    it is kept."""
    from bench.__main__ import Section, run_sections

    def raises(tmp: Path) -> Any:
        raise RuntimeError("5 of 67 calls failed")

    def exits(tmp: Path) -> Any:
        raise SystemExit("a tool gave up")

    def interrupted(tmp: Path) -> Any:
        raise KeyboardInterrupt

    def fine(tmp: Path) -> Any:
        assert tmp.is_dir()
        return {"events_per_s": 1}

    sections: list[Section] = [("a", "", fine), ("b", "", raises), ("c", "", exits), ("d", "", fine)]
    figures: dict[str, object] = {}
    assert run_sections(figures, sections) == ["b", "c"]
    assert figures["a"] == figures["d"] == {"events_per_s": 1}
    assert figures["b"]["error"] == "RuntimeError: 5 of 67 calls failed"  # type: ignore[index]
    assert figures["c"]["error"] == "SystemExit: a tool gave up"  # type: ignore[index]
    assert "b failed: RuntimeError" in capsys.readouterr().err
    figures = {}
    assert run_sections(figures, [("a", "", fine), ("b", "", interrupted), ("c", "", fine)]) == ["b"]
    assert figures == {"a": {"events_per_s": 1}, "b": {"error": "interrupted"}}
    figures = {}
    assert run_sections(figures, sections, only="d") == [] and figures == {"d": {"events_per_s": 1}}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["refund-approval", "refunds", "tool-loop"])
def test_every_recorded_thread_runs_the_same_in_xstate(
    xstate_install: Path, tmp_path: Path, name: str
) -> None:
    from bench.xstate_conformance import check_environment

    tally = check_environment(name, xstate_install, tmp_path)
    assert tally.threads > 20 and tally.events > tally.threads
    assert tally.diffs == [] and tally.identical == tally.threads


# --- diff -----------------------------------------------------------------------------------------


def test_diff_states_finds_exactly_the_changed_state(refund: MachineConfig) -> None:
    assert diff_states(refund, refund) == []
    original = copy.deepcopy(refund.states["approving"].on["REJECT"])
    changed = copy.deepcopy(refund)
    changed.states["approving"].on["REJECT"] = TransitionConfig(target="refused")
    assert diff_states(refund, changed) == ["approving"]
    assert refund.states["approving"].on["REJECT"] == original != changed.states["approving"].on["REJECT"]
    compile_machine(changed)  # still a valid machine


def test_diff_states_added_and_removed(raw: dict[str, Any]) -> None:
    old = parse_machine(raw)
    data = copy.deepcopy(raw)
    del data["states"]["rejected"]
    data["states"]["approving"]["on"]["REJECT"] = {"target": "closed"}
    data["states"]["closed"] = {"type": "final"}
    assert diff_states(old, parse_machine(data)) == ["approving", "closed", "rejected"]


def test_the_svg_diagram_draws_every_state_and_edge_escaped_and_marked(refund: MachineConfig) -> None:
    from xml.etree import ElementTree

    from improve.machine import describe_svg, edges

    data = refund.model_dump(by_alias=True, exclude_none=True)
    data["states"]["approving"]["on"]["APPROVE"]["guard"] = 'event.note != "<b>" && event.x < 1'
    config = parse_machine(data)
    svg = describe_svg(config, highlight=["approving"])
    root = ElementTree.fromstring(svg)  # well-formed: every user text escaped
    ns = {"s": "http://www.w3.org/2000/svg"}
    names = [t.text for t in root.findall("s:text", ns) if t.get("class") == "state-name"]
    assert names == list(config.states)
    boxes = {r.get("class") for r in root.findall("s:rect", ns)}
    assert "sentinel box" in boxes and "changed box" in boxes
    drawn = [
        e for e in [*root.findall("s:line", ns), *root.findall("s:path", ns)] if e.get("class") == "edge"
    ]
    count = sum(1 for name, state in config.states.items() for _ in edges(name, state))
    assert len(drawn) == count + 1  # every transition, and the arrow into the initial state
    labels = [t.text or "" for t in root.findall("s:text", ns) if t.get("class") == "edge-label"]
    assert 'APPROVE [event.note != "<b>" && event.x < 1]' in labels
    assert "<b>" not in svg and "<script" not in svg


def test_a_long_guard_is_shortened_at_whole_conjuncts_never_inside_a_name() -> None:
    from improve.machine.describe import shorten_guard

    guard = "facts.customer.refundsLast90d < 2 && facts.order.refundable <= facts.request.amount && x > 1"
    assert shorten_guard(guard, 64) == "facts.customer.refundsLast90d < 2 && …"
    assert shorten_guard(guard, 200) == guard
    # A `&&` inside parentheses or quotes is not a place to cut.
    nested = "(facts.a > 1 && facts.b < 2) && facts.reason.matches('a && b') && facts.c == 'long value here'"
    assert shorten_guard(nested, 60) == "(facts.a > 1 && facts.b < 2) && …"
    # One conjunct longer than the limit: cut after its last whole word.
    assert (
        shorten_guard("facts.customer.name.matches('a very long pattern of words')", 30)
        == "facts.customer.name.matches( …"
    )
