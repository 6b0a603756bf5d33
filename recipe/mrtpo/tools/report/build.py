"""Results report: the paper's table, per-reward training curves and steps-to-threshold, from a runs folder.

Usage::

    python -m recipe.mrtpo.tools.report RUNS_DIR [--out DIR] [--threshold 0.8]
                                  [--metric TASK=KEY[:LABEL]] [--rewards REGEX]

writes into ``--out`` (default ``RUNS_DIR/report``):

- ``table.md``: one table per model, rows = methods (``base`` if present, then grpo, gdpo, cort,
  shuffle, mrtpo, then any other name), columns = evaluated task x its headline metric(s) (IFBench /
  IFEval prompt-level strict accuracy, Spider / BIRD execution accuracy, BFCL AST accuracy, ...).
  A cell is ``mean ± sample std (n=seeds)`` over seeds, or the value alone for a single seed; a
  metric whose values all lie in [0, 1] is shown x 100.
- ``curves__<model>__<task>.png``: every ``mrtpo/reward/<name>/mean`` training metric against the
  step, one panel per reward, one line per method (mean over seeds, band = +-1 sample std over the
  seeds logged at that step).
- ``threshold__<model>__<task>.png``: per reward and method, the first step at which a run's reward
  mean is ``>= --threshold`` (bar = mean over the seeds that reached it, dots = single seeds, ``k/n``
  when only k of n seeds reached it); a method whose runs never reach it is marked "not reached", never
  drawn as 0.
- ``summary.json``: every number behind the above, the runs found, and the warnings.

What is read (recursively; ``checkpoints/``, ``global_step_*/`` and the output folder are skipped):

- training logs: verl's console logger (``trainer.logger=[console,...]``): ``*.log``, ``*.out``,
  ``*.txt`` files with ``step:N - key:value - ...`` lines (Ray's ``(Actor pid=..)`` prefixes and ANSI
  colours are fine). A step line that does not parse completely (a truncated or interleaved line) is
  skipped and counted in a warning. verl's ``file`` logger (``trainer.logger=[console,file]``) writes
  JSON lines ``{"step": N, "data": {...}}`` to ``$VERL_FILE_LOGGER_PATH``, or by default
  ``$VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl`` (root: the working directory):
  copy or point it into the run's folder; ``*.jsonl`` files of that shape are read too.
- eval results: ``*.json`` files written by ``python -m recipe.mrtpo.tools.eval``
  (``{"task", "model", "n", "metrics": {...}, "config": {...}, "items": [...]}``); other JSON files
  are ignored.

Which run a file belongs to (model, training task, method, seed), first source that has the field:

1. ``run.json`` in the file's folder or any folder above it up to RUNS_DIR (the nearest wins), e.g.
   ``{"method": "mrtpo", "task": "ifbench", "seed": 0, "model": "Qwen2.5-1.5B-Instruct"}``;
2. a name ``<model>_<task>_<method>_seed<k>``: the file's own name (without suffix), then its folders
   from the nearest up (``task`` may contain underscores if it is a known task name such as
   ``instruction_following``);
3. single path components: a folder named exactly like a known method (``mrtpo``) or ``seed<k>``;
4. for eval files, ``"model"`` inside the JSON.

The eval JSON's own ``"task"`` is the evaluated benchmark (the table's column); ``run.json``'s ``task``
is the training task (it groups the plots). Method names are lower-cased. A file whose method cannot
be told is skipped with a warning. Files of the same (model, task, method, seed) are one run (e.g. a
resumed run's two logs; a later file's value wins for a step both have).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from recipe.mrtpo.tools.verl_log import parse_console_log, parse_file_logger

#: Row order of the paper's table; other methods follow alphabetically.
METHOD_ORDER = ("base", "grpo", "gdpo", "cort", "shuffle", "mrtpo")
METHOD_COLORS = {
    "base": "#7f7f7f",
    "grpo": "#8c564b",
    "gdpo": "#1f77b4",
    "cort": "#ff7f0e",
    "shuffle": "#9467bd",
    "mrtpo": "#d62728",
}
_EXTRA_COLORS = ("#2ca02c", "#17becf", "#bcbd22", "#e377c2", "#393b79", "#637939")

#: Column order and display names of the evaluated tasks; others follow alphabetically.
TASK_ORDER = ("ifbench", "ifeval", "instruction_following", "spider", "bird", "chinook", "text_to_sql",
              "bfcl", "tool_calling")
TASK_LABELS = {
    "ifbench": "IFBench",
    "ifeval": "IFEval",
    "instruction_following": "IF",
    "spider": "Spider",
    "bird": "BIRD",
    "chinook": "Chinook",
    "text_to_sql": "Text-to-SQL",
    "bfcl": "BFCL",
    "tool_calling": "Tool calling",
}
_PROMPT_STRICT = ("prompt-strict", ("prompt_level_strict_acc", "prompt_strict_acc", "prompt_level_strict",
                                    "prompt_strict", "prompt_level_strict_accuracy", "prompt_strict_accuracy"))
_EX = ("EX", ("execution_accuracy", "exec_accuracy", "exec_acc", "ex", "execution_match", "exec_match"))
_AST = ("AST acc", ("ast_accuracy", "ast_acc", "ast", "accuracy"))
#: task -> [(column label, candidate keys of the eval JSON's metrics, first match wins)].
HEADLINE_METRICS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "ifbench": [_PROMPT_STRICT],
    "ifeval": [_PROMPT_STRICT],
    "instruction_following": [_PROMPT_STRICT],
    "spider": [_EX],
    "bird": [_EX],
    "chinook": [_EX],
    "text_to_sql": [_EX],
    "bfcl": [_AST],
    "tool_calling": [_AST],
}

REWARD_METRIC = re.compile(r"^mrtpo/reward/(?P<name>.+)/mean$")
RUN_NAME = re.compile(
    r"^(?P<model>.+?)_(?P<task>" + "|".join(sorted(TASK_ORDER, key=len, reverse=True)) + r"|[^_]+)"
    r"_(?P<method>[^_]+)_seed(?P<seed>\d+)$"
)
_SEED_DIR = re.compile(r"^seed[_-]?(\d+)$")
_SKIP_DIRS = re.compile(r"^(checkpoints|global_step_\d+|__pycache__|\.git|node_modules|\..*)$")
LOG_SUFFIXES = (".log", ".out", ".txt")
UNKNOWN = "?"


# ----------------------------------------------------------------------------------------------- parsing


def first_reach(series: dict[int, float], threshold: float) -> Optional[int]:
    """The first step (in step order) whose value is ``>= threshold``; ``None`` if none is (NaN never is)."""
    for step in sorted(series):
        value = series[step]
        if value is not None and math.isfinite(value) and value >= threshold:
            return step
    return None


def reward_series(steps: dict[int, dict[str, float]]) -> dict[str, dict[int, float]]:
    """``{reward name: {step: value}}`` of every ``mrtpo/reward/<name>/mean`` metric."""
    out: dict[str, dict[int, float]] = {}
    for step, metrics in steps.items():
        for key, value in metrics.items():
            m = REWARD_METRIC.match(key)
            if m:
                out.setdefault(m.group("name"), {})[step] = value
    return out


def mean_spread(values: Iterable[float]) -> tuple[Optional[float], Optional[float], int]:
    """(mean, sample standard deviation (ddof 1; ``None`` for fewer than 2), n) of the finite values."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(vals)
    if not n:
        return None, None, 0
    mean = sum(vals) / n
    if n < 2:
        return mean, None, n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)), n


