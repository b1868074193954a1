"""The event log: the entry format, stores, and replay.

>>> from improve.log import JsonlDirStore, replay
>>> store = JsonlDirStore(Path("traces"))
>>> result = replay(machine, store.read("train:v0:naive:small-refund-01:r1"), verify=True)
"""

from improve.log.entry import (
    INIT_EVENT,
    SCHEMA_VERSION,
    USAGE_EVENT,
    Attempt,
    LogEntry,
    ThreadId,
    Verification,
    model_slug,
)
from improve.log.replay import ReplayResult, replay, run_status, validate_log
from improve.log.store import JsonlDirStore, MemoryStore, Store, ThreadPage

__all__ = [
    "INIT_EVENT",
    "SCHEMA_VERSION",
    "USAGE_EVENT",
    "Attempt",
    "JsonlDirStore",
    "LogEntry",
    "MemoryStore",
    "ReplayResult",
    "Store",
    "ThreadId",
    "ThreadPage",
    "Verification",
    "model_slug",
    "replay",
    "run_status",
    "validate_log",
]
