"""The real-model learning plan's numbers (experiments.real_model_learning.analysis) on records written here: the
span-read training reward weighted by counts, theta's rule, T, stalls, collapses, n from a pilot, and the test."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from experiments.real_model_learning import analysis as A
from experiments.real_model_learning import settings as C

END, TITLE = "startend:end_checker", "detectable_format:title"


def steps_of(values, counts=(3, 1), length=60.0):
    """Per-step metrics with the end phrase at ``values[s]`` and the title at 0 (weights ``counts``)."""
    return {s + 1: {f"mrtpo/reward/{END}/mean": v, f"mrtpo/reward/{END}/count": counts[0],
                    f"mrtpo/reward/{TITLE}/mean": 0.0, f"mrtpo/reward/{TITLE}/count": counts[1],
                    "mrtpo/reward/punctuation:no_comma/mean": 1.0, "mrtpo/reward/punctuation:no_comma/count": 9,
                    "response_length/mean": length} for s, v in enumerate(values)}


def write_run(docs, arm, seed, primary, values, wall=3600.0, glob=0.5, length=60.0):
    (docs / "runs").mkdir(parents=True, exist_ok=True)
    rec = {"arm": arm, "seed": seed, "ok": True, "attempts": 1, "walls_s": {"total": wall},
           "heldout": {"span_read": primary, "global": glob}}
    (docs / "runs" / f"{arm}_seed{seed}.json").write_text(json.dumps(rec))
    folder = C.report_folder(docs, "report_runs", seed) / C.run_name(arm, seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "data": v}) + "\n"
                                                  for k, v in steps_of(values, length=length).items()))


def test_the_span_read_reward_is_weighted_by_counts_and_leaves_out_the_global_ones():
    series = A.span_read_reward(steps_of([1.0, 0.5]))
    assert series == {1: pytest.approx(0.75), 2: pytest.approx(0.375)}  # (3 x v + 1 x 0) / 4; no_comma not in it
    assert A.span_read_reward({1: {"mrtpo/reward/punctuation:no_comma/mean": 1.0}}) == {}


def test_t_is_the_first_complete_running_mean_at_the_threshold_and_censored_after_the_last_step():
    series = {1: 0.1, 2: 0.1, 3: 0.4, 4: 0.4, 5: 0.4}
    assert A.running_mean(series) == {3: pytest.approx(0.2), 4: pytest.approx(0.3), 5: pytest.approx(0.4)}
    assert A.steps_to_threshold(series, 0.3, steps=5) == 4
    assert A.steps_to_threshold(series, 0.45, steps=5) == 6


def test_a_stall_never_rises_005_above_its_start_and_a_collapse_is_either_rule():
    assert A.stalled({1: 0.2, 2: 0.2, 3: 0.2, 4: 0.24, 5: 0.24})
    assert not A.stalled({1: 0.2, 2: 0.2, 3: 0.2, 4: 0.3, 5: 0.3, 6: 0.3})
    rec = {"heldout": {"global": 0.5}, "steps": steps_of([0.1] * 30)}
    assert not A.collapsed(rec, 0.55)
    assert A.collapsed(rec, 0.65)  # 0.15 below the base model's
    assert A.collapsed({"heldout": {"global": 0.6}, "steps": steps_of([0.1] * 30, length=5.0)}, 0.6)


def test_theta_is_the_rounded_down_midpoint_and_is_dropped_without_a_gain():
    pilot = {("gdpo", 100): {"steps": steps_of([0.4] * 27 + [0.8] * 3)},
             ("mrtpo", 100): {"steps": steps_of([0.4] * 30)}}
    th = A.theta(pilot)  # start (0.3 + 0.3) / 2 = 0.3, GDPO's end 0.6: midpoint 0.45
    assert th["start"] == pytest.approx(0.3) and th["gdpo_end"] == pytest.approx(0.6) and th["theta"] == 0.45
    flat = {("gdpo", 100): {"steps": steps_of([0.4] * 30)}, ("mrtpo", 100): {"steps": steps_of([0.4] * 30)}}
    assert A.theta(flat)["theta"] is None


def test_n_from_the_pilot_follows_the_plans_rule():
    from experiments.format_speed.stats import seeds_needed

    prim = {("gdpo", 100): 0.30, ("mrtpo", 100): 0.40, ("gdpo", 101): 0.50, ("mrtpo", 101): 0.55,
            ("gdpo", 102): 0.40, ("mrtpo", 102): 0.40}
    pilot = {k: {"heldout": {"span_read": v}, "walls_s": {"total": 3600.0}} for k, v in prim.items()}
    out = A.seeds_for_the_test(pilot)
    diffs = [0.10, 0.05, 0.0]
    pooled = math.sqrt((np.var([0.3, 0.5, 0.4], ddof=1) + np.var([0.4, 0.55, 0.4], ddof=1)) / 2)
    s_d = max(float(np.std(diffs, ddof=1)), math.sqrt(2) * pooled)
    assert out["differences"] == pytest.approx(diffs) and out["s_d"] == pytest.approx(s_d)
    assert out["n_needed"] == max(6, math.ceil(seeds_needed(0.05, s_d / math.sqrt(2)) / (3 / math.pi)))
    assert out["n_max"] == math.floor((86_400 - 6 * 3600) / (2 * 3600)) == 9
    assert out["n"] == min(out["n_needed"], 9)

    assert "halved" not in out and not out["below_minimum"] and out["over_budget_s"] == 0  # one-hour runs: as planned

    # an attempt stopped from outside (the machine's allocation ended) spent the budget too; a confirmatory seed's is not the pilot's
    stopped = [{"arm": "gdpo", "seed": 101, "lost_s": 7200.0}, {"arm": "mrtpo", "seed": 0, "lost_s": 999.0}]
    cut = A.seeds_for_the_test(pilot, interrupted=stopped)
    assert cut["interrupted_s"] == 7200.0 and cut["pilot_wall_s"] == 6 * 3600 + 7200
    assert cut["n_max"] == math.floor((86_400 - 6 * 3600 - 7200) / (2 * 3600)) == 8


def test_the_walls_count_failed_attempts_as_spent_and_the_halving_rule_projects_the_steps():
    def record(arm, failed_s, step_s, primary=0.5):
        steps = {s: {"timing_s/step": step_s} for s in range(1, 31)}
        walls = {"train": 100.0 + 30 * step_s, "heldout_eval": 300.0, "ifeval_eval": 700.0}
        walls["total"] = walls["train"] + 1000.0 + failed_s
        return {"arm": arm, "heldout": {"span_read": primary}, "walls_s": walls, "steps": steps}

    rec = record("gdpo", 1500.0, 170.0)
    assert A.run_walls(rec) == {"spent": 7700.0, "clean": 6200.0, "steps": 5100.0}
    assert A.projected_wall(rec, 4) == pytest.approx(6200.0 - 2550.0)  # half the steps' time, start-up and evals kept
    pilot = {("gdpo", s): record("gdpo", 1500.0 if s == 100 else 0.0, 170.0) for s in C.PILOT_SEEDS}
    pilot.update({("mrtpo", s): record("mrtpo", 0.0, 250.0, 0.5 + 0.05 * (s - 100)) for s in C.PILOT_SEEDS})
    out = A.seeds_for_the_test(pilot)
    spent = 3 * 6200.0 + 1500.0 + 3 * (100.0 + 7500.0 + 1000.0)
    assert out["pilot_wall_s"] == pytest.approx(spent)
    assert out["mean_run_wall_s"] == pytest.approx((6200.0 + 8600.0) / 2) and out["n_max"] == 2
    half = out["halved"]
    assert half["prompts_per_step"] == 4
    assert half["projected_run_wall_s"] == pytest.approx({"gdpo": 3650.0, "mrtpo": 4850.0})
    assert half["n_max"] == math.floor((86_400 - spent) / 8500.0) == 4 and half["below_minimum"]
    # four pairs could not reach p < 0.05: six are run, over the budget by what the two more pairs cost
    assert half["n"] == 6 and half["over_budget_s"] == pytest.approx(spent + 6 * 8500.0 - 86_400)
    # the difference six pairs detect: seeds_needed's formula (before its rounding up) gives six pairs at it
    from statistics import NormalDist

    z, d, sd = NormalDist(), half["detectable_delta"], out["s_d"] / math.sqrt(2)
    pairs = 2 * (z.inv_cdf(0.975) + z.inv_cdf(0.8)) ** 2 * sd**2 / d**2 / (3 / math.pi)
    assert out["s_d"] > 0 and pairs == pytest.approx(6.0)


def test_the_summary_reads_the_committed_records(tmp_path):
    docs = tmp_path / "docs"
    for seed, (g, m) in zip(C.PILOT_SEEDS, [(0.3, 0.4), (0.5, 0.55), (0.4, 0.4)]):
        write_run(docs, "gdpo", seed, g, [0.4] * 27 + [0.8] * 3)
        write_run(docs, "mrtpo", seed, m, [0.4] * 25 + [0.8] * 5)
    (docs / "base.json").write_text(json.dumps({"heldout": {"span_read": 0.2, "global": 0.5}}))
    out = A.summary(docs)
    assert out["pilot"]["theta"]["theta"] == 0.45 and out["pilot"]["n_max"] == 9 and out["pilot"]["interrupted_s"] == 0
    (docs / "interrupted.json").write_text(json.dumps([{"arm": "gdpo", "seed": 101, "lost_s": 7200.0}]))
    assert A.summary(docs)["pilot"]["n_max"] == 8  # the ledger's lost wall is the pilot's
    (docs / "interrupted.json").write_text(json.dumps([{"arm": "gdpo", "seed": 101}]))
    with pytest.raises(ValueError, match="lost_s"):
        A.summary(docs)
    (docs / "interrupted.json").unlink()
    run = out["runs"]["mrtpo_seed100"]
    # span-read 0.3 then 0.6 (from step 26, GDPO's from 28): the running mean first reaches 0.45 at (0.3 + 0.6 + 0.6) / 3
    assert run["T"] == 27 and out["runs"]["gdpo_seed100"]["T"] == 29
    assert not run["stall"] and not run["collapse"] and "test" not in out
    for seed, d in enumerate([0.1, 0.05, 0.02, 0.08, 0.03, 0.06]):
        write_run(docs, "gdpo", seed, 0.3, [0.4] * 30)
        write_run(docs, "mrtpo", seed, 0.3 + d, [0.4] * 30)
    test = A.summary(docs)["test"]
    assert test["pairs"] == list(range(6)) and test["signed_rank"]["p"] == pytest.approx(2 / 64)
    assert test["hodges_lehmann"] > 0 and test["sign_test"]["positive"] == 6


def test_the_summary_command_prints_it(tmp_path, capsys):
    from experiments.real_model_learning import runs as R

    write_run(tmp_path / "docs", "gdpo", 100, 0.3, [0.4] * 30)
    assert R.main(["summary", "--docs", str(tmp_path / "docs")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"]["gdpo_seed100"]["primary"] == 0.3 and "pilot" not in out
