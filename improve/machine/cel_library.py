"""The `cel` package, imported without its command line.

`cel/__init__.py` imports `cel.cli`, its interactive REPL, which brings typer, prompt_toolkit, pygments
and rich: 0.2 s of CPU, a seventh of a one-scenario `improve run` and of every other command that
compiles a guard. improve only compiles and evaluates (`cel.compile`, `cel.Context`, `cel.evaluate`),
so a placeholder stands in for `cel.cli` while the package imports, and is taken away after: a later
`import cel.cli` (someone's own code in the same process) loads the real one.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

_lock = threading.Lock()


def cel() -> Any:
    """The imported `cel` module (at most one import per process, whoever asks first)."""
    loaded = sys.modules.get("cel")
    if loaded is not None:
        return loaded
    with _lock:
        loaded = sys.modules.get("cel")
        if loaded is not None:
            return loaded
        placeholder = types.ModuleType("cel.cli")
        sys.modules.setdefault("cel.cli", placeholder)
        try:
            import cel as imported
        finally:
            if sys.modules.get("cel.cli") is placeholder:
                del sys.modules["cel.cli"]
        if getattr(imported, "cli", None) is placeholder:
            del imported.cli
        return imported
