"""The results table: per model, methods x (evaluated task, headline metric), mean ± spread over seeds."""

from __future__ import annotations

import difflib
import math
import re
from typing import Optional

from recipe.mrtpo.tools.report.discovery import EvalResult
from recipe.mrtpo.tools.report.names import TASK_LABELS, method_sort, task_sort
from recipe.mrtpo.tools.report.series import mean_spread

_PROMPT_STRICT = ("prompt-strict", ("prompt_level_strict_acc", "prompt_strict_acc", "prompt_level_strict",
                                    "prompt_strict", "prompt_level_strict_accuracy", "prompt_strict_accuracy"))
_EX = ("EX", ("execution_accuracy", "exec_accuracy", "exec_acc", "ex", "execution_match", "exec_match"))
_AST = ("AST acc", ("ast_accuracy", "ast_acc", "ast", "accuracy"))
#: BFCL's own checker first (the headline), the recipe's reward-side AST match beside it
_BFCL = [("AST (BFCL checker)", ("bfcl_official_ast_accuracy",)), ("AST (recipe)", _AST[1])]
#: BFCL multi-turn (tools.eval --task bfcl_multi_turn): BFCL's verdict overall, per category, then the task's per-reward
#: rates beside it (the rewards' names: state, response, format, irrelevance)
_MULTI_TURN = [("acc (BFCL checker)", ("accuracy",)),
               *((c, (f"by_category/{c}/accuracy",)) for c in ("base", "long_context", "miss_func", "miss_param")),
               *((r, (f"{r}_rate",)) for r in ("state", "response", "format", "irrelevance"))]
#: task -> [(column label, candidate keys of the eval JSON's metrics, first match wins)].
HEADLINE_METRICS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "ifbench": [_PROMPT_STRICT],
    "ifeval": [_PROMPT_STRICT],
    "instruction_following": [_PROMPT_STRICT],
    "spider": [_EX],
    "bird": [_EX],
    "chinook": [_EX],
    "text_to_sql": [_EX],
    "bfcl": _BFCL,
    "tool_calling": _BFCL,
    "bfcl_multi_turn": _MULTI_TURN,
}


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9/]+", "_", key.lower()).strip("_")


def headline_columns(task: str, results: list[EvalResult], overrides: dict, warnings: list[str]
                     ) -> list[tuple[str, str]]:
    """[(label, metric key)] for one evaluated task: ``--metric`` overrides, else the eval JSON's own
    ``"headline"`` list, else the first of :data:`HEADLINE_METRICS`' candidates present, else (with a
    warning) every top-level metric."""
    available: dict[str, str] = {}
    for r in results:
        for k in r.metrics:
            available.setdefault(k, k)
    if task in overrides:
        for _label, key in overrides[task]:
            if key not in available:
                close = difflib.get_close_matches(key, list(available), n=3)
                warnings.append(f"--metric {task}={key}: no {task} result has metric {key!r}; column left out"
                                + (f" (did you mean {', '.join(close)}?)" if close else
                                   f" (metrics: {', '.join(sorted(k for k in available if '/' not in k))})"))
        return [(label, key) for label, key in overrides[task] if key in available]
    declared = next((r.headline for r in results if r.headline), None)
    if declared:
        return [(k, k) for k in declared if k in available]
    cols = []
    by_norm = {}
    for k in available:
        by_norm.setdefault(_norm_key(k), k)
        by_norm.setdefault(_norm_key(k).rsplit("/", 1)[-1], k)
    for label, candidates in HEADLINE_METRICS.get(task, []):
        hit = next((by_norm[c] for c in candidates if c in by_norm), None)
        if hit:
            cols.append((label, hit))
    if not cols:
        cols = [(k, k) for k in sorted(available) if "/" not in k]
        warnings.append(f"eval task {task!r}: no known headline metric among {sorted(available)[:12]}; "
                        f"showing top-level metrics (choose with --metric {task}=KEY[:LABEL])")
    return cols


