"""Bundled environments, by name. `load_environment("refunds")` is the embedded default."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from improve.errors import WorkspaceError
from improve.runtime.environment import Environment

BUNDLED: dict[str, str] = {
    "refunds": "improve.examples.refunds.env",
    "refund-approval": "improve.examples.refund_approval.env",
    "tool-loop": "improve.examples.tool_loop.env",
    "code-agent": "improve.examples.code_agent.env",
}
DEFAULT_ENVIRONMENT = "refunds"


def load_environment(name: str) -> Environment:
    """A bundled environment by name, or `package.module:function` returning an `Environment`."""
    if name in BUNDLED:
        module = importlib.import_module(BUNDLED[name])
        factory: Callable[[], Environment] = module.environment
        return factory()
    if ":" in name:
        # Environments are people's code (trusted, like a test suite); policies are never imported.
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise WorkspaceError(f"environment {name!r} could not be loaded: {err}") from None
        env = factory()
        if not isinstance(env, Environment):
            raise WorkspaceError(f"environment {name!r} returned {type(env).__name__}, not an Environment")
        return env
    raise WorkspaceError(
        f"unknown environment {name!r}; bundled ones are {sorted(BUNDLED)}, or give module:function"
    )
