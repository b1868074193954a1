"""Writing the files other commands and other processes read, so that a crash, a full disk or a second
writer never leaves one half written.

- `write_atomic(path, data)`: the bytes go to a temporary file beside `path` (the same directory, so the
  same file system), are flushed to disk, and replace `path` in one `rename`; the directory is flushed
  too. A reader sees the old file or the new one, never a part of one. A write that fails (no space
  left, a file size limit, a read-only directory) removes the temporary file and leaves `path` as it
  was, and raises `StorageError` naming the file.
- `append_whole(path, data)`: appends with one `write` on an `O_APPEND` descriptor, under an exclusive
  `flock` of the file, flushed to disk; a write that fails part way is cut back off, so the file ends
  where it did (no torn last line), and a file it created is removed. `data` may be a function of the
  file's content as it stands under the lock (a record numbered after the ones before it).
- `locked(path, what)`: an exclusive `flock` on a lock file (`path` itself, created empty when missing)
  or on a directory (which leaves no file behind: for directories kept in version control), held while
  the block runs: a read-modify-write of a shared file (a scenario file) runs in one process at a
  time, on this host. It is re-entrant within a process (a command
  that holds it may call code that takes it again), and it waits up to `timeout` seconds for another
  process, then raises `BusyError`. A lock is released when its process ends, however it ends: a
  killed process never leaves a lock behind. `flock` is advisory and may not hold across hosts on a
  network file system.
- `check_directory(path, what)`: a directory a command will write into, checked before anything is
  written: a file in its place, a dangling symbolic link (which would make its target's directories
  appear wherever it points) or a directory that cannot be written is refused.
- `storage_error(error, doing)`: an `OSError` (from anywhere) as the `StorageError` the CLI reports:
  the file, the system's reason, and what to do about it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from improve.errors import BusyError, ConfigError, StorageError

FILE_LOCK_TIMEOUT = 600.0
"""How long a writer waits for another process's lock: long enough for another command's writes (a
run of a suite) to finish, bounded so that a stuck process is reported rather than waited on forever."""

LOCK_TIMEOUT_ENV = "IMPROVE_LOCK_TIMEOUT"
_POLL = 0.05

_HINTS = {
    errno.ENOSPC: "the disk is full: free some space and run the command again",
    errno.EDQUOT: "the disk quota is used up: free some space and run the command again",
    errno.EFBIG: "the file is larger than this process may write (a file size limit, `ulimit -f`): "
    "raise the limit and run the command again",
    errno.EROFS: "the file system is read-only: run the command in a writable copy of the workspace",
    errno.EACCES: "permission denied: make it writable (or run where you may write) and run the command again",
    errno.EPERM: "the operation is not permitted (an immutable file, `chattr -i`?): make it writable and run "
    "the command again",
    errno.ENAMETOOLONG: "the name is longer than the file system allows: choose a shorter one",
    errno.ENOTDIR: "a part of the path is a file where a directory is expected: move it away",
    errno.EISDIR: "it is a directory where a file is expected: move it away",
    errno.EEXIST: "something is already there: move it away",
    errno.ENOENT: "a directory on the way does not exist (a dangling symbolic link?)",
    errno.ELOOP: "a symbolic link loops",
}


def hint_for(text: str) -> str | None:
    """The hint for a system error another library reported as text (DuckDB's "IO Error: Could not write
    file ...: No space left on device"), or None when it names none of the errors above."""
    for number, hint in _HINTS.items():
        if os.strerror(number) in text:
            return hint
    return None


def storage_error(error: OSError, doing: str | None = None) -> StorageError:
    """`error` as a `StorageError`: what was being done (e.g. "write scenarios/x.yaml"; by default the file
    the system names), the system's reason, and a hint."""
    reason = error.strerror or str(error)
    files = [str(f) for f in (error.filename, error.filename2) if f]
    if doing is None:
        said = " -> ".join(files) or "a file operation"
    else:
        missing = [f for f in files if f not in doing]
        said = f"cannot {doing}" + (f" ({', '.join(missing)})" if missing else "")
    hint = _HINTS.get(error.errno or 0)
    return StorageError(f"{said}: {reason}" + (f"; {hint}" if hint else ""))


def check_directory(path: Path, what: str) -> None:
    """Refuse, before a command writes anything, a directory it will write into that is a file, goes
    through a dangling symbolic link, or cannot be written (see the module docstring); `what` names it.
    Nothing is left behind: a directory made to check it is removed again."""
    path = Path(path)
    for part in (path, *path.parents):
        if part.is_symlink() and not part.exists():
            raise StorageError(
                f"{what} {path} goes through {part}, a symbolic link to {os.readlink(part)}, which does not "
                "exist; create its target or remove the link"
            )
    if path.exists() and not path.is_dir():
        raise StorageError(f"{what} {path} is a file, not a directory; move it away")
    made = [d for d in (path, *path.parents) if not d.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".{os.getpid()}.{threading.get_ident()}.probe"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        os.unlink(probe)
    except OSError as error:
        raise storage_error(error, f"write into {what} {path}") from None
    finally:
        for directory in made:
            with contextlib.suppress(OSError):
                directory.rmdir()


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """Replace `path` with `data` whole, or leave it as it was (see the module docstring). A new file gets
    `mode` (default 0o644 less the umask); an existing file keeps its own."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path = Path(path)
    temp = path.with_name(f".{path.name[:200]}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        final = _mode_for(path, mode)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            _write_all(fd, payload)
            if final is not None:
                os.fchmod(fd, final)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise storage_error(error, f"write {path}") from None
    sync_directory(path.parent)


def _mode_for(path: Path, mode: int | None) -> int | None:
    """The mode the replacement gets: the existing file's, else `mode`, else None (what `open` gives)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return mode


def append_whole(path: Path, data: bytes | str | Callable[[bytes], bytes | str]) -> None:
    """Append `data` to `path` (created when missing) whole, or not at all (see the module docstring)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise storage_error(error, f"append to {path}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        end = os.fstat(fd).st_size
        if callable(data):
            data = data(os.pread(fd, end, 0) if end else b"")
        payload = data.encode("utf-8") if isinstance(data, str) else data
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
                if end == 0:
                    os.unlink(path)  # it was created here, or was empty: no empty file is left
            raise storage_error(error, f"append to {path}") from None
    finally:
        os.close(fd)


def _write_all(fd: int, payload: bytes) -> None:
    written = 0
    while written < len(payload):
        written += os.write(fd, payload[written:])


def sync_directory(directory: Path) -> None:
    """Flush a directory's entries to disk (a rename or a new file in it); a file system that cannot is
    left alone."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Held:
    """The locks this process holds: path -> (fd, depth), so a nested `locked` of the same path passes."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.fds: dict[str, tuple[int, int]] = {}


_HELD = _Held()


@contextlib.contextmanager
def locked(
    path: Path,
    what: str,
    timeout: float | None = None,
    say: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold an exclusive `flock` on the lock file `path` while the block runs (see the module docstring).
    `what` says what it guards, for the message of a timeout ("the scenario file scenarios/x.yaml");
    `say` is told once when another process holds it and the command waits. `timeout` defaults to
    `lock_timeout()`."""
    key = os.path.abspath(path)
    with _HELD.lock:
        held = _HELD.fds.get(key)
        if held is not None:
            _HELD.fds[key] = (held[0], held[1] + 1)
    if held is not None:
        try:
            yield
        finally:
            with _HELD.lock:
                fd, depth = _HELD.fds[key]
                _HELD.fds[key] = (fd, depth - 1)
        return
    fd = _acquire(Path(path), what, lock_timeout() if timeout is None else timeout, say)
    with _HELD.lock:
        _HELD.fds[key] = (fd, 1)
    try:
        yield
    finally:
        with _HELD.lock:
            del _HELD.fds[key]
        os.close(fd)  # closing releases the flock


def lock_timeout() -> float:
    """Seconds a command waits for another process's lock (a warehouse's, a shared file's):
    `IMPROVE_LOCK_TIMEOUT` when set, else the caller's default (`FILE_LOCK_TIMEOUT` here)."""
    return env_seconds(LOCK_TIMEOUT_ENV, FILE_LOCK_TIMEOUT)


def env_seconds(name: str, default: float) -> float:
    """A number of seconds from the environment variable `name` (`default` when unset); a value that is
    not a non-negative number is a `ConfigError` naming the variable."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{name}={text!r} is not a number of seconds (e.g. {name}=120)")
    return value


def _acquire(path: Path, what: str, timeout: float, say: Callable[[str], None] | None) -> int:
    try:
        if path.is_dir():
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise storage_error(error, f"lock {what} ({path})") from None
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if say is not None:
                say(f"waiting for another process writing {what} (it holds {path}) ...")
                say = None
            if time.monotonic() >= deadline:
                os.close(fd)
                raise BusyError(
                    f"another process has been writing {what} for over {timeout:.0f} s (it holds the lock "
                    f"{path}); wait for it to finish, or end it, and run the command again (set "
                    f"{LOCK_TIMEOUT_ENV}=SECONDS to wait longer)"
                ) from None
            time.sleep(_POLL)
        except OSError as error:
            os.close(fd)
            raise storage_error(error, f"lock {what} ({path})") from None
