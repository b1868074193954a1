"""The exceptions `improve` raises, in one hierarchy.

This module is the ground floor: it imports nothing of ours, so every layer (even `machine`, which
imports nothing else of ours) may raise these. Every error carries a message that names the place
(file, line, path in the document, state, transition) and says what was expected.

    ImproveError                      base: catch this to catch everything we raise
    ├── ConfigError                   bad input a person wrote (exit code 2)
    │   ├── PeopleScriptError         a scenario's people answer a wait with what the machine refuses there
    │   ├── MachineConfigError        a machine or policy document is invalid
    │   │   └── ExpressionError       a CEL expression does not parse, uses a forbidden name, ...
    │   ├── ScenarioError             a scenario file is invalid
    │   │   ├── WorldFromThreadError  a thread's world cannot be rebuilt (a tool answered as no fixture can)
    │   │   └── SealedSplitError      the sealed test split was asked for without --unseal
    │   ├── WorkspaceError            improve.toml, a policy file or a directory is missing or wrong
    │   ├── BranchNameError           a branch name git would refuse (`:`, `..`, a space, ...)
    │   ├── LakeError                 a directory is not a Parquet lake, or an export cannot replace it
    │   └── SqlRefusedError           `improve sql` (read-only) refused a statement: which rule, what to run
    ├── MachineError                  the interpreter could not take a step (exit code 3)
    │   ├── EvaluationError           a CEL expression failed at run time (missing field, bad types)
    │   │   └── FastCelError          ... found by the CEL fast path, in cel's words (Expr.evaluate adds where)
    │   └── UnknownNameError          a named guard or actor is not registered
    ├── LogError                      a thread is not a valid log (exit code 3)
    │   ├── ConflictError             append at a stale index, or ingest of a different entry
    │   ├── VersionMismatchError      replaying a thread against another machine version
    │   ├── DivergenceError           replay reached a state whose hash differs from the journal
    │   │   └── TamperError           a chained thread's entries differ from what was written
    │   └── TapeError                 an opencli session tape line is not in the tape format
    ├── ResumeRefusedError            `improve resume` refused a thread or an event: which check, why (exit 1)
    ├── RunError                      a run could not complete (an actor crashed, a store failed)
    │   ├── ActorCrash                ... a tool raised what it does not declare (its bug, or the world's data)
    │   └── NondeterministicHarness   parity: two fresh runs of OLD differed, so nothing is compared
    ├── ClusterError                  --executor dask://: dask is not installed, or the scheduler is unreachable
    ├── ActorFailure                  a tool failed in a way the machine handles (its `onError`)
    ├── ModelCallError                a model call failed (timeout, refusal); the policy's `onError`
    │   └── ModelAnswerError          ... the endpoint answered, the model's answer was not one accepted
    ├── EndpointError                 so many decisions fell back for the endpoint that runs measure nothing (exit 3)
    │   └── MissingKeyError           ... a model's first call found no API key: the command stops there
    ├── ReplayMissError               replaying recorded model calls, a call was never recorded (exit code 3)
    ├── SpendLimitError               a round reached its spend limit (--max-usd) and stopped cleanly
    ├── FastCelFallback               the CEL fast path met a value outside its domain: Expr.evaluate asks cel
    ├── WarehouseLockedError          another process holds the warehouse file for writing
    ├── WarehouseDamagedError         the warehouse file is corrupted (exit code 3)
    ├── WarehouseVersionError         the warehouse file was written by a newer DuckDB than this one (exit code 3)
    ├── OtlpSendError                 spans could not be sent to an OTLP/HTTP collector (exit code 3)
    ├── StorageError                  a file could not be written: no space, read-only, a name too long (exit 3)
    ├── BusyError                     another process holds the lock of what a command would write (exit 3)
    ├── ProposalError                 a proposer produced no candidate (no rule fits, the endpoint failed)
    ├── ProposerCrash                 a registered proposer raised something else: its bug (exit code 3)
    └── PullRequestError              committing, pushing or opening the round's PR failed (exit code 3)

An exception that only signals inside one module or package and never leaves it (the CEL fast path's
"not in the subset") is control flow, not an error, and stays there.

`exit_code` on each class is what the CLI returns when the error reaches it, following docs/contracts.md:
2 for usage or config errors, 3 for infrastructure and data errors.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterable
from difflib import get_close_matches


class ImproveError(Exception):
    """Base class of every error raised by `improve`."""

    exit_code = 3


class ConfigError(ImproveError):
    """Input a person wrote is invalid: the message says where and what was expected."""

    exit_code = 2


class PeopleScriptError(ConfigError):
    """A scenario's people script answers a wait with an event the machine does not take there."""

    def __init__(self, message: str, state: str, index: int) -> None:
        super().__init__(message)
        self.state = state
        """The waiting state the script answered."""
        self.index = index
        """Which of the script's answers for that state (0 the first)."""


