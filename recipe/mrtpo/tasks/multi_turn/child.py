"""A child Python interpreter fed JSON lines: the one owner of running BFCL's backends out of process.

Why a process: BFCL's backends are ordinary Python, and a call of a real backend method with literal
arguments can hold the interpreter for hours inside one C operation (``power(base=99999999,
exponent=99999999999)``: CPython's big-integer power keeps the GIL, and an asynchronous exception never
lands) or fill memory (``square_root(number=2, precision=10**9)``). A thread cannot be stopped; a process
can, and its memory can be capped. Two users: the multi-turn verifier's checker (:mod:`.sandbox`, one
long-lived child per verifier process) and the agent loop's backends (``recipe.mrtpo.agent.bfcl_process``,
one child per trajectory).

:class:`ChildProcess` (the parent's side)
    Starts ``python -c`` with a small bootstrap (a fresh interpreter: a fork of a worker would copy its
    threads, and multiprocessing's spawn and forkserver re-import the worker's main module). The bootstrap
    enters the packages above the handler's module as bare path entries, so their ``__init__`` (the tasks
    package registers every task: seconds of imports) does not run there. :meth:`ChildProcess.ask` writes
    one request as a JSON line and waits for one JSON line back, at most ``timeout_s``: past it the child is
    killed (:class:`ChildTimeout`); a child that closes its pipe or answers something that is not a reply
    line is killed too (:class:`ChildLost`); a handler that raised answers its message
    (:class:`ChildError`, the child lives on). With ``restart=True`` a dead or killed child is started
    afresh on the next request; without, the next request is :class:`ChildLost` (a child whose state
    matters, such as one trajectory's backends, is never silently replaced).

:func:`serve` (the child's side)
    Caps its address space (``RLIMIT_AS``), keeps private copies of stdin / stdout for the protocol and
    points descriptors 0, 1 and 2 at ``/dev/null`` (the handler's prints are discarded and it reads nothing
    but the requests), builds the handler once (``module:factory``, called without arguments) and answers
    every request line with ``{"result": handler(request)}`` or ``{"error": "Type: message"}`` until stdin
    closes.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["MAX_REPLY_BYTES", "ChildError", "ChildFailure", "ChildLost", "ChildProcess", "ChildTimeout", "serve"]

MAX_REPLY_BYTES = 1 << 30  # a reply line longer than this is a broken child, not an answer
_ERROR_CHARS = 300  # a handler's exception message is cut to this many characters
_REPO = Path(__file__).resolve().parents[4]

# Each package above the handler's module (and above this one) is a bare module with its path entry; then
# this module's serve() runs the handler. Formatted with the repository root, the packages, the handler and
# the memory cap.
_BOOTSTRAP = """
import sys, types
for name in {packages!r}:
    module = types.ModuleType(name)
    module.__path__ = [{root!r} + "/" + name.replace(".", "/")]
    sys.modules[name] = module
from recipe.mrtpo.tasks.multi_turn.child import serve
serve({handler!r}, {memory!r})
"""


class ChildFailure(RuntimeError):
    """The child gave no answer to a request; the message says why."""


class ChildTimeout(ChildFailure):
    """No answer within the request's time limit: the child was killed."""


class ChildLost(ChildFailure):
    """The child could not start, ended, or wrote something that is not a reply: it was killed."""


class ChildError(ChildFailure):
    """The handler raised (its ``Type: message``), or the request is not JSON; the child lives on."""


