"""tool-loop: opencli's guarded agent loop as a machine, with its guards as registered objects.

Covered here: each built-in guard alone (pass, and block with its exact reason); a new guard changes
the loop's behaviour by being registered, with the machine untouched; every firing is a journaled
entry and a replay reaches the same snapshot; the three opencli tapes replay with counts derived by
hand from the guard rules; `improve tape replay`; exploration proofs of the turn budget; the rule
evals; the stand-in models; and a full improvement round that promotes a candidate.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import git
import pytest
import typer
from typer.testing import CliRunner

from improve.cli.tape import tape_app
from improve.errors import ConfigError, TapeError, VersionMismatchError
from improve.evals.scenarios import Scenario, load_scenarios
from improve.evals.suite import SuiteSpec, run_suite
from improve.evals.workspace import Workspace
from improve.examples.tool_loop import guards as g
from improve.examples.tool_loop.calls import ToolCall, calls_text, os_error_code, parse_calls, signature
from improve.examples.tool_loop.env import environment
from improve.examples.tool_loop.guards import Checkpoint, GuardRegistry, LoopState, Verdict, block
from improve.examples.tool_loop.rules import PROBE_CALL, bash_call, bash_ran, tool_output
from improve.examples.tool_loop.tape_replay import replay_tape, replay_tapes
from improve.examples.tool_loop.tapes import parse_tape
from improve.examples.tool_loop.world import SandboxWorld, execute_tools
from improve.log.entry import LogEntry
from improve.log.replay import replay
from improve.log.store import MemoryStore
from improve.loop import RoundOptions, run_round
from improve.machine import DONE_EVENT, Snapshot, transition
from improve.machine.describe import describe_mermaid, describe_text, to_xstate
from improve.machine.explore import can_reach, explore_paths
from improve.machine.rules import guarded_states, run_rule_evals, uncovered
from improve.runtime.decision import Decision, DecisionRequest, Usage
from improve.runtime.environment import Environment
from improve.runtime.policy import PolicyDecider, compile_policy, load_policy
from improve.runtime.run import RunResult, run
from tests.helpers import REPO, desk_workspace

TAPES = Path("/work/shared/data/opencli-tapes")
SCENARIOS = REPO / "scenarios" / "tool-loop.yaml"
POLICIES = REPO / "policies" / "tool-loop"
LS = 'bash {"command":"ls"}'


@pytest.fixture(scope="module")
def env() -> Environment:
    return environment()


def state(**fields: Any) -> LoopState:
    return LoopState(**fields)


def ls_turn(command: str = "ls") -> str:
    return calls_text([ToolCall("bash", {"command": command})])


# --- each built-in guard, alone ---------------------------------------------------------------------------


def test_max_turns_passes_below_the_budget_and_blocks_at_it() -> None:
    guard = g.MaxTurns()
    assert (guard.name, guard.checkpoint) == ("max-turns", "before-turn")
    assert guard.check(state(turns=49, max_turns=50)) == g.PASS
    assert guard.check(state(turns=50, max_turns=50)) == block(
        "50 of 50 turns used: the turn budget is spent"
    )
    assert guard.check(state(turns=3, max_turns=3)).blocked


def test_cost_limit_blocks_the_call_that_would_cross_the_limit() -> None:
    guard = g.CostLimit()
    assert (guard.name, guard.checkpoint) == ("cost-limit", "before-turn")
    assert (
        guard.check(state(tokens=900, context_tokens=100, max_tokens=1000)) == g.PASS
    )  # exactly at the limit
    assert guard.check(state(tokens=901, context_tokens=100, max_tokens=1000)) == block(
        "the next model call would bring the spend to 1001 tokens, over the cost limit of 1000"
    )


def test_stuck_loop_blocks_the_third_identical_turn_whatever_the_key_order_or_spacing() -> None:
    guard = g.StuckLoop()
    assert (guard.name, guard.checkpoint) == ("stuck-loop", "before-tools")
    spaced = '[{"args": {"command": "ls"},   "name": "bash"}]'
    assert guard.check(state(calls_text=spaced, last_signature=LS, identical_turns=1)) == g.PASS
    assert guard.check(state(calls_text=spaced, last_signature=LS, identical_turns=2)) == block(
        f"3 consecutive turns with identical tool calls: {LS}"
    )
    # Another argument, another tool, or no call at all is not a repeat.
    assert guard.check(state(calls_text=ls_turn("ls -la"), last_signature=LS, identical_turns=2)) == g.PASS
    other = calls_text([ToolCall("read", {"command": "ls"})])
    assert guard.check(state(calls_text=other, last_signature=LS, identical_turns=2)) == g.PASS
    assert guard.check(state(calls_text="", last_signature="", identical_turns=2)) == g.PASS
    assert (
        g.StuckLoop(repeats=2).check(state(calls_text=spaced, last_signature=LS, identical_turns=1)).blocked
    )


def test_environment_error_loop_blocks_on_the_third_error_turn() -> None:
    guard = g.EnvironmentErrorLoop()
    assert (guard.name, guard.checkpoint) == ("environment-error-loop", "after-tools")
    assert guard.check(state(error_turns=2, last_error="EACCES")) == g.PASS
    assert guard.check(state(error_turns=3, last_error="EACCES")) == block(
        "3 consecutive turns whose tool results contain an OS error (last: EACCES)"
    )


def test_empty_response_allows_one_retry() -> None:
    guard = g.EmptyResponse()
    assert (guard.name, guard.checkpoint) == ("empty-response", "after-response")
    assert guard.check(state(empty_responses=1)) == g.PASS
    assert guard.check(state(empty_responses=2)) == block(
        "2 empty model responses in a row (1 retry allowed)"
    )


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("ls: /root: EPERM: permission denied", "EPERM"),  # the explicit code wins
        ("/bin/ps: Operation not permitted\nError: Exited with code 1", "EPERM"),
        ("/bin/sh: ./deploy.sh: Permission denied", "EACCES"),
        ("OSError: [Errno 28] No space left on device", "ENOSPC"),
        ("fatal: Unable to create '.git/index.lock': Read-only file system", "EROFS"),
        ("write: a.txt: EROFS: read-only file system, open 'a.txt'", "EROFS"),
        ("cat: a.txt: No such file or directory", ""),  # ENOENT: the agent can work around it
        ("/bin/sh: yarn: command not found\nError: Exited with code 127", ""),
        ("1 failed, 2 passed", ""),
    ],
)
def test_os_errors_are_the_ones_an_agent_cannot_fix(text: str, code: str) -> None:
    assert os_error_code(text) == code


def test_well_formed_calls_and_their_signature() -> None:
    calls = parse_calls('[{"name": "bash", "args": {"command": "ls"}}, {"name": "read"}]')
    assert calls == (ToolCall("bash", {"command": "ls"}), ToolCall("read", {}))
    assert signature(calls) == f"{LS} ; read {{}}"
    for bad in ("ls", "[]", '{"name": "bash"}', '[{"name": ""}]', '[{"name": "x", "args": []}]', None, "[1]"):
        assert parse_calls(bad) is None, bad
    assert parse_calls(json.dumps([{"name": "x", "extra": 1}])) is None
    assert parse_calls(json.dumps([{"name": "x"}] * 17)) is None


def test_the_loop_state_reads_the_machines_context(env: Environment) -> None:
    snapshot = _fold(env, {"task": "t"}, [bash_call("ls"), bash_ran("ls"), bash_call("ls")])
    seen = LoopState.of(snapshot.context)
    assert (seen.turns, seen.identical_turns, seen.last_signature, seen.call_signature) == (2, 1, LS, LS)
    assert (seen.max_turns, seen.max_tokens, seen.tool_turns, seen.tool_calls) == (50, 1_000_000, 1, 1)


def test_the_registry_refuses_unknown_checkpoints_and_duplicate_names() -> None:
    registry = GuardRegistry.default()
    assert registry.names == [
        "max-turns",
        "cost-limit",
        "stuck-loop",
        "environment-error-loop",
        "empty-response",
    ]
    with pytest.raises(ConfigError, match="already registered"):
        registry.register(g.StuckLoop())
    with pytest.raises(ConfigError, match="use one of"):
        registry.register(g.StuckLoop(name="late", checkpoint="after-answer"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no guard named"):
        registry.without("nope")
    # The first guard that blocks at a checkpoint wins, in registration order.
    spent = state(turns=50, max_turns=50, tokens=10**7, max_tokens=10)
    firing = registry.check("before-turn", spent)
    assert firing is not None and firing.guard == "max-turns"
    assert GuardRegistry([g.CostLimit(), g.MaxTurns()]).check("before-turn", spent).guard == "cost-limit"  # type: ignore[union-attr]
    assert registry.check("after-tools", spent) is None


# --- a new guard is registered, not written into the loop -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ForbiddenCommand:
    """A guard written outside the loop: no `rm -rf` runs, whatever the model asks."""

    pattern: str = "rm -rf"
    name: str = "forbidden-command"
    checkpoint: Checkpoint = "before-tools"

    def check(self, state: LoopState) -> Verdict:
        for call in state.calls:
            command = str(call.args.get("command", ""))
            if call.name == "bash" and self.pattern in command:
                return block(f"refused to run {command!r}: it matches {self.pattern!r}")
        return g.PASS


CLEANUP = {
    "task": "Clear the build directory and rebuild.",
    "plan": [
        {"name": "bash", "args": {"command": "rm -rf build"}},
        {"name": "bash", "args": {"command": "make"}},
    ],
}
CLEANUP_WORLD = {"commands": {"rm -rf build": "(no output)", "make": "built"}}


def v0_decider(env: Environment, model: str, seed: str = "t") -> PolicyDecider:
    policy = compile_policy(load_policy(POLICIES / "v0.json"))
    return PolicyDecider(policy, {"decider": env.models[model](seed)})


def run_once(
    env: Environment, input: dict[str, Any], world: dict[str, Any], decider: Any
) -> tuple[RunResult, list[LogEntry]]:
    store = MemoryStore()
    result = run(
        env,
        input=input,
        world=SandboxWorld(world),
        people={},
        decider=decider,
        store=store,
        thread_id="test:v0:run:r1",
    )
    return result, store.read("test:v0:run:r1")


def firings(entries: list[LogEntry]) -> list[dict[str, Any]]:
    return [
        e.event["output"] for e in entries if e.type == DONE_EVENT and e.event.get("actorId") == "guard_fired"
    ]


def test_registering_a_guard_changes_behaviour_without_touching_the_loop(env: Environment) -> None:
    machine_file = Path(g.__file__).parent / "machine.json"
    before = machine_file.read_bytes()
    plain, _ = run_once(env, CLEANUP, CLEANUP_WORLD, v0_decider(env, "careful"))
    assert plain.final_state == "done" and plain.snapshot.context["toolCalls"] == 2

    guarded = environment(GuardRegistry.default().register(ForbiddenCommand()))
    result, entries = run_once(guarded, CLEANUP, CLEANUP_WORLD, v0_decider(guarded, "careful"))
    reason = "refused to run 'rm -rf build': it matches 'rm -rf'"
    assert result.final_state == "error" and result.snapshot.output["stoppedBy"] == "forbidden-command"
    assert firings(entries) == [
        {"verdict": "block", "checkpoint": "before-tools", "guard": "forbidden-command", "reason": reason}
    ]
    assert result.snapshot.context["toolCalls"] == 0  # stopped before the tools ran
    # The loop is the same document; only the registry differs, and the version says so.
    assert machine_file.read_bytes() == before and guarded.config.states == env.config.states
    assert env.machine.version == "1" and guarded.machine.version.startswith("1+guards.")
    with pytest.raises(VersionMismatchError):
        replay(env.machine, entries)


def test_removing_a_guard_lets_the_stuck_tape_run_its_third_call(env: Environment) -> None:
    loose = environment(GuardRegistry.default().without("stuck-loop"))
    replayed = replay_tape(TAPES / "stuck-loop.jsonl", loose)
    (prompt,) = replayed.prompts
    # The third `ls` now runs, and the tape has no result for it: the original loop never ran it.
    assert (prompt.model_calls, prompt.tool_executions, prompt.firings) == (3, 2, [])
    assert prompt.missing_results == 1 and not replayed.consumed_exactly
    assert prompt.output["stoppedBy"] == "tools"


# --- every firing is journaled, and replays to the same snapshot ------------------------------------------


class Scripted:
    """A decider that answers with a function of the request (a model without a policy)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def decide(self, request: DecisionRequest) -> Decision:
        event = self.answer(request)
        return Decision(event=event, usage=[Usage("decider", "scripted", 10, 5)], source="scripted")


