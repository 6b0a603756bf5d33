"""Read-only, time- and size-bounded execution of untrusted SQL against a SQLite database file.

:func:`execute_sql` runs one statement and returns a :class:`SqlResult`; it never raises for any SQL
text, however hostile. :func:`execute_gold` is the same with an LRU cache of successful results, for
the gold query that every rollout of a prompt is compared with.

Protection against writes, each layer sufficient on its own where it applies:

1. the database is opened through a ``file:<path>?mode=ro`` URI (SQLite refuses every write and never
   creates the file), in autocommit mode (no implicit ``BEGIN``);
2. the statement must start with ``SELECT``, ``WITH`` or ``VALUES`` (after comments and whitespace),
   which keeps out statements the authorizer does not see, such as ``VACUUM INTO`` or ``REINDEX``;
3. ``set_authorizer`` allows only reading actions (SELECT, READ, FUNCTION, RECURSIVE) and denies the rest:
   every write, CREATE/DROP/ALTER, ATTACH/DETACH, PRAGMA, transactions and savepoints, ANALYZE;
   among functions it denies ``load_extension`` (extension loading is also switched off on the
   connection), ``fts3_tokenizer``, and the nondeterministic ``random``/``randomblob`` (so that a
   score is a function of the response alone);
4. Python's ``sqlite3`` refuses to run more than one statement per call, before running any.

Resource bounds (all per call; defaults in the ``DEFAULT_*`` constants):

- wall time: a progress handler aborts the statement once ``timeout_s`` (default 2.0 s) have passed,
  checked every ``_PROGRESS_OPS`` virtual-machine instructions, during execution and row fetching;
  the error is ``"query timed out"``. Some built-in functions run long inside one instruction, where
  no progress handler is called (``printf('%.*c', 2000000000, 'x')`` loops two billion times,
  ``instr``/``replace``/``trim`` are quadratic in their arguments' lengths). Queries therefore run in
  a separate worker process (a plain ``python -I -S`` running this file, stdlib only), which the
  caller kills ``KILL_GRACE_S`` after the deadline; the error is the same ``"query timed out"``. The
  worker also has an address-space limit (``WORKER_MEMORY_BYTES``). Idle workers are reused; a killed
  or crashed one is replaced on the next call;
- value size: ``SQLITE_LIMIT_LENGTH`` caps every string/blob (and row) at ``max_value_bytes``
  (default 4 MB), so ``zeroblob``/``printf``/``group_concat`` bombs fail with "string or blob too big";
  ``SQLITE_LIMIT_LIKE_PATTERN_LENGTH`` keeps LIKE/GLOB matching cheap;
- result size: at most ``max_rows`` rows (default 10,000) and ``max_result_bytes`` (default 32 MB,
  approximate) are fetched. A larger result is **truncated, not an error**: the query did execute,
  so ``error`` stays ``None`` and ``truncated`` is ``True``; an execution-match comparison must then
  treat the result as "more rows than the cap" (see ``text_to_sql``).

Each call opens a fresh connection (well under a millisecond), so no connection state (deadline,
authorizer) is shared between calls; the worker pool is thread-safe and fork-aware (a forked child
starts its own workers). If no worker process can be started, execution falls back to the current
process, still bounded by the progress handler.
"""

from __future__ import annotations

import atexit
import logging
import marshal
import os
import re
import select
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_MAX_ROWS",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_MAX_RESULT_BYTES",
    "MAX_ERROR_CHARS",
    "TIMEOUT_MESSAGE",
    "SqlResult",
    "execute_sql",
    "execute_gold",
    "clear_gold_cache",
    "shutdown_workers",
]

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_VALUE_BYTES = 4_000_000
DEFAULT_MAX_RESULT_BYTES = 32_000_000
MAX_ERROR_CHARS = 280  # error text length; callers add a short prefix and stay within 300 chars
TIMEOUT_MESSAGE = "query timed out"

KILL_GRACE_S = 0.3  # the worker is killed this long after the deadline if it has not answered
WORKER_START_TIMEOUT_S = 30.0
WORKER_MEMORY_BYTES = 2 << 30  # RLIMIT_AS of a worker
MAX_IDLE_WORKERS = 32  # verl's reward loop scores from a thread pool (up to 32 threads)
GOLD_CACHE_SIZE = 4096  # entries
GOLD_CACHE_BYTES = 256_000_000  # approximate total size of the cached rows