# ------------------------------------------------------------------------------------- run identification


def parse_run_name(name: str) -> dict:
    """``<model>_<task>_<method>_seed<k>`` -> ``{"model", "task", "method", "seed"}``; ``{}`` otherwise."""
    m = RUN_NAME.match(name)
    if not m:
        return {}
    return {"model": m["model"], "task": m["task"], "method": m["method"], "seed": int(m["seed"])}


def _norm_seed(seed):
    if isinstance(seed, str) and seed.strip().isdigit():
        return int(seed)
    return seed


def resolve_meta(path: Path, root: Path, warnings: list[str]) -> dict:
    """Model / task / method / seed of a file under ``root`` (the module docstring's rules 1-3)."""
    meta: dict = {}
    folders = [path.parent, *path.parent.parents]
    folders = folders[: folders.index(root) + 1] if root in folders else [path.parent]
    for folder in folders:  # 1. run.json, nearest first
        rj = folder / "run.json"
        if rj.is_file():
            try:
                data = json.loads(rj.read_text())
                if not isinstance(data, dict):
                    raise ValueError("not an object")
            except (ValueError, OSError) as e:
                msg = f"{rj}: unreadable run.json ({e}); ignored"
                if msg not in warnings:
                    warnings.append(msg)
                continue
            for k in ("model", "task", "method", "seed"):
                if data.get(k) is not None:
                    meta.setdefault(k, _norm_seed(data[k]) if k == "seed" else str(data[k]))
    for name in [path.stem] + [f.name for f in folders]:  # 2. <model>_<task>_<method>_seed<k>
        for k, v in parse_run_name(name).items():
            meta.setdefault(k, v)
    for name in [f.name for f in folders]:  # 3. single components
        if name in METHOD_ORDER:
            meta.setdefault("method", name)
        m = _SEED_DIR.match(name)
        if m:
            meta.setdefault("seed", int(m.group(1)))
    if "method" in meta:
        meta["method"] = meta["method"].lower()
    return meta


