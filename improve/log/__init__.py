"""The event log: the entry format, stores, and replay.

>>> from improve.log import JsonlDirStore, replay
>>> store = JsonlDirStore(Path("traces"))
>>> thread = "train:v0:naive:small-refund-01:r1"
>>> result = replay(machine, store.read(thread), verify=True, thread_id=thread)
>>> result.verification   # "verified": chain, state hashes and end entry all check
"""

from improve.log.chain import check_chain, entry_content, entry_hash, head, is_chained, rechain, seal
from improve.log.entry import (
    END_EVENT,
    INIT_EVENT,
    MAX_ENTRY_DEPTH,
    SCHEMA_VERSION,
    UNCHAINED_VERSION,
    USAGE_EVENT,
    Attempt,
    LogEntry,
    ThreadId,
    Verification,
    entry_problems,
    model_slug,
    new_entry_id,
    now_rfc3339,
)
from improve.log.lines import (
    BOM,
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    LineScan,
    json_depth,
    line_problem,
    preview,
    scan_lines,
    split_lines,
)
from improve.log.replay import (
    ReplayResult,
    RunStatus,
    Verified,
    gc_paused,
    replay,
    run_status,
    validate_log,
)
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
    "BOM",
    "END_EVENT",
    "INIT_EVENT",
    "MAX_ENTRY_DEPTH",
    "MAX_JSON_DEPTH",
    "MAX_LINE_BYTES",
    "SCHEMA_VERSION",
    "UNCHAINED_VERSION",
    "USAGE_EVENT",
    "Attempt",
    "JsonlDirStore",
    "LineScan",
    "LogEntry",
    "MemoryStore",
    "ReplayResult",
    "RunStatus",
    "Store",
    "ThreadId",
    "ThreadPage",
    "Verification",
    "Verified",
    "check_batch",
    "check_chain",
    "check_from_index",
    "check_upto",
    "checked_thread_id",
    "conflict",
    "entry_content",
    "entry_hash",
    "entry_problems",
    "gc_paused",
    "head",
    "is_chained",
    "json_depth",
    "line_problem",
    "model_slug",
    "new_entry_id",
    "now_rfc3339",
    "preview",
    "rechain",
    "replay",
    "retarget",
    "run_status",
    "scan_lines",
    "seal",
    "split_lines",
    "validate_log",
]
