"""Execution of one untrusted SQL statement, read-only and bounded, in this process: what a sandbox
worker runs (:mod:`sql_sandbox` starts ``python -I -S`` on this file and talks to it over its stdin and
stdout), and the fallback when no worker can be started.

Standard library only, importing nothing from the project: the worker runs this file in isolated mode,
without the project on its path.

- :func:`check_statement`: the statement must be a single read statement (``SELECT``, ``WITH`` or
  ``VALUES`` after comments and whitespace, no NUL, at most 1,000,000 characters);
- :func:`execute_in_process`: open the database through a ``file:<path>?mode=ro`` URI in autocommit
  mode, with an authorizer that allows only reading actions (and denies ``load_extension``,
  ``fts3_tokenizer``, ``random``, ``randomblob``), SQLite's length limits, and a progress handler that
  aborts the statement at its deadline; fetch at most ``max_rows`` rows / ``max_result_bytes``
  (a larger result is truncated, not an error). Text that is not valid UTF-8 is decoded with the
  invalid bytes dropped, as test-suite-sql-eval's connection does. An error that is the environment's, not the
  statement's (:func:`environment_fault`: the database cannot be opened or read, is locked, corrupt or not a
  database; an ``OSError`` such as ESTALE) is marked ``SqlResult.environment``: the verifier then has no verdict;
- the wire protocol: length-prefixed ``marshal`` frames (not pickle, so that even a compromised worker
  cannot make the caller run code), and the worker loop :func:`serve`.

See :mod:`sql_sandbox` for the layers of protection and the resource bounds as a whole.
"""

from __future__ import annotations

import marshal
import os
import re
import select
import sqlite3
import sys
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_MAX_ROWS",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_MAX_RESULT_BYTES",
    "MAX_ERROR_CHARS",
    "TIMEOUT_MESSAGE",
    "WORKER_MEMORY_BYTES",
    "SqlResult",
    "WorkerGone",
    "check_statement",
    "environment_fault",
    "execute_in_process",
    "read_exact",
    "write_all",
    "encode_frame",
    "read_frame",
    "serve",
    "shorten",
]

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_VALUE_BYTES = 4_000_000
DEFAULT_MAX_RESULT_BYTES = 32_000_000
MAX_ERROR_CHARS = 280  # error text length; callers add a short prefix and stay within 300 chars
TIMEOUT_MESSAGE = "query timed out"
WORKER_MEMORY_BYTES = 2 << 30  # RLIMIT_AS of a worker

_PROGRESS_OPS = 1000  # VM instructions between two deadline checks (microseconds of work)
_FETCH_CHUNK = 256
_LIKE_PATTERN_LIMIT = 200
_SQL_LENGTH_LIMIT = 1_000_000

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
    ``nbytes``: approximate size of ``rows``; ``environment``: the error is the environment's, not the
    statement's (:func:`environment_fault`).
    """

    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    error: Optional[str] = None
    truncated: bool = False
    nbytes: int = 0
    environment: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_wire(self) -> tuple:
        return (self.columns, self.rows, self.error, self.truncated, self.nbytes, self.environment)

    @classmethod
    def from_wire(cls, t: tuple) -> SqlResult:
        columns, rows, error, truncated, nbytes, environment = t
        return cls(tuple(columns), tuple(tuple(r) for r in rows), error, bool(truncated), int(nbytes), bool(environment))


def shorten(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """One line, printable, at most ``limit`` characters."""
    text = " ".join(str(message).split())
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_statement(sql: str) -> Optional[str]:
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


#: SQLite's primary result codes of a database the connection cannot open or read, whatever the statement:
#: PERM, BUSY, LOCKED, IOERR (ESTALE and every I/O error of NFS), CORRUPT, CANTOPEN, PROTOCOL, NOLFS, NOTADB. Not FULL
#: (a query's temporary tables can fill the disk) nor IOERR_NOMEM (3082: memory the query exhausted): the statement's
_ENVIRONMENT_CODES = frozenset({3, 5, 6, 10, 11, 14, 15, 22, 26})
_STATEMENT_EXTENDED_CODES = frozenset({3082})
#: the same errors by their messages, for an error that carries no code
_ENVIRONMENT_MESSAGES = ("unable to open database file", "disk i/o error", "database disk image is malformed",
                         "file is not a database", "database is locked", "database table is locked")


def environment_fault(exc: BaseException) -> bool:
    """Whether ``exc``, raised while running a statement, is the environment's fault rather than the statement's:
    an ``OSError``, or a SQLite error whose primary code (or message) says the database file cannot be opened or
    read (``_ENVIRONMENT_CODES``). A syntax error, a missing table or column, the authorizer's refusal, a time-out
    (``interrupted``), a value too big, memory or temporary disk exhausted by the query are the statement's."""
    if isinstance(exc, OSError):
        return True
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in _ENVIRONMENT_CODES and code not in _STATEMENT_EXTENDED_CODES
    return str(exc).strip().lower() in _ENVIRONMENT_MESSAGES


def _authorizer(action: int, arg1, arg2, db_name, trigger) -> int:
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _decode_text(raw: bytes) -> str:
    # Databases in the wild (Spider, BIRD) hold some non-UTF-8 text: never fail on it, and drop the
    # invalid bytes as test-suite-sql-eval's connection does (``b.decode(errors="ignore")``).
    return raw.decode("utf-8", errors="ignore")


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


def execute_in_process(
    db_path: str, sql: str, timeout_s: float, max_rows: int, max_value_bytes: int, max_result_bytes: int
) -> SqlResult:
    """Run one checked statement in this process (bounded by the progress handler only)."""
    deadline = time.monotonic() + float(timeout_s)
    try:
        conn = _open_read_only(db_path, deadline, max_value_bytes)
    except Exception as e:  # missing file, not a database, ...: never the statement's fault
        return SqlResult(error=shorten(f"cannot open database: {e}"), environment=True)
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
        return SqlResult(error=shorten(message), environment=environment_fault(e))
    finally:
        try:
            conn.close()
        except Exception:
            pass


class WorkerGone(Exception):
    """The worker died, timed out or broke the protocol; it must be killed and replaced."""


def read_exact(fd: int, n: int, deadline: Optional[float]) -> bytes:
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
            raise WorkerGone("worker closed its output")
        chunks.append(data)
        remaining -= len(data)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def encode_frame(obj: Any) -> bytes:
    payload = marshal.dumps(obj)
    return len(payload).to_bytes(8, "big") + payload


def read_frame(fd: int, deadline: Optional[float]) -> Any:
    n = int.from_bytes(read_exact(fd, 8, deadline), "big")
    return marshal.loads(read_exact(fd, n, deadline))


def serve() -> None:
    """Worker loop: read a request frame, run it in-process, write the result frame; exit on EOF."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except Exception:
        pass
    inp, out = sys.stdin.fileno(), sys.stdout.fileno()
    write_all(out, b"R")
    while True:
        try:
            request = read_frame(inp, None)
        except Exception:
            return  # EOF: the caller closed the pipe or died
        try:
            result = execute_in_process(*request)
            reply = encode_frame(result.to_wire())
        except Exception as e:  # MemoryError while building the answer, ...
            reply = encode_frame(SqlResult(error=shorten(f"sandbox error: {type(e).__name__}: {e}")).to_wire())
        write_all(out, reply)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
