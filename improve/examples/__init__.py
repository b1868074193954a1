"""The bundled environments, each one folder: machine, world and tools, stand-in models, rule evals,
probes, scenarios, policies and CHANGELOG.

They are plugins like anyone else's: registered through the `improve.environments` entry points in
improve's `pyproject.toml`, found by `improve.runtime.ENVIRONMENTS`, and never imported by the
library below the CLI.
"""
