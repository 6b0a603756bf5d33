"""Time-limited instruction checks for long responses, in a separate worker process.

Several checkers are quadratic on degenerate text (``detectable_content:number_placeholders`` on
``"[[[[..."``, ``detectable_format:number_bullet_lists`` and ``detectable_content:postscript`` on long
whitespace runs; the NLTK-based ones take ~1 s per 16k characters of ``". . . ."``): at 16k
characters the worst single check takes a few seconds, at 1 MB hours. Python cannot interrupt a
regular expression or a C loop from another thread, so responses longer than
:data:`IN_PROCESS_MAX_CHARS` are checked in a worker process that the caller kills when one check
exceeds its time limit; the check then fails with a ``CheckTimeout`` error (counted by the reward
manager and the evaluation, never a hang), and the next check starts a fresh worker. Every other check
gets the checker's own verdict, whatever the length. One worker serves the process and stays alive
across checks until a timeout kills it; a lock serialises its use (long responses are rare).

Workers come from ``multiprocessing``'s forkserver context with the checkers preloaded in the server,
so replacing a killed worker is a fork (milliseconds) rather than a fresh interpreter importing the
checkers (seconds); where forkserver is unavailable, the spawn context is used.

Limits: ``$MRTPO_IF_CHECK_TIMEOUT_S`` (default :data:`DEFAULT_CHECK_TIMEOUT_S`) per check of one
variant; ``$MRTPO_IF_INPROCESS_MAX_CHARS`` (default :data:`IN_PROCESS_MAX_CHARS`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from typing import Any, Optional

from recipe.mrtpo.tasks.base import NoVerdict

__all__ = ["DEFAULT_CHECK_TIMEOUT_S", "IN_PROCESS_MAX_CHARS", "CheckTimeout", "check_timeout_s", "environment_fault",
           "in_process_max_chars", "run_isolated", "shutdown_worker"]

DEFAULT_CHECK_TIMEOUT_S = 20.0
IN_PROCESS_MAX_CHARS = 16_384
_START_TIMEOUT_S = 120.0
_log = logging.getLogger(__name__)


class CheckTimeout(RuntimeError):
    """One check of one response variant ran past its time limit (the worker was killed)."""


def environment_fault(exc: BaseException) -> bool:
    """Whether a checker's exception is its node's fault, not the response's: NLTK data that is not there
    (``LookupError`` itself, what ``nltk.data.find`` raises; its subclasses ``KeyError`` and ``IndexError`` are a
    checker failing on odd text), a dependency that does not import (``ImportError``), an asset it cannot read
    (``OSError``). Any other exception (``ValueError``, ``KeyError``, ``RecursionError``, a time-out ...) is the
    check's failure on this response: the constraint scores 0 and the error is counted, as before."""
    return type(exc) is LookupError or isinstance(exc, (ImportError, OSError))


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


def check_timeout_s() -> float:
    return _env_float("MRTPO_IF_CHECK_TIMEOUT_S", DEFAULT_CHECK_TIMEOUT_S)


def in_process_max_chars() -> int:
    return int(_env_float("MRTPO_IF_INPROCESS_MAX_CHARS", IN_PROCESS_MAX_CHARS))


def _serve(conn) -> None:  # pragma: no cover - runs in the worker process
    from recipe.mrtpo.tasks import if_registry as R

    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        iid, kwargs, text = request
        try:
            checker, _ = R._build_checker(iid, kwargs)
            conn.send(("ok", bool(text.strip()) and bool(checker.check_following(text))))
        except Exception as exc:  # noqa: BLE001 - reported to the caller as the check's error (or no verdict)
            conn.send(("no_verdict" if environment_fault(exc) else "error", R._error(exc)))


_PRELOAD = ["recipe.mrtpo.tasks.if_registry"]


def _context():
    """forkserver (the checkers imported once in the server) where available, else spawn."""
    try:
        ctx = multiprocessing.get_context("forkserver")
    except ValueError:
        return multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if getattr(server, "_forkserver_pid", None) is None:  # not started yet: add ours to its preload list
        current = list(getattr(server, "_preload_modules", None) or ["__main__"])
        ctx.set_forkserver_preload(current + [m for m in _PRELOAD if m not in current])
    return ctx


class _Worker:
    def __init__(self):
        ctx = _context()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(_START_TIMEOUT_S):
            self.kill()
            raise NoVerdict(f"instruction-check worker did not start in {_START_TIMEOUT_S:g} s")
        self.conn.recv()

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(5)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"worker": None, "pid": None}


def shutdown_worker() -> None:
    with _LOCK:
        if _STATE["worker"] is not None:
            _STATE["worker"].kill()
        _STATE["worker"] = None


def run_isolated(instruction_id: str, kwargs: dict, text: str, timeout_s: Optional[float] = None) -> bool:
    """The checker's verdict on ``text`` (non-empty and ``check_following``), computed in the worker.

    Raises :class:`CheckTimeout` past ``timeout_s``, ``NoVerdict`` for an error of the node (:func:`environment_fault`)
    and RuntimeError with the checker's error text for any other."""
    timeout_s = check_timeout_s() if timeout_s is None else timeout_s
    with _LOCK:
        worker = _STATE["worker"]
        if worker is None or _STATE["pid"] != os.getpid() or not worker.proc.is_alive():
            worker = _STATE["worker"] = _Worker()
            _STATE["pid"] = os.getpid()
        start = time.monotonic()
        try:
            worker.conn.send((instruction_id, kwargs, text))
            ready = worker.conn.poll(timeout_s)
            reply = worker.conn.recv() if ready else None
        except (OSError, EOFError):
            ready, reply = False, None
        if not ready or reply is None:
            worker.kill()
            _STATE["worker"] = None
            elapsed = time.monotonic() - start
            _log.warning("instruction check %s on %d characters stopped after %.1f s", instruction_id, len(text), elapsed)
            raise CheckTimeout(f"{instruction_id} on {len(text)} characters ran past {timeout_s:g} s")
    status, value = reply
    if status == "no_verdict":
        raise NoVerdict(f"instruction check {instruction_id}: {value}")
    if status == "error":
        raise RuntimeError(value)
    return bool(value)