def alternating(request: DecisionRequest) -> dict[str, Any]:
    """A model that never stops: `ls`, `pwd`, `ls`, ... (never three identical turns in a row)."""
    return bash_call("ls" if request.facts["turn"]["used"] % 2 else "pwd")


def _token_budget_reason() -> str:
    """The cost-limit reason for token-budget-01, computed from the loop's token rules (machine.json):
    the conversation starts at 500 + size(task) / 4; each call adds its input (the conversation) and its
    output (size(calls) / 4, which also joins the conversation); the results join it as
    size(output) / 4 + 10. Before the second call: spent + conversation > 3000."""
    scenario = _scenarios()["token-budget-01"]
    task, plan = scenario.input["task"], scenario.input["plan"]
    conversation = 500 + len(task) // 4
    spent = conversation
    out = len(calls_text([ToolCall(plan[0]["name"], plan[0]["args"])])) // 4
    spent, conversation = spent + out, conversation + out
    log = scenario.world["files"]["logs/access.log"]
    text = log["repeat"] * log["times"]
    numbered = "\n".join(f"{n}\t{line}" for n, line in enumerate(text.splitlines(), start=1))
    conversation += len(numbered) // 4 + 10
    return f"the next model call would bring the spend to {spent + conversation} tokens, over the cost limit of 3000"


