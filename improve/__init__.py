"""improve: make LLM agents reliable by treating their control flow as a state machine and improving
their policy from their own run traces. The packages below are its layers (docs/architecture.md)."""

from improve import native as _native

DISTRIBUTION = "improve-agents"
"""The name it is installed by (`pip install improve-agents`): `improve` on PyPI is another project. The
import package and the command stay `improve`."""

_native.select()  # before anything imports the fold's modules: compiled, or the pure reference
