"""The report's figures: per-reward training curves and steps until a reward first reaches a threshold."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from recipe.mrtpo.tools.report.names import method_sort

METHOD_COLORS = {
    "base": "#7f7f7f",
    "grpo": "#8c564b",
    "gdpo": "#1f77b4",
    "cort": "#ff7f0e",
    "shuffle": "#9467bd",
    "mrtpo": "#d62728",
}
_EXTRA_COLORS = ("#2ca02c", "#17becf", "#bcbd22", "#e377c2", "#393b79", "#637939")


def _color(method: str, methods: list[str]) -> str:
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    extras = [m for m in methods if m not in METHOD_COLORS]
    return _EXTRA_COLORS[extras.index(method) % len(_EXTRA_COLORS)]


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on savefig

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _title(fig, title: str, subtitle: str, width_in: float, fontsize: float = 10) -> None:
    """Title and subtitle above the panels, both wrapped to the figure's width so that nothing is cut
    (constrained layout makes room for the lines a suptitle has)."""
    chars = max(30, int(0.9 * width_in * 72 / (0.6 * fontsize)))  # DejaVu Sans: ~0.6 em a glyph, 10% margin
    fig.suptitle("\n".join([*textwrap.wrap(title, chars), *textwrap.wrap(subtitle, chars)]), fontsize=fontsize)


def save_figure(fig, path: Path) -> list[Path]:
    """``path`` (PNG, 200 dpi) and the same figure as vector PDF beside it; returns both paths."""
    path = Path(path)
    pdf = path.with_suffix(".pdf")
    fig.savefig(path, dpi=200)
    fig.savefig(pdf)
    return [path, pdf]


def plot_curves(curves: dict, title: str, threshold: float, path: Path) -> list[Path]:
    """One panel per reward (``curves[reward][method] = curve_stats``), one line per method; PNG + PDF."""
    rewards = sorted(curves)
    methods = method_sort({m for r in rewards for m in curves[r]})
    ncols = min(4, len(rewards))
    nrows = math.ceil(len(rewards) / ncols)
    width = 3.6 * ncols + 0.4
    fig = _figure(width, 2.7 * nrows + 0.8)
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
    _title(fig, f"{title}: per-reward training curves",
           f"mean over seeds, band ±1 std over seeds; dashed: threshold {threshold:g}", width)
    return save_figure(fig, path)


def plot_threshold(results: dict, title: str, threshold: float, path: Path) -> list[Path]:
    """Grouped bars: x = rewards, one bar per method (``results[reward][method]`` from
    :func:`threshold_results`); never-reached methods are labelled, not drawn as 0; PNG + PDF."""
    rewards = sorted(results)
    methods = method_sort({m for r in rewards for m in results[r]})
    width = 0.8 / max(1, len(methods))
    fig_width = max(6.0, 1.2 + len(rewards) * (0.32 * len(methods) + 0.35))
    fig = _figure(fig_width, 4.9)
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
                ax.text(x, max(reached) + top * 0.03, f"{res['n_reached']}/{res['n_runs']}", ha="center",
                        va="bottom", fontsize=7)  # above the highest dot, not on it
    fig.legend(handles=[Patch(color=_color(m, methods), label=m) for m in methods], fontsize=8,
               loc="outside lower center", ncols=min(len(methods), 6))
    ax.set_xticks(range(len(rewards)))
    slanted = len(rewards) > 3
    ax.set_xticklabels(rewards, rotation=30 if slanted else 0, ha="right" if slanted else "center",
                       rotation_mode="anchor", fontsize=8)
    ax.set_xlim(-0.6, len(rewards) - 0.4)
    ax.set_ylim(0, top * 1.18 + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)  # steps are whole numbers
    ax.set_ylabel(f"first step with reward mean ≥ {threshold:g}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    _title(fig, f"{title}: steps until each reward first reaches {threshold:g}",
           "bar: mean over the seeds that reached it; dots: single seeds; k/n: seeds that reached it", fig_width,
           fontsize=9)
    return save_figure(fig, path)