GUARD_RUNS = {
    # guard: (how the run is made, expected reason, model calls, tool calls)
    "stuck-loop": ("stuck-loop.jsonl", f"3 consecutive turns with identical tool calls: {LS}", 3, 2),
    "environment-error-loop": (
        "env-error-loop.jsonl",
        "3 consecutive turns whose tool results contain an OS error (last: EPERM)",
        3,
        3,
    ),
    "max-turns": ("alternating", "50 of 50 turns used: the turn budget is spent", 50, 50),
    "empty-response": ("empty", "2 empty model responses in a row (1 retry allowed)", 2, 0),
    "cost-limit": ("scenario", "computed", 1, 1),
}


@pytest.mark.parametrize("guard", sorted(GUARD_RUNS))
def test_every_guard_firing_is_journaled_and_replays_to_the_same_snapshot(
    env: Environment, guard: str
) -> None:
    how, reason, calls, tools = GUARD_RUNS[guard]
    if how.endswith(".jsonl"):
        (prompt,) = replay_tape(TAPES / how, env).prompts
        entries, thread = prompt.entries, prompt.thread_id
        final: Snapshot = replay(env.machine, entries).snapshot
        model_calls = prompt.model_calls
    else:
        if how == "scenario":
            scenario = _scenarios()["token-budget-01"]
            reason = _token_budget_reason()
            result, entries = run_once(env, scenario.input, scenario.world, v0_decider(env, "careful"))
            thread = "test:v0:run:r1"
        else:
            answer = alternating if how == "alternating" else (lambda request: {"type": "ANSWER", "text": ""})
            result, entries = run_once(env, {"task": "list the files"}, {}, Scripted(answer))
            thread = "test:v0:run:r1"
        final, model_calls = result.snapshot, result.model_calls
    fired = firings(entries)
    assert [(f["guard"], f["reason"]) for f in fired] == [(guard, reason)]
    assert final.value == "error" and (final.output["stoppedBy"], final.output["reason"]) == (guard, reason)
    assert (model_calls, final.context["toolCalls"]) == (calls, tools)
    # The firing entry carries what a replay needs: folding the log calls no guard, model or tool, and
    # reaches the snapshot the run ended in (every journaled state hash checked on the way).
    replayed = replay(env.machine, entries, verify=True, thread_id=thread)
    assert replayed.verification == "verified"
    assert replayed.snapshot.hash() == final.hash() and replayed.snapshot.output == final.output