class MachineConfigError(ConfigError):
    """A machine or policy document is invalid (bad target, unknown name, bad shape)."""


class ExpressionError(MachineConfigError):
    """A CEL expression failed to compile or breaks the allowlist."""


class ScenarioError(ConfigError):
    """A scenario file is invalid."""


class WorldFromThreadError(ScenarioError):
    """A thread cannot become a scenario: its environment's world fixture has no way to make a tool
    answer as the thread records (a tool failed that the fixture cannot fail, or the rebuilt world
    answers differently). The message names the thread, the entry and the tool."""


class SealedSplitError(ScenarioError):
    """The sealed `test` split (or one of its scenarios) was asked for without `--unseal`: no round reads
    it, and it is scored only by `improve score --split test --unseal`, each unsealing recorded. The
    message says how to unseal and what that costs."""


class WorkspaceError(ConfigError):
    """The workspace (improve.toml, scenarios/, policies/) is missing something or is malformed."""


class BranchNameError(ConfigError):
    """A branch name breaks git's rules for branch names; the message says which and suggests one."""


class LakeError(ConfigError):
    """A directory given as a Parquet lake (`improve sql --lake`, `improve.warehouse.connect(DIR)`) is not
    one written by `improve export --format parquet`, or `improve export` was pointed at a directory that
    holds something else; the message names the directory and what to pass instead."""


class SqlRefusedError(ConfigError):
    """A statement given to the warehouse's read-only mode (`improve sql`, `query_readonly`, `connect(...,
    sandboxed=True)`) breaks one of its rules: exactly one statement, of an allowed type (SELECT, WITH,
    DESCRIBE, SHOW, SUMMARIZE, EXPLAIN of a query, PRAGMA table_info). `rule` names the rule broken; the
    message says which and what to run instead. Nothing of the statement ran."""

    def __init__(self, message: str, *, rule: str) -> None:
        super().__init__(message)
        self.rule = rule

    def __reduce__(self) -> tuple[object, ...]:
        return (_sql_refused_error, (str(self), self.rule))


def _sql_refused_error(message: str, rule: str) -> SqlRefusedError:
    return SqlRefusedError(message, rule=rule)


class MachineError(ImproveError):
    """The interpreter could not take a step."""


class EvaluationError(MachineError):
    """A CEL expression raised while being evaluated (a missing field, mismatched types)."""


class FastCelError(EvaluationError):
    """An evaluation error `cel` would also raise, found by the fast path (`improve.machine.fastcel`); the
    text is the first line of cel's message. `Expr.evaluate` turns it into an EvaluationError that names
    the expression and where it came from."""


class UnknownNameError(MachineError):
    """A named guard or actor is not registered with the host."""


class LogError(ImproveError):
    """A thread is not a valid log."""


class ConflictError(LogError):
    """An append used a stale index, or an entry already stored differs from the one offered."""


class VersionMismatchError(LogError):
    """A thread was recorded by another machine id or version than the one replaying it."""


class DivergenceError(LogError):
    """Replay reached a snapshot whose hash differs from the one journaled."""


