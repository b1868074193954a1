"""`--executor dask://HOST:PORT`: runs on a Dask cluster give what local runs give.

One `LocalCluster` of two worker processes serves the module. Each test runs the same command on two
copies of a workspace, locally and on the cluster, through the real CLI, and compares what a user
reads (the round's decision, the scorecards, parity's rows) with only volatile fields masked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from improve.cli.main import app
from tests.helpers import REPO, committed_workspace, copy_workspace

from .fake_openai import FakeEndpoint, Reply, completion, tool_answer

distributed = pytest.importorskip("distributed")

runner = CliRunner()
KEY_ENV = "FAKE_CLUSTER_KEY"
SECRET = "sk-cluster-test-never-in-a-file"


def _set_environment(values: dict[str, str]) -> None:
    os.environ.update(values)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A scheduler and two single-threaded worker processes on 127.0.0.1: `dask://HOST:PORT`."""
    with distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=None,
        worker_dashboard_address=None,
    ) as local:
        with distributed.Client(local, set_as_default=False) as client:
            # What a user's worker environment would hold: the model's key, and no proxy for 127.0.0.1.
            client.run(_set_environment, {KEY_ENV: SECRET, "NO_PROXY": "127.0.0.1"})
        yield "dask://" + local.scheduler_address.removeprefix("tcp://")


def invoke(*args: str, ok: bool = True) -> Any:
    result = runner.invoke(app, list(args))
    if ok:
        assert result.exit_code == 0, result.output
    return result


ROUND_FIELDS = (
    "status",
    "recommended",
    "candidate_version",
    "cluster",
    "hypothesis",
    "branches",
    "gates",
    "scores",
    "held_out",
    "regressions",
    "reruns",
    "decision_detail",
    "candidate_threads",
    "quarantined",
)


