"""BFCL's checker in a child process with a time limit: model calls are executed there, never here.

Why a process, and how the child is run (time limit per request, address-space cap, prints discarded,
killed and restarted): :mod:`.child`, the one owner of BFCL's child interpreters. Here: one child per
verifier process (started on first use, about a second), fed one request per trajectory; when it does not
answer within the time limit it is killed, the trajectory scored 0 (counted, :class:`CheckerUnavailable`)
and a fresh child answers the next request. Its address space is capped at :data:`MEMORY_LIMIT_BYTES`.

:func:`evaluate` is the work itself (also callable in-process by tests): the gate of
:func:`recipe.mrtpo.tasks.multi_turn.calls.executable_calls`, then
:func:`recipe.mrtpo.tasks.multi_turn.official.check_turns` and the irrelevance checker, summarised as
plain JSON (what differs, what is missing, each cut to a bounded length).
"""

from __future__ import annotations

import re
from typing import Any

from recipe.mrtpo.tasks.multi_turn.child import ChildError, ChildFailure, ChildProcess

__all__ = ["DEFAULT_TIMEOUT_S", "MEMORY_LIMIT_BYTES", "CheckerUnavailable", "evaluate", "run_checked"]

DEFAULT_TIMEOUT_S = 20.0  # gold trajectories take milliseconds; this only stops pathological calls
MEMORY_LIMIT_BYTES = 4 << 30
_DETAIL_CHARS = 240  # each reported difference / missing result is cut to this many characters
_DETAIL_ITEMS = 5


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


# Started on first use; the child imports only this module, the checker's (official.py, calls.py) and
# bfcl_eval's (the packages above are entered bare: :mod:`.child`).
_CHILD = ChildProcess(f"{__name__}:_checker", MEMORY_LIMIT_BYTES, restart=True)


def _checker():
    """The child's handler (:func:`recipe.mrtpo.tasks.multi_turn.child.serve` builds it once)."""
    return evaluate


def run_checked(request: dict, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """:func:`evaluate` in the child process; :class:`CheckerUnavailable` when it gives no answer in time."""
    try:
        return _CHILD.ask(request, timeout_s)
    except ChildError as e:
        raise CheckerUnavailable(f"checker error: {e}") from None
    except ChildFailure as e:
        raise CheckerUnavailable(str(e)) from None
