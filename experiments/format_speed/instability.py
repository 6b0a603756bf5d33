"""Why MRTPO's correctness is less stable: per run and arm, from the per-step metrics a run logs (the grid's
records, :mod:`.grid`), how concentrated and how large its updates are, and whether their spikes precede the drops
of correctness. Measured, not acted on: the grid's ablation ``mrtpo-cap3`` (``mrtpo.max_token_weight=3``, off by
default) is what says whether a cap on one token's weight stabilises it.

Per run (:func:`run_instability`):

- **max |A_t|**: the largest |final token advantage| of the run, max over steps of max(|critic/advantages/max|,
  |critic/advantages/min|) (verl's own metrics: every method has them);
- **top token's share, mean**: the mean over steps of ``mrtpo/adv_top_share_mean``, the batch's mean over responses
  of max_t A_t^2 / sum_t A_t^2 (the recipe's advantage step). Where every token of a response carries the same
  advantage (GDPO; GRPO, which runs verl's step and logs none) a response's share is exactly 1 / L, so this is the
  mean of 1 / L over the responses; it is the figure that compares the arms;
- **top token's share, largest**: max over steps of ``mrtpo/adv_top_share_max``, the largest share of any one
  response of the run: an extreme, which for GDPO is 1 / L of the run's shortest response (100% for a one-token
  response), so it does not compare concentration between arms;
- **grad norm**: ``actor/grad_norm``, the total norm before clipping (torch's ``clip_grad_norm_`` returns it),
  max and median over steps;
- **clip fraction**: ``actor/pg_clipfrac``, mean and max over steps;
- **spikes** (:func:`spikes`): steps k (with at least :data:`MIN_HISTORY` earlier steps) whose grad norm exceeds
  :data:`SPIKE_FACTOR` times the median of the run's earlier steps;
- **drops** (:func:`drops`): steps j (with :data:`WINDOW` earlier steps) whose correctness batch mean is more than
  :data:`DROP` below the mean of the :data:`WINDOW` steps before it;
- **spikes precede drops** (:func:`preceded`): the drops with a spike at step j - 1 or j - 2 (:data:`LAG`: the update
  of step k first shapes the samples of step k + 1), against the base rate (:func:`base_rate`): the share of the
  steps that could be drops (j > WINDOW) with a spike in their LAG steps before. A share of drops well above the
  base rate is what "spikes precede drops" means here; the same with max |A_t| as the spike signal.

Exploratory, not in the analysis plan (added after MRTPO seed 1 of the grid was seen to reach format 0.8 and then
lose it, which T cannot see): **format lost** (:func:`format_floor`): after the first step whose 3-step running
mean of the format rate reaches 0.8 (the step T of the plan), the lowest running mean of the later steps and its
step; a run whose floor is below :data:`FORMAT_LOST` lost the format it had learned.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Optional

from experiments.format_speed.results import curve_summary

SPIKE_FACTOR = 2.0
MIN_HISTORY = 3
WINDOW = 3
DROP = 0.5  # on ToolRL's correctness scale [-3, 3]
LAG = 2

FORMAT_REACHED, FORMAT_LOST = 0.8, 0.6

CORRECTNESS = "mrtpo/reward/correctness/mean"
FORMAT = "mrtpo/reward/format/mean"


def spikes(series: Mapping[int, float], factor: float = SPIKE_FACTOR, min_history: int = MIN_HISTORY) -> list[int]:
    """Steps k with at least ``min_history`` earlier steps and x_k > factor * median(x_j, j < k)."""
    keys, out = sorted(series), []
    for i, k in enumerate(keys):
        if i >= min_history and series[k] > factor * statistics.median(series[j] for j in keys[:i]):
            out.append(k)
    return out


def drops(series: Mapping[int, float], drop: float = DROP, window: int = WINDOW) -> list[int]:
    """Steps j with ``window`` earlier steps and c_j < mean(c_{j-window}, ..., c_{j-1}) - drop."""
    keys = sorted(series)
    return [k for i, k in enumerate(keys) if i >= window
            and series[k] < sum(series[j] for j in keys[i - window:i]) / window - drop]


def preceded(drop_steps: list[int], spike_steps: list[int], lag: int = LAG) -> int:
    """Drops j with a spike at one of steps j - lag, ..., j - 1."""
    s = set(spike_steps)
    return sum(1 for j in drop_steps if any(j - d in s for d in range(1, lag + 1)))


def base_rate(steps: list[int], spike_steps: list[int], lag: int = LAG, window: int = WINDOW) -> Optional[float]:
    """The share of the steps that could be drops (all but the first ``window``) with a spike in their ``lag``
    steps before: how often a drop would follow a spike by chance."""
    eligible = sorted(steps)[window:]
    if not eligible:
        return None
    return preceded(eligible, spike_steps, lag) / len(eligible)


def format_floor(series: Mapping[int, float], reached: float = FORMAT_REACHED,
                 window: int = WINDOW) -> Optional[tuple[int, float]]:
    """(step, value) of min_{k > T} r_k, where r_k is the ``window``-step running mean of the format rate and T the
    first step with r_T >= ``reached`` (both as the plan's T: :func:`.results.curve_summary`); None when it is never
    reached or reached last."""
    c = curve_summary(dict(series), reached, window, 0)
    later = [(k, r) for k, r in c["running"].items() if c["first_reach"] is not None and k > c["first_reach"]]
    return min(later, key=lambda kr: (kr[1], kr[0])) if later else None


def _series(record: dict, key: str) -> dict[int, float]:
    return {int(k): float(v) for k, v in (record.get("metrics", {}).get(key) or {}).items()}


def run_instability(record: dict) -> dict:
    """One run's measures (module docstring) from its record's per-step metrics."""
    amax, amin = _series(record, "critic/advantages/max"), _series(record, "critic/advantages/min")
    adv = {k: max(abs(amax[k]), abs(amin.get(k, 0.0))) for k in amax}
    share, share_mean = _series(record, "mrtpo/adv_top_share_max"), _series(record, "mrtpo/adv_top_share_mean")
    share_mean = {k: v for k, v in share_mean.items() if v == v}  # a step without a response logs NaN
    grad, clip, cor = _series(record, "actor/grad_norm"), _series(record, "actor/pg_clipfrac"), _series(record, CORRECTNESS)
    g_spikes, a_spikes, d = spikes(grad), spikes(adv), drops(cor)
    floor = format_floor(_series(record, FORMAT))
    return {
        "arm": record.get("arm"), "seed": record.get("seed"), "ok": bool(record.get("ok")),
        "max_abs_adv": max(adv.values()) if adv else None,
        "top_share_max": max(share.values()) if share else None,
        "top_share_mean": sum(share_mean.values()) / len(share_mean) if share_mean else None,
        "grad_norm_max": max(grad.values()) if grad else None,
        "grad_norm_median": statistics.median(grad.values()) if grad else None,
        "clipfrac_mean": sum(clip.values()) / len(clip) if clip else None,
        "clipfrac_max": max(clip.values()) if clip else None,
        "spikes": g_spikes, "drops": d, "drops_after_spike": preceded(d, g_spikes),
        "base_rate": base_rate(list(cor), g_spikes),
        "adv_spikes": a_spikes, "drops_after_adv_spike": preceded(d, a_spikes), "adv_base_rate": base_rate(list(cor), a_spikes),
        "format_floor": floor[1] if floor else None, "format_floor_step": floor[0] if floor else None,
        "format_lost": bool(floor and floor[1] < FORMAT_LOST),
    }


def arm_summary(per_run: Mapping) -> dict:
    """Per arm over its finished runs: the median and the max of the run measures, the pooled drops, the drops
    after a spike and the mean base rate."""
    arms: dict = {}
    for r in per_run.values():
        if r["ok"]:
            arms.setdefault(r["arm"], []).append(r)

    def agg(rs, key):
        v = [r[key] for r in rs if r[key] is not None]
        return (statistics.median(v), max(v)) if v else (None, None)

    def mean(rs, key):
        v = [r[key] for r in rs if r[key] is not None]
        return sum(v) / len(v) if v else None

    return {arm: {"runs": len(rs), **{k: agg(rs, k) for k in ("max_abs_adv", "top_share_mean", "top_share_max",
                                                            "grad_norm_max", "clipfrac_mean")},
                  "spikes": sum(len(r["spikes"]) for r in rs), "drops": sum(len(r["drops"]) for r in rs),
                  "drops_after_spike": sum(r["drops_after_spike"] for r in rs), "base_rate": mean(rs, "base_rate"),
                  "drops_after_adv_spike": sum(r["drops_after_adv_spike"] for r in rs),
                  "adv_base_rate": mean(rs, "adv_base_rate"),
                  "format_reached": sum(r["format_floor"] is not None for r in rs),
                  "format_lost": sum(r["format_lost"] for r in rs)}
            for arm, rs in arms.items()}


def _f(v, digits=2, pct=False) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.0f}%" if pct else f"{v:.{digits}f}"


def _floor(r: Mapping) -> str:
    if r["format_floor"] is None:
        return "–"
    return f"{r['format_floor']:.2f} ({r['format_floor_step']}){' lost' if r['format_lost'] else ''}"


def render_instability(per_run: Mapping) -> str:
    """``instability.md``: the table per arm, then per run."""
    lines = ["# Format speed: the instability measured (per arm, then per run)", "",
             "Definitions: `experiments/format_speed/instability.py`. A spike: a step whose grad norm (before clipping) "
             f"exceeds {SPIKE_FACTOR:g}x the median of the run's earlier steps (after {MIN_HISTORY}); a drop: a step whose "
             f"correctness batch mean is more than {DROP:g} below the mean of the {WINDOW} steps before; a drop after a "
             f"spike: a spike in the {LAG} steps before it; base rate: the share of steps with a spike in their {LAG} "
             "steps before (what chance alone gives). Medians (max) over the arm's finished runs. Exploratory, not in "
             f"the plan: format lost: runs whose 3-step running mean of the format rate, after first reaching "
             f"{FORMAT_REACHED:g}, fell below {FORMAT_LOST:g} (of the runs that reached it before their last step); "
             "format floor: that lowest running mean after the first reach, and its step. Top token's share of a "
             "response's sum_t A_t^2: its mean over the run's responses and steps (the comparable figure; where a "
             "response's tokens share one advantage, GDPO, it is 1 / L) and the largest of any one response (an extreme: "
             "for GDPO, 1 / L of the shortest response).", "",
             "| arm | runs | max abs A_t | top token's share, mean | top token's share, largest | grad norm max | clip fraction (mean) | spikes | drops "
             "| drops after a grad spike (base rate) | drops after an abs-A spike (base rate) | format lost (exploratory) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for arm, s in arm_summary(per_run).items():
        def mm(key, digits=2, pct=False):
            med, mx = s[key]
            return f"{_f(med, digits, pct)} ({_f(mx, digits, pct)})"

        lines.append(f"| {arm} | {s['runs']} | {mm('max_abs_adv')} | {mm('top_share_mean', 3)} | {mm('top_share_max', pct=True)} | "
                     f"{mm('grad_norm_max')} | {mm('clipfrac_mean', 3)} | {s['spikes']} | {s['drops']} | "
                     f"{s['drops_after_spike']} ({_f(s['base_rate'], pct=True)}) | "
                     f"{s['drops_after_adv_spike']} ({_f(s['adv_base_rate'], pct=True)}) | "
                     f"{s['format_lost']} of {s['format_reached']} |")
    lines += ["", "| run | max abs A_t | top token's share, mean / largest | grad norm max / median | clip fraction mean / max | "
              "grad spikes at | drops at | drops after a spike | format floor after 0.8 (step) |",
              "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |"]
    for r in sorted(per_run.values(), key=lambda r: (str(r["arm"]), r["seed"] or 0)):
        lines.append(f"| {r['arm']} seed {r['seed']}{'' if r['ok'] else ' (failed)'} | {_f(r['max_abs_adv'])} | "
                     f"{_f(r['top_share_mean'], 3)} / {_f(r['top_share_max'], pct=True)} | {_f(r['grad_norm_max'])} / {_f(r['grad_norm_median'])} | "
                     f"{_f(r['clipfrac_mean'], 3)} / {_f(r['clipfrac_max'], 3)} | {', '.join(map(str, r['spikes'])) or '–'} | "
                     f"{', '.join(map(str, r['drops'])) or '–'} | {r['drops_after_spike']} | {_floor(r)} |")
    return "\n".join(lines) + "\n"
