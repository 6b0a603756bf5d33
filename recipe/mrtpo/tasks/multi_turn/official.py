"""BFCL v4 multi-turn from the installed ``bfcl-eval``: its data files, function docs and official checker.

``bfcl-eval==2026.3.23`` (Apache-2.0, installed with ``--no-deps``) ships the four multi-turn categories
(``base``, ``long_context``, ``miss_func``, ``miss_param``; 200 questions each), their gold answers
(``possible_answer/``), the function docs (``multi_turn_func_doc/``), the pure-Python stateful backends
(``func_source_code/``) and the checker (``eval_checker/multi_turn_eval/multi_turn_checker.py``). Its
multi-turn modules import cleanly without the package's heavy dependencies, so they are imported as they
are; nothing of the checker is re-implemented here.

:func:`check_turns` runs BFCL's own pieces in the order of ``multi_turn_checker`` (per turn: execute
the model's steps, execute the gold calls, the empty-turn check, ``state_checker``,
``response_checker``), but records every turn's verdicts instead of returning at the first failure,
so that each reward can be read separately; :func:`first_failure` recovers the checker's single
verdict from them (the tests compare it with ``multi_turn_checker`` called directly).
``multi_turn_irrelevance_checker`` is called as it is.

BFCL's executor caches backend instances in its module's globals under
``{model_name}_{test_entry_id}_{class}_instance``; every call here uses a fresh random model name (a
fresh instance per trajectory, as BFCL's evaluation has) and deletes its instances afterwards.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import threading
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Optional

__all__ = [
    "BFCL_EVAL_VERSION",
    "CATEGORIES",
    "ERR_EMPTY_TURN",
    "ERR_STATE",
    "ERR_RESPONSE",
    "ERR_IRRELEVANCE",
    "ERR_FORCE_TERMINATED",
    "TurnCheck",
    "data_dir",
    "load_category",
    "function_docs",
    "category_of",
    "is_long_context",
    "method_names",
    "check_turns",
    "first_failure",
    "irrelevance_verdict",
    "official_verdict",
]

BFCL_EVAL_VERSION = "2026.3.23"
#: the multi-turn categories shipped with answers, as in the file names ``BFCL_v4_multi_turn_<c>.json``
CATEGORIES = ("base", "long_context", "miss_func", "miss_param")

# The checker's error types (multi_turn_checker.py, eval_runner.py).
ERR_EMPTY_TURN = "multi_turn:empty_turn_model_response"
ERR_STATE = "multi_turn:instance_state_mismatch"
ERR_RESPONSE = "multi_turn:execution_response_mismatch"
ERR_IRRELEVANCE = "multi_turn:irrelevance_error:decoder_success"
ERR_FORCE_TERMINATED = "multi_turn:force_terminated"

_LOCK = threading.Lock()  # the executor's instance cache and the backends' modules are shared state


def _package_root() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")  # locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"bfcl-eval=={BFCL_EVAL_VERSION} is not installed (pip install --no-deps bfcl-eval)")
    return Path(list(spec.submodule_search_locations)[0])


def data_dir() -> Path:
    """The installed package's ``bfcl_eval/data`` folder."""
    return _package_root() / "data"


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_category(category: str, root: Optional[Path] = None) -> list[tuple[dict, list[list[str]]]]:
    """``[(question entry, gold turns)]`` of one category, in file order (answers matched by id)."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown multi-turn category {category!r}; choose from {CATEGORIES}")
    root = Path(root) if root is not None else data_dir()
    questions = _read_jsonl(root / f"BFCL_v4_multi_turn_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(root / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")}
    return [(q, answers[q["id"]]) for q in questions if q["id"] in answers]


@cache
def _class_docs(class_name: str) -> tuple[str, ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(json.dumps(d, sort_keys=True) for d in _read_jsonl(path))


def function_docs(involved_classes: list[str]) -> list[dict]:
    """The function docs BFCL offers for these classes, in its order (``populate_test_cases_with_predefined_
    functions``: each class's doc file in ``involved_classes`` order)."""
    return [json.loads(d) for c in involved_classes for d in _class_docs(c)]


def category_of(entry_id: str) -> str:
    """BFCL's ``test_category``: the id without its index (``multi_turn_base_3`` -> ``multi_turn_base``)."""
    return str(entry_id).rsplit("_", 1)[0]


def is_long_context(entry_id: str) -> bool:
    """Whether BFCL loads the scenario with ``long_context=True`` (the checker's own rule)."""
    cat = category_of(entry_id)
    return "long_context" in cat or "composite" in cat


def _modules():
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils

    return multi_turn_checker, multi_turn_utils


@cache
def _class_methods(class_name: str) -> frozenset:
    import importlib
    import inspect

    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    return frozenset(n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_"))


def method_names(involved_classes: list[str]) -> frozenset:
    """The public method names of the backends: every name BFCL's executor routes to an instance."""
    out: set = set()
    for c in involved_classes:
        out |= _class_methods(c)
    return frozenset(out)


@dataclass
class TurnCheck:
    """The checker's verdicts on one turn (``None``: not checked, because the gold turn is empty)."""

    gold_empty: bool
    empty_response: bool = False  # the gold calls but the model made no call in this turn
    state: Optional[dict] = None  # state_checker's result
    response: Optional[dict] = None  # response_checker's result
    model_results: list = field(default_factory=list)  # execution results per step (strings)


class _Run:
    """One fresh set of backend instances per trajectory; deleted from BFCL's cache on exit."""

    def __init__(self):
        self.name = "mrtpo_" + uuid.uuid4().hex

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _, utils = _modules()
        g = vars(utils)
        for k in [k for k in list(g) if k.startswith(self.name)]:
            del g[k]
        return False


def _execute(calls: list[str], entry: dict, model_name: str) -> tuple[list[str], dict]:
    _, utils = _modules()
    return utils.execute_multi_turn_func_call(
        func_call_list=calls,
        initial_config=entry["initial_config"],
        involved_classes=entry["involved_classes"],
        model_name=model_name,
        test_entry_id=entry["id"],
        long_context=is_long_context(entry["id"]),
        is_evaL_run=True,
    )


def check_turns(decoded: list[list[list[str]]], gold: list[list[str]], entry: dict) -> list[TurnCheck]:
    """Every turn's verdicts, from BFCL's own executor and sub-checkers (module docstring).

    ``decoded``: per turn, per step, the call strings (as many turns as ``gold``); ``entry``: the question
    (``id``, ``initial_config``, ``involved_classes``). The calls must already be safe to hand to BFCL's
    ``eval`` (:func:`recipe.mrtpo.tasks.multi_turn.calls.executable_calls`).
    """
    if len(decoded) != len(gold):
        raise ValueError(f"{len(decoded)} model turns for {len(gold)} gold turns")
    checker, utils = _modules()
    out: list[TurnCheck] = []
    with _LOCK, _Run() as run:
        all_results: list[str] = []
        for steps, gold_calls in zip(decoded, gold):
            tc = TurnCheck(gold_empty=not gold_calls)
            turn_results: list[str] = []
            model_instances: dict = {}
            for step in steps:
                results, model_instances = _execute(list(step), entry, run.name)
                turn_results.extend(results)
                tc.model_results.append(results)
            gold_results, gold_instances = _execute(list(gold_calls), entry, run.name + "_ground_truth")
            all_results.extend(turn_results)
            if not tc.gold_empty:
                tc.empty_response = not steps or utils.is_empty_execute_response(steps)
                if not model_instances:  # no step ran: the instances as they stand (nothing executed)
                    _, model_instances = _execute([], entry, run.name)
                tc.state = checker.state_checker(model_instances, gold_instances)
                tc.response = checker.response_checker(list(all_results), gold_results, len(out))
            out.append(tc)
    return out


def first_failure(turns: list[TurnCheck]) -> dict:
    """``multi_turn_checker``'s verdict from the per-turn verdicts: the first failure in its order
    (per turn: empty turn, state, response), or ``{"valid": True}``."""
    for i, tc in enumerate(turns):
        if tc.gold_empty:
            continue
        if tc.empty_response:
            return {"valid": False, "error_type": ERR_EMPTY_TURN, "turn": i}
        if not tc.state["valid"]:
            return {"valid": False, "error_type": tc.state["error_type"], "turn": i}
        if not tc.response["valid"]:
            return {"valid": False, "error_type": tc.response["error_type"], "turn": i}
    return {"valid": True}


def irrelevance_verdict(decoded: list[list[list[str]]], gold: list[list[str]]) -> dict:
    """``multi_turn_irrelevance_checker`` as it is (no execution)."""
    checker, _ = _modules()
    return checker.multi_turn_irrelevance_checker(decoded, gold)


def official_verdict(decoded: list[list[list[str]]], gold: list[list[str]], entry: dict) -> dict:
    """``multi_turn_checker`` itself, on fresh instances (for comparisons; the verifier uses
    :func:`check_turns`). A turn-count mismatch is eval_runner's ``force_terminated`` verdict."""
    if len(decoded) != len(gold):
        return {"valid": False, "error_type": ERR_FORCE_TERMINATED}
    checker, _ = _modules()
    with _LOCK, _Run() as run:
        return checker.multi_turn_checker(copy.deepcopy(decoded), gold, entry, category_of(entry["id"]), run.name)
