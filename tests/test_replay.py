"""Replay: a pure fold that reaches the live run's final snapshot, and refuses logs it cannot trust."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from improve.cli.main import app
from improve.errors import DivergenceError, LogError, TamperError, VersionMismatchError
from improve.log import BulkEntry, decode_entry, seal
from improve.log.chain import content_bytes, line_content
from improve.log.entry import LogEntry
from improve.log.replay import replay
from improve.log.store import MemoryStore
from improve.machine import compile_machine
from improve.runtime import load_environment
from improve.runtime.policy import PolicyDecider, compile_policy, load_policy
from improve.runtime.run import run
from tests.helpers import REPO, copy_workspace

REFUNDS = load_environment("refunds")
APPROVAL = load_environment("refund-approval")
V0 = compile_policy(load_policy(REPO / "policies" / "refunds" / "v0.json"))
V0_APPROVAL = compile_policy(load_policy(REPO / "policies" / "refund-approval" / "v0.json"))

amounts = st.one_of(
    st.sampled_from([0, 40, 99.99, 100, 100.01, 101, 240]), st.floats(1, 500).map(lambda x: round(x, 2))
)


@st.composite
def refund_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Random tickets over the whole input space: amounts at the rule boundaries, missing and foreign
    orders, old deliveries, fraud signals, people who answer or not, declined payments."""
    total = draw(amounts)
    refunded = draw(st.sampled_from([0, 0, round(total / 2, 2), total]))
    owner = draw(st.sampled_from(["C-1", "C-1", "C-2"]))
    order_known = draw(st.booleans()) or draw(st.booleans())
    give_order = draw(st.booleans())
    world = {
        "customers": {
            "C-1": {"refundsLast90d": draw(st.integers(0, 6)), "accountAgeDays": draw(st.integers(0, 900))}
        },
        "orders": {
            "O-1": {
                "customerId": owner,
                "total": total,
                "refunded": refunded,
                "deliveredDaysAgo": draw(st.integers(0, 60)),
            }
        }
        if order_known
        else {},
        "paymentsFail": draw(st.booleans()) and draw(st.booleans()),
    }
    people: dict[str, list[dict[str, Any]]] = {}
    if draw(st.booleans()):
        people["awaitingOrderId"] = [
            draw(st.sampled_from([{"type": "PROVIDE_ORDER_ID", "orderId": "O-1"}, {"type": "NO_REPLY"}]))
        ]
    if draw(st.booleans()):
        people["awaitingApproval"] = [
            draw(st.sampled_from([{"type": "APPROVE", "approver": "dana"}, {"type": "REJECT"}]))
        ]
    inp = {
        "ticket": draw(st.sampled_from(["it broke", "unacceptable!! refund now", "wrong size"])),
        "customerId": draw(st.sampled_from(["C-1", "C-9"])),
        "amount": draw(amounts),
    }
    if give_order:
        inp["orderId"] = "O-1"
    return {
        "input": inp,
        "world": world,
        "people": people,
        "model": draw(st.sampled_from(["careful", "naive", "sloppy"])),
        "seed": draw(st.text("abc123", min_size=1, max_size=6)),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(refund_scenarios())
def test_replay_equals_the_live_final_snapshot(case: dict[str, Any]) -> None:
    store = MemoryStore()
    live = run(
        REFUNDS,
        input=case["input"],
        world=REFUNDS.make_world(case["world"]),
        people=case["people"],
        decider=PolicyDecider(V0, {"decider": REFUNDS.models[case["model"]](case["seed"])}),
        store=store,
        thread_id="t:v0:x:r1",
        stamp={},
    )
    entries = store.read("t:v0:x:r1")
    replayed = replay(REFUNDS.machine, entries, verify=True, thread_id="t:v0:x:r1")
    assert replayed.snapshot == live.snapshot
    assert (replayed.verification, replayed.ended) == ("verified", live.status)
    assert replayed.status == live.status
    assert replayed.model_calls == live.model_calls
    assert replayed.tokens == live.input_tokens + live.output_tokens
    # The sentinel stays unreachable whatever the model does: the guards hold.
    assert live.final_state != "illegallyIssued"
    # Every prefix replays too, and the prefix's state is the journaled one at that point.
    for cut in range(1, len(entries) + 1):
        partial = replay(REFUNDS.machine, entries, upto=cut, verify=True, thread_id="t:v0:x:r1")
        assert partial.entries == cut


@settings(max_examples=60, deadline=None)
@given(
    amount=amounts,
    reason=st.sampled_from(["broken", "fraud suspected", "late"]),
    model=st.sampled_from(["careful", "naive", "sloppy"]),
    answer=st.sampled_from(
        [None, {"type": "APPROVE", "approver": "kim"}, {"type": "REJECT", "reason": "no"}]
    ),
)
def test_replay_property_on_refund_approval(amount: float, reason: str, model: str, answer: Any) -> None:
    store = MemoryStore()
    people = {"approving": [answer]} if answer else {}
    live = run(
        APPROVAL,
        input={"amount": amount, "reason": reason},
        world=APPROVAL.make_world({}),
        people=people,
        decider=PolicyDecider(V0_APPROVAL, {"decider": APPROVAL.models[model](reason)}),
        store=store,
        thread_id="t:v0:y:r1",
        stamp={},
    )
    replayed = replay(APPROVAL.machine, store.read("t:v0:y:r1"), verify=True, thread_id="t:v0:y:r1")
    assert replayed.snapshot == live.snapshot and replayed.verification == "verified"
    assert live.final_state != "illegallyIssued"


def _recorded() -> list[LogEntry]:
    store = MemoryStore()
    run(
        REFUNDS,
        input={"ticket": "broke", "customerId": "C-1", "orderId": "O-1", "amount": 40},
        world=REFUNDS.make_world(
            {
                "customers": {"C-1": {}},
                "orders": {"O-1": {"customerId": "C-1", "total": 90, "deliveredDaysAgo": 2}},
            }
        ),
        people={},
        decider=PolicyDecider(V0, {"decider": REFUNDS.models["careful"]("s")}),
        store=store,
        thread_id="t:v0:z:r1",
        stamp={},
    )
    return store.read("t:v0:z:r1")


def test_version_mismatch_names_entry_expected_and_found() -> None:
    entries = _recorded()
    newer = REFUNDS.config.model_copy(update={"version": "2"})
    with pytest.raises(
        VersionMismatchError, match=r"entry 0: version mismatch, expected refunds@2, found refunds@1"
    ):
        replay(compile_machine(newer, guards=REFUNDS.guards), entries)


def test_an_edited_output_is_named_by_the_chain_and_by_the_state_hashes() -> None:
    entries = _recorded()
    tampered = [e.model_copy(deep=True) for e in entries]
    lookup = next(e for e in tampered if e.event.get("actorId") == "lookingUpOrder")
    lookup.event["output"]["order"]["refundable"] = 10.0
    with pytest.raises(
        TamperError, match=rf"entry {lookup.index} \(xstate.done.actor, id .*\): content changed"
    ):
        replay(REFUNDS.machine, tampered, verify=True, thread_id="t:v0:z:r1")
    # Chained again after the edit (what someone who recomputes every hash would do), the chain holds;
    # the state hashes still see that the output no longer leads where the run went.
    resealed = rechained(tampered, "t:v0:z:r1")
    with pytest.raises(DivergenceError, match=rf"entry {lookup.index} \(xstate.done.actor\) diverges"):
        replay(REFUNDS.machine, resealed, verify=True, thread_id="t:v0:z:r1")
    # Without verification, the refused decision still gives it away: the machine does not accept it.
    with pytest.raises(LogError, match=r"entry \d+ \(REFUND\) is not accepted in state 'choosingResolution'"):
        replay(REFUNDS.machine, tampered)


def test_a_state_hash_edited_in_its_last_digit_is_shown_far_enough_to_tell_it_apart() -> None:
    entries = [e.model_copy(deep=True) for e in _recorded()]
    edited = next(e for e in entries if e.verification is not None and e.verification.stateHash)
    assert edited.verification is not None and edited.verification.stateHash is not None
    right = edited.verification.stateHash
    wrong = right[:-1] + ("0" if right[-1] != "0" else "1")
    edited.verification.stateHash = wrong
    with pytest.raises(DivergenceError) as raised:
        replay(REFUNDS.machine, rechained(entries, "t:v0:z:r1"), verify=True, thread_id="t:v0:z:r1")
    assert f"the journal says state hash {wrong}, replay reached {right} in state" in str(raised.value)


def rechained(entries: list[LogEntry], thread_id: str) -> list[LogEntry]:
    out: list[LogEntry] = []
    previous = thread_id
    for entry in entries:
        out.append(seal(entry, previous))
        previous = out[-1].verification.entryHash  # type: ignore[assignment,union-attr]
    return out


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda es: es[1:], "entry 0 is 'xstate.done.actor'"),
        (lambda es: [es[0], *es[2:]], "has index 2; indices must be contiguous"),
        (lambda es: [], "the thread is empty"),
        (
            lambda es: [es[0], es[1].model_copy(update={"machineId": "other"}), *es[2:]],
            "entry 1 was recorded by machine other@1, expected refunds@1",
        ),
        (
            lambda es: [es[0], es[1].model_copy(update={"threadId": "another:v0:x:s:r1"}), *es[2:]],
            "entry 1 belongs to thread 'another:v0:x:s:r1'",
        ),
        (
            lambda es: [es[0], es[0].model_copy(update={"index": 1}), *es[2:]],
            "entry 1 is a second '@agent.init'",
        ),
        (
            lambda es: [es[0], es[1].model_copy(update={"machineVersion": "9"}), *es[2:]],
            "entry 1: version mismatch, expected refunds@1, found refunds@9",
        ),
        # The log's shape is judged before what its entries say: an event the machine refuses, then a
        # wrong version further on, is named by the version (the fold checks the shape in its own pass).
        (
            lambda es: [
                es[0],
                es[1].model_copy(update={"event": {"type": "NOT_AN_EVENT"}}),
                *es[2:-1],
                es[-1].model_copy(update={"machineVersion": "9"}),
            ],
            r"entry \d+: version mismatch, expected refunds@1, found refunds@9",
        ),
    ],
)
def test_invalid_logs_are_refused(mutate: Any, message: str) -> None:
    with pytest.raises(LogError, match=message):
        replay(REFUNDS.machine, mutate(_recorded()))


