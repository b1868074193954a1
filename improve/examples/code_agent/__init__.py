"""`code-agent`: the normalize `@agent` explorer/evaluator machine, its fixture repository, stand-in
models with the original's recorded failure modes, and a freeform variant to compare it with
(`freeform.py`, a `parity compare` runner)."""
