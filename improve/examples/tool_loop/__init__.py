"""tool-loop: opencli's guarded agent loop (issue #60) as a machine, with guards as registered objects.

- `env.py`: the environment (`environment()`), its sandbox world, tools, stand-in models and proofs;
- `guards.py`: the `TransitionGuard` protocol, the built-in guards and the `GuardRegistry`;
- `tapes.py`: replaying opencli session tapes through the machine (`improve tape replay`).
"""
