"""The views analysts rely on, with a description of every column stored as DuckDB comments.

The comments live in the database file itself (`COMMENT ON ...`), so `improve sql --schema`, the
`duckdb` CLI and any DuckDB client see the same documentation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Relation:
    name: str
    description: str
    columns: dict[str, str]
    sql: str | None = None  # None for tables (created by migrations)
    in_lake: bool = True
    """False for a view over a table a Parquet lake does not hold (`lake.LAKE_TABLES`)."""


THREAD_PARTS = r"'^[^:]+:[^:]+:([^:]+:)?[^:]+:r[0-9]+$'"
"""`split:version:model:scenario:rK`, or the older `split:version:scenario:rK` (no model)."""

VERIFIED = "thread_id NOT IN (SELECT thread_id FROM quarantine)"
"""The condition the analyst views over `entries` put on a thread: it is not set aside in `quarantine`.
The README promises that no score, diagnosis or round uses a thread that does not verify (an entry
edited after it was written, a thread cut short); a count of refusals or tokens over every entry
counted the edited ones too, so these views leave them out, and `threads` says which they are."""

SET_ASIDE = "Threads in `quarantine` (whose replay does not verify, or that were cut short) are left out."

RELATIONS: tuple[Relation, ...] = (
    Relation(
        "quarantine",
        "Threads set aside because their replay does not verify (an edited, removed, inserted or reordered "
        "entry, a state that diverges, a thread cut short): no score, diagnosis or round uses them.",
        {
            "thread_id": "The thread.",
            "environment": "The environment it claims to have run in.",
            "reason": "What did not verify, naming the first bad entry.",
            "entries": "Entries in the thread when it was checked.",
            "quarantined_at": "When.",
        },
    ),
    Relation(
        "entries",
        "Every log entry ingested, one row per (thread_id, index); the journal as it was written.",
        {
            "thread_id": "The thread (one run): split:policyVersion:model:scenario:rK for a scenario's run made by "
            "improve (train:v3:naive:refund-small:r1; older ones split:policyVersion:scenario:rK), the caller's id "
            "for a deployed agent's run, or the importer's for another agent's log.",
            "index": "0-based position in the thread; contiguous.",
            "entry_id": "The entry's unique id.",
            "recorded_at": "When it was written, RFC 3339 text exactly as journaled (cast with ::TIMESTAMPTZ).",
            "machine_id": "The environment machine that recorded the thread.",
            "machine_version": "Its version.",
            "event_type": "event.type: @agent.init, xstate.done.actor, a decision's event, @agent.usage, ...",
            "event": "The event, whole, as JSON.",
            "causation_id": "The entry that caused this one.",
            "attempts": "Refused answers before the event landed (JSON array of {event, kind, reason, guard}).",
            "metadata": "The stamp on entry 0; decision name, options offered and source on decisions.",
            "state_hash": "sha256 of the snapshot after the entry.",
            "schema_version": "Log format version: 2 (chained, with entry_hash) or 1.",
            "line_thread_id": "The line carried its threadId (a file holding many threads).",
            "source": "The file the entry was ingested from (NULL when appended directly).",
            "batch_id": "The ingest batch that added it.",
            "raw": "The original line, for entries imported from another agent's log format.",
            "entry_hash": "schemaVersion 2: the entry's link in its thread's hash chain (sha256 of the previous "
            "entry's entry_hash, or the thread id, with the entry's content). NULL for version 1 and other formats. "
            "Kept as written, not checked on ingest: `improve replay --verify` checks it.",
        },
    ),
    Relation(
        "thread_lengths",
        "One row per thread in entries: how many entries it holds. Every write to entries advances its "
        "thread's row in the same transaction, so two writers to one thread cannot both commit.",
        {
            "thread_id": "The thread.",
            "entries": "Its entries in the warehouse (indices 0 to entries - 1).",
        },
    ),
    Relation(
        "rejected_lines",
        "Lines that could not be ingested: nothing is dropped silently.",
        {
            "file": "The file the line came from.",
            "line": "1-based line number in that file.",
            "error": "Why it was rejected: not JSON, a missing or mistyped field, a gap in indices, a conflict.",
            "raw": "The line as it was.",
            "batch_id": "The ingest batch that read it.",
            "rejected_at": "When.",
        },
    ),
    Relation(
        "ingested_files",
        "One row per file ingested: how it looked when read, so a file read again unchanged is skipped, and "
        "one changed since is read again (its lines past what the warehouse holds ingested, others checked).",
        {
            "path": "The file, as given to ingest (resolved).",
            "size": "Its size in bytes when read.",
            "mtime_ns": "Its modification time (nanoseconds) when read.",
            "sha256": "The sha256 of its content when read.",
            "lines": "Non-blank lines read from it.",
            "rejected": "Of those, lines sent to rejected_lines.",
            "batch_id": "The ingest batch that last read it.",
        },
        in_lake=False,
    ),
    Relation(
        "schema_migrations",
        "The warehouse's schema changes applied, in order (and the version of its views): a warehouse is "
        "migrated forward when opened; one written by a newer improve is refused.",
        {
            "name": "The migration (`009_outcome_label`), or `views:` and the digest of the views' definitions.",
            "applied_at": "When it was applied.",
        },
        in_lake=False,
    ),
    Relation(
        "ingest_batches",
        "One row per `improve ingest` batch (one transaction): lines read = ingested + already present + rejected.",
        {
            "batch_id": "Batch id.",
            "format": "native, normalize, opencli (or an importer a package or workspace adds), or otlp (spans).",
            "started_at": "When the batch started.",
            "finished_at": "When it committed.",
            "files": "Files read.",
            "lines_read": "Non-blank lines read (for otlp: spans read, plus lines that held none).",
            "ingested": "Entries added (for otlp: spans added to otel_spans).",
            "already_present": "Lines identical to an entry already stored (ingest is idempotent).",
            "rejected": "Lines sent to rejected_lines.",
        },
    ),
    Relation(
        "otel_spans",
        "OpenTelemetry spans ingested from OTLP/JSON exports (`improve ingest --format otlp`): any agent's "
        "traces, from an OpenTelemetry Collector's file exporter, an SDK, or `improve export --format otlp`.",
        {
            "trace_id": "The trace (32 hex digits).",
            "span_id": "The span (16 hex digits); (trace_id, span_id) is the key.",
            "parent_span_id": "The parent span (NULL for a root span).",
            "trace_state": "W3C trace state, as written.",
            "flags": "W3C trace flags and the OTLP span flags, as written.",
            "name": "The span's name, e.g. `chat gpt-4.1` or `execute_tool lookup`.",
            "kind": "INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER or UNSPECIFIED.",
            "start_time": "Start, to the microsecond.",
            "end_time": "End, to the microsecond.",
            "start_unix_nano": "Start in nanoseconds since 1970, exactly as written.",
            "end_unix_nano": "End in nanoseconds since 1970, exactly as written.",
            "duration_ms": "End minus start, in milliseconds.",
            "status_code": "UNSET, OK or ERROR.",
            "status_message": "The status message (usually the error), NULL when empty.",
            "attributes": "The span's attributes as a JSON object (`attributes ->> '$.\"gen_ai.request.model\"'`); "
            "ints and doubles stay numbers, arrays lists, bytes base64 text.",
            "events": "Span events, JSON array of {name, time_unix_nano, attributes}.",
            "links": "Links, JSON array of {trace_id, span_id, attributes}.",
            "dropped_attributes_count": "Attributes the writer dropped (its limits).",
            "dropped_events_count": "Events the writer dropped.",
            "dropped_links_count": "Links the writer dropped.",
            "service_name": "The resource's service.name.",
            "resource_attributes": "The resource's attributes, JSON object.",
            "resource_schema_url": "The resource's semantic-conventions schema URL.",
            "scope_name": "The instrumentation scope (library) that made the span.",
            "scope_version": "Its version.",
            "scope_attributes": "The scope's attributes, JSON object.",
            "scope_schema_url": "The scope's schema URL.",
            "raw": "The span's OTLP JSON as it was read (ids in hex), unknown fields included: nothing is lost.",
            "content_hash": "sha256 of the span as parsed, with its resource and scope: ingesting it again is "
            "recognised, a different span under the same ids is a conflict.",
            "source": "The file it was ingested from.",
            "line": "The line of that file holding its export document.",
            "batch_id": "The ingest batch that added it.",
            "ingested_at": "When.",
        },
    ),
    Relation(
        "otel_sessions",
        "One row per OpenTelemetry trace in otel_spans (one agent run): the agent, its model, tokens, model "
        "and tool calls, errors and duration, read through the GenAI semantic conventions.",
        {
            "trace_id": "The trace.",
            "agent": "gen_ai.agent.name of its first span naming one, else the root's service.name.",
            "service": "The root span's service.name (the first span's when there is no root).",
            "root_span": "The root span's name, e.g. `invoke_agent support-bot`; improve's say the run and its outcome, "
            "`invoke_agent refunds: refund-01 r1 (v3, naive) -> issued, passed`.",
            "model": "The first model call's model (gen_ai.response.model, else gen_ai.request.model).",
            "models": "Every model named by a model call, sorted.",
            "model_calls": "Spans whose gen_ai.operation.name is chat, text_completion or generate_content.",
            "input_tokens": "gen_ai.usage.input_tokens (or the older prompt_tokens) over the model calls; the "
            "agent spans' when no other span reports usage (so nothing counts twice).",
            "output_tokens": "gen_ai.usage.output_tokens (or completion_tokens), counted the same way.",
            "tool_calls": "Spans whose gen_ai.operation.name is execute_tool.",
            "tools": "The tools called (gen_ai.tool.name), sorted.",
            "errors": "Spans with status ERROR.",
            "spans": "Spans in the trace.",
            "started_at": "First span start.",
            "ended_at": "Last span end.",
            "duration_ms": "From the first start to the last end, in milliseconds.",
            "thread_id": "For traces exported by improve: the thread (join threads, outcomes); else NULL.",
            "status": "For improve's traces: the run's status (done, error, ...).",
            "outcome": "For improve's traces: the final state, when the thread was scored.",
            "passed": "For improve's traces: whether the run passed its scenario.",
        },
        """
        WITH spans AS (
            SELECT *,
                   attributes ->> '$."gen_ai.operation.name"' AS op,
                   coalesce(TRY_CAST(attributes ->> '$."gen_ai.usage.input_tokens"' AS BIGINT),
                            TRY_CAST(attributes ->> '$."gen_ai.usage.prompt_tokens"' AS BIGINT)) AS tokens_in,
                   coalesce(TRY_CAST(attributes ->> '$."gen_ai.usage.output_tokens"' AS BIGINT),
                            TRY_CAST(attributes ->> '$."gen_ai.usage.completion_tokens"' AS BIGINT)) AS tokens_out,
                   coalesce(attributes ->> '$."gen_ai.response.model"',
                            attributes ->> '$."gen_ai.request.model"') AS span_model
            FROM otel_spans
        )
        SELECT trace_id,
               coalesce(arg_min(attributes ->> '$."gen_ai.agent.name"', start_unix_nano)
                            FILTER (WHERE (attributes ->> '$."gen_ai.agent.name"') IS NOT NULL),
                        arg_min(service_name, start_unix_nano) FILTER (WHERE parent_span_id IS NULL),
                        arg_min(service_name, start_unix_nano)) AS agent,
               coalesce(arg_min(service_name, start_unix_nano) FILTER (WHERE parent_span_id IS NULL),
                        arg_min(service_name, start_unix_nano)) AS service,
               arg_min(name, start_unix_nano) FILTER (WHERE parent_span_id IS NULL) AS root_span,
               arg_min(span_model, start_unix_nano)
                   FILTER (WHERE op IN ('chat', 'text_completion', 'generate_content') AND span_model IS NOT NULL)
                   AS model,
               coalesce(list(DISTINCT span_model ORDER BY span_model)
                            FILTER (WHERE op IN ('chat', 'text_completion', 'generate_content')
                                    AND span_model IS NOT NULL), []) AS models,
               coalesce(sum(coalesce(TRY_CAST(attributes ->> '$."improve.usage.calls"' AS BIGINT), 1))
                            FILTER (WHERE op IN ('chat', 'text_completion', 'generate_content')), 0) AS model_calls,
               CASE WHEN count(tokens_in) FILTER (WHERE op IS DISTINCT FROM 'invoke_agent') > 0
                    THEN sum(tokens_in) FILTER (WHERE op IS DISTINCT FROM 'invoke_agent')
                    ELSE coalesce(sum(tokens_in), 0) END AS input_tokens,
               CASE WHEN count(tokens_out) FILTER (WHERE op IS DISTINCT FROM 'invoke_agent') > 0
                    THEN sum(tokens_out) FILTER (WHERE op IS DISTINCT FROM 'invoke_agent')
                    ELSE coalesce(sum(tokens_out), 0) END AS output_tokens,
               count(*) FILTER (WHERE op = 'execute_tool') AS tool_calls,
               coalesce(list(DISTINCT attributes ->> '$."gen_ai.tool.name"' ORDER BY attributes ->> '$."gen_ai.tool.name"')
                            FILTER (WHERE op = 'execute_tool' AND (attributes ->> '$."gen_ai.tool.name"') IS NOT NULL),
                        []) AS tools,
               count(*) FILTER (WHERE status_code = 'ERROR') AS errors,
               count(*) AS spans,
               min(start_time) AS started_at,
               max(end_time) AS ended_at,
               (max(end_unix_nano) - min(start_unix_nano)) / 1e6 AS duration_ms,
               max(attributes ->> '$."improve.thread.id"') AS thread_id,
               max(attributes ->> '$."improve.status"') AS status,
               max(attributes ->> '$."improve.outcome"') AS outcome,
               bool_or(TRY_CAST(attributes ->> '$."improve.passed"' AS BOOLEAN)) AS passed
        FROM spans
        GROUP BY trace_id
        """,
        in_lake=False,
    ),
    Relation(
        "outcomes",
        "One row per thread, materialized by replaying it against its environment and scoring it against "
        "the scenario's labels (never the agent's own report). A scorecard's pass rate is the mean over "
        "scenarios of each one's pass fraction, and a round runs changed scenarios again (more rows for "
        "them): an average over these rows weighs those more; `scenario_passes` averages per scenario first. "
        "A run recorded before its scenario or the environment changed is scored against the label now but "
        "is not `current`: `improve score` leaves it out, and so must a pass rate (`WHERE current`).",
        {
            "thread_id": "The thread.",
            "environment": "The environment it ran in.",
            "scenario": "Scenario id.",
            "category": "Scenario category.",
            "split": "train, held-out or test (from the thread id, else its stamp; NULL for a deployed agent's "
            "thread).",
            "policy_version": "Policy version label (v3).",
            "run": "Run number within k.",
            "final_state": "The state the replay ends in.",
            "status": "done, waiting (or checkpointed, blocked_ask: resumable), budget, decision-exhausted, error "
            "or incomplete.",
            "output": "The final state's output.",
            "steps": "Entries folded (usage records excluded).",
            "model_calls": "Model calls journaled.",
            "input_tokens": "Input tokens journaled.",
            "output_tokens": "Output tokens journaled.",
            "failed_attempts": "Refused decider answers.",
            "violations": "Rule violations: the world's audit of the effects plus any sentinel state reached.",
            "violation_rules": "Which rules were violated.",
            "expected_outcome": "The labelled final state (NULL when the scenario is unknown).",
            "passed": "Outcome and every effect as labelled, no violation (NULL when the scenario is unknown).",
            "reason": "Why it passed or failed.",
            "entries": "Entries in the thread when it was replayed.",
            "replayed_at": "When the row was materialized.",
            "model": "The model bound to the decider (from the thread's stamp; NULL for other agents' logs).",
            "effects": "The effects the world recorded, in order (JSON array).",
            "violation_details": "Each violation: the rule and what broke it (JSON array).",
            "cost_usd": "USD the thread's model calls cost (0 when none was priced).",
            "decisions": "Decisions the model was asked.",
            "fallbacks": "Of those, decisions the policy's onError answered because a model call failed (the "
            "endpoint: an HTTP error, a timeout, a refused request), not because of the model's answer.",
            "fallback_reason": "The first failed model call's error (NULL when none failed).",
            "label": "A digest of what scored the row: the scenario's label, category and world, and what a run "
            "of it starts from (the environment's files, the scenario's input, world and people) (NULL when the "
            "scenario is unknown); a row whose scenario or environment has changed since is scored again.",
            "current": "The run was recorded from what a run of its scenario starts from now (its stamp's "
            "digests of the environment's files and of the scenario's input, world and people are today's, or "
            "it carries none): `improve score` scores only these, so a pass rate that agrees with it filters "
            "`WHERE current`. False for a run recorded before the scenario or the environment changed "
            "(`improve run` records it again); NULL when not scored. Brought up to date by `improve ingest` "
            "and by the commands that read the run.",
        },
    ),
    Relation(
        "scenario_passes",
        "One row per scenario, split, policy version and model: its runs and pass fraction, as a scorecard "
        "counts them (a pass rate is the mean of `pass_fraction` over a split's scenarios). Only `current` "
        "runs count: a run recorded before its scenario or the environment changed is left out, as "
        "`improve score` leaves it out.",
        {
            "environment": "The environment.",
            "split": "train, held-out or test.",
            "policy_version": "Policy version label (v3).",
            "model": "The model bound to the decider (NULL for other agents' logs).",
            "scenario": "Scenario id.",
            "category": "Scenario category.",
            "runs": "Scored runs of it that are current.",
            "passed": "Of those, runs that passed.",
            "pass_fraction": "passed / runs.",
        },
        """
        SELECT environment, split, policy_version, model, scenario, any_value(category) AS category,
               count(*) AS runs, count(*) FILTER (WHERE passed) AS passed,
               avg(passed::INTEGER) AS pass_fraction
        FROM outcomes
        WHERE passed IS NOT NULL AND current
        GROUP BY environment, split, policy_version, model, scenario
        """,
    ),
    Relation(
        "threads",
        "One row per thread: its id parsed into split, policy version, model, scenario and run; machine; size; "
        "times; whether it is chained and ended, and whether it is set aside in `quarantine` (every thread is "
        "here; the other views over entries leave the quarantined ones out).",
        {
            "thread_id": "The thread.",
            "split": "train, held-out or test (NULL when the id is neither split:version:model:scenario:rK nor "
            "the older split:version:scenario:rK).",
            "policy_version": "Policy version label, e.g. v3 (from the id, else from the stamp of its first entry, "
            "as a deployed agent's thread has it).",
            "model": "The model's name as in the id, else as the stamp of its first entry names it (NULL for ids "
            "of the older form without one and no stamp).",
            "scenario": "Scenario id.",
            "run": "Run number.",
            "machine_id": "Environment machine id.",
            "machine_version": "Environment machine version.",
            "entries": "Entry count.",
            "first_at": "First recorded_at.",
            "last_at": "Last recorded_at.",
            "chained": "Every entry is schemaVersion 2 with an entry_hash: `improve replay --verify` can check "
            "its content entry by entry. False for version 1 threads (and other formats).",
            "ended": "Its last entry is @agent.end: the run finished (a chained thread without it is incomplete).",
            "end_status": "The status the last end entry records (done, waiting, checkpointed, blocked_ask, budget, "
            "decision-exhausted, error; idle in threads written before runs could be resumed).",
            "head_hash": "The last entry's entry_hash: the thread's digest, which depends on every entry.",
            "quarantined": "The thread is in `quarantine`: its replay does not verify (an entry edited, removed, "
            "inserted or reordered after it was written, a state that diverges) or it was cut short; "
            "`decisions`, `attempts`, `usage`, `outcomes` and `scenario_passes` leave it out, and the "
            "quarantine table says why. False for every other thread, replayed or not (another agent's log, a "
            "machine no environment of the workspace has).",
        },
        f"""
        SELECT thread_id,
               CASE WHEN regexp_matches(thread_id, {THREAD_PARTS}) THEN string_split(thread_id, ':')[1] END AS split,
               coalesce(
                   CASE WHEN regexp_matches(thread_id, {THREAD_PARTS}) THEN string_split(thread_id, ':')[2] END,
                   'v' || ltrim(min(metadata ->> '$.policy.version') FILTER (WHERE "index" = 0), 'v')
               ) AS policy_version,
               coalesce(
                   CASE WHEN regexp_matches(thread_id, {THREAD_PARTS}) AND len(string_split(thread_id, ':')) = 5
                        THEN string_split(thread_id, ':')[3] END,
                   min(metadata ->> '$.models.decider') FILTER (WHERE "index" = 0)
               ) AS model,
               CASE WHEN regexp_matches(thread_id, {THREAD_PARTS}) THEN string_split(thread_id, ':')[-2] END
                   AS scenario,
               CASE WHEN regexp_matches(thread_id, {THREAD_PARTS})
                    THEN TRY_CAST(substr(string_split(thread_id, ':')[-1], 2) AS INTEGER) END AS run,
               min(machine_id) AS machine_id,
               min(machine_version) AS machine_version,
               count(*) AS entries,
               min(TRY_CAST(recorded_at AS TIMESTAMPTZ)) AS first_at,
               max(TRY_CAST(recorded_at AS TIMESTAMPTZ)) AS last_at,
               bool_and(schema_version = 2 AND entry_hash IS NOT NULL) AS chained,
               arg_max(event_type, "index") = '@agent.end' AS ended,
               arg_max(event ->> '$.status', "index") FILTER (WHERE event_type = '@agent.end') AS end_status,
               arg_max_null(entry_hash, "index") AS head_hash,
               thread_id IN (SELECT thread_id FROM quarantine) AS quarantined
        FROM entries
        GROUP BY thread_id
        """,
    ),
    Relation(
        "waiting",
        "One row per thread whose run stopped in a waiting state and can be resumed (`improve resume`): "
        "where it waits, for which events, since when; and per thread whose resume was interrupted after "
        "its event was journaled (status `interrupted`: `improve resume THREAD --finish` ends it). "
        "`improve waiting` lists it.",
        {
            "thread_id": "The thread.",
            "environment": "The environment it ran in (its stamp's; NULL when the stamp names none).",
            "scenario": "Scenario id (NULL when the id is neither split:version:model:scenario:rK nor the older "
            "split:version:scenario:rK).",
            "policy_version": "Policy version label, e.g. v3.",
            "model": "The model's name as in the id.",
            "status": "waiting, checkpointed or blocked_ask (the waiting state's meta.status); idle in threads "
            "written before runs could be resumed; interrupted when a resume's event was journaled and the run "
            "has not ended since (finish it: `improve resume THREAD --finish`).",
            "state": "The waiting state (NULL for an idle end entry, which did not say); for an interrupted "
            "resume, the state it was resumed from.",
            "events": "The event types it accepts, in the order of the state's transitions (none when "
            "interrupted: only --finish goes on).",
            "waiting_for": "Each accepted event with the JSON Schema of its payload: [{type, payload}] as the end "
            "entry's waitingFor records it (NULL when interrupted).",
            "since": "When the run stopped (its end entry's recorded_at; when interrupted, its last entry's).",
            "resumes": "How many times the run was resumed before it stopped here.",
            "entries": "Entries in the thread.",
            "head_hash": "The end entry's entry_hash: a resume chains its first entry to it.",
        },
        """
        SELECT l.thread_id, l.environment, t.scenario, t.policy_version, t.model,
               CASE WHEN l.interrupted THEN 'interrupted' ELSE l.event ->> '$.status' END AS status,
               CASE WHEN l.interrupted THEN l.end_event ->> '$.state' ELSE l.event ->> '$.state' END AS state,
               CASE WHEN l.interrupted THEN []
                    ELSE coalesce(json_extract_string(l.event, '$.waitingFor[*].type'), []) END AS events,
               CASE WHEN l.interrupted THEN NULL ELSE l.event -> '$.waitingFor' END AS waiting_for,
               TRY_CAST(l.recorded_at AS TIMESTAMPTZ) AS since,
               l.resumes, l.entries, l.head_hash
        FROM (
            SELECT *, coalesce(last_resume > coalesce(last_end, -1), false) AS interrupted
            FROM (
                SELECT thread_id,
                       arg_max(event, "index") AS event,
                       arg_max(event_type, "index") AS event_type,
                       arg_max(recorded_at, "index") AS recorded_at,
                       arg_max_null(entry_hash, "index") AS head_hash,
                       arg_min(metadata ->> '$.environment', "index") AS environment,
                       count(*) FILTER (WHERE json_exists(metadata, '$.resume')) AS resumes,
                       count(*) AS entries,
                       max("index") FILTER (WHERE event_type = '@agent.end') AS last_end,
                       arg_max(event, "index") FILTER (WHERE event_type = '@agent.end') AS end_event,
                       max("index") FILTER (WHERE json_exists(metadata, '$.resume')) AS last_resume
                FROM entries
                GROUP BY thread_id
            )
        ) AS l
        JOIN threads AS t USING (thread_id)
        -- json_extract_string, not ->>: DuckDB 1.2 plans `->> ... IN (...)` beside the filter on the event
        -- type into a cast of the whole event to a number on a Parquet lake.
        WHERE l.interrupted
           OR (l.event_type = '@agent.end'
               AND json_extract_string(l.event, '$.status') IN ('waiting', 'checkpointed', 'blocked_ask', 'idle'))
        """,
    ),
    Relation(
        "decisions",
        "One row per decision: its name, the event chosen (NULL when every answer was refused), the options "
        "offered and how many attempts it took. " + SET_ASIDE,
        {
            "thread_id": "The thread.",
            "index": "Entry index of the decision.",
            "decision": "Decision name, e.g. chooseResolution.",
            "chosen_event": "Type of the event that landed (NULL when exhausted).",
            "chosen": "The event that landed, with its payload.",
            "options": "Options offered (the events the guards accepted), JSON array.",
            "option_count": "How many options were offered.",
            "attempts": "Answers it took: refused ones plus the one that landed.",
            "failed_attempts": "Refused answers.",
            "exhausted": "Every answer was refused (the invoke's onError was taken).",
            "source": "Who answered, e.g. policy:<final state> of the policy.",
            "recorded_at": "When it landed.",
        },
        """
        SELECT thread_id, "index",
               metadata ->> '$.decision.name' AS decision,
               CASE WHEN event_type = 'xstate.error.actor' THEN NULL ELSE event_type END AS chosen_event,
               CASE WHEN event_type = 'xstate.error.actor' THEN NULL ELSE event END AS chosen,
               metadata -> '$.decision.options' AS options,
               json_array_length(metadata -> '$.decision.options') AS option_count,
               coalesce(json_array_length(attempts), 0)
                   + CASE WHEN event_type = 'xstate.error.actor' THEN 0 ELSE 1 END AS attempts,
               coalesce(json_array_length(attempts), 0) AS failed_attempts,
               event_type = 'xstate.error.actor' AS exhausted,
               metadata ->> '$.source' AS source,
               TRY_CAST(recorded_at AS TIMESTAMPTZ) AS recorded_at
        FROM entries
        WHERE json_exists(metadata, '$.decision') AND """
        + VERIFIED,
    ),
    Relation(
        "attempts",
        "One row per refused answer: the failure kind, its reason, the event attempted and the guard that "
        "refused it. " + SET_ASIDE,
        {
            "thread_id": "The thread.",
            "index": "Entry index of the decision it belongs to.",
            "decision": "Decision name.",
            "attempt": "1-based position among the refused answers.",
            "kind": "unknown-event, invalid-payload, rejected-by-guard or no-answer.",
            "reason": "The fixed reason sentence fed back to the decider.",
            "attempted_event": "Type of the event attempted.",
            "attempted": "The event attempted, whole.",
            "guard": "For rejected-by-guard: the guard that refused it (state, event, transition, expression).",
        },
        """
        SELECT thread_id, "index", decision, attempt,
               att ->> '$.kind' AS kind,
               att ->> '$.reason' AS reason,
               att ->> '$.event.type' AS attempted_event,
               att -> '$.event' AS attempted,
               att ->> '$.guard' AS guard
        FROM (
            SELECT thread_id, "index", metadata ->> '$.decision.name' AS decision,
                   unnest(json_extract(attempts, '$[*]')) AS att,
                   generate_subscripts(json_extract(attempts, '$[*]'), 1) AS attempt
            FROM entries
            WHERE attempts IS NOT NULL AND """
        + VERIFIED
        + """
        )
        """,
    ),
    Relation(
        "usage",
        "Model calls, tokens and cost per thread, from the @agent.usage spend records. " + SET_ASIDE,
        {
            "thread_id": "The thread.",
            "model_calls": "Model calls.",
            "input_tokens": "Input tokens.",
            "output_tokens": "Output tokens.",
            "tokens": "Input plus output tokens.",
            "cost_usd": "USD spent, from the model's price table (NULL when no call was priced).",
            "recorded_calls": "Calls answered from recorded responses (--cache replay) rather than live.",
            "models": "Models that answered.",
            "fingerprints": "The endpoints' system_fingerprint values reported, if any.",
        },
        """
        SELECT thread_id,
               sum(coalesce(TRY_CAST(event ->> '$.calls' AS BIGINT), 1)) AS model_calls,
               sum(coalesce(TRY_CAST(event ->> '$.inputTokens' AS BIGINT), 0)) AS input_tokens,
               sum(coalesce(TRY_CAST(event ->> '$.outputTokens' AS BIGINT), 0)) AS output_tokens,
               sum(coalesce(TRY_CAST(event ->> '$.inputTokens' AS BIGINT), 0)
                   + coalesce(TRY_CAST(event ->> '$.outputTokens' AS BIGINT), 0)) AS tokens,
               sum(TRY_CAST(event ->> '$.costUsd' AS DOUBLE)) AS cost_usd,
               count(*) FILTER (WHERE (event ->> '$.recorded') = 'true') AS recorded_calls,
               list(DISTINCT event ->> '$.model' ORDER BY event ->> '$.model') AS models,
               list(DISTINCT event ->> '$.fingerprint' ORDER BY event ->> '$.fingerprint')
                   FILTER (WHERE (event ->> '$.fingerprint') IS NOT NULL) AS fingerprints
        FROM entries
        WHERE event_type = '@agent.usage' AND """
        + VERIFIED
        + """
        GROUP BY thread_id
        """,
    ),
    Relation(
        "sessions",
        "One row per normalize @agent session imported with --format normalize (threads normalize:<session_id>).",
        {
            "thread_id": "The thread: normalize:<session_id>.",
            "session_id": "The agent's session id (from session_start; the file stem when there is none).",
            "task": "The task: the task event's user_prompt (prompt in early v1 logs).",
            "role": "The v2 role (investigator, auditor, refactorer, ...); NULL for v1.",
            "provider": "LLM provider named by the task event (anthropic, gemini, ...).",
            "model": "Model named by the task event.",
            "version": "The agent's format: v1 (freeform loop) or v2 (state machine: explorer/evaluator states).",
            "max_turns": "The turn budget given in the task event.",
            "turns": "turn_start events (turns actually started).",
            "last_turn": "The highest turn number any event names (max_turns_reached may name one never started).",
            "commands": "command events (commands the agent ran).",
            "failed_commands": "command events with success = false.",
            "terminal_event": "The last event other than session_end: done, max_turns_reached, loop_detected, ... "
            "(llm_response, command or turn_start when the session stopped mid-turn).",
            "ended": "The log has a session_end event (the agent closed the session).",
            "answer": "The done event's answer (v2) or summary (v1); NULL without a done event.",
            "started_at": "First recorded_at.",
            "ended_at": "Last recorded_at.",
            "entries": "Entries (log lines) in the thread.",
        },
        """
        SELECT thread_id,
               coalesce(arg_min(event ->> '$.session_id', "index")
                            FILTER (WHERE event_type = 'normalize.session_start'),
                        substr(thread_id, length('normalize:') + 1)) AS session_id,
               arg_min(coalesce(event ->> '$.user_prompt', event ->> '$.prompt'), "index")
                   FILTER (WHERE event_type = 'normalize.task') AS task,
               arg_min(event ->> '$.role', "index") FILTER (WHERE event_type = 'normalize.task') AS role,
               arg_min(event ->> '$.provider', "index") FILTER (WHERE event_type = 'normalize.task') AS provider,
               arg_min(event ->> '$.model', "index") FILTER (WHERE event_type = 'normalize.task') AS model,
               min(machine_version) AS version,
               arg_min(TRY_CAST(event ->> '$.max_turns' AS INTEGER), "index")
                   FILTER (WHERE event_type = 'normalize.task') AS max_turns,
               count(*) FILTER (WHERE event_type = 'normalize.turn_start') AS turns,
               max(TRY_CAST(event ->> '$.turn' AS INTEGER)) AS last_turn,
               count(*) FILTER (WHERE event_type = 'normalize.command') AS commands,
               count(*) FILTER (WHERE event_type = 'normalize.command' AND (event ->> '$.success') = 'false')
                   AS failed_commands,
               substr(arg_max(event_type, "index") FILTER (WHERE event_type != 'normalize.session_end'),
                      length('normalize.') + 1) AS terminal_event,
               bool_or(event_type = 'normalize.session_end') AS ended,
               arg_max(coalesce(event ->> '$.answer', event ->> '$.summary'), "index")
                   FILTER (WHERE event_type = 'normalize.done') AS answer,
               min(TRY_CAST(recorded_at AS TIMESTAMPTZ)) AS started_at,
               max(TRY_CAST(recorded_at AS TIMESTAMPTZ)) AS ended_at,
               count(*) AS entries
        FROM entries
        WHERE machine_id = 'normalize-agent' AND starts_with(thread_id, 'normalize:')
        GROUP BY thread_id
        """,
    ),
    Relation(
        "session_checkpoints",
        "One row per normalize @agent checkpoint (session-<id>.json) imported with --format normalize: the "
        "session state saved for --resume.",
        {
            "thread_id": "The checkpoint's thread: normalize-checkpoint:<session_id>.",
            "session_thread_id": "The session's log thread (join sessions.thread_id).",
            "session_id": "The agent's session id.",
            "task": "The task the session was given.",
            "turn": "The turn the checkpoint was saved at.",
            "saved_at": "The checkpoint's timestamp as written: local time of the writer, no offset.",
            "working_memory_items": "Items in the saved working memory.",
            "working_memory": "The saved working memory (JSON array of {type, id, content, cmd, success}).",
            "progress": "The saved progress note.",
            "open_questions": "The saved open questions.",
            "source": "The checkpoint file.",
        },
        """
        SELECT thread_id,
               'normalize:' || substr(thread_id, length('normalize-checkpoint:') + 1) AS session_thread_id,
               event ->> '$.session_id' AS session_id,
               event ->> '$.task' AS task,
               TRY_CAST(event ->> '$.turn' AS INTEGER) AS turn,
               event ->> '$.timestamp' AS saved_at,
               json_array_length(event -> '$.working_memory') AS working_memory_items,
               event -> '$.working_memory' AS working_memory,
               event ->> '$.progress' AS progress,
               event ->> '$.open_questions' AS open_questions,
               source
        FROM entries
        WHERE event_type = 'normalize.session_checkpoint' AND starts_with(thread_id, 'normalize-checkpoint:')
        """,
    ),
    Relation(
        "checkpoints_resumable",
        "One row per checkpoint, normalize's (session-<id>.json) and the code agent's (its checkpoint.save "
        "output): which of what a resume needs (working memory, notes, plan, state) it holds, and which of "
        "those its session had but the checkpoint dropped. " + SET_ASIDE,
        {
            "thread_id": "The thread the checkpoint is in.",
            "agent": "normalize (imported checkpoints) or code-agent (improve's own runs).",
            "session_thread_id": "The session's thread: for normalize its log thread (may not be imported).",
            "task": "The task.",
            "turn": "The turn it was saved at (normalize), or the turns used (code-agent).",
            "has_memory": "It holds the working memory (normalize: working_memory; code-agent: memory).",
            "has_notes": "It holds the notes (normalize checkpoints have none: progress is one summary line).",
            "has_plan": "It holds the plan.",
            "has_state": "It holds the machine's state (which state, the budgets, the edits made).",
            "session_had_notes": "The session wrote notes before the checkpoint (normalize: a turn_start with "
            "notes_count > 0; NULL when the session's log is not imported).",
            "session_had_plan": "The session made a plan (normalize: a plan_created event).",
            "session_had_state": "The session ran as a state machine (normalize v2: turn_start names a state).",
            "missing": "What a resume needs that the checkpoint does not hold (memory, notes, plan, state).",
            "dropped": "Of those, what the session had: lost by checkpointing.",
            "resumable": "Nothing is missing: a resume can rebuild the run from the checkpoint alone.",
        },
        """
        WITH normalize AS (
            SELECT c.thread_id, 'normalize' AS agent,
                   'normalize:' || substr(c.thread_id, length('normalize-checkpoint:') + 1) AS session_thread_id,
                   c.event ->> '$.task' AS task,
                   TRY_CAST(c.event ->> '$.turn' AS INTEGER) AS turn,
                   json_type(c.event, '$.working_memory') = 'ARRAY' AS has_memory,
                   json_type(c.event, '$.notes') = 'ARRAY' AS has_notes,
                   json_type(c.event, '$.plan') = 'VARCHAR' AS has_plan,
                   json_type(c.event, '$.state') = 'OBJECT' AS has_state
            FROM entries c
            WHERE c.event_type = 'normalize.session_checkpoint'
        ), session_facts AS (
            SELECT thread_id,
                   bool_or(TRY_CAST(event ->> '$.notes_count' AS INTEGER) > 0) AS had_notes,
                   bool_or(event_type = 'normalize.plan_created') AS had_plan,
                   bool_or(event_type = 'normalize.turn_start' AND json_type(event, '$.state') = 'VARCHAR')
                       AS had_state
            FROM entries
            WHERE machine_id = 'normalize-agent' AND starts_with(thread_id, 'normalize:')
            GROUP BY thread_id
        ), own AS (
            SELECT thread_id, 'code-agent' AS agent, thread_id AS session_thread_id,
                   event -> '$.output.checkpoint' ->> '$.task' AS task,
                   TRY_CAST(event -> '$.output.checkpoint' -> '$.state' ->> '$.turns' AS INTEGER) AS turn,
                   json_type(event, '$.output.checkpoint.memory') = 'ARRAY' AS has_memory,
                   json_type(event, '$.output.checkpoint.notes') = 'ARRAY' AS has_notes,
                   json_type(event, '$.output.checkpoint.plan') = 'VARCHAR' AS has_plan,
                   json_type(event, '$.output.checkpoint.state') = 'OBJECT' AS has_state,
                   true AS had_notes, true AS had_plan, true AS had_state
            FROM entries
            WHERE event_type = 'xstate.done.actor' AND json_type(event, '$.output.checkpoint') = 'OBJECT'
              AND """
        + VERIFIED
        + """
        ), rows AS (
            SELECT n.*, f.had_notes, f.had_plan, f.had_state
            FROM normalize n LEFT JOIN session_facts f ON f.thread_id = n.session_thread_id
            UNION ALL BY NAME
            SELECT * FROM own
        )
        SELECT thread_id, agent, session_thread_id, task, turn,
               coalesce(has_memory, false) AS has_memory, coalesce(has_notes, false) AS has_notes,
               coalesce(has_plan, false) AS has_plan, coalesce(has_state, false) AS has_state,
               had_notes AS session_had_notes, had_plan AS session_had_plan, had_state AS session_had_state,
               [x FOR x IN ['memory', 'notes', 'plan', 'state'] IF NOT (CASE x
                   WHEN 'memory' THEN coalesce(has_memory, false) WHEN 'notes' THEN coalesce(has_notes, false)
                   WHEN 'plan' THEN coalesce(has_plan, false) ELSE coalesce(has_state, false) END)] AS missing,
               [x FOR x IN ['notes', 'plan', 'state'] IF (CASE x
                   WHEN 'notes' THEN coalesce(had_notes, false) AND NOT coalesce(has_notes, false)
                   WHEN 'plan' THEN coalesce(had_plan, false) AND NOT coalesce(has_plan, false)
                   ELSE coalesce(had_state, false) AND NOT coalesce(has_state, false) END)] AS dropped,
               coalesce(has_memory AND has_notes AND has_plan AND has_state, false) AS resumable
        FROM rows
        """,
    ),
    Relation(
        "tapes",
        "One row per opencli agent session tape imported with --format opencli (threads opencli:<file stem>).",
        {
            "thread_id": "The thread: opencli:<file stem>.",
            "tape": "The tape's name (the file stem, as sanitised into the thread id).",
            "first_user_message": "What the user asked first.",
            "user_messages": "user lines.",
            "assistant_messages": "assistant lines.",
            "tool_calls": "tool_call lines.",
            "tool_results": "tool_result lines (fewer than tool_calls when the tape stops mid-call).",
            "tools_used": "Distinct tool names called, sorted.",
            "first_at": "First recorded_at.",
            "last_at": "Last recorded_at.",
            "entries": "Entries (tape lines) in the thread.",
        },
        """
        SELECT thread_id,
               substr(thread_id, length('opencli:') + 1) AS tape,
               arg_min(event ->> '$.content', "index") FILTER (WHERE event_type = 'opencli.user')
                   AS first_user_message,
               count(*) FILTER (WHERE event_type = 'opencli.user') AS user_messages,
               count(*) FILTER (WHERE event_type = 'opencli.assistant') AS assistant_messages,
               count(*) FILTER (WHERE event_type = 'opencli.tool_call') AS tool_calls,
               count(*) FILTER (WHERE event_type = 'opencli.tool_result') AS tool_results,
               coalesce(list(DISTINCT event ->> '$.name' ORDER BY event ->> '$.name')
                            FILTER (WHERE event_type = 'opencli.tool_call'), []) AS tools_used,
               min(TRY_CAST(recorded_at AS TIMESTAMPTZ)) AS first_at,
               max(TRY_CAST(recorded_at AS TIMESTAMPTZ)) AS last_at,
               count(*) AS entries
        FROM entries
        WHERE machine_id = 'opencli-agent' AND starts_with(thread_id, 'opencli:')
        GROUP BY thread_id
        """,
    ),
)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def view_statements(relations: tuple[Relation, ...] = RELATIONS) -> list[str]:
    """CREATE OR REPLACE for every view, then the comments on every relation and column."""
    statements = [f"CREATE OR REPLACE VIEW {r.name} AS {r.sql}" for r in relations if r.sql]
    for r in relations:
        kind = "VIEW" if r.sql else "TABLE"
        statements.append(f"COMMENT ON {kind} {r.name} IS {_quote(r.description)}")
        for column, text in r.columns.items():
            statements.append(f'COMMENT ON COLUMN {r.name}."{column}" IS {_quote(text)}')
    return statements
