"""Does the policy write the layout its instruction names? Per step, from the relevance dumps: the format
rate under each instruction the prompts carry, and how many prompt groups have a format reward that varies.

Under ToolRL's rewards (``data_prep.format_speed --reward toolrl``) the instruction names one of two
layouts (:data:`data_prep.format_speed.FRAMES`) and the warm start writes its default layout most of the
time. A policy that writes the default whatever the instruction scores format about the share of prompts
that name the default, and its groups agree on the format reward: a group whose format does not vary has
A_format = 0 for every response, so none of the methods (GRPO's sum included) gets a format signal from
it. :func:`step_layouts` measures both on one dump (its ``max_samples`` first responses); :func:`render_layouts`
and :func:`plot_layouts` show them per run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from experiments.format_speed.common import FORMAT

#: the label of an instruction that names none of the known layouts (e.g. the control condition's one frame)
OTHER = "other"


def layout_of(instruction: Optional[str]) -> str:
    """The layout (a key of :data:`data_prep.format_speed.FRAMES`) that the instruction sentence names, or
    :data:`OTHER`."""
    from data_prep.format_speed import FRAMES

    for name, sentence in FRAMES.items():
        if instruction == sentence:
            return name
    return OTHER


def step_layouts(dump: dict) -> Optional[dict]:
    """``{"step", "responses", "groups", "groups_with_format_variance", "format_by_layout": {layout: rate},
    "n_by_layout": {layout: responses}}`` for one dump, or ``None`` when it has no format reward or no
    contexts (Z_format is the instruction: ``contexts[i]["format"]["text"]``). A response whose format
    score is NaN (the reward absent) is left out; a group varies when its format scores are not all equal."""
    names = list(dump.get("reward_names") or [])
    contexts = dump.get("contexts")
    if FORMAT not in names or not contexts:
        return None
    kf = names.index(FORMAT)
    scores = [float(row[kf]) for row in dump["scores"]]
    uid = list(dump.get("uid") or range(len(scores)))
    by_group, by_layout = defaultdict(list), defaultdict(list)
    for i, s in enumerate(scores):
        if math.isnan(s) or i >= len(contexts):
            continue
        by_group[uid[i]].append(s)
        by_layout[layout_of(((contexts[i] or {}).get(FORMAT) or {}).get("text"))].append(s)
    return {"step": int(dump.get("step", -1)), "responses": sum(len(v) for v in by_layout.values()),
            "groups": len(by_group), "groups_with_format_variance": sum(max(v) > min(v) for v in by_group.values()),
            "format_by_layout": {k: sum(v) / len(v) for k, v in sorted(by_layout.items())},
            "n_by_layout": {k: len(v) for k, v in sorted(by_layout.items())}}


def run_layouts(dumps: Sequence[dict]) -> list[dict]:
    """:func:`step_layouts` of each dump that has one, by step."""
    out = [r for r in (step_layouts(d) for d in dumps) if r is not None]
    return sorted(out, key=lambda r: r["step"])


def at_steps(records: Sequence[dict], steps: Sequence[int]) -> dict[int, Optional[dict]]:
    """The record of each of ``steps`` (``None`` where the run has no dump of that step)."""
    by_step = {r["step"]: r for r in records}
    return {s: by_step.get(s) for s in steps}


def layout_steps(steps: int, after_steps: int) -> list[int]:
    """The steps the layout table shows: the first, every ``after_steps`` after it, and the last."""
    return sorted({1, steps, *range(after_steps + 1, steps, after_steps)})


def _known_layouts(per_run: dict) -> list[str]:
    return sorted({k for e in per_run.values() for r in e.get("layouts") or [] for k in r["format_by_layout"]} - {OTHER})


def render_layouts(per_run: dict, steps: int, after_steps: int, threshold: float) -> list[str]:
    """Per finished replay run: the format rate under each instruction and the groups whose format varies, at
    :func:`layout_steps`; nothing when no dump names a known layout (the control's one frame)."""
    layouts = _known_layouts(per_run)
    rows = [(k, e) for k, e in sorted(per_run.items()) if e["ok"] and e.get("layouts")]
    if not layouts or not rows:
        return []
    shown = layout_steps(steps, after_steps)
    lines = ["", "The layouts written (relevance dumps): the format rate under the instruction that names "
             + " / ".join(f"`{name}`" for name in layouts) + ", and in brackets the prompt groups whose format "
             "reward varies (the only ones with a format advantage), at steps " + ", ".join(map(str, shown)) + ":", "",
             f"| run | seed | steps to format ≥ {threshold:g} | " + " | ".join(f"step {s}" for s in shown) + " |",
             "| --- | ---: | ---: |" + " ---: |" * len(shown)]
    for (method, seed), e in rows:
        reach = e["curves"].get(FORMAT, {}).get("first_reach")
        cells = []
        for r in at_steps(e["layouts"], shown).values():
            if r is None:
                cells.append("–")
                continue
            rates = " / ".join("–" if name not in r["format_by_layout"] else f"{r['format_by_layout'][name]:.2f}"
                               for name in layouts)
            cells.append(f"{rates} ({r['groups_with_format_variance']}/{r['groups']})")
        lines.append(f"| {method} | {seed} | {'–' if reach is None else reach} | " + " | ".join(cells) + " |")
    return lines


def plot_layouts(per_run: dict, methods: Sequence[str], path: Path) -> None:
    """Per replay method, per seed: the format rate under each instruction by step (nothing to plot for the
    control's one frame)."""
    from matplotlib.figure import Figure

    layouts = _known_layouts(per_run)
    shown = [m for m in methods if any(e["ok"] and e.get("layouts") for (mm, _), e in per_run.items() if mm == m)]
    if not layouts or not shown:
        return
    fig = Figure(figsize=(5 * len(shown) + 1.6, 3.8), dpi=110, layout="constrained")
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    styles = ["-", "--", ":", "-."]
    for ax, method in zip(axes, shown):
        for i, ((_, seed), e) in enumerate(sorted((k, e) for k, e in per_run.items() if k[0] == method and e["ok"])):
            color = f"C{i % 10}"
            for name, ls in zip(layouts, styles):
                pts = [(r["step"], r["format_by_layout"][name]) for r in e.get("layouts") or [] if name in r["format_by_layout"]]
                if pts:
                    ax.plot(*zip(*pts), color=color, ls=ls, lw=1.2, label=f"seed {seed}: {name}" if ax is axes[0] else None)
        ax.set_title(f"{method}: format rate under each instruction", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.02)
    fig.legend(loc="outside right upper", fontsize=6)  # one colour per seed, one line style per instruction
    fig.savefig(path)

