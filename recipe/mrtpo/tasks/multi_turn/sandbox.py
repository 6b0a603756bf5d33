"""BFCL's checker in a child process with a time limit: model calls are executed there, never here.

Why a process: BFCL's backends are ordinary Python, and a call of a real backend method with literal
arguments can still run for hours or eat the machine (``power(base=9**9, exponent=10**12)``,
``square_root(number=2, precision=10**9)``). A thread cannot be stopped; a process can. One child per
verifier process (started on first use, about a second), fed one request per trajectory as a JSON line
on stdin, answering one JSON line; it is killed and the trajectory scored 0 (counted) when it does not
answer within the time limit, and started afresh on the next request. The child's address space is
capped (:data:`MEMORY_LIMIT_BYTES`), its ``print`` output discarded (the protocol has its own file
descriptor), and it reads nothing but the request.

:func:`evaluate` is the work itself (also callable in-process by tests): the gate of
:func:`recipe.mrtpo.tasks.multi_turn.calls.executable_calls`, then
:func:`recipe.mrtpo.tasks.multi_turn.official.check_turns` and the irrelevance checker, summarised as
plain JSON (what differs, what is missing, each cut to a bounded length).
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["DEFAULT_TIMEOUT_S", "MEMORY_LIMIT_BYTES", "CheckerUnavailable", "evaluate", "run_checked"]

DEFAULT_TIMEOUT_S = 20.0  # gold trajectories take milliseconds; this only stops pathological calls
MEMORY_LIMIT_BYTES = 4 << 30
_DETAIL_CHARS = 240  # each reported difference / missing result is cut to this many characters
_DETAIL_ITEMS = 5
_REPO = Path(__file__).resolve().parents[4]


class CheckerUnavailable(RuntimeError):
    """The child did not answer (time limit, crash, or it could not start); the message says which."""


def _short(value: Any, limit: int = _DETAIL_CHARS) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def evaluate(request: dict) -> dict:
    """Check one trajectory: ``request = {"decoded", "gold", "entry"}`` -> a JSON-able summary::

        {"refused_calls": int, "verdict": {"valid", "error_type"?, "turn"?},
         "irrelevance": {"valid", "error_type"?},
         "turns": [{"gold_empty", "empty_response", "state_valid", "response_valid",
                    "state_differences": [str], "missing": [str]}, ...]}
    """
    from recipe.mrtpo.tasks.multi_turn import official
    from recipe.mrtpo.tasks.multi_turn.calls import executable_calls

    entry, gold = request["entry"], request["gold"]
    methods = official.method_names(entry["involved_classes"])
    refused = 0
    decoded = []
    for steps in request["decoded"]:
        turn = []
        for step in steps:
            calls, n = executable_calls(list(step), methods)
            refused += n
            turn.append(calls)
        decoded.append(turn)
    turns = official.check_turns(decoded, gold, entry)
    irrelevance = official.irrelevance_verdict(decoded, gold)
    summary = []
    for tc in turns:
        state, response = tc.state or {"valid": True}, tc.response or {"valid": True}
        diffs = state.get("details", {}).get("differences", {}) if not state["valid"] else {}
        m = re.match(r"Model instance for (\S+) ", state.get("error_message", "")) if not state["valid"] else None
        cls = m.group(1) if m else ""
        summary.append({
            "gold_empty": tc.gold_empty,
            "empty_response": tc.empty_response,
            "state_valid": bool(state["valid"]),
            "response_valid": bool(response["valid"]),
            "state_differences": [_short(f"{cls}.{k}: expected {d.get('ground_truth')!r}, got {d.get('model')!r}")
                                  for k, d in list(diffs.items())[:_DETAIL_ITEMS]],
            "missing": [_short(m) for m in response.get("details", {}).get("missing_items", [])[:_DETAIL_ITEMS]]
            if not response["valid"] else [],
        })
    return {
        "refused_calls": refused,
        "verdict": official.first_failure(turns),
        "irrelevance": {k: irrelevance[k] for k in ("valid", "error_type") if k in irrelevance},
        "turns": summary,
    }


# The child imports only this module, the checker's (official.py, calls.py) and bfcl_eval's: the packages
# above are entered as bare path entries, so their __init__ (which registers every task: seconds of
# imports) does not run there.
_CHILD_MAIN = """
import sys, types
for name in ("recipe", "recipe.mrtpo", "recipe.mrtpo.tasks", "recipe.mrtpo.tasks.multi_turn"):
    module = types.ModuleType(name)
    module.__path__ = [{root!r} + "/" + name.replace(".", "/")]
    sys.modules[name] = module
from recipe.mrtpo.tasks.multi_turn.sandbox import _serve
_serve()
"""


class _Child:
    def __init__(self):
        self.proc: Optional[subprocess.Popen] = None
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(_REPO), *[p for p in [env.get("PYTHONPATH")] if p]])
        return subprocess.Popen([sys.executable, "-u", "-c", _CHILD_MAIN.format(root=str(_REPO))], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=str(_REPO))

    def _kill(self) -> None:
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=5)
            except Exception:
                pass
        self.proc = None

    def ask(self, line: bytes, timeout_s: float) -> dict:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._kill()
                try:
                    self.proc = self._start()
                except OSError as e:
                    raise CheckerUnavailable(f"cannot start the checker process: {e}") from None
            proc = self.proc
            try:
                proc.stdin.write(line + b"\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._kill()
                raise CheckerUnavailable("the checker process died") from None
            deadline = time.monotonic() + timeout_s
            buf = b""
            fd = proc.stdout.fileno()
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                while not buf.endswith(b"\n"):
                    left = deadline - time.monotonic()
                    if left <= 0 or not sel.select(left):
                        self._kill()
                        raise CheckerUnavailable(f"timeout: no verdict within {timeout_s:g} s")
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        self._kill()
                        raise CheckerUnavailable("the checker process died")
                    buf += chunk
            reply = json.loads(buf)
            if "error" in reply:
                raise CheckerUnavailable(f"checker error: {reply['error']}")
            return reply["result"]


_CHILD = _Child()


def run_checked(request: dict, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """:func:`evaluate` in the child process; :class:`CheckerUnavailable` when it gives no answer in time."""
    return _CHILD.ask(json.dumps(request, ensure_ascii=True).encode(), timeout_s)


def _serve() -> None:
    """The child: one JSON request per stdin line, one JSON reply per line on the saved stdout."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    proto = os.fdopen(os.dup(1), "w", encoding="ascii", buffering=1)
    devnull = open(os.devnull, "w")
    os.dup2(devnull.fileno(), 1)
    sys.stdout = devnull
    for line in sys.stdin:
        try:
            reply = {"result": evaluate(json.loads(line))}
        except BaseException as e:  # noqa: BLE001 - every failure is an answer, never a silent exit
            if isinstance(e, KeyboardInterrupt):
                raise
            reply = {"error": _short(f"{type(e).__name__}: {e}", 300)}
        proto.write(json.dumps(reply, ensure_ascii=True, default=str) + "\n")