# --- the opencli tapes, with counts derived by hand ---------------------------------------------------------


def test_the_tapes_replay_with_the_counts_the_guard_rules_give(env: Environment) -> None:
    """Expected numbers, derived by hand from the tapes and the guard rules (not from a run).

    A prompt is a `user` line; a model turn is a `tool_call` (these tapes have one call per turn) or a
    final `assistant` line; max-turns 50, stuck-loop at the 3rd identical tool turn (before its tools run),
    environment-error-loop at the 3rd tool turn in a row with an OS error (after its tools ran),
    empty responses: none in these tapes; cost limit 1,000,000 tokens (the whole card-trade tape is 52 kB,
    at most ~13,000 tokens of conversation, so 36 calls cannot spend 1,000,000).

    stuck-loop: one prompt; turns `ls`, `ls`, `ls`: the 3rd is the 3rd identical tool turn and is
      stopped before its tools run: 3 model calls, 2 tool executions, 1 firing (stuck-loop). The tape's
      3rd call has no result, and none is needed: consumed exactly.
    env-error-loop: one prompt; `ls /root`, `cat /root/secrets`, `touch /root/x` all fail with EPERM:
      different calls (no stuck loop), 3 error turns in a row, so the guard fires after the 3rd turn's
      tools: 3 model calls, 3 tool executions, 1 firing (environment-error-loop, last error EPERM).
    card-trade: 5 user lines, one of them `/exit` (a command: no run), so 4 prompts:
      1. 21 tool turns then an answer: 22 model calls, 21 tool executions. OS errors only in turn 13
         (`ps aux`: Operation not permitted) and turn 20 (`npm install --verbose`: EPERM): never 3 in a
         row. No two consecutive turns repeat a call (`npm install` runs reappear only 2 turns apart).
      2. 2 reads then an answer: 3 model calls, 2 tool executions.
      3. 5 bash turns (`npm install` twice, not in a row) then an answer: 6 and 5.
      4. 4 bash turns then an answer: 5 and 4.
      Total 36 model calls, 32 tool executions, no firing.
    """
    replays = {r.tape: r for r in replay_tapes([TAPES], env)}
    expected = {
        # tape: (model calls, tool executions, [(guard, reason)], commands)
        "stuck-loop": (3, 2, [("stuck-loop", f"3 consecutive turns with identical tool calls: {LS}")], []),
        "env-error-loop": (
            3,
            3,
            [
                (
                    "environment-error-loop",
                    "3 consecutive turns whose tool results contain an OS error (last: EPERM)",
                )
            ],
            [],
        ),
        "card-trade-2026-05-17": (36, 32, [], ["/exit"]),
    }
    assert set(replays) == set(expected)
    for tape, (calls, tools, fired, commands) in expected.items():
        r = replays[tape]
        assert (r.model_calls, r.tool_executions) == (calls, tools), tape
        assert [(f.guard, f.reason) for f in r.firings] == fired, tape
        assert r.commands == commands and r.consumed_exactly, tape
    card = replays["card-trade-2026-05-17"]
    assert [(p.model_calls, p.tool_executions, p.final_state) for p in card.prompts] == [
        (22, 21, "done"),
        (3, 2, "done"),
        (6, 5, "done"),
        (5, 4, "done"),
    ]
    assert [p.turns for p in card.prompts] == [22, 3, 6, 5]
    # The long `write` turns do not fit the protocol's 2,000-character field and are digested.
    assert sum(p.compacted for p in card.prompts) == 0  # every real tool call fits the free-text cap


