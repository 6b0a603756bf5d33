"""BFCL multi-turn verifier: rewards of one trajectory from BFCL's official multi-turn checker.

``score(record, ground_truth, extra_info)``:

- ``record``: the trajectory record (:mod:`recipe.mrtpo.tasks.multi_turn.trajectory`; a
  :class:`Trajectory`, its dict or its JSON string), in the place where other tasks get the response
  text. The verifier reads the model's decoded calls from it and re-executes them on fresh backends, as
  BFCL's evaluation does; tool output and injected user turns never reach it as model text.
- ``ground_truth = {"turns": [[gold call, ...] per turn]}`` (BFCL's ``possible_answer``; a JSON string
  after parquet);
- ``extra_info``: the question as the data builder writes it (``id``, ``initial_config``,
  ``involved_classes``, ``tools``: the function specs offered from the start, ``missed_function``:
  ``{turn: [specs]}`` offered from that turn on; :mod:`data_prep.multi_turn`). Missing fields are a
  data bug (``ValueError``).

Rewards (each 0.0 or 1.0), T = the question's number of turns, "scored turn" = a turn whose gold makes calls:

- ``state``: after every scored turn, BFCL's ``state_checker`` finds the model's backend instances equal
  to the gold's (every public attribute). Z_k: the differences it found (class, attribute, expected and
  actual value, per turn; cut), or that every state matched.
- ``response``: at every scored turn, the model made a call (BFCL's empty-turn check) and BFCL's
  ``response_checker`` finds every gold execution result of that turn among the model's results so far.
  Z_k: the gold results that were missing (per turn; cut), or that none was.
- ``format``: every step of the record decoded (``error`` is None) and each of its calls is well-formed
  (:func:`recipe.mrtpo.tasks.multi_turn.calls.call_error`: a function of the question, declared
  arguments, required ones given, literal values). Judged on the record, no execution. The functions of
  the question include the ``miss_func`` held-out ones at every turn: BFCL's own gold calls one before
  it is offered (``miss_func_49``, ``tail`` at turn 1), and a call where none is due costs
  ``irrelevance``. Z_k: the first malformed steps and why, or that every step was well-formed.
- ``irrelevance`` (only for questions with a turn whose gold makes no call: every ``miss_func`` and
  ``miss_param`` question and 2 each of ``base`` and ``long_context``): BFCL's
  ``multi_turn_irrelevance_checker``: the model made no call in those turns. Z_k: which turns expected
  no call and why.

All four Z_k are ``appended`` (one verifier-information block in the last user turn of P_all, as
text-to-SQL's). BFCL's own single verdict (``multi_turn_checker``: the first failing check in its order)
is ``info["bfcl_valid"]`` / ``info["bfcl_error_type"]``; it is 1 exactly when ``state`` and ``response``
are both 1. The pinned ``eval_runner`` does not call the irrelevance checker for the multi-turn
categories; it is a reward of its own here.

Hostile input never raises: a record off its shape (:class:`TrajectoryError`) scores 0 on every reward;
a record with another number of turns than T is BFCL's ``force_terminated`` (``state``, ``response``,
``irrelevance`` 0; ``format`` still judged); a checker that gives no verdict within the time limit
(:mod:`.sandbox`) scores its rewards 0. Each case is in ``info["errors"]`` (the reward manager counts
it) and in :data:`REASON_COUNTS`; calls refused by the gate (:mod:`.calls`) are ``info["refused_calls"]``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any, Optional

from recipe.mrtpo.tasks.base import Context, RewardResult, register_task, to_plain
from recipe.mrtpo.tasks.multi_turn.calls import call_error
from recipe.mrtpo.tasks.multi_turn.sandbox import DEFAULT_TIMEOUT_S, CheckerUnavailable, run_checked
from recipe.mrtpo.tasks.multi_turn.trajectory import RECORD_FIELD, Trajectory, TrajectoryError, parse_trajectory

__all__ = [
    "DATA_SOURCE",
    "REWARD_KEYS",
    "REASON_COUNTS",
    "STATE_OK",
    "RESPONSE_OK",
    "FORMAT_OK",
    "question_from_row",
    "question_docs",
    "format_errors",
    "score",
]

logger = logging.getLogger(__name__)

DATA_SOURCE = "bfcl_multi_turn"
REWARD_KEYS = ("state", "response", "format", "irrelevance")
#: process-wide counts of the reasons a reward was 0 for a defect of the record or the checker
REASON_COUNTS: Counter = Counter()

STATE_OK = "State checker: after every turn the backends' state equals the gold state."
RESPONSE_OK = "Response checker: every turn produced all of the gold calls' execution results."
FORMAT_OK = "Call format: every step decoded to well-formed calls of the offered functions."
_MAX_LISTED = 3  # turns / steps listed in one Z_k
MAX_CONTEXT_CHARS = 1200  # length bound of one Z_k text (the replay's prompt grows by it)


def _json(value: Any, what: str) -> Any:
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except ValueError as e:
            raise ValueError(f"{DATA_SOURCE}: {what} is not JSON: {e}") from None
    return to_plain(value)


def _spec(tool: Any) -> dict:
    tool = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise ValueError(f"{DATA_SOURCE}: a tool spec without a name: {tool!r:.200}")
    return tool


def question_from_row(ground_truth: Any, extra_info: Any) -> tuple[list[list[str]], dict, list[dict], dict]:
    """(gold turns, BFCL entry for the checker, tools offered from the start, {turn: tools added}) of a
    row; ``ValueError`` when a field is missing or malformed (a data bug, not model output)."""
    gt = _json(ground_truth, "ground_truth")
    if not isinstance(gt, dict) or "turns" not in gt:
        raise ValueError(f"{DATA_SOURCE}: ground_truth must be a dict with 'turns'")
    gold = _json(gt["turns"], "ground_truth['turns']")
    if not isinstance(gold, list) or not all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in gold):
        raise ValueError(f"{DATA_SOURCE}: ground_truth['turns'] must be a list of lists of call strings")
    if not isinstance(extra_info, dict):
        raise ValueError(f"{DATA_SOURCE}: extra_info with the question is required")
    missing = [k for k in ("id", "initial_config", "involved_classes", "tools") if k not in extra_info]
    if missing:
        raise ValueError(f"{DATA_SOURCE}: extra_info lacks {missing}")
    entry = {
        "id": str(extra_info["id"]),
        "initial_config": _json(extra_info["initial_config"], "initial_config"),
        "involved_classes": [str(c) for c in to_plain(extra_info["involved_classes"])],
    }
    tools = [_spec(t) for t in _json(extra_info["tools"], "tools")]
    held = _json(extra_info.get("missed_function") or "{}", "missed_function")
    if not isinstance(held, dict):
        raise ValueError(f"{DATA_SOURCE}: missed_function must map turn -> tool specs")
    added = {int(k): [_spec(t) for t in v] for k, v in held.items()}
    return gold, entry, tools, added


def question_docs(tools: list[dict], added: dict[int, list[dict]]) -> dict[str, dict]:
    """Every function of the question by name: those offered from the start and the held-out ones."""
    out = {t["name"]: t for t in tools}
    for k in sorted(added):
        out.update({t["name"]: t for t in added[k]})
    return out


def format_errors(traj: Trajectory, tools: list[dict], added: dict[int, list[dict]]) -> list[str]:
    """Why each malformed step is malformed (empty: the ``format`` reward is 1)."""
    out = []
    docs = question_docs(tools, added)
    for t, turn in enumerate(traj.turns):
        for s, step in enumerate(turn.steps):
            if step.error is not None:
                out.append(f"turn {t} step {s}: did not decode ({_cut(step.error, 120)})")
                continue
            for call in step.calls:
                why = call_error(call, docs)
                if why is not None:
                    out.append(f"turn {t} step {s}: {_cut(repr(call), 120)}: {why}")
                    break
    return out


def _cut(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _listing(items: list[str], head: str) -> str:
    more = f" (and {len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else ""
    return head + " " + "; ".join(items[:_MAX_LISTED]) + more


def _irrelevance_text(gold: list[list[str]]) -> str:
    turns = [str(i) for i, g in enumerate(gold) if not g]
    return ("Irrelevance: no function call should be made in turn " + ", ".join(turns) + ": the function or "
            "parameter the request needs is not available there, so the model should say so instead of calling.")


def _count(reason: str) -> None:
    REASON_COUNTS[reason] += 1
    logger.debug("bfcl_multi_turn: %s", reason)


def score(record: Any, ground_truth: Any, extra_info: Optional[dict] = None) -> RewardResult:
    """The rewards of one trajectory record (module docstring)."""
    gold, entry, tools, added = question_from_row(ground_truth, extra_info)
    keys = [k for k in REWARD_KEYS if k != "irrelevance" or any(not g for g in gold)]
    scores = dict.fromkeys(keys, 0.0)
    texts: dict[str, str] = {}
    if "irrelevance" in scores:
        texts["irrelevance"] = _irrelevance_text(gold)
    info: dict[str, Any] = {"bfcl_valid": False, "bfcl_error_type": None, "refused_calls": 0}

    def result() -> RewardResult:
        contexts = {k: Context(_cut(texts.get(k, ""), MAX_CONTEXT_CHARS), "appended") for k in keys}
        return RewardResult(scores=scores, contexts=contexts, info=info)

    try:
        traj = parse_trajectory(record)
    except TrajectoryError as e:
        _count("malformed_record")
        msg = _cut(f"malformed trajectory record: {e}", 300)
        info["errors"] = dict.fromkeys(keys, msg)
        info["record_error"] = msg  # the reward manager counts it apart (mrtpo/record_errors)
        texts.update({k: msg for k in ("state", "response", "format")})
        return result()
    bad_steps = format_errors(traj, tools, added)
    scores["format"] = 0.0 if bad_steps else 1.0
    texts["format"] = _listing(bad_steps, "Call format:") if bad_steps else FORMAT_OK
    info["format_error"] = bad_steps[0] if bad_steps else None
    if bad_steps:
        _count("malformed_step")
    if len(traj.turns) != len(gold):
        _count("force_terminated")
        msg = f"the trajectory has {len(traj.turns)} turns, the question {len(gold)}"
        info["bfcl_error_type"] = "multi_turn:force_terminated"
        info["errors"] = {k: msg for k in keys if k != "format"}
        texts["state"] = texts["response"] = f"Turns: {msg}; BFCL scores it as force-terminated."
        return result()
    try:
        summary = run_checked({"decoded": traj.decoded(), "gold": gold, "entry": entry}, DEFAULT_TIMEOUT_S)
    except CheckerUnavailable as e:
        _count("checker_unavailable")
        info["errors"] = {k: _cut(str(e), 300) for k in keys if k != "format"}
        texts["state"] = texts["response"] = _cut(f"BFCL's checker gave no verdict: {e}", 300)
        return result()
    info["refused_calls"] = summary["refused_calls"]
    if summary["refused_calls"]:
        _count("refused_call")
    verdict = summary["verdict"]
    info["bfcl_valid"] = bool(verdict["valid"])
    info["bfcl_error_type"] = verdict.get("error_type")
    turns = summary["turns"]
    state_bad = [f"after turn {t}: " + ", ".join(tc["state_differences"]) for t, tc in enumerate(turns)
                 if not tc["gold_empty"] and not tc["state_valid"]]
    resp_bad = [f"turn {t}: " + ("no call was made" if tc["empty_response"] else
                                 "missing gold results " + " | ".join(tc["missing"]))
                for t, tc in enumerate(turns)
                if not tc["gold_empty"] and (tc["empty_response"] or not tc["response_valid"])]
    scores["state"] = 0.0 if state_bad else 1.0
    scores["response"] = 0.0 if resp_bad else 1.0
    texts["state"] = _listing(state_bad, "State checker: expected state") if state_bad else STATE_OK
    texts["response"] = _listing(resp_bad, "Response checker:") if resp_bad else RESPONSE_OK
    if "irrelevance" in scores:
        scores["irrelevance"] = 1.0 if summary["irrelevance"]["valid"] else 0.0
    return result()


register_task(DATA_SOURCE, score, record_field=RECORD_FIELD)