def _short(text: str, limit: int = _ERROR_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _packages(handler: str) -> list[str]:
    """Every package above the handler's module and above this module (the bootstrap enters them bare)."""
    out: list[str] = []
    for module in (handler.split(":")[0], __name__):
        parts = module.split(".")
        for k in range(1, len(parts)):
            name = ".".join(parts[:k])
            if name not in out:
                out.append(name)
    return out


class ChildProcess:
    """One child interpreter serving ``handler`` (``module:factory``; module docstring)."""

    def __init__(self, handler: str, memory_limit_bytes: int, restart: bool = True):
        self.handler = handler
        self.memory_limit_bytes = int(memory_limit_bytes)
        self.restart = restart
        self.proc: Optional[subprocess.Popen] = None
        self.started = 0  # how many children were started (a restart counts)
        self._lock = threading.Lock()
        self._buf = bytearray()

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(_REPO), *[p for p in [env.get("PYTHONPATH")] if p]])
        code = _BOOTSTRAP.format(packages=_packages(self.handler), root=str(_REPO), handler=self.handler,
                                 memory=self.memory_limit_bytes)
        try:
            self.proc = subprocess.Popen([sys.executable, "-u", "-c", code], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=str(_REPO))
        except OSError as e:
            raise ChildLost(f"cannot start the child process: {e}") from None
        self.started += 1
        self._buf.clear()

    def kill(self) -> None:
        """Kill the child at once (idempotent)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.kill()
            proc.wait(10.0)
        except Exception:  # noqa: BLE001 (already gone, or interpreter shutdown)
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self, grace_s: float = 2.0) -> None:
        """Close the child's stdin (it ends when it reads end of file), then kill it after ``grace_s``."""
        with self._lock:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                try:
                    proc.stdin.close()
                    proc.wait(grace_s)
                except (OSError, ValueError, subprocess.TimeoutExpired):
                    pass
            self.kill()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ask(self, request: Any, timeout_s: float) -> Any:
        """The handler's answer to ``request`` (JSON-able), within ``timeout_s`` (a child started now
        included); :class:`ChildFailure` otherwise (module docstring)."""
        try:
            line = json.dumps(request, ensure_ascii=True).encode() + b"\n"
        except (TypeError, ValueError) as e:
            raise ChildError(f"the request is not JSON: {_short(e)}") from None
        with self._lock:
            if not self.alive:
                self.kill()
                if self.started and not self.restart:
                    raise ChildLost("the child process ended")
                self._start()
            deadline = time.monotonic() + timeout_s
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (OSError, ValueError):
                self.kill()
                raise ChildLost("the child process ended") from None
            reply = self._read_line(deadline, timeout_s)
        if "error" in reply:
            raise ChildError(str(reply["error"]))
        return reply["result"]

    def _read_line(self, deadline: float, timeout_s: float) -> dict:
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.kill()
                    raise ChildTimeout(f"timeout: no answer within {timeout_s:g} s")
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self.kill()
                    raise ChildLost("the child process ended")
                self._buf += chunk
                if len(self._buf) > MAX_REPLY_BYTES:
                    self.kill()
                    raise ChildLost(f"a reply longer than {MAX_REPLY_BYTES} bytes")
        end = self._buf.index(b"\n")
        raw = bytes(self._buf[:end])
        del self._buf[: end + 1]
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or not ("result" in reply or "error" in reply):
            self.kill()
            raise ChildLost(f"not a reply line: {_short(raw[:200])}")
        return reply

    def __del__(self):  # an owner that raised before closing: no orphan child
        try:
            self.kill()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def serve(handler: str, memory_limit_bytes: int) -> None:
    """The child (module docstring): cap memory, keep the protocol's descriptors, answer until end of file."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    except (ImportError, ValueError, OSError):  # no rlimits here, or a lower hard limit already set: keep it
        pass
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "w", encoding="ascii", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    sys.stdin = sys.stdout = sys.stderr = open(os.devnull, "r+")
    module, factory = handler.split(":")
    import importlib

    try:
        handle = getattr(importlib.import_module(module), factory)()
    except BaseException as e:  # noqa: BLE001 - answered to every request: the parent raises it as ChildError
        if isinstance(e, KeyboardInterrupt):
            raise
        failed = _short(f"{type(e).__name__}: {e}")

        def handle(request):
            raise RuntimeError(f"the handler did not start: {failed}")

    for line in proto_in:
        try:
            reply = json.dumps({"result": handle(json.loads(line))}, ensure_ascii=True, default=str)
        except BaseException as e:  # noqa: BLE001 - every failure is an answer, never a silent exit
            if isinstance(e, KeyboardInterrupt):
                raise
            reply = json.dumps({"error": _short(f"{type(e).__name__}: {e}")})
        proto_out.write(reply + "\n")