def test_a_tape_the_loop_outlives_is_not_consumed_exactly(tmp_path: Path, env: Environment) -> None:
    tape = tmp_path / "short.jsonl"
    lines = [
        {"type": "user", "content": "list the files"},
        {"type": "tool_call", "name": "bash", "args": {"command": "ls"}},
        {"type": "tool_result", "name": "bash", "result": "a.txt"},
        {"type": "user", "content": "and again"},
        {"type": "assistant", "content": "Here you go."},
        {"type": "assistant", "content": "(left over)"},
    ]
    tape.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    first, second = replay_tape(tape, env).prompts
    # The first prompt's tape ends after one tool turn: the loop asks the model again and gets nothing.
    assert (first.asked_beyond, first.refused, first.final_state) == (1, 0, "error")
    assert first.output["stoppedBy"] == "model" and not first.consumed_exactly
    # The second answers at once, leaving a model turn unused.
    assert second.unused_turns == 1 and second.final_state == "done" and not second.consumed_exactly


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["not json"], r"bad\.jsonl:1: not JSON"),
        ([{"type": "tool_call", "name": "bash", "args": {}}], r":1: a tool_call line outside a prompt"),
        (
            [{"type": "user", "content": "/exit"}, {"type": "assistant", "content": "x"}],
            r"follows the command '/exit'",
        ),
        (
            [{"type": "user", "content": "x"}, {"type": "tool_result", "name": "bash", "result": ""}],
            r":2: a tool_result with no",
        ),
        (
            [
                {"type": "user", "content": "x"},
                {"type": "tool_call", "name": "ls", "args": {}},
                {"type": "tool_result", "name": "cat"},
            ],
            r":3: this tool_result is for 'cat', but the call waiting is 'ls'",
        ),
        ([{"type": "user", "content": "x"}, {"type": "thought"}], r"unknown line type 'thought'"),
    ],
)
def test_malformed_tapes_name_the_line(tmp_path: Path, lines: list[Any], message: str) -> None:
    tape = tmp_path / "bad.jsonl"
    tape.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines))
    with pytest.raises(TapeError, match=message):
        parse_tape(tape)


