"""Per-response scores and benchmark metrics of the evaluation CLI (:mod:`recipe.mrtpo.tools.eval.harness`).

Everything is computed with the project's verifiers (:mod:`recipe.mrtpo.tasks`), with each benchmark's
official semantics. Tasks fall into three families (:data:`TASK_FAMILY`):

``if`` (IFEval, IFBench)
    Per response: every instruction checked *strict* (:func:`instruction_following.score`) and *loose*
    (:func:`instruction_following.score_loose`: the response, or it without its first and/or last
    line, with or without ``*``, passes). Metrics, as in IFEval's ``evaluation_main``:
    ``prompt_level_strict`` / ``prompt_level_loose`` = fraction of prompts whose instructions *all*
    pass; ``inst_level_strict`` / ``inst_level_loose`` = passed instructions / all instructions
    (micro average over instructions). ``by_instruction`` gives the instruction-level accuracies per
    instruction id. Loose is never below strict (the response itself is the first loose variant).

``sql`` (Spider, BIRD, Chinook)
    Per response: :func:`text_to_sql.score`'s ``format``, ``executable`` and ``execution_match``
    (test-suite-sql-eval's ``eval_exec_match``, in the ``--sql-mode`` chosen: ``keep_distinct`` or
    ``spider_default``). Metrics: ``execution_accuracy`` (mean ``execution_match``, Spider/BIRD's EX),
    ``format_rate``, ``executable_rate``; ``by_difficulty`` (BIRD's
    simple/moderate/challenging) and ``by_category`` where the rows carry them.

``tool`` (BFCL)
    Per response: ``ast_match`` = :func:`tool_calling.exact_match` (the recipe's full credit: every
    call BFCL-valid, order-free), ``bfcl_official_ast`` = BFCL's own ``ast_checker`` from the pinned
    bfcl-eval on the same decoded calls (rows built from BFCL; :mod:`bfcl_official`),
    ``ast_match_formatted`` (the same and the response format-valid), and the training rewards
    ``format`` and ``correctness`` of :func:`tool_calling.score`. Metrics: ``ast_accuracy``,
    ``ast_formatted_accuracy``, ``format_rate`` (mean ``format``), ``correctness_mean``,
    ``bfcl_official_ast_accuracy`` and ``n_official_differs`` (responses where the two verdicts differ),
    per category, and ``bfcl_official_summary`` (BFCL's non-live / live AST summaries);
    ``by_category`` and ``ast_accuracy_category_mean`` (unweighted mean over categories, as BFCL's
    leaderboard summaries average categories) where the rows carry a category.

``multi_turn`` (BFCL v4 multi-turn; :mod:`.multi_turn` plays each question through the agent loop)
    Per trajectory: the multi-turn task's rewards (:func:`recipe.mrtpo.tasks.multi_turn.verifier.score`
    on the loop's trajectory record, never on its text): ``state``, ``response``, ``format``, and
    ``irrelevance`` for questions with a turn that expects no call; ``bfcl_valid`` = BFCL's own verdict
    (``multi_turn_checker``: 1 exactly when state and response hold at every turn). Metrics:
    ``accuracy`` (mean ``bfcl_valid``, BFCL's multi-turn accuracy), ``state_rate``, ``response_rate``,
    ``format_rate``, ``irrelevance_rate`` (over the trajectories that have it), ``by_category`` (base,
    long_context, miss_func, miss_param), ``accuracy_category_mean`` (unweighted over the categories, as
    BFCL's "Multi Turn Overall Acc"), ``bfcl_error_types`` (BFCL's first failing check, counted) and
    ``loop_ends`` (how the loop ended: ``completed`` or the bound that acted, counted).

With several samples per prompt (``--n``), every sample counts as one response: metrics are means
over all samples (mean@n). Every metric is a finite float in [0, 1], or None when nothing was scored.

Public names: :data:`TASK_FAMILY`, :func:`family_of`, :func:`score_response`,
:func:`validate_ground_truth`, :func:`aggregate`.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Optional

from recipe.mrtpo.cluster.node_files import DATA_ROOT_ENV, resolve

__all__ = ["TASK_FAMILY", "FAMILY_DATA_SOURCES", "family_of", "score_response", "validate_ground_truth", "aggregate"]

#: evaluation task -> verifier family
TASK_FAMILY: dict[str, str] = {
    "ifeval": "if",
    "ifbench": "if",
    "spider": "sql",
    "bird": "sql",
    "chinook": "sql",
    "bfcl": "tool",
    "bfcl_multi_turn": "multi_turn",
}

#: family -> the data sources whose rows it can score (the verifiers registered for that family)
FAMILY_DATA_SOURCES: dict[str, tuple[str, ...]] = {
    "if": ("ifeval", "ifbench", "instruction_following"),
    "sql": ("spider", "bird", "chinook", "text_to_sql"),
    "tool": ("bfcl", "tool_calling"),
    "multi_turn": ("bfcl_multi_turn",),
}

_MAX_INFO_CHARS = 500


def family_of(task: str) -> str:
    """The verifier family (``if``, ``sql``, ``tool``) of an evaluation task; ValueError if unknown."""
    try:
        return TASK_FAMILY[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASK_FAMILY)}") from None


def _plain_info(info: Any) -> dict:
    """Verifier diagnostics as a small JSON-safe dict (strings cut to 500 characters)."""
    if not isinstance(info, dict):
        return {}
    out = {}
    for k, v in info.items():
        if v is None or v == {} or v == "":
            continue
        if isinstance(v, dict):
            out[str(k)] = {str(a): str(b)[:_MAX_INFO_CHARS] for a, b in v.items()}
        elif isinstance(v, (bool, int, float)):
            out[str(k)] = v
        else:
            out[str(k)] = str(v)[:_MAX_INFO_CHARS]
    return out


# --------------------------------------------------------------------------------------------------
# per-response scores
# --------------------------------------------------------------------------------------------------


def _score_if(response: str, ground_truth: Any, extra_info: Optional[dict], strip_reasoning: bool = False,
              **_) -> tuple[dict, dict]:
    from recipe.mrtpo.tasks import instruction_following as IF

    strict = IF.evaluate(response, ground_truth, extra_info, mode="strict", strip_reasoning=strip_reasoning)
    loose = IF.evaluate(response, ground_truth, extra_info, mode="loose", strip_reasoning=strip_reasoning)
    scores = {
        "prompt_strict": float(all(v == 1.0 for v in strict.scores.values())),
        "prompt_loose": float(all(v == 1.0 for v in loose.scores.values())),
        "strict": dict(strict.scores),
        "loose": dict(loose.scores),
    }
    errors = {**loose.info.get("errors", {}), **strict.info.get("errors", {})}
    return scores, _plain_info({"errors": errors})


def _score_sql(response: str, ground_truth: Any, extra_info: Optional[dict], sql_mode: Optional[str] = None,
               sql_timeout_s: Optional[float] = None, **_) -> tuple[dict, dict]:
    from recipe.mrtpo.tasks import text_to_sql as SQL

    override = {k: v for k, v in (("sql_mode", sql_mode), ("sql_timeout_s", sql_timeout_s)) if v is not None}
    if override:  # the evaluation's --sql-mode / --sql-timeout-s override the row's settings
        extra_info = {**(extra_info if isinstance(extra_info, dict) else {}), **override}
    result = SQL.score(response, ground_truth, extra_info)
    return dict(result.scores), _plain_info(result.info)


def _score_tool(response: str, ground_truth: Any, extra_info: Optional[dict], **_) -> tuple[dict, dict]:
    from recipe.mrtpo.tasks import tool_calling as TOOL

    result = TOOL.score(response, ground_truth, extra_info)
    scores = {
        "ast_match": float(TOOL.exact_match(response, ground_truth)),
        "ast_match_formatted": float(TOOL.exact_match(response, ground_truth, require_format=True)),
        **result.scores,
    }
    info = dict(result.info)
    official = _bfcl_official(response, ground_truth)
    if official is not None:
        scores["bfcl_official_ast"] = float(official[0])
        if official[1]:
            info["bfcl_official_error"] = official[1]
    return scores, _plain_info(info)


def _bfcl_official(response: str, ground_truth: Any) -> Optional[tuple[bool, str]]:
    """BFCL's own checker on the calls read from ``response``, for rows that carry the official data
    (``ground_truth["bfcl"]``) when the pinned bfcl-eval is installed; else None."""
    from recipe.mrtpo.tasks import tool_calling as TOOL
    from recipe.mrtpo.tools.eval import bfcl_official

    gt = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    raw = gt.get("bfcl") if isinstance(gt, dict) else None
    if not raw or not bfcl_official.available():
        return None
    off = json.loads(raw) if isinstance(raw, str) else raw
    return bfcl_official.official_ast_valid(off["function"], TOOL.extract_calls(response), off["ground_truth"],
                                            off["category"])


def _score_multi_turn(record: Any, ground_truth: Any, extra_info: Optional[dict], **_) -> tuple[dict, dict]:
    from recipe.mrtpo.tasks.multi_turn import verifier as MT

    result = MT.score(record, ground_truth, extra_info)
    info = dict(result.info)
    scores = {**result.scores, "bfcl_valid": float(bool(info.pop("bfcl_valid", False)))}
    return scores, _plain_info(info)


_SCORERS = {"if": _score_if, "sql": _score_sql, "tool": _score_tool, "multi_turn": _score_multi_turn}


def score_response(family: str, response: str, ground_truth: Any, extra_info: Optional[dict] = None, *,
                   strip_reasoning: bool = False, sql_mode: Optional[str] = None,
                   sql_timeout_s: Optional[float] = None) -> tuple[dict, dict]:
    """``(scores, info)`` of one response (module docstring). ``info`` holds the verifier's diagnostics.
    For family ``multi_turn`` the response is the trajectory record (its dict or JSON string).

    ``strip_reasoning`` (family ``if``): check the answer after the reasoning block (off: the response
    as generated, the official semantics). ``sql_mode`` (family ``sql``): ``keep_distinct`` or
    ``spider_default``, overriding the row's ``extra_info["sql_mode"]`` (None: the row's setting);
    ``sql_timeout_s`` likewise overrides ``extra_info["sql_timeout_s"]``.

    Never raises for any response; a malformed ground truth raises ValueError (a data bug).
    """
    if family not in _SCORERS:
        raise ValueError(f"unknown family {family!r}; choose from {sorted(_SCORERS)}")
    return _SCORERS[family](response, ground_truth, extra_info, strip_reasoning=strip_reasoning, sql_mode=sql_mode,
                            sql_timeout_s=sql_timeout_s)


def validate_ground_truth(family: str, ground_truth: Any, extra_info: Optional[dict] = None) -> None:
    """Raise ValueError if a row cannot be scored (checked before any generation).

    Scores an empty response (which runs no SQL), and for text-to-SQL also checks that the database
    file exists (resolved against ``$MRTPO_DATA_ROOT``; a database outside it is stored absolute).
    """
    if family == "multi_turn":  # the verifier's and the agent loop's readings of the row (no checker run)
        from recipe.mrtpo.agent.bfcl_env import parse_entry
        from recipe.mrtpo.tasks.multi_turn.verifier import question_from_row

        question_from_row(ground_truth, extra_info)
        parse_entry(extra_info)
        return
    if family == "sql":
        gt = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
        db_path = resolve(gt["db_path"]) if isinstance(gt, dict) and isinstance(gt.get("db_path"), str) else None
        if db_path is not None and not os.path.isfile(db_path):
            raise ValueError(f"database file not found: {db_path} (data moved, or {DATA_ROOT_ENV} not the data "
                             "root? rebuild it with data_prep)")
    score_response(family, "", ground_truth, extra_info)


# --------------------------------------------------------------------------------------------------
# aggregation
# --------------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> Optional[float]:
    return float(sum(values) / len(values)) if values else None


def _base_key(reward_key: str) -> str:
    """The instruction id of a reward key (``"punctuation:no_comma#2"`` -> ``"punctuation:no_comma"``)."""
    return reward_key.split("#", 1)[0]


def _aggregate_if(samples: list[dict]) -> dict:
    strict_all, loose_all = [], []
    per_inst: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"strict": [], "loose": []})
    n_errors = 0
    for s in samples:
        sc = s["scores"]
        for key, v in sc["strict"].items():
            strict_all.append(v)
            per_inst[_base_key(key)]["strict"].append(v)
        for key, v in sc["loose"].items():
            loose_all.append(v)
            per_inst[_base_key(key)]["loose"].append(v)
        n_errors += len((s.get("info") or {}).get("errors", {}))
    return {
        "prompt_level_strict": _mean([s["scores"]["prompt_strict"] for s in samples]),
        "inst_level_strict": _mean(strict_all),
        "prompt_level_loose": _mean([s["scores"]["prompt_loose"] for s in samples]),
        "inst_level_loose": _mean(loose_all),
        "n_instructions": len(strict_all),
        "n_checker_errors": n_errors,
        "by_instruction": {
            iid: {"n": len(v["strict"]), "strict": _mean(v["strict"]), "loose": _mean(v["loose"])}
            for iid, v in sorted(per_inst.items())
        },
    }


def _sql_core(samples: list[dict]) -> dict:
    return {
        "execution_accuracy": _mean([s["scores"]["execution_match"] for s in samples]),
        "format_rate": _mean([s["scores"]["format"] for s in samples]),
        "executable_rate": _mean([s["scores"]["executable"] for s in samples]),
    }


def _tool_core(samples: list[dict]) -> dict:
    out = {
        "ast_accuracy": _mean([s["scores"]["ast_match"] for s in samples]),
        "ast_formatted_accuracy": _mean([s["scores"]["ast_match_formatted"] for s in samples]),
        "format_rate": _mean([s["scores"]["format"] for s in samples]),
        "correctness_mean": _mean([s["scores"]["correctness"] for s in samples]),
    }
    official = [s for s in samples if "bfcl_official_ast" in s["scores"]]
    if official:  # BFCL's own checker next to the recipe's full credit, and where they differ
        out["bfcl_official_ast_accuracy"] = _mean([s["scores"]["bfcl_official_ast"] for s in official])
        out["n_official_differs"] = sum(s["scores"]["bfcl_official_ast"] != s["scores"]["ast_match"] for s in official)
    return out


def _breakdown(samples: list[dict], field: str, core) -> dict:
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        value = s.get(field)
        if isinstance(value, str) and value:
            groups[value].append(s)
    return {g: {"n": len(members), **core(members)} for g, members in sorted(groups.items())}


def _aggregate_sql(samples: list[dict]) -> dict:
    out = _sql_core(samples)
    for field in ("difficulty", "category"):
        groups = _breakdown(samples, field, _sql_core)
        if groups:
            out[f"by_{field}"] = groups
    out["n_gold_errors"] = sum(1 for s in samples if "errors" in (s.get("info") or {}))
    return out


def _aggregate_tool(samples: list[dict]) -> dict:
    out = _tool_core(samples)
    groups = _breakdown(samples, "category", _tool_core)
    if groups:
        out["by_category"] = groups
        out["ast_accuracy_category_mean"] = _mean([g["ast_accuracy"] for g in groups.values()])
        if any("bfcl_official_ast_accuracy" in g for g in groups.values()):
            from recipe.mrtpo.tools.eval.bfcl_official import summary_scores

            per = {c: {"n": g["n"], "accuracy": g.get("bfcl_official_ast_accuracy")} for c, g in groups.items()}
            out["bfcl_official_summary"] = summary_scores(per)
    return out


def _multi_turn_core(samples: list[dict]) -> dict:
    with_irr = [s["scores"]["irrelevance"] for s in samples if "irrelevance" in s["scores"]]
    return {
        "accuracy": _mean([s["scores"]["bfcl_valid"] for s in samples]),
        "state_rate": _mean([s["scores"]["state"] for s in samples]),
        "response_rate": _mean([s["scores"]["response"] for s in samples]),
        "format_rate": _mean([s["scores"]["format"] for s in samples]),
        "irrelevance_rate": _mean(with_irr),
        "n_irrelevance": len(with_irr),
    }


def _counts(values: Iterable[Any]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for v in values:
        out[str(v)] += 1
    return dict(sorted(out.items()))


def _aggregate_multi_turn(samples: list[dict]) -> dict:
    out = _multi_turn_core(samples)
    groups = _breakdown(samples, "category", _multi_turn_core)
    if groups:
        out["by_category"] = groups
        out["accuracy_category_mean"] = _mean([g["accuracy"] for g in groups.values()])
    out["bfcl_error_types"] = _counts((s.get("info") or {}).get("bfcl_error_type") or "none" for s in samples)
    out["loop_ends"] = _counts((s.get("loop") or {}).get("end", "unknown") for s in samples)
    return out


_AGGREGATORS = {"if": _aggregate_if, "sql": _aggregate_sql, "tool": _aggregate_tool,
                "multi_turn": _aggregate_multi_turn}


def aggregate(family: str, samples: Iterable[dict]) -> dict:
    """Benchmark metrics over scored responses.

    ``samples``: one dict per response, ``{"scores": <score_response's scores>, "info": {...}}``,
    optionally with ``"category"`` / ``"difficulty"`` strings for the breakdowns. Returns
    ``{"n_responses": int, <metric>: float | None, ...}`` (module docstring).
    """
    if family not in _AGGREGATORS:
        raise ValueError(f"unknown family {family!r}; choose from {sorted(_AGGREGATORS)}")
    samples = list(samples)
    return {"n_responses": len(samples), **_AGGREGATORS[family](samples)}
