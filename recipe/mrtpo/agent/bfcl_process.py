"""The BFCL backends of one trajectory in a child process of their own: the loop's default isolation.

Why a process: a backend method with literal arguments can hold the interpreter for hours inside one C
operation (``power(base=99999999, exponent=99999999999)``: CPython's big-integer power keeps the GIL, so
no thread of the agent-loop worker runs meanwhile) or fill memory (``power(base=2, exponent=2**40)``), and
the math backend sets process-wide precision (``mpmath.mp.dps``) that trajectories sharing a process would
see. The child itself (a fresh interpreter fed JSON lines, its address space capped, its prints discarded,
killed past a request's time limit) is :class:`recipe.mrtpo.tasks.multi_turn.child.ChildProcess`, the one
owner of BFCL's child interpreters; this module is what the trajectory sends it and how it reads the answers.

:class:`ProcessEnv` has :class:`recipe.mrtpo.agent.bfcl_env.BFCLEnv`'s interface (``execute``,
``poisoned``, ``stop_reason``, ``snapshot``, ``close``). Its child (never restarted: a fresh child would
hold fresh backends) builds the ``BFCLEnv`` from the entry's ``id``, ``involved_classes`` and
``initial_config`` (all the backends read) and answers one request at a time. A call that does not answer
within its time limit kills the child (``call_timeout``); a child that dies (``env_lost``) is reported;
either way the environment is poisoned and the loop ends the trajectory. A child that does not start is a
:class:`~recipe.mrtpo.agent.bfcl_env.BFCLEntryError`. Results are cut to :data:`MAX_RESULT_CHARS` in the
child before they cross the pipe. The backend instances (:meth:`ProcessEnv.snapshot`, for tests) cross as
a pickle inside the JSON reply.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Mapping
from typing import Any, Optional

from recipe.mrtpo.agent.bfcl_env import BFCLEntry, BFCLEntryError, BFCLEnv, ExecResult
from recipe.mrtpo.tasks.multi_turn.child import ChildError, ChildFailure, ChildProcess, ChildTimeout

__all__ = ["MEMORY_LIMIT_BYTES", "MAX_RESULT_CHARS", "START_TIMEOUT_S", "ProcessEnv"]

MEMORY_LIMIT_BYTES = 4 << 30  # address space of a child (the backends' states are a few MB)
MAX_RESULT_CHARS = 1_000_000  # a result crossing the pipe (the loop cuts further: multi_turn.max_tool_response_length)
START_TIMEOUT_S = 120.0  # a child's start (an interpreter importing the backends; seconds on a busy machine)


class ProcessEnv:
    """:class:`BFCLEnv` in a child process (module docstring)."""

    def __init__(self, entry: BFCLEntry, memory_limit_bytes: int = MEMORY_LIMIT_BYTES,
                 start_timeout_s: float = START_TIMEOUT_S):
        self.entry = entry
        self.poisoned = False
        self.stop_reason: Optional[str] = None
        self._child: Optional[ChildProcess] = ChildProcess(f"{__name__}:_Backends", memory_limit_bytes, restart=False)
        start = {"op": "start", "id": entry.id, "involved_classes": list(entry.involved_classes),
                 "initial_config": entry.initial_config}
        try:
            self._child.ask(start, start_timeout_s)
        except ChildFailure as e:
            self.close(kill=True)
            raise BFCLEntryError(f"{entry.id}: the backends did not start: {e}") from None

    @property
    def _proc(self):
        """The child's process (None once stopped)."""
        return None if self._child is None else self._child.proc

    def _stop(self, reason: str) -> None:
        self.poisoned, self.stop_reason = True, reason
        self.close(kill=True)

    def execute(self, name: str, arguments: Mapping, timeout_s: float) -> ExecResult:
        """Run one decoded call in the child under a time limit. Never raises."""
        if self.poisoned or self._child is None:
            return ExecResult("Error during execution: the environment stopped after a call failed", "env_poisoned")
        try:
            text, reason = self._child.ask({"op": "call", "name": name, "arguments": dict(arguments)}, timeout_s)
        except ChildTimeout:
            self._stop("call_timeout")
            return ExecResult(f"Error during execution: the call did not finish within {timeout_s:g} s", "call_timeout")
        except ChildFailure:
            self._stop("env_lost")
            return ExecResult("Error during execution: the backend process ended (memory limit or crash)", "env_lost")
        return ExecResult(text, reason)

    def snapshot(self) -> dict[str, Any]:
        """The backend instances, pickled across (tests compare them with BFCL's state checker)."""
        if self._child is None:
            raise ChildError("the backend process was stopped")
        return pickle.loads(base64.b64decode(self._child.ask({"op": "snapshot"}, START_TIMEOUT_S)))

    def close(self, kill: bool = False) -> None:
        """Stop the child (its stdin closed, then killed; ``kill``: at once); idempotent."""
        child, self._child = self._child, None
        if child is not None:
            child.kill() if kill else child.close()


class _Backends:
    """The child's handler (:func:`recipe.mrtpo.tasks.multi_turn.child.serve` builds it once): ``start``
    builds the backends, then ``call`` -> ``[text, reason]`` and ``snapshot`` -> the instances' pickle (base64)."""

    def __init__(self):
        self.env: Optional[BFCLEnv] = None

    def __call__(self, request: dict) -> Any:
        op = request["op"]
        if op == "start":
            self.env = BFCLEnv(BFCLEntry(id=request["id"], turns=(), initial_config=request["initial_config"],
                                         involved_classes=tuple(request["involved_classes"]), tools=(), held_out={}))
            return "ready"
        if self.env is None:
            raise RuntimeError("no backends: the first request is start")
        if op == "call":
            res = self.env.call(request["name"], request["arguments"])
            text = res.text if len(res.text) <= MAX_RESULT_CHARS else res.text[:MAX_RESULT_CHARS] + "...(truncated)"
            return [text, res.reason]
        if op == "snapshot":
            return base64.b64encode(pickle.dumps(self.env.snapshot(), protocol=pickle.HIGHEST_PROTOCOL)).decode()
        raise ValueError(f"unknown request {op!r}")