def test_the_tape_cli_prints_json_and_a_table(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        tape_app, ["replay", str(TAPES / "stuck-loop.jsonl"), str(TAPES / "env-error-loop.jsonl"), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # exactly one document; progress went to stderr
    rows = {t["tape"]: t for t in doc["tapes"]}
    assert rows["stuck-loop"]["model_calls"] == 3 and rows["stuck-loop"]["tool_executions"] == 2
    assert rows["stuck-loop"]["guard_firings"] == [
        {
            "guard": "stuck-loop",
            "checkpoint": "before-tools",
            "reason": f"3 consecutive turns with identical tool calls: {LS}",
        }
    ]
    assert rows["env-error-loop"]["consumed_exactly"] is True
    assert "replaying" in result.stderr and "replaying" not in result.stdout

    # Wired as `improve tape replay` (the main app adds it with add_typer(tape_app, name="tape")).
    root = typer.Typer()
    root.command("noop")(lambda: None)
    root.add_typer(tape_app, name="tape")
    table = runner.invoke(root, ["tape", "replay", str(TAPES)])
    assert table.exit_code == 0, table.output
    assert "card-trade-2026-05-17" in table.stdout and "consumed exactly" in table.stdout
    assert (
        "stuck-loop: stuck-loop at before-tools: 3 consecutive turns with identical tool calls"
        in table.stdout
    )
    assert "environment-error-loop at after-tools" in table.stdout

    missing = runner.invoke(tape_app, ["replay", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "no such tape file or directory" in missing.stderr
    (tmp_path / "broken.jsonl").write_text('{"type": "user", "content": "x"}\n{oops\n')
    broken = runner.invoke(tape_app, ["replay", str(tmp_path / "broken.jsonl")])
    assert broken.exit_code == 3 and "broken.jsonl:2: not JSON" in broken.stderr


# --- exploration proofs ---------------------------------------------------------------------------------------


def _over_budget(snapshot: Snapshot) -> bool:
    return snapshot.value == "overBudget" or snapshot.context["turns"] > snapshot.context["maxTurns"]


LOOP_COUNTERS_IGNORED = ("tokens", "contextTokens", "resultTokens", "toolTurns", "toolCalls")


def _projection(snapshot: Snapshot) -> str:
    """A snapshot without the counters no transition reads once the cost limit cannot bind (see below)."""
    context = {k: v for k, v in snapshot.context.items() if k not in LOOP_COUNTERS_IGNORED}
    return json.dumps(
        [snapshot.value, snapshot.status, context, snapshot.output], sort_keys=True, default=str
    )


def test_the_default_turn_budget_can_never_be_exceeded(env: Environment) -> None:
    """Proof for the default budget of 50 turns, over every path the probe world allows.

    Snapshots are compared without the token counters and the tool tallies: no guard or transition reads
    `toolTurns` or `toolCalls`, and the tokens are read only by the cost limit, which cannot bind here:
    per turn the conversation grows by at most the probe call's output and the largest probe result, so
    50 turns spend at most 50 * (start + 50 * growth) tokens, far below the 1,000,000 limit (asserted).
    Two snapshots equal up to those counters therefore have the same futures, and the search is exact."""
    assert env.probe is not None
    task = "list the files"
    start = 500 + len(task) // 4
    growth = len(PROBE_CALL) // 4 + max(out["tokens"] for out in env.probe.outputs["tools.execute"])
    assert 50 * (start + 50 * growth) < 1_000_000
    options = dataclasses.replace(env.probe, dedupe_by=_projection, max_paths=1_000_000)
    result = explore_paths(env.machine, {"task": task}, options, target=_over_budget)
    assert result.complete and not result.reachable, result.cuts
    assert result.terminals.keys() == {"done", "error"} and result.states > 10_000


def test_the_sentinel_needs_the_max_turns_guard(env: Environment) -> None:
    assert env.probe is not None
    for input in env.probe_inputs:  # what `improve explore --env tool-loop` proves
        result = can_reach(env.machine, "overBudget", input, env.probe)
        assert result.complete and not result.reachable, input
    loose = environment(GuardRegistry.default().without("max-turns"))
    result = can_reach(loose.machine, "overBudget", env.probe_inputs[0], env.probe)
    assert result.reachable and result.witness
    starts = [e for e in result.witness if e.get("type") in ("CALL_TOOLS", "ANSWER")]
    assert len(starts) == 6  # the 6-turn budget of that probe input, spent, then one more call starts


def test_no_model_call_starts_over_the_cost_limit(env: Environment) -> None:
    assert env.probe is not None

    def call_over_limit(snapshot: Snapshot) -> bool:
        ctx = snapshot.context
        return snapshot.value == "streaming" and ctx["tokens"] > ctx["maxTokens"]

    tight = {"task": "list the files", "limits": {"maxTurns": 50, "maxTokens": 1500}}
    result = explore_paths(env.machine, tight, env.probe, target=call_over_limit)
    assert result.complete and not result.reachable
    loose = environment(GuardRegistry.default().without("cost-limit"))
    assert explore_paths(
        loose.machine, tight, env.probe, target=call_over_limit, stop_at_target=True
    ).reachable


def test_improve_explore_proves_the_sentinel_unreachable(tmp_path: Path) -> None:
    from improve.cli.main import app

    result = CliRunner().invoke(app, ["explore", "--env", "tool-loop", "--json", "-w", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"]
    assert len(rows) == 3 and all(r["target"] == "overBudget" and r["proof"] for r in rows)


# --- rule evals, describe, vocabulary ---------------------------------------------------------------------------


def test_rule_evals_pass_and_cover_every_guarded_state(env: Environment) -> None:
    results = run_rule_evals(env.machine, env.rule_evals)
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    assert uncovered(env.machine, results) == []
    assert set(guarded_states(env.machine)) == {
        "idle",
        "checking_turn",
        "starting_turn",
        "streaming",
        "checking_calls",
        "checking_results",
        "checking_response",
        "guard_fired",
    }
    # The evals can fail: without the stuck-loop guard, the ones that need a third identical turn stopped do.
    loose = environment(GuardRegistry.default().without("stuck-loop"))
    failed = [r.name for r in run_rule_evals(loose.machine, loose.rule_evals) if not r.ok]
    assert failed == [
        "the third identical tool turn is stopped before its tools run",
        "a guard's firing ends the loop in error",
        "a guard that passes on a second look is an error too (guards must be pure)",
    ]


def test_describe_shows_the_loop_goal_first(env: Environment, tmp_path: Path) -> None:
    from improve.cli.main import app

    text = describe_text(env.config)
    assert (
        text.startswith("Goal: Do a coding task")
        and "overBudget (sentinel, final, must be unreachable)" in text
    )
    mermaid = describe_mermaid(env.config)
    assert "streaming --> checking_calls : CALL_TOOLS" in mermaid and "guard_fired --> error" in mermaid
    assert to_xstate(env.config)["initial"] == "idle"
    result = CliRunner().invoke(app, ["describe", "--env", "tool-loop", "-w", str(tmp_path)])
    assert result.exit_code == 0 and "checkpointBlocks" in result.stdout


def test_the_decision_offers_closed_options_and_numeric_facts(env: Environment) -> None:
    from improve.runtime.decision import build_request
    from improve.runtime.vocabulary import vocabulary

    snapshot = _fold(
        env, {"task": "t"}, [bash_call("touch /root/x"), bash_ran("touch /root/x", "EACCES: nope")]
    )
    request = build_request(env.machine, snapshot)
    # Free-text fields are left out of options: what a policy can answer without a model.
    assert request.options == [{"type": "ANSWER"}, {"type": "REPORT_BLOCKED"}]
    assert request.facts["loop"] == {
        "identicalCalls": 1,
        "errorTurns": 1,
        "emptyResponses": 0,
        "toolTurns": 1,
    }
    words = vocabulary(env).fact_paths
    numeric = sorted(p for p, kind in words.items() if kind == "int")
    assert "facts.loop.errorTurns" in numeric and "facts.loop.identicalCalls" in numeric
    assert "facts.turn.used" in numeric and "facts.tokens.used" in numeric


# --- scenarios and stand-in models --------------------------------------------------------------------------


def _scenarios() -> dict[str, Scenario]:
    return {s.id: s for s in load_scenarios(SCENARIOS).scenarios}


def test_scenarios_have_every_category_in_both_splits(env: Environment) -> None:
    scenarios = list(_scenarios().values())
    splits: dict[str, set[str]] = {}
    for s in scenarios:
        splits.setdefault(s.category, set()).add(s.split)
        assert s.expected.outcome in env.config.final_states(), s.id
    assert len(splits) == 10 and all(v == {"train", "held-out"} for v in splits.values())
    blocked = [s for s in scenarios if any(e["kind"] == "blocked-report" for e in s.expected.effects or [])]
    assert len([s for s in blocked if s.split == "held-out"]) == 8


def test_improve_scenarios_check_accepts_the_file(tmp_path: Path) -> None:
    from improve.cli.main import app

    result = CliRunner().invoke(
        app, ["scenarios", "check", "--env", "tool-loop", "--file", str(SCENARIOS), "-w", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output


def test_stand_in_models_fail_the_way_they_should(env: Environment) -> None:
    policy = load_policy(POLICIES / "v0.json")
    scenarios = list(_scenarios().values())
    rows = {
        m: run_suite(env, scenarios, SuiteSpec(policy, m, 2), MemoryStore())
        for m in ("careful", "naive", "sloppy")
    }
    assert all(r.passed for r in rows["careful"])
    blocked = {"permission-denied", "disk-full", "read-only-filesystem"}
    assert {r.category for r in rows["naive"] if not r.passed} == blocked
    assert all(r.passed for r in rows["naive"] if r.category not in blocked)
    # naive retries permission errors word for word (the stuck loop stops it) and carries on past the rest.
    stopped = {r.scenario: (r.output or {}).get("stoppedBy") for r in rows["naive"] if not r.passed}
    assert (
        stopped["permission-denied-01"] == "stuck-loop"
        and stopped["disk-full-01"] == "environment-error-loop"
    )
    sloppy = rows["sloppy"]
    assert 0.3 < sum(r.passed for r in sloppy) / len(sloppy) < 0.7
    assert sum(r.failed_attempts for r in sloppy) > 0  # malformed calls and unfounded reports were refused
    caught = {(r.output or {}).get("stoppedBy") for r in sloppy}
    assert {"stuck-loop", "empty-response"} <= caught <= {None, "model", *GuardRegistry.default().names}
    assert all(not r.violations for m in rows for r in rows[m])


def test_the_sandbox_tools() -> None:
    world = SandboxWorld(
        {
            "files": {"src/a.py": "x = 1\n", "vendor/b.py": "y\n", "/root/k": "s"},
            "readonly": ["vendor/"],
            "unreadable": ["/root/"],
            "commands": {"make": ["fail", {"output": "ok", "effect": {"kind": "built"}}]},
        }
    )
    run_ = world.execute
    assert run_(ToolCall("read", {"file_path": "src/a.py"})) == "1\tx = 1"
    assert os_error_code(run_(ToolCall("read", {"file_path": "/root/k"}))) == "EACCES"
    assert "ENOENT" in run_(ToolCall("read", {"file_path": "nope"}))
    assert (
        run_(ToolCall("edit", {"file_path": "src/a.py", "old_string": "1", "new_string": "2"}))
        == "Edited src/a.py"
    )
    assert os_error_code(run_(ToolCall("write", {"file_path": "vendor/c.py", "content": ""}))) == "EACCES"
    assert [run_(ToolCall("bash", {"command": "make"})) for _ in range(3)] == ["fail", "ok", "ok"]
    assert run_(ToolCall("bash", {"command": "ls"})) == "/root\nsrc\nvendor"
    assert "command not found" in run_(ToolCall("bash", {"command": "yarn"}))
    assert world.effects == [{"kind": "edit", "path": "src/a.py"}, {"kind": "built"}, {"kind": "built"}]
    assert world.audit([{"kind": "write", "path": "vendor/c.py"}]) == [
        {"rule": "write-refused-by-sandbox", "path": "vendor/c.py"}
    ]


# --- a full round: the rule miner fixes how naive ends blocked tasks --------------------------------------------


def scratch(tmp_path: Path) -> Workspace:
    objective = (
        "k = 2\nmax_model_calls = 100\ncost_budget = 1.5\nmin_gain = 0.0\nconfidence = 0.95\n"
        "tolerance = 0.0\nseed = 20261130\n"
    )
    return Workspace.load(
        desk_workspace(tmp_path, "tool-loop", SCENARIOS, objective=objective) / "improve.toml"
    )


@pytest.mark.slow
def test_a_round_promotes_reporting_os_errors_at_once(tmp_path: Path, no_token: None) -> None:
    space = scratch(tmp_path)
    result = run_round(space, RoundOptions(env="tool-loop", policy="v0", k=2, model="naive"))
    assert result.status == "recommended", result.decision_detail
    assert result.cluster is not None and result.cluster.startswith("wrong-answer:nextStep:CALL_TOOLS")
    assert result.cluster.endswith("->REPORT_BLOCKED")
    held, train = result.scores["held-out"], result.scores["train"]
    # naive fails the 8 blocked held-out scenarios of 20 (12/20 pass); the rule fixes all of them.
    assert (held.before, held.after, held.violations_after) == (0.6, 1.0, 0)
    assert (train.before, train.after, train.violations_after) == (0.68, 1.0, 0)
    assert held.ci_low > 0 and not result.regressions
    candidate = json.loads((tmp_path / str(result.report) / "policy.json").read_text())
    route = candidate["states"][candidate["initial"]]
    assert route["choice"][0]["guard"] in (
        "facts.loop.errorTurns > 0 && {'type': 'REPORT_BLOCKED'} in input.options",
        "facts.loop.errorTurns >= 1 && {'type': 'REPORT_BLOCKED'} in input.options",
    )  # the same rule over ints, answering only when the option is offered
    assert candidate["states"][route["choice"][0]["target"]]["output"] == {"type": "'REPORT_BLOCKED'"}
    repo = git.Repo(tmp_path)
    changed = repo.git.diff("--name-only", "main", "improve/tool-loop-v1").split()
    assert changed == ["policies/tool-loop/CHANGELOG.md", "policies/tool-loop/v1.json"]
    assert repo.active_branch.name == "main" and not repo.is_dirty()


# --- helpers -----------------------------------------------------------------------------------------------------


def _fold(env: Environment, input: dict[str, Any], events: list[dict[str, Any]]) -> Snapshot:
    from improve.machine import initial

    snapshot = initial(env.machine, input)
    for event in events:
        nxt = transition(env.machine, snapshot, event)
        assert nxt is not snapshot, (event, snapshot.value)
        snapshot = nxt
    return snapshot


def test_probe_outputs_are_what_the_tools_report() -> None:
    world = SandboxWorld({"commands": {"ls": "file.txt"}})
    assert execute_tools(world, {"calls": PROBE_CALL}) == tool_output(LS)
