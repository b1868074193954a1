"""A corpus of recorded threads: the refund desk's scenarios run with every stand-in model."""

from __future__ import annotations

import json
from pathlib import Path

from improve.evals.scenarios import load_scenarios
from improve.examples import load_environment
from improve.log.store import MemoryStore
from improve.runtime.policy import PolicyDecider, compile_policy, load_policy
from improve.runtime.run import run

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
            run(env, input=scenario.input, world=env.make_world(scenario.world), people=scenario.people,
                decider=PolicyDecider(policy, {"decider": env.models[model](f"{scenario.id}:{i}")}),
                store=store, thread_id=thread_id, stamp={"model": model})
            for entry in store.read(thread_id):
                line = json.loads(entry.to_line())
                line["threadId"] = thread_id
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
                entries += 1
            store.delete(thread_id)
    return entries
