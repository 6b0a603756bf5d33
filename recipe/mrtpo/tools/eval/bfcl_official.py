"""BFCL's own AST checker, loaded from the pinned ``bfcl-eval`` package without its heavy imports.

``bfcl-eval==2026.3.23`` (Apache-2.0) is installed with ``--no-deps``: its dependencies pin numpy 1.26
and a dozen model-API clients, and importing ``bfcl_eval.eval_checker.ast_eval.ast_checker`` the
normal way pulls them in through ``bfcl_eval.constants.model_config`` (every model handler). This
module therefore executes the checker's own source file, ``bfcl_eval/eval_checker/ast_eval/
ast_checker.py``, unchanged, with the modules it imports provided as follows: ``constants/enums.py``,
``constants/type_mappings.py`` and the Java/JavaScript type converters are the package's own files
(plain Python); ``constants.model_config.MODEL_CONFIG_MAPPING`` is replaced by a stub whose every
model has ``underscore_to_dot = False`` (the checker consults it only to rewrite ``.`` in function
names for APIs that cannot carry dots; this recipe's prompts show the names as they are). The
stand-in modules live in ``sys.modules`` only while the file executes and are removed afterwards, so
a real ``import bfcl_eval`` elsewhere is unaffected. Nothing is re-implemented: the verdicts are the
package's.

:func:`official_ast_valid` applies the checker as BFCL's ``ast_file_runner`` does after decoding: the
decoded output must be a list of one-key dicts (``is_function_calling_format_output``), then
``ast_checker(functions, output, possible_answer, Language.PYTHON, category, model)``. The decoded
output is the recipe's lenient reading of the response (``tool_calling.extract_calls``), written in
BFCL's ``[{name: arguments}]`` form; ``docs/benchmarks.md`` says how that reading relates to BFCL's
own model handlers.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any, Optional

__all__ = ["BFCL_EVAL_VERSION", "available", "load_checker", "official_ast_valid", "summary_scores"]

BFCL_EVAL_VERSION = "2026.3.23"
_MODEL_NAME = "mrtpo-recipe"
_LOCK = threading.Lock()
_CACHE: dict[str, Any] = {}


class _Config:
    underscore_to_dot = False


class _AnyModel(dict):
    def __missing__(self, key):
        return _Config()


def _package_root() -> Optional[Path]:
    spec = importlib.util.find_spec("bfcl_eval")  # locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def available() -> bool:
    """Whether the pinned ``bfcl-eval`` package is installed (its checker file is present)."""
    root = _package_root()
    return root is not None and (root / "eval_checker" / "ast_eval" / "ast_checker.py").is_file()


def _exec_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_checker() -> types.ModuleType:
    """The executed ``ast_checker.py`` module (cached). ImportError when bfcl-eval is not installed."""
    with _LOCK:
        if "checker" in _CACHE:
            return _CACHE["checker"]
        root = _package_root()
        if root is None or not available():
            raise ImportError(f"bfcl-eval=={BFCL_EVAL_VERSION} is not installed (pip install --no-deps bfcl-eval)")
        packages = ["bfcl_eval", "bfcl_eval.constants", "bfcl_eval.eval_checker",
                    "bfcl_eval.eval_checker.ast_eval", "bfcl_eval.eval_checker.ast_eval.type_convertor"]
        files = [
            ("bfcl_eval.constants.enums", root / "constants" / "enums.py"),
            ("bfcl_eval.constants.type_mappings", root / "constants" / "type_mappings.py"),
            ("bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter",
             root / "eval_checker" / "ast_eval" / "type_convertor" / "java_type_converter.py"),
            ("bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter",
             root / "eval_checker" / "ast_eval" / "type_convertor" / "js_type_converter.py"),
        ]
        touched = packages + [n for n, _ in files] + ["bfcl_eval.constants.model_config",
                                                      "bfcl_eval.eval_checker.ast_eval.ast_checker"]
        saved = {n: sys.modules[n] for n in touched if n in sys.modules}
        try:
            for n in packages:
                if n not in sys.modules:
                    pkg = types.ModuleType(n)
                    pkg.__path__ = []
                    sys.modules[n] = pkg
            stub = types.ModuleType("bfcl_eval.constants.model_config")
            stub.MODEL_CONFIG_MAPPING = _AnyModel()
            sys.modules["bfcl_eval.constants.model_config"] = stub
            for n, path in files:
                _exec_file(n, path)
            checker = _exec_file("bfcl_eval.eval_checker.ast_eval.ast_checker",
                                 root / "eval_checker" / "ast_eval" / "ast_checker.py")
            language = sys.modules["bfcl_eval.constants.enums"].Language
        finally:
            for n in touched:
                if n in saved:
                    sys.modules[n] = saved[n]
                else:
                    sys.modules.pop(n, None)
        checker.PYTHON = language.PYTHON
        _CACHE["checker"] = checker
        return checker


def _format_ok(decoded: Any) -> bool:
    """BFCL's ``is_function_calling_format_output``: a list of one-key dicts."""
    return type(decoded) is list and all(type(i) is dict and len(i) == 1 for i in decoded)


def official_ast_valid(functions: list, calls: list[dict], possible_answer: list, category: str) -> tuple[bool, str]:
    """BFCL's verdict on decoded calls: ``(valid, error_type)`` (``""`` when valid).

    ``functions``: the row's BFCL function docs as in the BFCL data (Python-style types);
    ``calls``: ``[{"name", "arguments"}]``; ``possible_answer``: the row's BFCL ``ground_truth``;
    ``category``: the BFCL test category (``simple_python``, ``multiple``, ``live_parallel``...).
    An exception inside the checker (malformed data) is reported as invalid, ``checker_exception``.
    """
    checker = load_checker()
    decoded = [{c["name"]: copy.deepcopy(c["arguments"])} for c in calls]
    if not _format_ok(decoded):
        return False, "ast_decoder:decoder_wrong_output_format"
    try:
        result = checker.ast_checker(copy.deepcopy(functions), decoded, copy.deepcopy(possible_answer),
                                     checker.PYTHON, category, _MODEL_NAME)
    except Exception as e:  # noqa: BLE001 - the official code on hostile output: count, never crash
        return False, f"checker_exception:{type(e).__name__}"
    return bool(result.get("valid")), "" if result.get("valid") else str(result.get("error_type", ""))


_NON_LIVE = ("simple_python", "multiple", "parallel", "parallel_multiple")
_LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")


def summary_scores(per_category: dict[str, dict]) -> dict[str, Optional[float]]:
    """BFCL's AST summaries from per-category ``{"n", "accuracy"}``, as its leaderboard computes them:
    non-live = unweighted mean of simple, multiple, parallel, parallel_multiple (simple here is
    ``simple_python`` alone: the Java/JavaScript categories are not built); live = mean over the
    live entries (weighted by category size). None when a summary's categories are all absent."""
    non_live = [per_category[c]["accuracy"] for c in _NON_LIVE
                if c in per_category and per_category[c].get("accuracy") is not None]
    live = [(per_category[c]["n"], per_category[c]["accuracy"]) for c in _LIVE
            if c in per_category and per_category[c].get("accuracy") is not None]
    n_live = sum(n for n, _ in live)
    return {
        "summary_ast_non_live": sum(non_live) / len(non_live) if non_live else None,
        "summary_ast_live": sum(n * a for n, a in live) / n_live if n_live else None,
    }