def _decision(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [{key: r.get(key) for key in ROUND_FIELDS} for r in doc["rounds"]]


def _scorecard(ws: Path, doc: dict[str, Any]) -> str:
    """The round's scorecard.md, with its round id (a timestamp) masked."""
    [round_doc] = doc["rounds"]
    text = (ws / round_doc["report"] / "scorecard.md").read_text(encoding="utf-8")
    return text.replace(round_doc["round_id"], "ROUND")


@pytest.mark.slow
def test_a_round_on_the_cluster_decides_as_a_local_round(tmp_path: Path, cluster: str) -> None:
    local, remote = committed_workspace(tmp_path / "local"), committed_workspace(tmp_path / "remote")
    common = ("round", "--policy", "v0", "--k", "2", "--json")
    here = invoke(*common, "-w", str(local))
    there = invoke(*common, "-w", str(remote), "--executor", cluster)
    assert f"runs go to the Dask cluster at tcp://{cluster.removeprefix('dask://')}" in there.stderr
    doc_here, doc_there = json.loads(here.stdout), json.loads(there.stdout)
    assert doc_here["rounds"][0]["status"] == "recommended"  # a round with a candidate, gates and reruns
    assert _decision(doc_there) == _decision(doc_here)
    assert _scorecard(remote, doc_there) == _scorecard(local, doc_here)
    # Every run's thread was written here and recorded in this workspace's warehouse, run for run.
    files = sorted(p.name for p in (local / "traces").glob("*.jsonl"))
    assert files and sorted(p.name for p in (remote / "traces").glob("*.jsonl")) == files
    query = "SELECT thread_id, passed, final_state, model_calls FROM outcomes ORDER BY thread_id"
    rows = [
        json.loads(invoke("sql", query, "--format", "json", "-w", str(ws)).stdout) for ws in (local, remote)
    ]
    assert rows[0] and rows[1] == rows[0]


DESK_MODULE = '''
"""A workspace's own environment: the refund desk under another name, importable only from here."""
from dataclasses import replace

from improve.runtime import Environment, load_environment


def environment() -> Environment:
    return replace(load_environment("refunds"), name="my-desk")
'''


def desk_workspace(target: Path) -> Path:
    """A workspace whose environment is a module in the workspace (not installed): the workers must
    import it from the workspace root."""
    copy_workspace(target)
    (target / "mydesk").mkdir()
    (target / "mydesk" / "__init__.py").write_text("")
    (target / "mydesk" / "env.py").write_text(DESK_MODULE)
    scenarios = (target / "scenarios" / "refunds.yaml").read_text(encoding="utf-8")
    (target / "scenarios" / "my-desk.yaml").write_text(
        scenarios.replace("\nenvironment: refunds\n", "\nenvironment: my-desk\n"), encoding="utf-8"
    )
    shutil.copytree(target / "policies" / "refunds", target / "policies" / "my-desk")
    (target / "improve.toml").write_text(
        '[workspace]\nenvironment = "my-desk"\n\n[environments.my-desk]\nmodule = "mydesk.env:environment"\n'
        "\n[objective]\nk = 2\n",
        encoding="utf-8",
    )
    return target


@pytest.mark.slow
def test_run_and_score_on_the_cluster_give_the_local_scorecards(tmp_path: Path, cluster: str) -> None:
    local, remote = desk_workspace(tmp_path / "local"), desk_workspace(tmp_path / "remote")
    assert "mydesk" not in sys.modules  # only a worker with the workspace on its path can load it
    run = ("run", "--policy", "v0", "--model", "sloppy", "--split", "train", "--json")
    invoke(*run, "-w", str(local))
    # The workspace's improve.toml names the cluster: no --executor needed.
    toml = remote / "improve.toml"
    toml.write_text(toml.read_text().replace("[workspace]\n", f'[workspace]\nexecutor = "{cluster}"\n'))
    there = invoke(*run, "-w", str(remote))
    assert "runs go to the Dask cluster" in there.stderr
    score = ("score", "--policy", "v0", "--model", "sloppy", "--split", "train", "--json")
    cards = [json.loads(invoke(*score, "-w", str(ws)).stdout)["scorecards"] for ws in (local, remote)]
    assert cards[0][0]["runs"] == 2 * len(cards[0][0]["scenarios"]) > 0
    assert cards[1] == cards[0]
    # The sealed test split's runs, made by `score --unseal`, go to the cluster too.
    unseal = ("score", "--policy", "v0", "--model", "sloppy", "--split", "test", "--unseal", "--json")
    sealed = [
        json.loads(invoke(*unseal, "-w", str(local)).stdout)["scorecards"],
        json.loads(invoke(*unseal, "-w", str(remote), "--executor", cluster).stdout)["scorecards"],
    ]
    assert sealed[0][0]["split"] == "test" and sealed[1] == sealed[0]


@pytest.mark.slow
def test_parity_on_the_cluster_gives_the_local_rows(tmp_path: Path, cluster: str) -> None:
    ws = copy_workspace(tmp_path / "ws")
    compare = ("parity", "compare", "improve.examples.refunds.legacy:run", "v0", "--split", "held-out")
    here = json.loads(invoke(*compare, "-w", str(ws), "--json", ok=False).stdout)
    there = json.loads(invoke(*compare, "-w", str(ws), "--json", "--executor", cluster, ok=False).stdout)
    assert here["rows"] and there["rows"] == here["rows"]
    assert there["summary"] == here["summary"]


@pytest.mark.slow
def test_a_model_keeps_its_concurrency_cap_across_the_workers(
    tmp_path: Path, cluster: str, serve: Callable[[Callable[[dict[str, Any]], Reply]], FakeEndpoint]
) -> None:
    """Two workers, eight runs in flight in each: a model capped at 1 still sees one call at a time."""
    lock = threading.Lock()
    flying = {"now": 0, "most": 0}

    def slow_naive(body: dict[str, Any]) -> Reply:
        with lock:
            flying["now"] += 1
            flying["most"] = max(flying["most"], flying["now"])
        time.sleep(0.02)
        with lock:
            flying["now"] -= 1
        text = body["messages"][1]["content"]
        facts = json.loads(text.split("Facts:\n", 1)[1].split("\n\nOptions", 1)[0])
        event = {"type": "REFUND", "amount": facts["requested"]}
        return tool_answer(event) if "tools" in body else completion(json.dumps({"answer": event}))

    server = serve(slow_naive)
    ws = copy_workspace(tmp_path / "ws")
    (ws / "improve.toml").write_text(
        (ws / "improve.toml").read_text()
        + f'\n[models.fake]\nmodel = "test-model"\nbase_url = "{server.url}"\napi_key_env = "{KEY_ENV}"\n'
        "concurrency = 1\nprice = { input_per_mtok = 0.40, output_per_mtok = 1.60 }\n"
    )
    result = invoke(
        "run", "-w", str(ws), "--model", "fake", "--split", "held-out", "--k", "1", "--concurrency", "8",
        "--executor", cluster, "--json",
    )  # fmt: skip
    doc = json.loads(result.stdout)
    assert len(server.requests) >= 20 and flying["most"] == 1
    # The workers' calls are metered here: the command's count is the server's.
    assert doc["model_calls"]["live"] == len(server.requests) and doc["model_calls"]["usd"] > 0
    assert all(
        KEY_ENV not in p.read_text() and SECRET not in p.read_text() for p in (ws / "traces").glob("*.jsonl")
    )


def test_an_unreachable_scheduler_says_where_and_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("improve.evals.cluster.CONNECT_TIMEOUT_S", 0.5)
    ws = copy_workspace(tmp_path / "ws")
    result = invoke("run", "-w", str(ws), "--split", "train", "--executor", "dask://127.0.0.1:9", ok=False)
    assert result.exit_code == 3
    text = " ".join(result.stderr.split())
    assert "no Dask scheduler answered at tcp://127.0.0.1:9 within 0.5 s" in text
    assert "dask scheduler" in text and "--executor local" in text and "Traceback" not in result.output
    assert not list((ws / "traces").glob("*.jsonl"))


def test_without_dask_the_error_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises ImportError
    ws = copy_workspace(tmp_path / "ws")
    result = invoke("round", "-w", str(ws), "--policy", "v0", "--executor", "dask://127.0.0.1:8786", ok=False)
    assert result.exit_code == 3
    assert "pip install 'improve-agents[cluster]'" in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("where", "value"),
    [("option", "dask:/127.0.0.1:8786"), ("option", "ray://head:10001"), ("toml", "dask://host:99999")],
)
def test_a_bad_executor_is_refused_with_what_is_expected(tmp_path: Path, where: str, value: str) -> None:
    ws = copy_workspace(tmp_path / "ws")
    args = ["run", "-w", str(ws), "--split", "train"]
    if where == "option":
        args += ["--executor", value]
    else:
        toml = ws / "improve.toml"
        toml.write_text(toml.read_text().replace("[workspace]\n", f'[workspace]\nexecutor = "{value}"\n'))
    result = invoke(*args, ok=False)
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert re.search(r"expected `local` or `dask://HOST:PORT`", text), text
    if where == "toml":
        assert f"{ws.resolve() / 'improve.toml'}" in text and "$.workspace.executor" in text


