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
    new_entry_id,
    now_rfc3339,
)
from improve.log.replay import ReplayResult, RunStatus, gc_paused, replay, run_status, validate_log
from improve.log.store import (
    JsonlDirStore,
    MemoryStore,
    Store,
    ThreadPage,
    check_batch,
    check_from_index,
    check_upto,
    checked_thread_id,
    conflict,
    retarget,
)

__all__ = [
    "INIT_EVENT",
    "SCHEMA_VERSION",
    "USAGE_EVENT",
    "Attempt",
    "JsonlDirStore",
    "LogEntry",
    "MemoryStore",
    "ReplayResult",
    "RunStatus",
    "Store",
    "ThreadId",
    "ThreadPage",
    "Verification",
    "check_batch",
    "check_from_index",
    "check_upto",
    "checked_thread_id",
    "conflict",
    "gc_paused",
    "model_slug",
    "new_entry_id",
    "now_rfc3339",
    "replay",
    "retarget",
    "run_status",
    "validate_log",
]
