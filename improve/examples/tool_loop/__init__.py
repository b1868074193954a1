"""`tool-loop`: opencli's guarded agent loop (issue #60) as a machine, acting on a fake sandbox, with
its safety checks as guard objects registered on the loop (`guards.py`) rather than written into it;
opencli session tapes replay through the same loop (`improve tape replay`: `tapes.py` reads them,
`tape_replay.py` replays them)."""
