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
  a separate worker process (a plain ``python -I -S`` running :mod:`sql_executor`, stdlib only), which the
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
import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from typing import Optional

from recipe.mrtpo.tasks import sql_executor as _ex
from recipe.mrtpo.tasks.sql_executor import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_TIMEOUT_S,
    MAX_ERROR_CHARS,
    TIMEOUT_MESSAGE,
    SqlResult,
    WorkerGone,
    check_statement,
    encode_frame,
    execute_in_process,
    read_exact,
    read_frame,
    shorten,
    write_all,
)

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

KILL_GRACE_S = 0.3  # the worker is killed this long after the deadline if it has not answered
WORKER_START_TIMEOUT_S = 30.0
MAX_IDLE_WORKERS = 32  # verl's reward loop scores from a thread pool (up to 32 threads)
GOLD_CACHE_SIZE = 4096  # entries
GOLD_CACHE_BYTES = 256_000_000  # approximate total size of the cached rows

_log = logging.getLogger(__name__)


class _Worker:
    """One ``python -I -S sql_executor.py --serve`` process."""

    def __init__(self):
        self.owner = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(_ex.__file__), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            close_fds=True,
        )
        try:
            if read_exact(self.proc.stdout.fileno(), 1, time.monotonic() + WORKER_START_TIMEOUT_S) != b"R":
                raise WorkerGone("bad handshake")
        except BaseException:
            self.kill()
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, request: tuple, deadline: float) -> SqlResult:
        try:
            write_all(self.proc.stdin.fileno(), encode_frame(request))
            return SqlResult.from_wire(read_frame(self.proc.stdout.fileno(), deadline))
        except TimeoutError:
            raise
        except Exception as e:  # BrokenPipeError, EOF, bad frame
            raise WorkerGone(str(e) or type(e).__name__) from None

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
        return execute_in_process(*request)
    try:
        result = worker.run(request, time.monotonic() + timeout_s + KILL_GRACE_S)
    except TimeoutError:
        worker.kill()
        return SqlResult(error=TIMEOUT_MESSAGE)
    except WorkerGone as e:
        worker.kill()
        return SqlResult(error=shorten(f"sandbox worker died: {e}"))
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
    refusal = check_statement(sql)
    if refusal is not None:
        return SqlResult(error=refusal)
    if not isinstance(db_path, str) or not db_path:
        return SqlResult(error="cannot open database: no path")
    request = (
        os.path.abspath(db_path), sql, float(timeout_s), int(max_rows), int(max_value_bytes), int(max_result_bytes)
    )
    if isolate and sys.executable and not _pool.disabled:
        return _execute_isolated(request, float(timeout_s))
    return execute_in_process(*request)


#SEP
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