def test_the_repository_workspace_runs_locally_by_default() -> None:
    from improve.evals import Workspace

    assert str(Workspace.load(REPO / "improve.toml").executor()) == "local"


DYING_MODULE = '''
"""The refund desk with a stand-in model whose process dies on its first call (a worker killed)."""
import os
from dataclasses import replace

from improve.runtime import Environment, load_environment


class Dies:
    name = "dies"

    def answer(self, request):
        os._exit(17)


def environment() -> Environment:
    env = load_environment("refunds")
    return replace(env, name="dying-desk", models={**env.models, "dies": lambda seed: Dies()})
'''


def test_a_worker_that_dies_is_a_clear_error_and_the_written_runs_stay(tmp_path: Path) -> None:
    from concurrent.futures import ProcessPoolExecutor

    from improve.errors import RunError
    from improve.evals import Fanout, SuiteSpec, Workspace, write_threads
    from improve.log import JsonlDirStore

    (tmp_path / "dying.py").write_text(DYING_MODULE)
    (tmp_path / "improve.toml").write_text('[environments.dying-desk]\nmodule = "dying:environment"\n')
    space = Workspace.load(tmp_path / "improve.toml")
    env = space.environment("dying-desk")
    scenarios = [s.model_copy(update={"environment": "dying-desk"}) for s in _refund_scenarios()[:4]]
    policy = space.load_policy("dying-desk", str(REPO / "policies" / "refunds" / "v0.json"))
    store = JsonlDirStore(tmp_path / "traces")
    with ProcessPoolExecutor(max_workers=1) as pool:
        fanout = Fanout(pool, workers=1, where="a process pool")
        with pytest.raises(RunError, match=r"a batch of runs failed on a process pool: BrokenProcessPool"):
            write_threads(env, scenarios, SuiteSpec(policy, "dies", 1), store, executor=fanout)
    assert store.list_threads().thread_ids == []  # nothing half-written
    # The same runs with a model that lives are written whole, batch by batch.
    with ProcessPoolExecutor(max_workers=2) as pool:
        plan = write_threads(env, scenarios, SuiteSpec(policy, "naive", 2), store, executor=pool)
    assert len(plan) == 8 and all(store.read(p.thread_id)[-1].event["type"] == "@agent.end" for p in plan)


