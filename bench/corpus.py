"""A corpus of recorded threads: the refund desk's scenarios run with every stand-in model."""

from __future__ import annotations

import json
from pathlib import Path

from improve.evals import run_scenario
from improve.evals.scenarios import load_scenarios
from improve.log.store import MemoryStore
from improve.runtime import load_environment
from improve.runtime.policy import PolicyDecider, compile_policy, load_policy

REPO = Path(__file__).resolve().parents[1]
MODELS = ("careful", "naive", "sloppy")


def write_corpus(path: Path, threads: int) -> int:
    """Run `threads` runs into one multi-thread JSONL file (every line carries `threadId`).

    Returns the number of entries written."""
    env = load_environment("refunds")
    scenarios = load_scenarios(REPO / "scenarios" / "refunds.yaml").scenarios
    policy = compile_policy(load_policy(REPO / "policies" / "refunds" / "v0.json"))
    store = MemoryStore()
    entries = 0
    with path.open("w", encoding="utf-8") as out:
        for i in range(threads):
            scenario = scenarios[i % len(scenarios)]
            model = MODELS[(i // len(scenarios)) % len(MODELS)]
            thread_id = f"{scenario.split}:v0:{scenario.id}:r{i}"
            decider = PolicyDecider(policy, {"decider": env.models[model](f"{scenario.id}:{i}")})
            run_scenario(env, scenario, decider, store, thread_id, stamp={"model": model})
            for entry in store.read(thread_id):
                line = json.loads(entry.to_line())
                line["threadId"] = thread_id
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
                entries += 1
            store.delete(thread_id)
    return entries


def write_synthetic_corpus(folder: Path, threads: int = 20_000, files: int = 100, seed: int = 1) -> int:
    """About 50 entries per thread of refund-desk-shaped traffic (tool completions with outputs, decisions
    with options and refused attempts, usage records, people's answers), `files` multi-thread JSONL files.

    Real refund-desk threads are short (6-10 entries); this corpus stands for longer agent sessions at the
    scale the warehouse must take. Lines are schemaVersion 2, as improve writes them: every entry has an
    `entryHash` and each thread ends with `@agent.end`. The hashes are random hex of the right shape (the
    ingest keeps them and does not check them; replay does). Returns the number of entries written."""
    import random
    import uuid

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    per_file = max(1, threads // files)
    entries = 0
    handle = None
    splits = ("train", "held-out")
    for t in range(threads):
        if t % per_file == 0:
            if handle:
                handle.close()
            handle = (folder / f"part-{t // per_file:05d}.jsonl").open("w", encoding="utf-8")
        assert handle is not None
        thread = f"{splits[t % 3 == 0]}:v{rng.randint(0, 5)}:scenario-{t % 400:03d}:r{t // 400 + 1}"
        length = rng.randint(20, 80)
        last = None
        for i in range(length + 1):
            entry: dict[str, object] = {
                "schemaVersion": 2,
                "id": str(uuid.UUID(int=rng.getrandbits(128))),
                "index": i,
                "recordedAt": f"2026-11-{1 + t % 28:02d}T{i % 24:02d}:{rng.randint(0, 59):02d}:00.{rng.randint(0, 999999):06d}Z",
                "machineId": "refunds",
                "machineVersion": "1",
                "threadId": thread,
            }
            kind = rng.random()
            if i == length:
                entry["event"] = {"type": "@agent.end", "status": rng.choice(["done", "idle", "budget"])}
            elif i == 0:
                entry["event"] = {
                    "type": "@agent.init",
                    "input": {
                        "ticket": rng.choice(TICKETS),
                        "customerId": f"C-{rng.randint(1000, 9999)}",
                        "orderId": f"O-{rng.randint(5000, 9999)}",
                        "amount": round(rng.uniform(5, 300), 2),
                    },
                }
                entry["metadata"] = {
                    "policy": {"id": "refunds-policy", "version": "0"},
                    "models": {"decider": "naive"},
                }
            elif kind < 0.3:
                entry["event"] = {
                    "type": "@agent.usage",
                    "ref": "decider",
                    "model": rng.choice(["naive", "careful", "sloppy"]),
                    "decision": "chooseResolution",
                    "calls": 1,
                    "inputTokens": rng.randint(200, 900),
                    "outputTokens": rng.randint(10, 80),
                }
            elif kind < 0.7:
                entry["event"] = {
                    "type": "xstate.done.actor",
                    "actorId": rng.choice(["verifyingCustomer", "lookingUpOrder", "paying"]),
                    "output": {
                        "found": True,
                        "order": {
                            "id": f"O-{rng.randint(5000, 9999)}",
                            "total": round(rng.uniform(10, 400), 2),
                            "refundable": round(rng.uniform(0, 200), 2),
                            "deliveredDaysAgo": rng.randint(0, 90),
                        },
                    },
                }
                if rng.random() < 0.3:
                    entry["event"]["effects"] = [
                        {"kind": "refund", "orderId": "O-1", "amount": round(rng.uniform(5, 100), 2)}
                    ]  # type: ignore[index]
            elif kind < 0.9:
                options = [
                    {"type": "REFUND", "amount": round(rng.uniform(5, 100), 2)},
                    {"type": "ESCALATE"},
                    {"type": "CLOSE"},
                ]
                entry["event"] = rng.choice(options)
                entry["metadata"] = {
                    "decision": {"name": "chooseResolution", "options": options},
                    "source": "policy:answer",
                }
                if rng.random() < 0.3:
                    entry["attempts"] = [
                        {
                            "event": {"type": "REFUND", "amount": 999.0},
                            "kind": "rejected-by-guard",
                            "reason": "rejected-by-guard: the rules do not allow REFUND here",
                            "guard": rng.choice(GUARDS),
                        }
                    ]
            else:
                entry["event"] = rng.choice(
                    [{"type": "APPROVE", "approver": "dana"}, {"type": "REJECT"}, {"type": "NO_REPLY"}]
                )
                entry["metadata"] = {"source": "person"}
            if last:
                entry["causationId"] = last
            link = uuid.UUID(int=rng.getrandbits(128)).hex
            if entry["event"]["type"] == "@agent.usage":  # type: ignore[index]
                entry["verification"] = {"entryHash": link}  # a usage record does not move the machine
            else:
                entry["verification"] = {
                    "stateHash": uuid.UUID(int=rng.getrandbits(128)).hex * 2,
                    "entryHash": link,
                }
            last = str(entry["id"])
            handle.write(json.dumps(entry, separators=(",", ":")) + "\n")
            entries += 1
    if handle:
        handle.close()
    return entries


TICKETS = [
    "My blender arrived broken, I want my money back.",
    "Wrong size, please refund the difference!!",
    "This is unacceptable, the parcel never arrived.",
    "Refund please, item does not work as described.",
]
GUARDS = [
    "'choosingResolution'.on.REFUND[0]: event.amount > 0 && event.amount <= context.order.refundable",
    "'awaitingApproval'.on.APPROVE[0]: context.refundAmount <= 1000",
    "'checkingPayment'.always[0]: guard:illegalRefund",
]


def unchain(source: Path, target: Path) -> int:
    """A copy of a JSONL corpus as the log was before the hash chain: schemaVersion 1, no `entryHash`,
    no `@agent.end` entries. The same threads, so chained and unchained can be measured side by side."""
    kept = 0
    with source.open(encoding="utf-8") as lines, target.open("w", encoding="utf-8") as out:
        for line in lines:
            entry = json.loads(line)
            if entry["event"]["type"] == "@agent.end":
                continue
            entry["schemaVersion"] = 1
            verification = entry.pop("verification", None) or {}
            if verification.get("stateHash"):
                entry["verification"] = {"stateHash": verification["stateHash"]}
            out.write(json.dumps(entry, separators=(",", ":")) + "\n")
            kept += 1
    return kept