# ---------------------------------------------------------------------------------------------- discovery


@dataclass
class TrainRun:
    """One training run: its identity, the merged steps of its log files and how many lines were bad."""

    model: str
    task: str
    method: str
    seed: object  # int, or the run folder's relative path when no seed is known
    sources: list = field(default_factory=list)
    steps: dict = field(default_factory=dict)
    corrupt_lines: int = 0


@dataclass
class EvalResult:
    """One eval JSON, with the run it belongs to."""

    model: str
    train_task: str
    method: str
    seed: object
    eval_task: str
    metrics: dict  # flattened: "a/b" for nested dicts, numbers only
    headline: Optional[list]
    path: str


def _flatten(d: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def _walk(root: Path, skip: Optional[Path]) -> list[Path]:
    """Files under ``root``, following folder links once each, without :data:`_SKIP_DIRS` and ``skip``."""
    files, seen = [], {root.resolve()}
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir():
                real = entry.resolve()
                if _SKIP_DIRS.match(entry.name) or real == skip or real in seen:
                    continue
                seen.add(real)
                stack.append(entry)
            elif entry.is_file():
                files.append(entry)
    return sorted(files)


def _seed_or_path(meta: dict, path: Path, root: Path):
    if meta.get("seed") is not None:
        return meta["seed"]
    return str(path.parent.relative_to(root)) or "."


def discover(root: Path, skip: Optional[Path], warnings: list[str]) -> tuple[list[TrainRun], list[EvalResult]]:
    """Every training log and eval JSON under ``root`` (except under ``skip``), grouped into runs."""
    runs: dict[tuple, TrainRun] = {}
    evals: dict[tuple, EvalResult] = {}
    for path in _walk(root, skip):
        suffix = path.suffix.lower()
        rel = str(path.relative_to(root))
        if suffix in LOG_SUFFIXES or suffix == ".jsonl":
            try:
                text = path.read_text(errors="replace")
            except OSError as e:
                warnings.append(f"{rel}: unreadable ({e}); skipped")
                continue
            if suffix == ".jsonl":
                steps, corrupt, is_log = parse_file_logger(text)
                if not is_log:
                    continue  # some other JSON-lines file (e.g. rollout dumps)
            else:
                steps, corrupt = parse_console_log(text)
                if not steps and not corrupt:
                    continue
            meta = resolve_meta(path, root, warnings)
            if corrupt:
                warnings.append(f"{rel}: {corrupt} corrupt/truncated step line(s) skipped")
            if "method" not in meta:
                warnings.append(f"{rel}: training log of unknown method (no run.json, name not "
                                f"<model>_<task>_<method>_seed<k>); skipped")
                continue
            key = (meta.get("model", UNKNOWN), meta.get("task", UNKNOWN), meta["method"],
                   _seed_or_path(meta, path, root))
            run = runs.setdefault(key, TrainRun(*key))
            run.sources.append(rel)
            run.corrupt_lines += corrupt
            for step, metrics in steps.items():
                run.steps.setdefault(step, {}).update(metrics)
        elif suffix == ".json" and path.name != "run.json":
            try:
                data = json.loads(path.read_text(errors="replace"))
            except (ValueError, OSError) as e:
                warnings.append(f"{rel}: not valid JSON ({str(e)[:80]}); skipped")
                continue
            if not (isinstance(data, dict) and isinstance(data.get("metrics"), dict)):
                continue  # not an eval result
            if not isinstance(data.get("task"), str):
                warnings.append(f"{rel}: eval JSON without a \"task\"; skipped")
                continue
            meta = resolve_meta(path, root, warnings)
            if "method" not in meta:
                warnings.append(f"{rel}: eval result of unknown method (no run.json, name not "
                                f"<model>_<task>_<method>_seed<k>); skipped")
                continue
            model = meta.get("model") or (str(data["model"]) if data.get("model") else UNKNOWN)
            headline = data.get("headline")
            result = EvalResult(
                model=model, train_task=meta.get("task", UNKNOWN), method=meta["method"],
                seed=_seed_or_path(meta, path, root), eval_task=data["task"],
                metrics=_flatten(data["metrics"]),
                headline=[str(h) for h in headline] if isinstance(headline, list) else None, path=rel,
            )
            key = (result.model, result.method, result.eval_task, result.train_task, result.seed)
            if key in evals:
                warnings.append(f"{rel}: second eval of {result.eval_task} for the same run as "
                                f"{evals[key].path}; using {rel}")
            evals[key] = result
    return list(runs.values()), list(evals.values())


# ------------------------------------------------------------------------------------------------- table


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9/]+", "_", key.lower()).strip("_")