def _refund_scenarios() -> list[Any]:
    from improve.evals import load_scenarios

    return load_scenarios(REPO / "scenarios" / "refunds.yaml").split("train")


@pytest.mark.slow
def test_the_workers_model_calls_are_metered_here_with_their_fingerprints(
    tmp_path: Path, cluster: str, serve: Callable[[Callable[[dict[str, Any]], Reply]], FakeEndpoint]
) -> None:
    from improve.evals import SuiteSpec, Workspace, open_fanout, parse_executor, write_threads
    from improve.llm import Meter, ModelSpec
    from improve.log import JsonlDirStore

    def escalate(body: dict[str, Any]) -> Reply:
        return tool_answer({"type": "ESCALATE"}, fingerprint="fp_cluster")

    server = serve(escalate)
    space = Workspace.load(copy_workspace(tmp_path / "ws") / "improve.toml")
    env = space.environment("refunds")
    model = ModelSpec(model="test-model", base_url=server.url, api_key_env=KEY_ENV)
    spec = SuiteSpec(
        space.load_policy("refunds", "v0"), "fake", 1, model_spec=model, cache_dir=str(space.cache_dir)
    )
    meter = Meter()
    with open_fanout(parse_executor(cluster), space.root) as fanout:
        plan = write_threads(
            env, _refund_scenarios()[:6], spec, JsonlDirStore(space.traces), executor=fanout, meter=meter
        )
    assert len(plan) == 6 and meter.live == len(server.requests) > 0
    assert meter.fingerprints == {"fp_cluster"} and meter.input_tokens > 0


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("local", None),
        ("dask://127.0.0.1:8786", "tcp://127.0.0.1:8786"),
        ("dask://scheduler.internal:8786", "tcp://scheduler.internal:8786"),
        ("dask://[::1]:8786", "tcp://[::1]:8786"),
    ],
)
def test_an_executor_names_local_or_a_scheduler_address(text: str, address: str | None) -> None:
    from improve.evals import parse_executor

    choice = parse_executor(text)
    assert choice.address == address and str(choice) == text


def test_the_spend_limit_stops_sending_batches_and_keeps_what_ran(
    tmp_path: Path, cluster: str, serve: Callable[[Callable[[dict[str, Any]], Reply]], FakeEndpoint]
) -> None:
    from improve.errors import SpendLimitError
    from improve.evals import SuiteSpec, Workspace, open_fanout, parse_executor, write_threads
    from improve.llm import Meter, ModelSpec
    from improve.llm.spec import Price
    from improve.log import JsonlDirStore

    server = serve(lambda body: tool_answer({"type": "ESCALATE"}))
    space = Workspace.load(copy_workspace(tmp_path / "ws") / "improve.toml")
    model = ModelSpec(
        model="test-model",
        base_url=server.url,
        api_key_env=KEY_ENV,
        price=Price(input_per_mtok=1e6, output_per_mtok=0),
    )  # a call costs $321: the first batch back is over any limit
    spec = SuiteSpec(
        space.load_policy("refunds", "v0"), "fake", 1, model_spec=model, cache_dir=str(space.cache_dir)
    )
    scenarios = _refund_scenarios()[:24]
    store = JsonlDirStore(space.traces)
    meter = Meter(limit_usd=1.0)
    with (
        open_fanout(parse_executor(cluster), space.root) as fanout,
        pytest.raises(SpendLimitError) as stopped,
    ):
        assert fanout is not None and fanout.in_flight * fanout.batch_size(24) < 24
        write_threads(space.environment("refunds"), scenarios, spec, store, executor=fanout, meter=meter)
    written = store.list_threads(limit=100).thread_ids
    # The batches sent before the limit showed finished and were written; none was sent after it.
    assert 0 < len(written) <= fanout.in_flight * fanout.batch_size(24) < len(scenarios)
    assert meter.live == len(server.requests) and meter.usd > meter.limit_usd
    assert "spend limit of $1.0 is reached" in str(stopped.value)
