"""The bundled environments, each one folder of the same shape: `machine.json`, `env.py` (the
`environment()` factory), `world.py` (the world and its tools, for a desk that has tools),
`models.py` (the stand-in models), `rules.py` (the rule evals and the exploration probe),
`scenarios.yaml` and `policies/` (with its CHANGELOG). A desk that has more keeps it in modules of
its own beside these.

They are plugins like anyone else's: registered through the `improve.environments` entry points in
improve's `pyproject.toml`, found by `improve.runtime.ENVIRONMENTS`, and never imported by the
library below the CLI.
"""