_PROGRESS_OPS = 1000  # VM instructions between two deadline checks (microseconds of work)
_FETCH_CHUNK = 256
_LIKE_PATTERN_LIMIT = 200
_SQL_LENGTH_LIMIT = 1_000_000

_log = logging.getLogger(__name__)

_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
)
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "random", "randomblob"})

# SQLite limit ids (sqlite3.SQLITE_LIMIT_* exist from Python 3.11; the numbers are SQLite's ABI).
_LIMITS = {
    "LENGTH": getattr(sqlite3, "SQLITE_LIMIT_LENGTH", 0),
    "SQL_LENGTH": getattr(sqlite3, "SQLITE_LIMIT_SQL_LENGTH", 1),
    "ATTACHED": getattr(sqlite3, "SQLITE_LIMIT_ATTACHED", 7),
    "LIKE_PATTERN_LENGTH": getattr(sqlite3, "SQLITE_LIMIT_LIKE_PATTERN_LENGTH", 8),
}

# Leading whitespace and SQL comments (an unterminated /* comment runs to the end, as in SQLite).
_LEADING_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*", re.DOTALL)
_READ_KEYWORD = re.compile(r"(?:select|with|values)\b", re.IGNORECASE)


@dataclass(frozen=True)
class SqlResult:
    """Outcome of one execution.

    ``columns``: result column names; ``rows``: tuples of Python values (None, int, float, str, bytes);
    ``error``: ``None`` if the statement ran, else a short message (at most ``MAX_ERROR_CHARS``);
    ``truncated``: the result had more than ``max_rows`` rows / ``max_result_bytes`` and was cut;
    ``nbytes``: approximate size of ``rows``.
    """

    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    error: Optional[str] = None
    truncated: bool = False
    nbytes: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_wire(self) -> tuple:
        return (self.columns, self.rows, self.error, self.truncated, self.nbytes)

    @classmethod
    def from_wire(cls, t: tuple) -> SqlResult:
        columns, rows, error, truncated, nbytes = t
        return cls(tuple(columns), tuple(tuple(r) for r in rows), error, bool(truncated), int(nbytes))


def _shorten(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """One line, printable, at most ``limit`` characters."""
    text = " ".join(str(message).split())
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_statement(sql: str) -> Optional[str]:
    """Error message if ``sql`` is not a single read statement we are willing to hand to SQLite."""
    if not isinstance(sql, str):
        return f"SQL must be a string, got {type(sql).__name__}"
    if "\x00" in sql:
        return "SQL contains a NUL character"
    if len(sql) > _SQL_LENGTH_LIMIT:
        return "SQL too long"
    start = _LEADING_NOISE.match(sql).end()
    if start >= len(sql):
        return "empty SQL"
    if not _READ_KEYWORD.match(sql, start):
        return "only SELECT / WITH / VALUES statements are allowed"
    return None


# ---------------------------------------------------------------------------------------------------
# In-process execution (what a worker runs)


def _authorizer(action: int, arg1, arg2, db_name, trigger) -> int:
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _decode_text(raw: bytes) -> str:
    # Databases in the wild (Spider, BIRD) hold some non-UTF-8 text; never fail on it.
    return raw.decode("utf-8", errors="replace")


def _open_read_only(db_path: str, deadline: float, max_value_bytes: int) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(os.path.abspath(db_path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=1.0)
    try:
        if hasattr(conn, "enable_load_extension"):
            conn.enable_load_extension(False)
        if hasattr(conn, "setlimit"):
            conn.setlimit(_LIMITS["LENGTH"], int(max_value_bytes))
            conn.setlimit(_LIMITS["SQL_LENGTH"], _SQL_LENGTH_LIMIT)
            conn.setlimit(_LIMITS["ATTACHED"], 0)
            conn.setlimit(_LIMITS["LIKE_PATTERN_LENGTH"], _LIKE_PATTERN_LIMIT)
        conn.text_factory = _decode_text
        conn.set_authorizer(_authorizer)
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, _PROGRESS_OPS)
    except BaseException:
        conn.close()
        raise
    return conn


def _value_size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value) + 16
    return 16