def build_table(evals: list[EvalResult], overrides: dict, warnings: list[str],
                marks: Optional[dict] = None) -> list[dict]:
    """One entry per (model, method, eval task, headline metric): values over seeds, mean, std, n, and the
    display scale (100 when every value of that column lies in [0, 1]). ``marks``: (model, training task,
    method) -> (mark, sentence) of self-teacher runs without privileged information
    (:func:`recipe.mrtpo.tools.report.privileged.group_marks`); a cell all of whose training tasks have
    the same mark carries it (``no_privileged``)."""
    marks = marks or {}
    cells = []
    for task in task_sort(r.eval_task for r in evals):
        results = [r for r in evals if r.eval_task == task]
        for label, key in headline_columns(task, results, overrides, warnings):
            column = [r.metrics[key] for r in results if key in r.metrics and math.isfinite(r.metrics[key])]
            scale = 100.0 if column and all(0.0 <= v <= 1.0 for v in column) else 1.0
            for model in sorted({r.model for r in results}):
                for method in method_sort(r.method for r in results if r.model == model):
                    group = sorted((r for r in results if r.model == model and r.method == method
                                    and key in r.metrics), key=lambda r: str(r.seed))
                    if not group:
                        continue
                    mean, std, n = mean_spread(r.metrics[key] for r in group)
                    tasks = sorted({r.train_task for r in group})
                    got = {marks.get((model, t, method)) for t in tasks}
                    cells.append({
                        "model": model, "method": method, "task": task, "metric": key, "label": label,
                        "values": [r.metrics[key] for r in group], "seeds": [r.seed for r in group],
                        "train_tasks": sorted({r.train_task for r in group}),
                        "subsets": sorted({r.subset for r in group if r.subset}),
                        "mean": mean, "std": std, "n": n, "scale": scale,
                        "no_privileged": list(next(iter(got))) if len(got) == 1 and None not in got else None,
                    })
    return cells


def format_cell(mean: Optional[float], std: Optional[float], n: int, scale: float) -> str:
    """``62.1 ± 0.8 (n=3)``; the value alone for one seed; ``–`` for none. x ``scale``; 1 decimal when
    scaled to percent, else 4 significant digits."""
    if mean is None or n == 0:
        return "–"
    fmt = (lambda v: f"{v * scale:.1f}") if scale != 1.0 else (lambda v: f"{v:.4g}")
    if n < 2 or std is None:
        return fmt(mean)
    return f"{fmt(mean)} ± {fmt(std)} (n={n})"


def render_table(cells: list[dict]) -> str:
    """Markdown: one section per model, rows = methods, columns = (task, metric)."""
    if not cells:
        return "# Results\n\nNo eval results found (eval JSONs of `python -m recipe.mrtpo.tools.eval`).\n"
    lines = ["# Results", ""]
    subsets = False
    notes: dict[str, tuple[str, str]] = {}  # method -> (mark, sentence) of its marked cells
    models = sorted({c["model"] for c in cells})
    columns = []
    for c in cells:
        col = (c["task"], c["metric"], c["label"])
        if col not in columns:
            columns.append(col)
    for model in models:
        mine = [c for c in cells if c["model"] == model]
        cols = [col for col in columns if any((c["task"], c["metric"]) == col[:2] for c in mine)]
        lines += [f"## {model}", ""]
        header = ["method"] + [f"{TASK_LABELS.get(t, t)} {label}" for t, _, label in cols]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("| --- |" + " ---: |" * len(cols))
        for method in method_sort(c["method"] for c in mine):
            row = [method]
            for task, key, _ in cols:
                c = next((c for c in mine if c["method"] == method and c["task"] == task
                          and c["metric"] == key), None)
                text = format_cell(c["mean"], c["std"], c["n"], c["scale"]) if c else "–"
                if c and c.get("subsets"):
                    text += " [subset " + ", ".join(c["subsets"]) + "]"
                    subsets = True
                if c and c.get("no_privileged"):
                    mark, sentence = c["no_privileged"]
                    text += f" [{mark}]"
                    notes.setdefault(method, (mark, sentence))
                row.append(text)
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines.append("Cells: mean ± sample standard deviation over seeds (n = seeds; a single seed shows its value). "
                 "Metrics whose values lie in [0, 1] are shown x 100.")
    if subsets:
        lines.append("[subset k/N]: scored on the first k of the N items of the evaluation file (`tools.eval "
                     "--limit`), not on the whole benchmark.")
    for method, (mark, sentence) in notes.items():
        lines.append(f"[{mark}] ({method}): the run logged mrtpo/rows_privileged = 0 on every step: no row's teacher "
                     f"prompt differed from its rollout prompt (every Z_k already in the prompt), so {sentence}.")
    return "\n".join(lines) + "\n"