# --- the hash chain: a real thread, tampered with every way, and the unchained form ----------------------

THREAD = "train:v0:naive:partial-refund-01:r1"
V1_FIXTURE = REPO / "tests" / "fixtures" / "v1" / f"{THREAD}.jsonl"
runner = CliRunner()


@pytest.fixture(scope="module")
def recorded_lines(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The lines of a real thread, written by `improve run` in a copy of the workspace."""
    ws = copy_workspace(tmp_path_factory.mktemp("ws"))
    args = ["run", "-w", str(ws), "--env", "refunds", "--policy", "v0", "--model", "naive"]
    result = runner.invoke(app, [*args, "--scenario", "partial-refund-01", "--k", "1"])
    assert result.exit_code in (0, 1), result.output  # 1: the naive model fails the scenario
    return [json.loads(line) for line in (ws / "traces" / f"{THREAD}.jsonl").read_text().splitlines()]


def at(lines: list[dict[str, Any]], test: Callable[[dict[str, Any]], bool]) -> int:
    return next(i for i, line in enumerate(lines) if test(line))


def _usage(ls: list[dict[str, Any]]) -> int:
    return at(ls, lambda e: e["event"]["type"] == "@agent.usage")


def _edit(where: Callable[[list[dict[str, Any]]], int], change: Callable[[dict[str, Any]], None]) -> Tamper:
    def tamper(ls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        i = where(ls)
        change(ls[i])
        return ls, i

    return tamper


def _remove(ls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    i = _usage(ls)
    return ls[:i] + ls[i + 1 :], i


def _remove_and_renumber(ls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    i = _usage(ls)
    rest = ls[:i] + ls[i + 1 :]
    for n, line in enumerate(rest):
        line["index"] = n
    return rest, i


def _insert(ls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    i = _usage(ls) + 1
    forged = copy.deepcopy(ls[i - 1])
    forged.update(id="forged", index=i)
    forged["event"]["inputTokens"] = 1
    return [*ls[:i], forged, *ls[i:]], i


def _duplicate(ls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    i = _usage(ls)
    return [*ls[: i + 1], copy.deepcopy(ls[i]), *ls[i + 1 :]], i + 1


def _swap(ls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    ls[1], ls[2] = ls[2], ls[1]
    return ls, 1


def _downgrade(ls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    i = _usage(ls)
    ls[i]["schemaVersion"] = 1
    del ls[i]["verification"]
    return ls, i


def _output(line: dict[str, Any]) -> None:
    line["event"]["output"]["order"]["refunded"] = 0.0  # the refund already paid, in a tool's output


def _effect(line: dict[str, Any]) -> None:
    line["event"]["effects"][0]["kind"] = "nothing-happened"


def _attempt(line: dict[str, Any]) -> None:
    line["attempts"][0]["reason"] = "the decider was right all along"


Tamper = Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], int]]
TAMPERS: dict[str, tuple[Tamper, str]] = {
    # name: (the tampering, the kind of finding)
    "an event field": (_edit(lambda ls: 0, lambda e: e["event"]["input"].update(ticket="edited")), "changed"),
    "an actor's output": (
        _edit(lambda ls: at(ls, lambda e: e["event"].get("actorId") == "lookingUpOrder"), _output),
        "changed",
    ),
    "an effect": (_edit(lambda ls: at(ls, lambda e: "effects" in e["event"]), _effect), "changed"),
    "a usage entry's counts": (_edit(_usage, lambda e: e["event"].update(inputTokens=1, calls=0)), "changed"),
    "an attempt": (_edit(lambda ls: at(ls, lambda e: bool(e.get("attempts"))), _attempt), "changed"),
    "recordedAt": (_edit(lambda ls: 2, lambda e: e.update(recordedAt="2020-01-01T00:00:00Z")), "changed"),
    "removing an entry": (_remove, "missing"),
    "removing an entry and renumbering": (_remove_and_renumber, "missing"),
    "inserting one": (_insert, "inserted"),
    "duplicating one": (_duplicate, "inserted"),
    "swapping two": (_swap, "reordered"),
    "downgrading one to version 1": (_downgrade, "changed"),
}
WORDS = {
    "changed": "content changed",
    "missing": "missing",
    "inserted": "inserted",
    "reordered": "order changed",
}


def _entries(lines: list[dict[str, Any]]) -> list[LogEntry]:
    return [LogEntry.model_validate(line) for line in lines]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("inputTokens", 10**30),
        ("inputTokens", -5),
        ("inputTokens", "lots"),
        ("inputTokens", 1.5),
        ("inputTokens", True),
        ("calls", -1),
        ("calls", False),
        ("outputTokens", 10**8 + 1),
        ("costUsd", float("nan")),
        ("costUsd", -0.5),
        ("costUsd", True),
        ("costUsd", "0.1"),
    ],
)
def test_a_usage_count_no_endpoint_could_mean_fails_its_thread_alone(
    recorded_lines: list[dict[str, Any]], name: str, value: Any
) -> None:
    """An older improve journaled whatever usage an endpoint claimed: chained as written, the thread
    still does not replay (a warehouse would sink its whole batch on a 10**30 count), whichever of the
    counts (or the cost) it is."""
    lines = copy.deepcopy(recorded_lines)
    i = _usage(lines)
    lines[i]["event"][name] = value
    for line in lines:
        line["verification"].pop("entryHash", None)
    resealed = rechained(_entries(lines), THREAD)
    what = "not a cost in USD" if name == "costUsd" else "not a count"
    with pytest.raises(LogError, match=rf"entry {i} \(@agent.usage\): {name} is .*, {what}"):
        replay(REFUNDS.machine, resealed, verify=True, thread_id=THREAD)


def test_a_real_thread_is_chained_and_ended(recorded_lines: list[dict[str, Any]]) -> None:
    assert all(
        line["schemaVersion"] == 2 and len(line["verification"]["entryHash"]) == 32 for line in recorded_lines
    )
    assert recorded_lines[-1]["event"] == {"type": "@agent.end", "status": "done"}
    result = replay(REFUNDS.machine, _entries(recorded_lines), verify=True, thread_id=THREAD)
    assert (result.verification, result.status, result.ended) == ("verified", "done", "done")
    assert replay(REFUNDS.machine, _entries(recorded_lines)).verification == "unverified"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TAMPERS))
def test_each_tampering_is_named_with_its_entry_and_kind(
    recorded_lines: list[dict[str, Any]], name: str, tmp_path: Path
) -> None:
    tamper, kind = TAMPERS[name]
    lines, index = tamper(copy.deepcopy(recorded_lines))
    with pytest.raises(TamperError) as info:
        replay(REFUNDS.machine, _entries(lines), verify=True, thread_id=THREAD)
    assert (info.value.index, info.value.kind) == (index, kind), str(info.value)
    assert f"entry {index} (" in str(info.value) and WORDS[kind] in str(info.value)
    # The same through the command line: exit 1, the entry and what is wrong with it on stderr. The file
    # is laid out as improve writes it, so the command checks the chain over the lines as written
    # (`line_content`); the entries above, without their lines, were written again (`content_bytes`).
    ws = copy_workspace(tmp_path)
    path = ws / "traces" / f"{THREAD}.jsonl"
    path.parent.mkdir()
    path.write_text("".join(LogEntry.model_validate(line).to_line() + "\n" for line in lines))
    result = runner.invoke(app, ["replay", "-w", str(ws), THREAD, "--verify", "--json"])
    assert result.exit_code == 1, result.output
    assert (
        "TAMPERED" in result.stderr and f"entry {index} (" in result.stderr and WORDS[kind] in result.stderr
    )
    doc = json.loads(result.stdout)
    assert doc["tampered"] == 1 and (doc["threads"][0]["entry"], doc["threads"][0]["kind"]) == (index, kind)
    if name in ("duplicating one", "swapping two"):
        # Ingest keys entries by their index: an identical line twice is one entry (ingest is idempotent)
        # and lines out of order in the file are put back in order, so the warehouse holds the thread whole.
        return
    # Ingest: the thread lands nowhere a score reads; the quarantine (or a rejected line) names the entry.
    ingested = runner.invoke(app, ["ingest", "-w", str(ws), str(path.parent), "--allow-rejects", "--json"])
    assert ingested.exit_code == 0, ingested.output
    sql = ["sql", "-w", str(ws), "--format", "json"]
    outcomes = json.loads(
        runner.invoke(app, [*sql, f"SELECT * FROM outcomes WHERE thread_id = '{THREAD}'"]).stdout
    )
    aside = json.loads(runner.invoke(app, [*sql, "SELECT reason FROM quarantine"]).stdout)
    rejected = json.loads(runner.invoke(app, [*sql, "SELECT line, error FROM rejected_lines"]).stdout)
    assert outcomes == []
    assert (aside and f"entry {index} (" in aside[0]["reason"]) or any(
        r["line"] == index + 1 for r in rejected
    ), (
        aside,
        rejected,
    )


def test_the_lines_improve_writes_are_verified_as_written(tmp_path: Path) -> None:
    """A thread's lines are the canonical text its hashes cover, with `entryHash` and `threadId` put in
    (`LogEntry.to_line`), so `--verify` hashes them as they are (`line_content`); the same entries laid
    out otherwise verify the slower way, and an edit of the bytes is named either way."""
    ws = copy_workspace(tmp_path)
    args = ["run", "-w", str(ws), "--env", "refunds", "--policy", "v0", "--model", "naive"]
    assert runner.invoke(app, [*args, "--scenario", "partial-refund-01", "--k", "1"]).exit_code in (0, 1)
    path = ws / "traces" / f"{THREAD}.jsonl"
    written = path.read_bytes().splitlines()
    for line in written:
        keys = list(json.loads(line))  # a thread's own file leaves out the threadId its name says
        assert keys == sorted(keys) and "threadId" not in keys, keys
        entry = decode_entry(line)
        assert isinstance(entry, BulkEntry)
        assert line_content(line, entry) == content_bytes(entry)
        # Any other layout of the same entry is not taken for it: the caller writes the content again.
        moved = json.dumps({"threadId": THREAD, **json.loads(line)}, separators=(",", ":")).encode()
        assert line_content(moved, decode_entry(moved)) is None  # type: ignore[arg-type]

    def verify(lines: list[bytes]) -> Any:
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        return runner.invoke(app, ["replay", "-w", str(ws), THREAD, "--verify", "--json"])

    assert json.loads(verify(written).stdout)["threads"][0]["verification"] == "verified"
    entries = [decode_entry(line) for line in written]
    with pytest.raises(LogError, match="one line per entry: 2 line"):
        replay(REFUNDS.machine, entries, verify=True, thread_id=THREAD, lines=written[:2])
    # A file of many threads: every line ends with its threadId, and is still hashed as written.
    carried = [
        LogEntry.model_validate({**json.loads(line), "threadId": THREAD}).to_line().encode()
        for line in written
    ]
    for line in carried:
        keys = list(json.loads(line))
        assert keys[-1] == "threadId" and keys[:-1] == sorted(keys[:-1]), keys
        assert line_content(line, decode_entry(line)) == content_bytes(decode_entry(line))  # type: ignore[arg-type]
    many = tmp_path / "many.jsonl"
    many.write_bytes(b"".join(line + b"\n" for line in carried))
    replayed = runner.invoke(app, ["replay", "-w", str(ws), str(many), "--verify", "--json"])
    assert json.loads(replayed.stdout)["threads"][0]["verification"] == "verified", replayed.output
    shuffled = [json.dumps(dict(reversed(json.loads(line).items()))).encode() for line in written]
    assert json.loads(verify(shuffled).stdout)["threads"][0]["verification"] == "verified"
    # An amount edited in the bytes as written: the entry is named, its content changed.
    lookup = next(i for i, line in enumerate(written) if b'"lookingUpOrder"' in line)
    edited = list(written)
    edited[lookup] = edited[lookup].replace(b'"refundable":', b'"refundable":1', 1)
    assert edited[lookup] != written[lookup]
    result = verify(edited)
    assert result.exit_code == 1, result.output
    assert f"entry {lookup} (xstate.done.actor" in result.stderr and "content changed" in result.stderr
    # A key spliced in where the line's end is still as written (the fast path's cut matches): a
    # duplicate, which the decoder takes over the hashed one, is caught, with the entry of each kind.
    for kind, key in (("usage", b'"event":{"type":"@agent.usage","calls":0},'), ("state", b'"index":0,')):
        spliced = list(written)
        at_ = next(
            i for i, line in enumerate(written) if (b'"stateHash"' in line) == (kind == "state") and i > 0
        )
        spliced[at_] = spliced[at_].replace(b'"verification":', key + b'"verification":', 1)
        result = verify(spliced)
        assert result.exit_code == 1 and f"entry {at_} (" in result.stderr, (kind, result.output)
    # Moved into another thread's file, the lines still name their own thread: caught at entry 0.
    other = "held-out:v0:naive:partial-refund-01:r2"
    (ws / "traces" / f"{other}.jsonl").write_bytes(b"".join(line + b"\n" for line in written))
    moved_in = runner.invoke(app, ["replay", "-w", str(ws), other, "--verify"])
    assert moved_in.exit_code == 1 and "entry 0 (@agent.init" in moved_in.stderr, moved_in.output


def test_the_reported_problem_a_refund_and_usage_edited_together(
    recorded_lines: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The tampering that used to pass --verify: a refund amount in a tool's output and the usage counts."""
    lines = copy.deepcopy(recorded_lines)
    lookup = at(lines, lambda e: e["event"].get("actorId") == "lookingUpOrder")
    _output(lines[lookup])
    for line in lines:
        if line["event"]["type"] == "@agent.usage":
            line["event"].update(inputTokens=0, outputTokens=0)
    ws = copy_workspace(tmp_path)
    (ws / "traces").mkdir()
    path = ws / "traces" / f"{THREAD}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = runner.invoke(app, ["replay", "-w", str(ws), str(path), "--verify"])
    assert result.exit_code == 1, result.output
    assert f"entry {lookup} (xstate.done.actor" in result.stderr and "content changed" in result.stderr


def test_a_truncated_thread_is_incomplete_never_verified(
    recorded_lines: list[dict[str, Any]], tmp_path: Path
) -> None:
    lines = copy.deepcopy(recorded_lines)[:-1]  # the end entry removed: every hash still checks
    result = replay(REFUNDS.machine, _entries(lines), verify=True, thread_id=THREAD)
    assert (result.verification, result.ended, result.status) == ("incomplete", None, "done")
    ws = copy_workspace(tmp_path)
    (ws / "traces").mkdir()
    (ws / "traces" / f"{THREAD}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    cli = runner.invoke(app, ["replay", "-w", str(ws), THREAD, "--verify", "--json"])
    assert cli.exit_code == 1, cli.output
    assert f"INCOMPLETE {THREAD}" in cli.stderr and "no @agent.end entry" in cli.stderr
    doc = json.loads(cli.stdout)
    assert doc["incomplete"] == 1 and doc["threads"][0]["verification"] == "incomplete"
    # Without --verify nothing is checked, and nothing fails.
    assert runner.invoke(app, ["replay", "-w", str(ws), THREAD]).exit_code == 0
    # Ingested, it is set aside, and counted as such alone: not also as scored.
    ingested = runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces"), "--json"])
    outcomes = json.loads(ingested.stdout)["outcomes"]
    assert (outcomes["replayed"], outcomes["scored"], outcomes["quarantined"]) == (0, 0, 1), outcomes
    said = runner.invoke(
        app, ["ingest", "-w", str(ws), str(ws / "traces"), "--db", str(tmp_path / "b.duckdb")]
    )
    assert "outcomes: 0 thread(s) replayed (0 scored, 0 failed)" in said.stderr, said.stderr


def test_a_thread_renamed_into_another_is_caught_at_entry_0(
    recorded_lines: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A passing run copied in as another run of the scenario (or into held-out) does not verify."""
    other = "held-out:v0:naive:partial-refund-01:r2"
    # Its lines say which run it was, and it chains to that id: said, with the name to give it back.
    with pytest.raises(
        TamperError, match="renamed: it was recorded as thread 'train:v0:naive:partial-refund-01:r1'"
    ) as info:
        replay(REFUNDS.machine, _entries(recorded_lines), verify=True, thread_id=other)
    assert (info.value.index, info.value.kind) == (0, "renamed")
    assert "name its file train:v0:naive:partial-refund-01:r1.jsonl again" in str(info.value)
    # Edited as well: its content changed (or it was recorded under yet another id).
    edited = [dict(line) for line in recorded_lines]
    edited[0] = {**edited[0], "metadata": {**edited[0]["metadata"], "run": 7}}
    with pytest.raises(TamperError, match="recorded under another id") as info:
        replay(REFUNDS.machine, _entries(edited), verify=True, thread_id=other)
    assert (info.value.index, info.value.kind) == (0, "changed")
    ws = copy_workspace(tmp_path)
    (ws / "traces").mkdir()
    (ws / "traces" / f"{other}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in recorded_lines))
    result = runner.invoke(app, ["replay", "-w", str(ws), other, "--verify"])
    assert result.exit_code == 1 and "entry 0 (@agent.init" in result.stderr


def test_an_entry_after_the_end_is_refused(recorded_lines: list[dict[str, Any]]) -> None:
    lines = copy.deepcopy(recorded_lines)
    extra = copy.deepcopy(lines[_usage(lines)])
    extra.update(id="late", index=len(lines))
    with pytest.raises(TamperError, match=r"inserted: it comes after the run's @agent\.end entry"):
        replay(REFUNDS.machine, _entries([*lines, extra]), verify=True, thread_id=THREAD)
    # Chained properly after the end (a writer that kept going), the log's shape still refuses it.
    entries = rechained(_entries([*lines, extra]), THREAD)
    with pytest.raises(LogError, match=r"is '@agent\.end' but 1 entries follow it"):
        replay(REFUNDS.machine, entries)


def test_an_end_entry_that_disagrees_with_replay_diverges(recorded_lines: list[dict[str, Any]]) -> None:
    lines = copy.deepcopy(recorded_lines)
    lines[-1]["event"]["status"] = "idle"  # and chained again, so only the status check can see it
    with pytest.raises(DivergenceError, match="recorded status 'idle' as it ended, replay derives 'done'"):
        replay(REFUNDS.machine, rechained(_entries(lines), THREAD), verify=True, thread_id=THREAD)


def test_verifying_a_chained_thread_needs_its_id(recorded_lines: list[dict[str, Any]]) -> None:
    with pytest.raises(LogError, match="needs its thread id"):
        replay(REFUNDS.machine, _entries(recorded_lines), verify=True)
    # Lines that carry their threadId (a file of many threads) name it themselves.
    carried = [{**line, "threadId": THREAD} for line in recorded_lines]
    assert replay(REFUNDS.machine, _entries(carried), verify=True).verification == "verified"


def test_a_version_1_thread_still_replays_and_verifies_as_unchained(tmp_path: Path) -> None:
    """A thread written before the chain (by the previous release: no entryHash, no end entry)."""
    entries = [LogEntry.model_validate_json(line) for line in V1_FIXTURE.read_text().splitlines()]
    assert {e.schemaVersion for e in entries} == {1}
    result = replay(REFUNDS.machine, entries, verify=True, thread_id=THREAD)
    assert (result.verification, result.final_state, result.ended) == ("unchained", "escalated", None)
    # Its state hashes are still checked ...
    changed = [e.model_copy(deep=True) for e in entries]
    lookup = next(e for e in changed if e.event.get("actorId") == "lookingUpOrder")
    lookup.event["output"]["order"]["deliveredDaysAgo"] = 400
    with pytest.raises(DivergenceError, match=rf"entry {lookup.index} \(xstate.done.actor\) diverges"):
        replay(REFUNDS.machine, changed, verify=True)
    # ... and the command line reports it as unchained, which is not a failure unless asked.
    ws = copy_workspace(tmp_path)
    (ws / "traces").mkdir()
    shutil.copy(V1_FIXTURE, ws / "traces")
    ok = runner.invoke(app, ["replay", "-w", str(ws), THREAD, "--verify", "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["unchained"] == 1 and doc["threads"][0]["verification"] == "unchained"
    assert "unchained (schemaVersion 1)" in ok.stderr
    strict = runner.invoke(app, ["replay", "-w", str(ws), THREAD, "--verify", "--require-chain"])
    assert strict.exit_code == 1, strict.output


def test_the_entry_hash_is_what_the_contract_says(recorded_lines: list[dict[str, Any]]) -> None:
    """Recomputed from the lines alone, as another language would: sha256 of canonical [previous, content]."""
    previous = THREAD
    for line in recorded_lines:
        content = copy.deepcopy(line)
        content.pop("threadId", None)
        link = content["verification"].pop("entryHash")
        if not content["verification"]:
            del content["verification"]
        text = json.dumps([previous, content], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert hashlib.sha256(text.encode()).hexdigest()[:32] == link
        previous = link


# --- a thread file that is not text, or nests too deep: a message with the line, exit 3, no traceback ----


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b'{"schemaVersion": 2, "event": {"type": "\xff\xfe"}}\n',
            ":1: not a log entry: not UTF-8 text: invalid byte at offset 40",
        ),
        (bytes(range(10, 256)) * 4, ":2: not a log entry: not UTF-8 text: invalid byte at offset 117"),
        (
            b'{"event": {"x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}}\n",
            ":1: not a log entry: JSON nested too deep: 10,002 levels, the limit is 128",
        ),
    ],
    ids=["invalid-utf8", "binary", "nested-10000-deep"],
)
def test_replay_of_a_file_that_is_not_a_thread_says_which_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    ws = copy_workspace(tmp_path / "ws")
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    result = CliRunner().invoke(app, ["replay", "-w", str(ws), str(path)])
    assert result.exit_code == 1, result.output  # named as invalid, as a thread that does not fold is
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert f"INVALID {path}{message}" in " ".join(result.stderr.split())


def test_a_thread_with_a_line_that_is_no_entry_is_named_and_the_others_still_replay(
    recorded_lines: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A directory of threads, one with a garbage line: that one is invalid (its file and line named),
    the others replay and verify, the table says not every thread verified, and the exit is 1. A thread
    file whose last line is cut short says so beside its verdict."""
    ws = copy_workspace(tmp_path / "ws")
    folder = tmp_path / "threads"
    folder.mkdir()
    good = "".join(json.dumps(line) + "\n" for line in recorded_lines)
    (folder / f"{THREAD}.jsonl").write_text(good)
    other = THREAD.replace(":r1", ":r9")
    lines = good.splitlines(keepends=True)
    (folder / f"{other}.jsonl").write_text("".join([*lines[:2], "{not json\n", *lines[2:]]))
    result = runner.invoke(app, ["replay", "-w", str(ws), str(folder), "--verify"])
    assert result.exit_code == 1, result.output
    assert f"INVALID {folder / other}.jsonl, line 3: not a valid log entry" in " ".join(result.stderr.split())
    assert "replayed 2 thread(s) (1 did not verify)" in result.stdout and "verified" in result.stdout
    # The verdict in the verification column, beside no final state (the replay stopped).
    (row,) = [line for line in result.stdout.splitlines() if "invalid" in line]
    assert row.rstrip(" │|").endswith("invalid") and "│ -" in row, row
    # In the workspace's traces, by id: a store reads whole lines only, and the end entry cut short is
    # left out, as a torn write is, and said so.
    (ws / "traces").mkdir(exist_ok=True)
    (ws / "traces" / f"{THREAD}.jsonl").write_text("".join(lines[:-1]) + lines[-1][:40])
    torn = runner.invoke(app, ["replay", "-w", str(ws), THREAD, "--verify", "--json"])
    assert torn.exit_code == 1, torn.output
    said = " ".join(torn.stderr.split())
    assert (
        "ends with a line cut short (no line break)" in said
        and "(its file's last line was cut short)" in said
    )
    assert json.loads(torn.stdout)["threads"][0]["torn"]


@pytest.mark.parametrize("text", [b"\xef\xbb\xbf", b"  \t", b"\n\n   "])
def test_a_file_that_ends_blank_is_not_said_to_be_cut_short(tmp_path: Path, text: bytes) -> None:
    """A file holding only a BOM, or blanks after its last line break, has no line cut short: it is
    empty (exit 3), and no warning says a torn write was left out."""
    path = tmp_path / "blank.jsonl"
    path.write_bytes(text)
    result = runner.invoke(app, ["replay", str(path)])
    assert result.exit_code == 3, result.output
    assert "cut short" not in result.stderr and "is empty" in result.stderr, result.stderr


def test_a_torn_last_line_longer_than_a_line_may_be_is_left_out_whole(
    recorded_lines: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A last line with no line break and longer than any entry may be (a torn write of a huge line): left
    out from its start, so the whole thread before it replays and verifies (it was cut MAX_LINE_BYTES from
    the end, inside the line, and the rest of the line read as an entry: INVALID)."""
    from improve.log import MAX_LINE_BYTES

    ws = copy_workspace(tmp_path / "ws")
    text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in recorded_lines)
    path = tmp_path / f"{THREAD}.jsonl"
    path.write_bytes(text.encode() + b'{"k":"' + b"y" * (MAX_LINE_BYTES + (1 << 20)))
    result = runner.invoke(app, ["replay", "-w", str(ws), str(path), "--verify", "--json"])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 0, said
    assert f"warning: {path} ends with a line cut short (no line break): left out" in said, said
    (thread,) = json.loads(result.stdout)["threads"]
    assert (thread["verification"], thread["entries"]) == ("verified", len(recorded_lines))


@pytest.mark.parametrize("cut", [2, 40, 100])
def test_a_torn_last_line_reads_the_same_by_path_as_in_a_directory(
    recorded_lines: list[dict[str, Any]], tmp_path: Path, cut: int
) -> None:
    """A thread file whose last bytes were lost (no final line break): given by path it was INVALID (the
    cut line is no JSON), in a directory its line was left out as a torn write and the thread INCOMPLETE.
    Both now say the latter (docs/cli.md, replay); a whole last entry missing only its line break reads."""
    ws = copy_workspace(tmp_path / "ws")
    text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in recorded_lines)
    folder = tmp_path / "threads"
    folder.mkdir()
    path = folder / f"{THREAD}.jsonl"
    path.write_text(text[: -cut - 1])  # the line break and `cut` bytes before it
    verdicts = []
    for target in (path, folder):
        result = runner.invoke(app, ["replay", "-w", str(ws), str(target), "--verify", "--json"])
        assert result.exit_code == 1, result.output
        said = " ".join(result.stderr.split())
        assert f"warning: {path} ends with a line cut short (no line break): left out" in said, said
        assert f"INCOMPLETE {THREAD}: its {len(recorded_lines) - 1} entries chain" in said, said
        assert "INVALID" not in said and "Invalid JSON" not in said
        (thread,) = json.loads(result.stdout)["threads"]
        verdicts.append((thread["verification"], thread["entries"], bool(thread["torn"])))
    assert verdicts[0] == verdicts[1] == ("incomplete", len(recorded_lines) - 1, True)
    path.write_text(text[:-1])  # only the final line break lost: the last entry is whole
    whole = runner.invoke(app, ["replay", "-w", str(ws), str(path), "--verify", "--json"])
    assert whole.exit_code == 0, whole.output
    assert json.loads(whole.stdout)["threads"][0]["verification"] == "verified"


def test_replay_reads_a_thread_with_a_byte_order_mark(tmp_path: Path) -> None:
    ws = copy_workspace(tmp_path / "ws")
    runner = CliRunner()
    thread = "train:v0:naive:small-refund-01:r1"
    ran = runner.invoke(
        app, ["run", "-w", str(ws), "--split", "train", "--k", "1", "--scenario", "small-refund-01"]
    )
    assert ran.exit_code == 0, ran.output
    path = tmp_path / f"{thread}.jsonl"  # entry 0 is chained to the thread id, which is the file's name
    path.write_bytes(b"\xef\xbb\xbf" + (ws / "traces" / f"{thread}.jsonl").read_bytes())
    result = runner.invoke(app, ["replay", "-w", str(ws), str(path), "--verify", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["threads"][0]["verification"] == "verified"


def test_a_replay_result_cannot_be_edited_after_the_fact() -> None:
    import dataclasses

    result = replay(REFUNDS.machine, _recorded())
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.status = "done"  # type: ignore[misc]
    # Built field by field (replay skips the dataclass's __init__): every field, and nothing else, once
    # its snapshot, built when first read, is.
    names = {field.name for field in dataclasses.fields(result)}
    assert result.final_state == "issued" and "snapshot" not in vars(result)
    assert result.snapshot == replay(REFUNDS.machine, _recorded()).snapshot
    assert set(vars(result)) == names
    assert result == dataclasses.replace(result)


def test_a_replay_results_snapshot_is_built_when_read_and_travels_with_it() -> None:
    """replay leaves the snapshot to be built when it is first read: a result compares, copies and pickles
    with it built (a pickle holds the snapshot, never the fold it is built from), and it is the snapshot the
    interpreter reaches."""
    import copy
    import pickle

    from improve.machine import initial, transition

    entries = _recorded()
    snapshot = initial(REFUNDS.machine, entries[0].event.get("input"))
    for entry in entries[1:]:
        if entry.type not in ("@agent.usage", "@agent.end"):
            snapshot = transition(REFUNDS.machine, snapshot, entry.event)
    for read in (pickle.loads, copy.copy, copy.deepcopy):
        result = replay(REFUNDS.machine, entries)
        data = pickle.dumps(result) if read is pickle.loads else result
        again = read(data)  # type: ignore[operator]
        assert "_snapshot_of" not in vars(again)
        assert again.snapshot == snapshot and again == replay(REFUNDS.machine, entries)
    assert repr(replay(REFUNDS.machine, entries)) == repr(result)
    with pytest.raises(AttributeError, match="no attribute 'snapshots'"):
        result.snapshots  # type: ignore[attr-defined]  # noqa: B018


def test_run_status_names_each_way_a_run_ends() -> None:
    from improve.log.replay import run_status
    from improve.machine.snapshot import Invocation, Snapshot

    def status(snapshot: Snapshot, calls: int = 0, stamp: dict[str, Any] | None = None) -> str:
        return run_status(REFUNDS.machine, snapshot, calls, stamp or {})

    idle = next(n for n, s in REFUNDS.machine.states.items() if s.idle)
    assert status(Snapshot("done", {}, status="done")) == "done"
    assert status(Snapshot(idle, {}, status="error", error={"kind": "tool-failed"})) == "error"
    assert status(Snapshot(idle, {}, status="error", error="boom")) == "error"
    for kind in ("decision-exhausted", "no-options"):
        assert status(Snapshot(idle, {}, status="error", error={"kind": kind})) == "decision-exhausted"
    assert status(Snapshot(idle, {})) == "waiting"
    decide = Invocation("d", "agent.decide", input={})
    assert status(Snapshot(idle, {}, invoke=decide), 3, {"maxModelCalls": 3}) == "budget"
    assert status(Snapshot(idle, {}, invoke=decide), 2, {"maxModelCalls": 3}) == "incomplete"
    assert status(Snapshot(idle, {}, invoke=Invocation("t", "lookupOrder", input={}))) == "incomplete"


def test_a_second_init_read_from_json_is_refused() -> None:
    """The same check whether the entry's strings are shared objects or freshly decoded ones."""
    entries = _recorded()
    again = LogEntry.model_validate(json.loads(entries[0].model_dump_json()) | {"index": 1})
    with pytest.raises(LogError, match=r"entry 1 is a second '@agent\.init'"):
        replay(REFUNDS.machine, [entries[0], again, *entries[2:]])


def test_the_stamp_is_the_init_entrys_metadata(recorded_lines: list[dict[str, Any]]) -> None:
    metadata = recorded_lines[0]["metadata"]
    assert metadata, "a real run stamps its init entry"
    assert replay(REFUNDS.machine, _entries(recorded_lines)).stamp == metadata
    bare = copy.deepcopy(recorded_lines)
    bare[0]["metadata"] = None
    assert replay(REFUNDS.machine, _entries(bare)).stamp == {}