def _execute_in_process(
    db_path: str, sql: str, timeout_s: float, max_rows: int, max_value_bytes: int, max_result_bytes: int
) -> SqlResult:
    """Run one checked statement in this process (bounded by the progress handler only)."""
    deadline = time.monotonic() + float(timeout_s)
    try:
        conn = _open_read_only(db_path, deadline, max_value_bytes)
    except Exception as e:  # missing file, not a database, ...
        return SqlResult(error=_shorten(f"cannot open database: {e}"))
    try:
        cursor = conn.execute(sql)
        columns = tuple(str(d[0]) for d in (cursor.description or ()))
        rows: list[tuple] = []
        size = 0
        truncated = False
        while not truncated:
            chunk = cursor.fetchmany(_FETCH_CHUNK)
            if not chunk:
                break
            for row in chunk:
                row_size = sum(_value_size(v) for v in row)
                if len(rows) >= max_rows or size + row_size > max_result_bytes:
                    truncated = True
                    break
                size += row_size
                rows.append(tuple(row))
        return SqlResult(columns=columns, rows=tuple(rows), error=None, truncated=truncated, nbytes=size)
    except Exception as e:  # sqlite3.Error, UnicodeEncodeError, MemoryError, RecursionError, ...
        message = str(e) or type(e).__name__
        if isinstance(e, sqlite3.OperationalError) and message == "interrupted":
            message = TIMEOUT_MESSAGE
        return SqlResult(error=_shorten(message))
    finally:
        try:
            conn.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------------
# Worker processes: length-prefixed marshal messages over the worker's stdin/stdout.
# marshal (not pickle) so that even a compromised worker cannot make the caller run code.


class _WorkerGone(Exception):
    """The worker died, timed out or broke the protocol; it must be killed and replaced."""


def _read_exact(fd: int, n: int, deadline: Optional[float]) -> bytes:
    chunks, remaining = [], n
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while remaining:
        if deadline is not None:
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms <= 0 or not poller.poll(wait_ms):
                raise TimeoutError
        data = os.read(fd, min(remaining, 1 << 20))
        if not data:
            raise _WorkerGone("worker closed its output")
        chunks.append(data)
        remaining -= len(data)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _frame(obj: Any) -> bytes:
    payload = marshal.dumps(obj)
    return len(payload).to_bytes(8, "big") + payload


def _read_frame(fd: int, deadline: Optional[float]) -> Any:
    n = int.from_bytes(_read_exact(fd, 8, deadline), "big")
    return marshal.loads(_read_exact(fd, n, deadline))