class TamperError(DivergenceError):
    """A chained thread (schemaVersion 2) differs from what was written: an entry's content changed, an
    entry is missing or was inserted, or entries are out of order (`improve.log.chain`).

    It is a `DivergenceError`, so whatever treats a diverged thread as failing verification (`improve
    replay --verify` exits 1) treats a tampered one the same way. `index` is the first bad entry's
    position in the thread, `kind` one of `changed`, `missing`, `inserted`, `reordered`, `renamed` (the
    thread unedited, read under another id than it was recorded under).
    """

    def __init__(self, message: str, *, thread_id: str | None, index: int, kind: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.index = index
        self.kind = kind

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields: pickling (a worker process of an executor) must pass them back.
        return (_tamper_error, (str(self), self.thread_id, self.index, self.kind))


def _tamper_error(message: str, thread_id: str | None, index: int, kind: str) -> TamperError:
    return TamperError(message, thread_id=thread_id, index=index, kind=kind)


class TapeError(LogError):
    """A tape line that cannot be read as the opencli format (exit code 3: the data is wrong)."""


class ResumeRefusedError(ImproveError):
    """A waiting thread was not resumed, and nothing was journaled. `kind` names the check that refused:

    - `not-found`: no such thread;
    - `does-not-verify`: its hash chain or state hashes do not check (or it is unchained, schemaVersion 1);
    - `version-changed`: the environment's machine is not the version (or the environment) that
      recorded it, or the policy under that version changed;
    - `not-waiting`: it ended done, in error, on a budget, or without an end entry;
    - `event-id-reused`: the event id resumed this thread before, with another event;
    - `unknown-event`, `invalid-payload`, `rejected-by-guard`: the decision protocol's refusals, for an
      event the waiting state does not accept;
    - `world-changed`: the world rebuilt from the scenario's fixture no longer answers the recorded tool
      calls as the thread says.
    """

    exit_code = 1

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[object, ...]:
        return (_resume_refused_error, (str(self), self.kind))


def _resume_refused_error(message: str, kind: str) -> ResumeRefusedError:
    return ResumeRefusedError(message, kind=kind)


class RunError(ImproveError):
    """A run could not complete: an actor crashed unexpectedly, a store failed."""


class ActorCrash(RunError):
    """A tool raised something other than `ActorFailure` (or a stand-in model raised): a bug of the
    environment's code, or a scenario's world it cannot read (a number written as text). The suite names
    the scenario (`evals.suite`)."""


class NondeterministicHarness(RunError):
    """Parity's OLD side gave different results on two fresh runs: comparing against it would mean nothing."""


class ClusterError(ImproveError):
    """The cluster `--executor dask://HOST:PORT` names cannot take runs: dask is not installed (`pip
    install 'improve[cluster]'`), or its scheduler did not answer within the timeout. The message names
    the address and the timeout, and how to start or reach a scheduler."""


class ActorFailure(ImproveError):
    """A tool failed in a way the machine should handle (`onError`), e.g. a declined payment.

    Raised by an environment's tools; the runner journals it as `xstate.error.actor` with `code` and
    the message, and the machine takes the invoke's `onError`. It never reaches the CLI.
    """

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code

    def to_error(self) -> dict[str, str]:
        return {"code": self.code, "message": str(self)}


class ModelCallError(ImproveError):
    """A model call failed (timeout, refusal, unparsable answer). A policy's `onError` handles it."""


class ModelAnswerError(ModelCallError):
    """The endpoint answered, but the model's answer is not one the call accepts (a judgment outside its
    closed choice): the model's doing, not the endpoint's, so it is not counted as an endpoint fallback."""


class EndpointError(ImproveError):
    """A model's endpoint failed for more of a command's decisions than it allows (the model never
    answered, or a round's side fell back past `max_fallback_share`): the runs measure the endpoint, not
    the policy, so nothing is compared or promoted. The threads written so far stay."""


class MissingKeyError(EndpointError):
    """A run's model has no API key: every call would fall back, so the command stops at the first one
    instead (the runs it finished, from recorded calls, stay)."""


class ProposerEndpointError(ImproveError):
    """The proposer's endpoint failed (nothing listens, an HTTP error, a timeout, an answer that is no
    completion): no proposal was made, so the round stops (exit 3) and records no candidate, spending
    neither a version nor its cluster. A model that answered with a bad proposal is a `ProposalError`."""


class ReplayMissError(ImproveError):
    """Replaying recorded model calls (`--cache replay`), a request has no recorded response: the run
    would diverge from the recording, so it stops instead of asking a model or taking `onError`."""


class SpendLimitError(ImproveError):
    """A round reached its spend limit (`--max-usd`): no further run is started, the runs under way
    finish, and the message says what was spent. Nothing is left half-written."""

    exit_code = 1


class ProposalError(ImproveError):
    """The proposer could not produce a candidate (no rule separates the cases, the endpoint failed).

    The round records it as a failed candidate and goes on; it reaches the CLI only from a direct call.
    `calls`: the model calls the proposer made before it gave up, which the round counts as spent.
    """

    calls: int = 0


class ProposerCrash(ImproveError):
    """A proposer raised something other than `ProposalError` (a workspace's or a package's proposer: its
    bug). The round stops, nothing recorded; the message names the proposer, what it was asked and the
    file and line that raised."""


class PullRequestError(ImproveError):
    """Committing, pushing or opening the pull request failed; the message says what to do.

    Raised without chaining the original exception and with secrets scrubbed from the message, so
    neither the message nor a traceback can carry a token.
    """

    exit_code = 3


class FastCelFallback(ImproveError):
    """The CEL fast path met a value outside its domain (a tuple, an int beyond 64 bits, ...): evaluate
    the expression with `cel` instead. `Expr.evaluate` does; it never reaches a user."""


class WarehouseLockedError(ImproveError):
    """Another process holds the warehouse file for writing (`improve ingest` waits `--lock-timeout`)."""


class WarehouseDamagedError(ImproveError):
    """The warehouse file is damaged (a block's checksum does not match): the message names the file and
    says how to recover (restore a backup, or move it aside and ingest the threads again)."""

    exit_code = 3


class WarehouseVersionError(ImproveError):
    """The warehouse file is in a storage format this DuckDB cannot read (written by a newer DuckDB
    that was not told to stay compatible). Upgrade duckdb, or rebuild the warehouse from the threads."""

    exit_code = 3


class OtlpSendError(ImproveError):
    """Sending spans to an OTLP/HTTP collector failed after every retry (or the collector refused them
    outright): the message names the endpoint, the last answer, and how many batches went through."""

    exit_code = 3


class StorageError(ImproveError):
    """The system refused a write (or the read before it): no space left, a file size limit, a read-only
    or immutable directory, a permission, a name too long, a file where a directory belongs. The message
    names the file, the system's reason and what to do; a write made through `improve.files` left the
    file as it was."""

    exit_code = 3


class BusyError(ImproveError):
    """Another process has held the lock of what this command would write for longer than the command
    waits (`improve.files.locked`): the message names what is locked and the lock file."""

    exit_code = 3


def raised(error: BaseException, within: os.PathLike[str] | None = None) -> str:
    """`NameError: name 'x' is not defined (booking_desk/handbook.py:68)`: the error and the last line of
    the traceback that raised it, where a person looks first; with `within` (a workspace), the last line
    of a file under it, where there is one (a mistaken import in the desk's `world.py` is raised inside
    the module it names, which is not where to fix it)."""
    frames: list[traceback.FrameSummary] = list(traceback.extract_tb(error.__traceback__))
    if within is not None:
        root = os.path.join(os.path.abspath(within), "")
        own = [f for f in frames if os.path.abspath(f.filename).startswith(root)]
        frames = own or frames
    at = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{type(error).__name__}: {error.msg} ({error.filename}:{error.lineno})"
    return f"{type(error).__name__}: {error}{at}"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'refunds'?)` when one of `known` is close to `name` (a typo), else empty: for a
    message about a name that is not there."""
    near = get_close_matches(name, list(known), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""
