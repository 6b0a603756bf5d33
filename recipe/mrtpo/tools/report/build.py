"""Results report: the paper's table, per-reward training curves and steps-to-threshold, from a runs folder.

Usage::

    python -m recipe.mrtpo.tools.report RUNS_DIR [--out-dir DIR] [--threshold 0.8]
                                  [--metric TASK=KEY[:LABEL]] [--rewards REGEX]

writes into ``--out-dir`` (default ``RUNS_DIR/report``):

- ``table.md``: one table per model, rows = methods (``base`` if present, then grpo, gdpo, cort,
  shuffle, mrtpo, then any other name), columns = evaluated task x its headline metric(s) (IFBench /
  IFEval prompt-level strict accuracy, Spider / BIRD execution accuracy, BFCL AST accuracy, ...).
  A cell is ``mean ± sample std (n=seeds)`` over seeds, or the value alone for a single seed; a
  metric whose values all lie in [0, 1] is shown x 100. A self-teacher (OPSD, RLSD) whose training runs
  logged ``mrtpo/rows_privileged`` = 0 on every step had no privileged information: its cells carry the
  method's mark (RLSD with the live teacher: ``[= GDPO here]``) with the reason below the table
  (:mod:`recipe.mrtpo.tools.report.privileged`).
- ``curves__<model>__<task>.png``: every ``mrtpo/reward/<name>/mean`` training metric against the
  step, one panel per reward, one line per method (mean over seeds, band = +-1 sample std over the
  seeds logged at that step).
- ``threshold__<model>__<task>.png``: per reward and method, the first step at which a run's reward
  mean is ``>= --threshold`` (bar = mean over the seeds that reached it, dots = single seeds, ``k/n``
  when only k of n seeds reached it); a method whose runs never reach it is marked "not reached", never
  drawn as 0.
- ``summary.json``: every number behind the above, the runs found, and the warnings.

Which files are read and which run each belongs to: :mod:`recipe.mrtpo.tools.report.discovery`. The other
modules: ``series`` (numbers per step and over seeds), ``table`` (the markdown table), ``plots`` (the PNGs),
``privileged`` (self-teacher runs without privileged information);
this one assembles them and is the command line.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Optional

from recipe.mrtpo.tools.report.discovery import discover
from recipe.mrtpo.tools.report.names import method_sort
from recipe.mrtpo.tools.report.plots import plot_curves, plot_threshold
from recipe.mrtpo.tools.report.privileged import group_marks
from recipe.mrtpo.tools.report.series import (
    curve_stats,
    reward_series,
    threshold_results,
)
from recipe.mrtpo.tools.report.table import build_table, render_table

__all__ = ["build_report", "main"]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(text)).strip("-") or "x"


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
        raise FileNotFoundError("\n".join([f"no training logs (verl console step lines, file-logger JSON lines, "
                                            f"wandb runs) or eval JSONs under {root}", *warnings]))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    marks = group_marks(runs)  # self-teacher runs without privileged information
    cells = build_table(evals, metric_overrides or {}, warnings, marks)
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
        methods = method_sort(r.method for r in group)
        curves = {rw: {m: curve_stats([r for r in group if r.method == m], rw) for m in methods} for rw in rewards}
        curves = {rw: {m: st for m, st in by_m.items() if st["steps"]} for rw, by_m in curves.items()}
        reach = {rw: {m: threshold_results([r for r in group if r.method == m], rw, threshold) for m in methods}
                 for rw in rewards}
        reach = {rw: {m: res for m, res in by_m.items() if res["n_runs"]} for rw, by_m in reach.items()}
        title = f"{model} · {task}"
        name = f"{_slug(model)}__{_slug(task)}.png"
        for plot, data, prefix in ((plot_curves, curves, "curves"), (plot_threshold, reach, "threshold")):
            written += [p.name for p in plot(data, title, threshold, out_dir / f"{prefix}__{name}")]
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
        "no_privileged": [{"model": k[0], "task": k[1], "method": k[2], "mark": v[0], "why": v[1]}
                          for k, v in sorted(marks.items())],
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


_EPILOG = """examples:
  python -m recipe.mrtpo.tools.report outputs/quickstart/runs           # the CPU quickstart's runs
  python -m recipe.mrtpo.tools.report runs/ --threshold 0.9 --rewards 'format|correctness'
  python -m recipe.mrtpo.tools.report runs/ --metric ifeval=inst_level_strict:inst-strict --metric ifeval=prompt_level_strict

RUNS_DIR may hold run-script folders (<model>_<task>_<method>[_seed<k>]/ with a console log and eval/ JSONs),
verl file-logger files (<project>/<experiment>.jsonl) and wandb run folders (wandb/offline-run-*/)."""


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.mrtpo.tools.report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG)
    parser.add_argument("runs_dir", help="folder with training logs and eval JSONs (searched recursively)")
    parser.add_argument("--out-dir", help="output folder (default RUNS_DIR/report)")
    parser.add_argument("--threshold", type=float, default=0.8,
                        help="reward level for the steps-until-threshold chart (default 0.8)")
    parser.add_argument("--metric", action="append", type=_parse_metric, default=[], metavar="TASK=KEY[:LABEL]",
                        help="table column(s) for an eval task, replacing its default headline metric "
                             "(repeatable, e.g. --metric ifeval=inst_level_strict:inst-strict; a nested metric as a/b/c)")
    parser.add_argument("--rewards", metavar="REGEX", help="plot only rewards whose name matches REGEX")
    args = parser.parse_args(argv)
    overrides: dict = {}
    for task, col in args.metric:
        overrides.setdefault(task, []).append(col)
    try:
        summary = build_report(args.runs_dir, args.out_dir, args.threshold, overrides, args.rewards)
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