class _Worker:
    """One ``python -I -S sql_sandbox.py --serve`` process."""

    def __init__(self):
        self.owner = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            close_fds=True,
        )
        try:
            if _read_exact(self.proc.stdout.fileno(), 1, time.monotonic() + WORKER_START_TIMEOUT_S) != b"R":
                raise _WorkerGone("bad handshake")
        except BaseException:
            self.kill()
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, request: tuple, deadline: float) -> SqlResult:
        try:
            _write_all(self.proc.stdin.fileno(), _frame(request))
            return SqlResult.from_wire(_read_frame(self.proc.stdout.fileno(), deadline))
        except TimeoutError:
            raise
        except Exception as e:  # BrokenPipeError, EOF, bad frame
            raise _WorkerGone(str(e) or type(e).__name__) from None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass
        self._close_pipes()

    def close(self) -> None:
        """Ask the worker to exit (EOF on its stdin); kill it if it does not."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=1)
        except Exception:
            self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except Exception:
                pass


class _WorkerPool:
    """Idle workers of this process, reused across calls and threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._pid = os.getpid()
        self.disabled = False

    def acquire(self) -> _Worker:
        with self._lock:
            if self._pid != os.getpid():  # forked: the idle workers belong to the parent
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
        return _Worker()

    def release(self, worker: _Worker) -> None:
        with self._lock:
            if worker.owner == os.getpid() and worker.alive() and len(self._idle) < MAX_IDLE_WORKERS:
                self._idle.append(worker)
                return
        if worker.owner == os.getpid():
            worker.close()

    def shutdown(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            mine = self._pid == os.getpid()
        if mine:
            for worker in idle:
                worker.close()


_pool = _WorkerPool()
atexit.register(_pool.shutdown)


def shutdown_workers() -> None:
    """Stop the idle worker processes (they are also stopped at exit)."""
    _pool.shutdown()


def _execute_isolated(request: tuple, timeout_s: float) -> SqlResult:
    try:
        worker = _pool.acquire()
    except Exception as e:
        if not _pool.disabled:
            _pool.disabled = True
            _log.warning("sql_sandbox: cannot start a worker process (%s); running queries in-process", e)
        return _execute_in_process(*request)
    try:
        result = worker.run(request, time.monotonic() + timeout_s + KILL_GRACE_S)
    except TimeoutError:
        worker.kill()
        return SqlResult(error=TIMEOUT_MESSAGE)
    except _WorkerGone as e:
        worker.kill()
        return SqlResult(error=_shorten(f"sandbox worker died: {e}"))
    except BaseException:  # KeyboardInterrupt mid-query: the worker's state is unknown
        worker.kill()
        raise
    _pool.release(worker)
    return result


def execute_sql(
    db_path: str,
    sql: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    isolate: bool = True,
) -> SqlResult:
    """Run ``sql`` read-only on the SQLite file ``db_path``; never raises (errors go in the result).

    ``isolate=False`` runs in this process: faster to start, but a single long-running built-in
    function can then exceed ``timeout_s`` (see the module docstring).
    """
    refusal = _check_statement(sql)
    if refusal is not None:
        return SqlResult(error=refusal)
    if not isinstance(db_path, str) or not db_path:
        return SqlResult(error="cannot open database: no path")
    request = (
        os.path.abspath(db_path), sql, float(timeout_s), int(max_rows), int(max_value_bytes), int(max_result_bytes)
    )
    if isolate and sys.executable and not _pool.disabled:
        return _execute_isolated(request, float(timeout_s))
    return _execute_in_process(*request)


# ---------------------------------------------------------------------------------------------------
# Gold cache: one execution per (database file version, gold SQL, limits), successes only.

_gold_cache: OrderedDict[tuple, SqlResult] = OrderedDict()
_gold_lock = threading.Lock()
_gold_bytes = 0


def _file_version(db_path: str) -> Optional[tuple]:
    try:
        st = os.stat(db_path)
    except OSError:
        return None
    return (os.path.realpath(db_path), st.st_ino, st.st_size, st.st_mtime_ns)


def execute_gold(db_path: str, sql: str, **limits) -> SqlResult:
    """:func:`execute_sql` with an LRU cache of successful results.

    The key includes the file's identity and version (real path, inode, size, mtime), so replacing or
    editing the database invalidates the entry. Errors (including time-outs, which may be transient
    under load) are not cached. Results are immutable, so sharing them is safe.
    """
    global _gold_bytes
    version = _file_version(db_path)
    if version is None:
        return execute_sql(db_path, sql, **limits)
    key = (version, sql, tuple(sorted(limits.items())))
    with _gold_lock:
        hit = _gold_cache.get(key)
        if hit is not None:
            _gold_cache.move_to_end(key)
            return hit
    result = execute_sql(db_path, sql, **limits)
    if result.ok:
        with _gold_lock:
            if key not in _gold_cache:  # another thread may have filled it meanwhile
                _gold_cache[key] = result
                _gold_bytes += result.nbytes
            _gold_cache.move_to_end(key)
            while _gold_cache and (len(_gold_cache) > GOLD_CACHE_SIZE or _gold_bytes > GOLD_CACHE_BYTES):
                _, old = _gold_cache.popitem(last=False)
                _gold_bytes -= old.nbytes
    return result


def clear_gold_cache() -> None:
    """Forget every cached gold result."""
    global _gold_bytes
    with _gold_lock:
        _gold_cache.clear()
        _gold_bytes = 0


# ---------------------------------------------------------------------------------------------------
# Worker entry point


def _serve() -> None:
    """Worker loop: read a request frame, run it in-process, write the result frame; exit on EOF."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except Exception:
        pass
    inp, out = sys.stdin.fileno(), sys.stdout.fileno()
    _write_all(out, b"R")
    while True:
        try:
            request = _read_frame(inp, None)
        except Exception:
            return  # EOF: the caller closed the pipe or died
        try:
            result = _execute_in_process(*request)
            frame = _frame(result.to_wire())
        except Exception as e:  # MemoryError while building the answer, ...
            frame = _frame(SqlResult(error=_shorten(f"sandbox error: {type(e).__name__}: {e}")).to_wire())
        _write_all(out, frame)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
