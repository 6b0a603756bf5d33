"""The BFCL backends of one trajectory in a child process of their own: the loop's default isolation.

Why a process: a backend method with literal arguments can hold the interpreter for hours inside one C
operation (``power(base=99999999, exponent=99999999999)``: CPython's big-integer power keeps the GIL, so
no thread of the agent-loop worker runs meanwhile, and an asynchronous exception never lands) or fill
memory (``power(base=2, exponent=2**40)``), and the math backend sets process-wide precision
(``mpmath.mp.dps``) that trajectories sharing a process would see. A thread cannot be stopped; a process
can, and its memory can be capped.

:class:`ProcessEnv` has :class:`recipe.mrtpo.agent.bfcl_env.BFCLEnv`'s interface (``execute``,
``poisoned``, ``stop_reason``, ``snapshot``, ``close``). Its child is ``python -m
recipe.mrtpo.agent.bfcl_process`` (a fresh interpreter, as the task's checker sandbox starts one: a fork
of the worker would copy its threads, and multiprocessing's spawn and forkserver re-import the worker's
main module in every child), which caps its address space (``memory_limit_bytes``), discards the
backends' prints, builds the ``BFCLEnv`` and answers one request at a time: length-prefixed pickles over
its stdin / stdout. A call that does not answer within its time limit kills the child (``call_timeout``);
a child that dies (``env_lost``) is reported; either way the environment is poisoned and the loop ends
the trajectory. A child that does not start is a :class:`~recipe.mrtpo.agent.bfcl_env.BFCLEntryError`.
Results are cut to :data:`MAX_RESULT_CHARS` in the child before they cross the pipe.
"""

from __future__ import annotations

import os
import pickle
import selectors
import struct
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from recipe.mrtpo.agent.bfcl_env import BFCLEntry, BFCLEntryError, BFCLEnv, ExecResult

__all__ = ["MEMORY_LIMIT_BYTES", "MAX_RESULT_CHARS", "START_TIMEOUT_S", "ProcessEnv"]

MEMORY_LIMIT_BYTES = 4 << 30  # address space of a child (the backends' states are a few MB)
MAX_RESULT_CHARS = 1_000_000  # a result crossing the pipe (the loop cuts further: multi_turn.max_tool_response_length)
START_TIMEOUT_S = 120.0  # a child's start (an interpreter importing the backends; seconds on a busy machine)
_HEADER = struct.Struct("<Q")
_MAX_FRAME = 1 << 30
_REPO = Path(__file__).resolve().parents[3]


class _ChildGone(Exception):
    """The child closed its pipe, or sent something that is not a frame."""


def _write(stream, msg: Any) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact(fd: int, n: int, deadline: Optional[float]) -> Optional[bytes]:
    """``n`` bytes from ``fd``, or None when the deadline passes first; _ChildGone at end of file."""
    chunks, got = [], 0
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while got < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if not sel.select(left):
                return None
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise _ChildGone("end of file")
            chunks.append(chunk)
            got += len(chunk)
    return b"".join(chunks)


def _read(fd: int, deadline: Optional[float]) -> Any:
    """One message, or None when the deadline passes first."""
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    (n,) = _HEADER.unpack(head)
    if n > _MAX_FRAME:
        raise _ChildGone(f"a frame of {n} bytes")
    body = _read_exact(fd, n, None if deadline is None else max(deadline, time.monotonic() + 5.0))
    if body is None:
        raise _ChildGone("a frame cut short")
    return pickle.loads(body)


class ProcessEnv:
    """:class:`BFCLEnv` in a child process (module docstring)."""

    def __init__(self, entry: BFCLEntry, memory_limit_bytes: int = MEMORY_LIMIT_BYTES,
                 start_timeout_s: float = START_TIMEOUT_S):
        self.entry = entry
        self.poisoned = False
        self.stop_reason: Optional[str] = None
        self._proc: Optional[subprocess.Popen] = subprocess.Popen(
            [sys.executable, "-m", "recipe.mrtpo.agent.bfcl_process", str(int(memory_limit_bytes))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=str(_REPO))
        try:
            _write(self._proc.stdin, entry)
            answer = _read(self._proc.stdout.fileno(), time.monotonic() + start_timeout_s)
        except (OSError, _ChildGone, pickle.UnpicklingError, EOFError) as e:
            answer = ("error", f"the child ended ({type(e).__name__}: {e})")
        if answer is None:
            answer = ("error", f"no answer within {start_timeout_s:g} s")
        if answer[0] != "ready":
            self.close(kill=True)
            raise BFCLEntryError(f"{entry.id}: the backends did not start: {answer[1]}")

    def _stop(self, reason: str) -> None:
        self.poisoned, self.stop_reason = True, reason
        self.close(kill=True)

    def execute(self, name: str, arguments: Mapping, timeout_s: float) -> ExecResult:
        """Run one decoded call in the child under a time limit. Never raises."""
        if self.poisoned or self._proc is None:
            return ExecResult("Error during execution: the environment stopped after a call failed", "env_poisoned")
        try:
            _write(self._proc.stdin, ("call", name, dict(arguments)))
            answer = _read(self._proc.stdout.fileno(), time.monotonic() + timeout_s)
        except (OSError, _ChildGone, pickle.UnpicklingError, EOFError, ValueError):
            self._stop("env_lost")
            return ExecResult("Error during execution: the backend process ended (memory limit or crash)", "env_lost")
        if answer is None:
            self._stop("call_timeout")
            return ExecResult(f"Error during execution: the call did not finish within {timeout_s:g} s", "call_timeout")
        return ExecResult(*answer[1])

    def snapshot(self) -> dict[str, Any]:
        """The backend instances, pickled across (tests compare them with BFCL's state checker)."""
        _write(self._proc.stdin, ("snapshot",))
        answer = _read(self._proc.stdout.fileno(), time.monotonic() + START_TIMEOUT_S)
        if answer is None:
            raise TimeoutError("the backend process did not answer")
        return answer[1]

    def close(self, kill: bool = False) -> None:
        """Stop the child (asked, then killed; ``kill``: at once); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if not kill:
            try:
                _write(proc.stdin, ("stop",))
                proc.wait(2.0)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait(10.0)
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def __del__(self):  # a loop that raised before closing: no orphan child
        try:
            self.close(kill=True)
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def _serve(memory_limit_bytes: int) -> None:
    """The child: cap memory, keep the protocol's descriptors, silence prints, serve until told to stop."""
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    except (ValueError, OSError):  # a lower hard limit already set: keep it
        pass
    out = os.fdopen(os.dup(1), "wb")
    inp = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        entry = _read(inp, None)
        env = BFCLEnv(entry)
    except Exception as e:  # noqa: BLE001 (reported to the parent, which raises it as a data error)
        _write(out, ("error", f"{type(e).__name__}: {str(e)[:300]}"))
        return
    _write(out, ("ready", None))
    while True:
        try:
            msg = _read(inp, None)
        except (_ChildGone, OSError, EOFError):
            return
        if msg[0] == "call":
            res = env.call(msg[1], msg[2])
            text = res.text if len(res.text) <= MAX_RESULT_CHARS else res.text[:MAX_RESULT_CHARS] + "...(truncated)"
            _write(out, ("result", (text, res.reason)))
        elif msg[0] == "snapshot":
            _write(out, ("snapshot", env.snapshot()))
        else:
            return


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
