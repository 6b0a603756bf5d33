"""The plan's numbers from the committed records (``docs/real_model_learning/analysis_plan.md``): the pilot's theta,
spread and n, each run's T, stall and collapse, and the confirmatory test.

Inputs are what a run commits: ``runs/<arm>_seed<s>.json`` (the held-out counts, the walls, the per-step means) and
``[confirmatory/]report_runs/<run name>/metrics.jsonl`` (every metric verl logged per step, the per-reward counts
included), and ``base.json`` (the initial model's held-out rates), and ``interrupted.json`` (attempts stopped from
outside before the runner could record them: what they cost the budget).

    python -m experiments.real_model_learning summary          # the pilot's numbers, or the test once seeds 0.. exist
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from experiments.real_model_learning import settings as C

#: the plan's constants
DELTA = 0.05  # the smallest difference in the held-out span-read pass rate worth detecting
SIGNED_RANK_EFFICIENCY = 3 / math.pi  # 0.955
MIN_SEEDS = 6  # the exact signed-rank test cannot reach p < 0.05 with fewer
BUDGET_S = 86_400
HALVING_WALL_S = 5_400  # runs longer than 1.5 h: the prompts a step are halved before seeds are cut
RUN_MEAN = 3  # steps in the running mean of T and of a stall
STALL_RISE = 0.05
COLLAPSE_DROP, COLLAPSE_LENGTH = 0.10, 10.0


def load_records(docs: Path) -> dict[tuple[str, int], dict]:
    """``{(arm, seed): record}`` of every finished run under ``docs/runs``, with its per-step metrics from
    ``<its set's report_runs>/<run name>/metrics.jsonl`` (:func:`settings.report_folder`) as
    ``record["steps"] = {step: {metric: value}}``."""
    from recipe.mrtpo.tools.verl_log import parse_file_logger

    out = {}
    for p in sorted((Path(docs) / "runs").glob("*.json")):
        rec = json.loads(p.read_text())
        if not rec.get("ok"):
            continue
        log = C.report_folder(docs, "report_runs", int(rec["seed"])) / C.run_name(rec["arm"], rec["seed"])
        log = log / "metrics.jsonl"
        steps = parse_file_logger(log.read_text())[0] if log.is_file() else {}
        out[(rec["arm"], int(rec["seed"]))] = {**rec, "steps": steps}
    return out


def load_interrupted(docs: Path) -> list[dict]:
    """The attempts stopped from outside the runner (``[{"arm", "seed", "started", "stopped", "lost_s", "why"}]``):
    a process ended with the machine's allocation leaves no record, yet spent the budget's wall."""
    path = Path(docs) / "interrupted.json"
    entries = json.loads(path.read_text()) if path.is_file() else []
    for e in entries:
        if not {"arm", "seed", "lost_s"} <= set(e) or float(e["lost_s"]) < 0:
            raise ValueError(f"{path}: an entry needs arm, seed and lost_s >= 0: {e}")
    return entries


def span_read_reward(steps: Mapping[int, Mapping[str, float]], ids: Sequence[str] = C.SPAN_READ) -> dict[int, float]:
    """Per step, the batch's mean over every span-read constraint instance: the ``mrtpo/reward/<id>/mean`` of the
    span-read ids weighted by their ``/count`` (a step with no span-read instance is left out)."""
    out = {}
    for step, m in sorted(steps.items()):
        num = den = 0.0
        for i in ids:
            n = m.get(f"mrtpo/reward/{i}/count")
            if n and f"mrtpo/reward/{i}/mean" in m:
                num += float(m[f"mrtpo/reward/{i}/mean"]) * float(n)
                den += float(n)
        if den:
            out[step] = num / den
    return out


def running_mean(series: Mapping[int, float], width: int = RUN_MEAN) -> dict[int, float]:
    """``{s: mean(series[s - width + 1 .. s])}`` for every step s whose window is complete."""
    return {s: float(np.mean([series[t] for t in range(s - width + 1, s + 1)])) for s in sorted(series)
            if all(t in series for t in range(s - width + 1, s + 1))}


def start_level(series: Mapping[int, float]) -> float:
    """The mean over steps 1-3."""
    return float(np.mean([series[s] for s in (1, 2, 3) if s in series]))


def end_level(series: Mapping[int, float], steps: int = C.STEPS) -> float:
    """The mean over the last three steps (28-30 at the plan's 30)."""
    return float(np.mean([series[s] for s in range(steps - 2, steps + 1) if s in series]))


def theta(pilot: Mapping[tuple[str, int], dict], steps: int = C.STEPS) -> dict:
    """The threshold rule: the midpoint between the pilot runs' steps-1-3 level (both arms) and the pilot GDPO runs'
    level over the last three steps, rounded down to 0.05; ``theta`` None (T dropped) when the midpoint is less than
    0.05 above the start."""
    series = {k: span_read_reward(r["steps"]) for k, r in pilot.items()}
    start = float(np.mean([start_level(s) for s in series.values()]))
    end = float(np.mean([end_level(s, steps) for (arm, _), s in series.items() if arm == "gdpo"]))
    mid = (start + end) / 2
    value = math.floor(mid / 0.05 + 1e-9) * 0.05
    return {"start": start, "gdpo_end": end, "midpoint": mid, "theta": round(value, 2) if mid - start >= 0.05 else None}


def steps_to_threshold(series: Mapping[int, float], threshold: float, steps: int = C.STEPS) -> int:
    """T: the first step whose running mean reaches ``threshold``; ``steps + 1`` (censored) when none does."""
    return next((s for s, v in running_mean(series).items() if v >= threshold - 1e-12), steps + 1)


def stalled(series: Mapping[int, float]) -> bool:
    """A stall: the running mean never rises ``STALL_RISE`` above the run's own steps-1-3 mean."""
    start = start_level(series)
    return not any(v >= start + STALL_RISE - 1e-12 for v in running_mean(series).values())


def collapsed(record: Mapping, base_global: Optional[float], steps: int = C.STEPS) -> bool:
    """A collapse: the held-out global pass rate more than 0.10 below the base model's, or a mean response length
    under 10 tokens over the last three steps."""
    glob = (record.get("heldout") or {}).get("global")
    lengths = [record["steps"][s]["response_length/mean"] for s in range(steps - 2, steps + 1)
               if "response_length/mean" in record["steps"].get(s, {})]
    return bool((glob is not None and base_global is not None and glob < base_global - COLLAPSE_DROP)
                or (lengths and float(np.mean(lengths)) < COLLAPSE_LENGTH))


def run_walls(record: Mapping) -> dict:
    """A run's walls: ``spent``, everything the run cost the budget (failed attempts included: the record's total);
    ``clean``, one attempt start to finish (the last attempt's verl wall, start-up included, plus its evaluations;
    the total where the phases are not recorded); ``steps``, the sum of verl's ``timing_s/step`` (the part that
    scales with the responses a step)."""
    w = record.get("walls_s") or {}
    phases = [w.get(k) for k in ("train", "heldout_eval", "ifeval_eval")]
    clean = sum(float(v) for v in phases) if all(v is not None for v in phases) else float(w["total"])
    steps = sum(float(m["timing_s/step"]) for m in (record.get("steps") or {}).values() if "timing_s/step" in m)
    return {"spent": float(w["total"]), "clean": clean, "steps": steps}


def projected_wall(record: Mapping, prompts: int, pilot_prompts: int = C.PROMPTS_PER_STEP) -> float:
    """A run's clean wall at ``prompts`` prompts a step: the steps' time scaled by ``prompts / pilot_prompts`` (the
    rollout, the passes and the update are linear in the responses), start-up and evaluations unchanged."""
    w = run_walls(record)
    return w["clean"] - w["steps"] * (1 - prompts / pilot_prompts)


def seeds_for_the_test(pilot: Mapping[tuple[str, int], dict], delta: float = DELTA,
                       interrupted: Sequence[Mapping] = ()) -> dict:
    """n from the pilot: s_d = max(SD of the paired differences, sqrt(2) x the pooled within-arm SD of the primary);
    n_needed = max(6, ceil(seeds_needed(delta, s_d / sqrt(2)) / 0.955)); n_max = floor((86,400 s - the pilot's wall)
    / (2 x the pilot's mean run wall)); n = min of the two.

    The walls: the pilot's wall is what its runs spent (failed attempts included, and the pilot seeds' ``interrupted``
    attempts, :func:`load_interrupted`), a run's wall one clean attempt
    (:func:`run_walls`). Where the mean run wall is over 1.5 h the plan halves the prompts a step before it cuts
    seeds: ``halved`` gives each arm's projected wall at half the prompts (:func:`projected_wall`) and the n_max
    they allow (the pair's projected walls, the arms' means, in the denominator). Where the budget holds fewer pairs
    than the exact test needs to reach p < 0.05 at all (``below_minimum``), n is that minimum, 6, and
    ``over_budget_s`` says by how much it exceeds the budget (the plan's note of 2026-12-07). ``detectable_delta``:
    the difference the test detects with power 0.8 at that n (what the amendment gives where n_needed > n_max)."""
    from experiments.format_speed.stats import detectable_difference, seeds_needed

    seeds = sorted({s for (_, s) in pilot if ("gdpo", s) in pilot and ("mrtpo", s) in pilot})
    primary = {k: r["heldout"]["span_read"] for k, r in pilot.items()}
    diffs = [primary[("mrtpo", s)] - primary[("gdpo", s)] for s in seeds]
    arms = {a: [v for (arm, _), v in primary.items() if arm == a] for a in ("gdpo", "mrtpo")}
    pooled = math.sqrt(np.mean([np.var(v, ddof=1) for v in arms.values() if len(v) > 1]))
    s_d = max(float(np.std(diffs, ddof=1)) if len(diffs) > 1 else 0.0, math.sqrt(2) * pooled)
    needed = max(MIN_SEEDS, math.ceil(seeds_needed(delta, s_d / math.sqrt(2)) / SIGNED_RANK_EFFICIENCY)) if s_d else MIN_SEEDS
    walls = {k: run_walls(r) for k, r in pilot.items()}
    lost = sum(float(e["lost_s"]) for e in interrupted if int(e["seed"]) in C.PILOT_SEEDS)
    spent = sum(w["spent"] for w in walls.values()) + lost
    mean_clean = float(np.mean([w["clean"] for w in walls.values()]))

    def choice(pair_wall: float) -> dict:
        n_max = math.floor((BUDGET_S - spent) / pair_wall)
        n = max(MIN_SEEDS, min(needed, n_max))  # below 6 the test is decided before it runs: 6, over budget
        return {"n_max": n_max, "n": n, "below_minimum": n_max < MIN_SEEDS,
                "over_budget_s": max(0.0, spent + n * pair_wall - BUDGET_S),
                "detectable_delta": detectable_difference(n * SIGNED_RANK_EFFICIENCY, s_d / math.sqrt(2))}

    out = {"seeds": seeds, "differences": diffs, "sd_differences": float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None,
           "pooled_within_arm_sd": pooled, "s_d": s_d, "n_needed": needed, "pilot_wall_s": spent,
           "interrupted_s": lost, "mean_run_wall_s": mean_clean, **choice(2 * mean_clean)}
    if mean_clean > HALVING_WALL_S:
        half = C.PROMPTS_PER_STEP // 2
        per_arm = {a: float(np.mean([projected_wall(r, half) for (arm, _), r in pilot.items() if arm == a]))
                   for a in ("gdpo", "mrtpo")}
        out["halved"] = {"prompts_per_step": half, "projected_run_wall_s": per_arm, **choice(sum(per_arm.values()))}
    return out


def confirmatory_test(records: Mapping[tuple[str, int], dict], seeds: Sequence[int]) -> dict:
    """The primary test over the pairs of ``seeds`` that both finished: the signed-rank p, the Hodges-Lehmann
    estimate and its bootstrap interval, the sign test, the mean difference and its bootstrap interval."""
    from experiments.format_speed import stats

    pairs = [s for s in seeds if ("gdpo", s) in records and ("mrtpo", s) in records]
    d = [records[("mrtpo", s)]["heldout"]["span_read"] - records[("gdpo", s)]["heldout"]["span_read"] for s in pairs]
    return {"pairs": pairs, "differences": d, "signed_rank": stats.signed_rank_p(d), "hodges_lehmann": stats.hodges_lehmann(d),
            "hl_interval": stats.bootstrap_hl_interval(d), "sign_test": stats.sign_test_p(d),
            "mean": float(np.mean(d)) if d else None, "mean_interval": stats.bootstrap_interval(d) if d else None}


def summary(docs: Path) -> dict:
    """What the records say so far: per run its primary, T (once theta is fixed), stall and collapse; the pilot's
    theta and n once its six runs are in; the test once confirmatory pairs are."""
    records = load_records(docs)
    base_path = Path(docs) / "base.json"
    base = json.loads(base_path.read_text()) if base_path.is_file() else None
    base_global = ((base or {}).get("heldout") or {}).get("global")
    pilot = {k: r for k, r in records.items() if k[1] in C.PILOT_SEEDS}
    out: dict = {"runs": {}, "base": (base or {}).get("heldout")}
    complete = len(pilot) == 2 * len(C.PILOT_SEEDS) and all((a, s) in pilot for a in ("gdpo", "mrtpo") for s in C.PILOT_SEEDS)
    th = theta(pilot) if complete else None
    for (arm, seed), r in sorted(records.items()):
        series = span_read_reward(r["steps"])
        out["runs"][f"{arm}_seed{seed}"] = {
            "primary": r["heldout"]["span_read"], "global": r["heldout"]["global"], "attempts": r.get("attempts"),
            "wall_s": (r.get("walls_s") or {}).get("total"), "start": start_level(series) if series else None,
            "end": end_level(series) if series else None, "stall": stalled(series) if series else None,
            "collapse": collapsed(r, base_global),
            "T": steps_to_threshold(series, th["theta"]) if th and th["theta"] is not None else None}
    if complete:
        out["pilot"] = {"theta": th, **seeds_for_the_test(pilot, interrupted=load_interrupted(docs))}
    confirmatory = sorted({s for (_, s) in records if s not in C.PILOT_SEEDS})
    if confirmatory:
        out["test"] = confirmatory_test(records, confirmatory)
    return out