def headline_columns(task: str, results: list[EvalResult], overrides: dict, warnings: list[str]
                     ) -> list[tuple[str, str]]:
    """[(label, metric key)] for one evaluated task: ``--metric`` overrides, else the eval JSON's own
    ``"headline"`` list, else the first of :data:`HEADLINE_METRICS`' candidates present, else (with a
    warning) every top-level metric."""
    if task in overrides:
        return overrides[task]
    available: dict[str, str] = {}
    for r in results:
        for k in r.metrics:
            available.setdefault(k, k)
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


def _method_sort(methods: Iterable[str]) -> list[str]:
    methods = set(methods)
    return [m for m in METHOD_ORDER if m in methods] + sorted(methods - set(METHOD_ORDER))


def _task_sort(tasks: Iterable[str]) -> list[str]:
    tasks = set(tasks)
    return [t for t in TASK_ORDER if t in tasks] + sorted(tasks - set(TASK_ORDER))


def build_table(evals: list[EvalResult], overrides: dict, warnings: list[str]) -> list[dict]:
    """One entry per (model, method, eval task, headline metric): values over seeds, mean, std, n, and the
    display scale (100 when every value of that column lies in [0, 1])."""
    cells = []
    for task in _task_sort(r.eval_task for r in evals):
        results = [r for r in evals if r.eval_task == task]
        for label, key in headline_columns(task, results, overrides, warnings):
            column = [r.metrics[key] for r in results if key in r.metrics and math.isfinite(r.metrics[key])]
            scale = 100.0 if column and all(0.0 <= v <= 1.0 for v in column) else 1.0
            for model in sorted({r.model for r in results}):
                for method in _method_sort(r.method for r in results if r.model == model):
                    group = sorted((r for r in results if r.model == model and r.method == method
                                    and key in r.metrics), key=lambda r: str(r.seed))
                    if not group:
                        continue
                    mean, std, n = mean_spread(r.metrics[key] for r in group)
                    cells.append({
                        "model": model, "method": method, "task": task, "metric": key, "label": label,
                        "values": [r.metrics[key] for r in group], "seeds": [r.seed for r in group],
                        "train_tasks": sorted({r.train_task for r in group}),
                        "mean": mean, "std": std, "n": n, "scale": scale,
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
        for method in _method_sort(c["method"] for c in mine):
            row = [method]
            for task, key, _ in cols:
                c = next((c for c in mine if c["method"] == method and c["task"] == task
                          and c["metric"] == key), None)
                row.append(format_cell(c["mean"], c["std"], c["n"], c["scale"]) if c else "–")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines.append("Cells: mean ± sample standard deviation over seeds (n = seeds; a single seed shows its value). "
                 "Metrics whose values lie in [0, 1] are shown x 100.")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- plots


def _color(method: str, methods: list[str]) -> str:
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    extras = [m for m in methods if m not in METHOD_COLORS]
    return _EXTRA_COLORS[extras.index(method) % len(_EXTRA_COLORS)]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(text)).strip("-") or "x"


def curve_stats(runs: list[TrainRun], reward: str) -> dict:
    """Per step: mean, sample std (None under 2 seeds) and n over the runs that logged ``reward``."""
    per_run = [reward_series(r.steps).get(reward, {}) for r in runs]
    steps = sorted({s for series in per_run for s in series})
    out = {"steps": [], "mean": [], "std": [], "n": []}
    for s in steps:
        mean, std, n = mean_spread(series[s] for series in per_run if s in series)
        if n:
            out["steps"].append(s)
            out["mean"].append(mean)
            out["std"].append(std)
            out["n"].append(n)
    return out


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on savefig

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def plot_curves(curves: dict, title: str, threshold: float, path: Path) -> None:
    """One panel per reward (``curves[reward][method] = curve_stats``), one line per method."""
    rewards = sorted(curves)
    methods = _method_sort({m for r in rewards for m in curves[r]})
    ncols = min(4, len(rewards))
    nrows = math.ceil(len(rewards) / ncols)
    fig = _figure(3.6 * ncols + 0.4, 2.7 * nrows + 0.8)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, reward in zip(axes.flat, rewards):
        values = []
        for method in methods:
            st = curves[reward].get(method)
            if not st or not st["steps"]:
                continue
            color = _color(method, methods)
            ax.plot(st["steps"], st["mean"], color=color, lw=1.6, marker="o" if len(st["steps"]) < 30 else None,
                    ms=3, label=method)
            lo = [m - (s or 0.0) for m, s in zip(st["mean"], st["std"])]
            hi = [m + (s or 0.0) for m, s in zip(st["mean"], st["std"])]
            if any(s for s in st["std"]):
                ax.fill_between(st["steps"], lo, hi, color=color, alpha=0.18, lw=0)
            values += lo + hi
        ax.axhline(threshold, color="0.5", lw=0.8, ls="--")
        if values and all(-0.05 <= v <= 1.05 for v in values):
            ax.set_ylim(-0.03, 1.03)
        ax.set_title(reward, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("reward mean", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for ax in list(axes.flat)[len(rewards):]:
        ax.set_visible(False)
    by_label = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            by_label.setdefault(lab, h)
    handles = [by_label[m] for m in methods if m in by_label]
    fig.legend(handles, [m for m in methods if m in by_label], loc="outside lower center",
               ncols=len(handles) or 1, fontsize=9)
    fig.suptitle(f"{title}: per-reward training curves\n"
                 f"mean over seeds, band ±1 std over seeds; dashed: threshold {threshold:g}", fontsize=10)
    fig.savefig(path)


def plot_threshold(results: dict, title: str, threshold: float, path: Path) -> None:
    """Grouped bars: x = rewards, one bar per method (``results[reward][method]`` from
    :func:`threshold_results`); never-reached methods are labelled, not drawn as 0."""
    rewards = sorted(results)
    methods = _method_sort({m for r in rewards for m in results[r]})
    width = 0.8 / max(1, len(methods))
    fig = _figure(max(6.0, 1.2 + len(rewards) * (0.32 * len(methods) + 0.35)), 4.6)
    ax = fig.subplots()
    top = max([s for r in rewards for m in results[r].values() for s in m["per_run"].values() if s is not None]
              or [1])
    from matplotlib.patches import Patch

    for j, method in enumerate(methods):
        color = _color(method, methods)
        for i, reward in enumerate(rewards):
            res = results[reward].get(method)
            if not res:
                continue
            x = i + (j - (len(methods) - 1) / 2) * width
            if res["mean_step"] is None:
                ax.text(x, top * 0.02, "not reached", rotation=90, ha="center", va="bottom", fontsize=7,
                        color=color, fontweight="bold")
                continue
            ax.bar(x, res["mean_step"], width * 0.92, color=color, alpha=0.85)
            reached = [s for s in res["per_run"].values() if s is not None]
            ax.scatter([x] * len(reached), reached, s=9, color="black", zorder=3)
            if res["n_reached"] < res["n_runs"]:
                ax.text(x, res["mean_step"], f"{res['n_reached']}/{res['n_runs']}", ha="center", va="bottom",
                        fontsize=7)
    ax.legend(handles=[Patch(color=_color(m, methods), label=m) for m in methods], fontsize=8, loc="upper left",
              ncols=min(len(methods), 5))
    ax.set_xticks(range(len(rewards)))
    slanted = len(rewards) > 3
    ax.set_xticklabels(rewards, rotation=30 if slanted else 0, ha="right" if slanted else "center",
                       rotation_mode="anchor", fontsize=8)
    ax.set_xlim(-0.6, len(rewards) - 0.4)
    ax.set_ylim(0, top * 1.18 + 0.5)
    ax.set_ylabel(f"first step with reward mean ≥ {threshold:g}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"{title}: steps until each reward first reaches {threshold:g}\n"
                 f"bar: mean over the seeds that reached it; dots: single seeds; k/n: seeds that reached it",
                 fontsize=9)
    fig.savefig(path)


def threshold_results(runs: list[TrainRun], reward: str, threshold: float) -> dict:
    """For one method's runs: first step at or above ``threshold`` per run (``None``: never reached;
    runs that never logged ``reward`` are left out), mean over the runs that reached it."""
    per_run = {}
    for r in runs:
        series = reward_series(r.steps).get(reward)
        if series:
            per_run[str(r.seed)] = first_reach(series, threshold)
    reached = [s for s in per_run.values() if s is not None]
    return {
        "per_run": per_run,
        "n_runs": len(per_run),
        "n_reached": len(reached),
        "mean_step": (sum(reached) / len(reached)) if reached else None,
        "not_reached": sorted(k for k, s in per_run.items() if s is None),
    }


# -------------------------------------------------------------------------------------------------- main


def _finite(obj):
    """JSON-safe copy: non-finite floats -> None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def build_report(runs_dir, out=None, threshold: float = 0.8, metric_overrides: Optional[dict] = None,
                 reward_filter: Optional[str] = None) -> dict:
    """Read ``runs_dir``, write table.md, the PNGs and summary.json into ``out``; returns the summary."""
    root = Path(runs_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"runs folder {runs_dir!r} does not exist")
    out_dir = Path(out).resolve() if out else root / "report"
    warnings: list[str] = []
    runs, evals = discover(root, out_dir, warnings)
    if not runs and not evals:
        raise FileNotFoundError(f"no training logs (step:N lines / file-logger JSON lines) or eval JSONs "
                                f"under {root}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    cells = build_table(evals, metric_overrides or {}, warnings)
    (out_dir / "table.md").write_text(render_table(cells))
    written.append("table.md")

    pattern = re.compile(reward_filter) if reward_filter else None
    curves_out: dict = {}
    thresholds_out: dict = {}
    for model, task in sorted({(r.model, r.task) for r in runs}):
        group = [r for r in runs if (r.model, r.task) == (model, task)]
        rewards = sorted({k for r in group for k in reward_series(r.steps)
                          if pattern is None or pattern.search(k)})
        if not rewards:
            warnings.append(f"{model} / {task}: no mrtpo/reward/*/mean metrics in the training logs; no plots")
            continue
        methods = _method_sort(r.method for r in group)
        curves = {rw: {m: curve_stats([r for r in group if r.method == m], rw) for m in methods} for rw in rewards}
        curves = {rw: {m: st for m, st in by_m.items() if st["steps"]} for rw, by_m in curves.items()}
        reach = {rw: {m: threshold_results([r for r in group if r.method == m], rw, threshold) for m in methods}
                 for rw in rewards}
        reach = {rw: {m: res for m, res in by_m.items() if res["n_runs"]} for rw, by_m in reach.items()}
        title = f"{model} · {task}"
        name = f"{_slug(model)}__{_slug(task)}.png"
        plot_curves(curves, title, threshold, out_dir / f"curves__{name}")
        plot_threshold(reach, title, threshold, out_dir / f"threshold__{name}")
        written += [f"curves__{name}", f"threshold__{name}"]
        curves_out.setdefault(model, {})[task] = curves
        thresholds_out.setdefault(model, {})[task] = reach

    summary = {
        "runs_dir": str(root),
        "threshold": threshold,
        "runs": [{"model": r.model, "task": r.task, "method": r.method, "seed": r.seed, "sources": r.sources,
                  "steps": len(r.steps), "last_step": max(r.steps, default=None),
                  "corrupt_lines": r.corrupt_lines} for r in runs],
        "evals": [{"model": e.model, "method": e.method, "seed": e.seed, "train_task": e.train_task,
                   "eval_task": e.eval_task, "path": e.path} for e in evals],
        "table": cells,
        "curves": curves_out,
        "threshold_steps": thresholds_out,
        "corrupt_lines": sum(r.corrupt_lines for r in runs),
        "warnings": warnings,
        "files": written + ["summary.json"],
    }
    (out_dir / "summary.json").write_text(json.dumps(_finite(summary), indent=1, allow_nan=False))
    summary["out_dir"] = str(out_dir)
    return summary


def _parse_metric(spec: str) -> tuple[str, tuple[str, str]]:
    task, sep, rest = spec.partition("=")
    if not sep or not task or not rest:
        raise argparse.ArgumentTypeError(f"--metric wants TASK=KEY[:LABEL], got {spec!r}")
    key, _, label = rest.partition(":")
    return task, (label or key, key)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.mrtpo.tools.report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs_dir", help="folder with training logs and eval JSONs (searched recursively)")
    parser.add_argument("--out", help="output folder (default RUNS_DIR/report)")
    parser.add_argument("--threshold", type=float, default=0.8,
                        help="reward level for the steps-until-threshold chart (default 0.8)")
    parser.add_argument("--metric", action="append", type=_parse_metric, default=[], metavar="TASK=KEY[:LABEL]",
                        help="table column(s) for an eval task, replacing its default headline metric "
                             "(repeatable, e.g. --metric ifeval=instruction_strict_acc:inst-strict)")
    parser.add_argument("--rewards", metavar="REGEX", help="plot only rewards whose name matches REGEX")
    args = parser.parse_args(argv)
    overrides: dict = {}
    for task, col in args.metric:
        overrides.setdefault(task, []).append(col)
    try:
        summary = build_report(args.runs_dir, args.out, args.threshold, overrides, args.rewards)
    except (FileNotFoundError, re.error) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    for w in summary["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    print(Path(summary["out_dir"], "table.md").read_text())
    print(f"{len(summary['runs'])} training run(s), {len(summary['evals'])} eval result(s); wrote "
          f"{', '.join(summary['files'])} to {summary['out_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
