"""End-to-end: OPSD (``mrtpo.mode=opsd`` with the GDPO advantage) through verl 0.9.1's real v1 loop on CPU.

The teacher pass runs on the actor worker (``compute_opsd_teacher``), the teacher fields go through
TransferQueue, and the actor update runs verl's own ``distillation_ppo_loss`` (top-k forward KL + the GDPO
policy loss) without teacher servers. The IF data's contexts are all in the prompt, so P_all is the rollout
prompt and the teacher is the behaviour policy itself: in fp32, with one mini-batch per step the student
is still the behaviour policy when the loss is taken, so the distillation loss is ~0 and the top-k sets
overlap fully. The random model's distributions are near-uniform (its top-k mass is ~k / V), which makes
that weak at step 1; a large learning rate (as in the GRPO e2e test) makes the policy peaked after step 1,
so at step 2 a teacher row off by one position would show as a large loss and a low overlap. (The layout
itself is pinned on a sharpened model against verl's own loss in tests/unit/test_opsd.py.)
"""

from __future__ import annotations

import math

import pytest

from recipe.mrtpo.cpu.launcher import run_cpu, tiny_run_overrides

TIMEOUT_S = 600
TOPK = 8


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_opsd_two_steps(tiny_task_qwen2_dir, if_train_parquet, tmp_path):
    extra = ["trainer.save_freq=-1", "mrtpo.mode=opsd", f"mrtpo.opsd_topk={TOPK}"]
    res = run_cpu("recipe.mrtpo.main_mrtpo", [*tiny_run_overrides(tiny_task_qwen2_dir, if_train_parquet, tmp_path, "gdpo", 2, lr=1.0), *extra],
                  tmp_path / "run", TIMEOUT_S)
    assert not res.timed_out, f"run did not finish within {TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == [1, 2], f"steps logged {sorted(res.steps)}:\n{res.tail()}"
    s1, s2 = res.steps[1], res.steps[2]
    for s in (s1, s2):
        # the teacher pass: every response taught, from its P_all (= the rollout prompt for IF constraints)
        assert s["mrtpo/opsd/rows_same_prompt"] == 16 and s["mrtpo/opsd/rows_privileged"] == 0
        assert 0 < s["mrtpo/opsd/teacher_topk_mass"] <= 1 + 1e-6
        assert s["mrtpo/opsd/teacher_padding_forwards"] == 0
        # verl's distillation loss ran in the actor update, next to the GDPO policy loss
        for key in ("actor/distillation/loss", "actor/distillation/overlap_ratio", "actor/distillation/teacher_mass",
                    "actor/distillation/student_mass", "actor/pg_loss"):
            assert key in s and math.isfinite(s[key]), f"{key} not logged: {sorted(k for k in s if 'distill' in k)}"
        assert s["mrtpo/beta"] == 0.0 and math.isfinite(s["mrtpo/adv_abs_mean"])
    # the teacher is the behaviour policy (old_log_probs) on the same prompt: same sampled-token log-probs
    assert abs(s1["mrtpo/opsd/teacher_logprob_gain"]) < 1e-4
    # one mini-batch per step: the student is still the teacher, position by position
    for s in (s1, s2):
        assert s["actor/distillation/loss"] < 1e-4
        assert s["actor/distillation/overlap_ratio"] > 0.99
        assert s["actor/distillation/teacher_mass"] == pytest.approx(s["mrtpo/opsd/teacher_topk_mass"], rel=1e-2, abs=1e-6)
    print(f"\n[e2e opsd] teacher top-{TOPK} mass step 1 {s1['mrtpo/opsd/teacher_topk_mass']:.3g} -> step 2 "
          f"{s2['mrtpo/opsd/teacher_topk_mass']:.3g}, rollout log-ppl {s1.get('rollout_corr/rollout_log_ppl', float('nan')):.2f} -> "
          f"{s2.get('rollout_corr/rollout_log_ppl', float('nan')):.2f}")
    print(f"\n[e2e opsd] wall {res.wall_s:.0f}s, peak PSS {res.peak_pss_gib:.1f} GiB, teacher "
          f"{s2['mrtpo/opsd/teacher_time_s']:.2f}s vs step {s2.get('timing_s/step', float('nan')):.2f}s; step 2: distillation loss "
          f"{s2['actor/distillation/loss']:.2e}, overlap {s2['actor/distillation/overlap_ratio']:.3f}, teacher mass "
          f"{s2['actor/distillation/teacher_mass']:.3f}")


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_opsd_privileged_text2sql_step_with_the_k3_estimator(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path):
    """One step on text-to-SQL prompts (the schema, a few hundred tokens of the task vocabulary): the teacher reads the gold SQL the student does
    not, through verl's single-sample k3 estimator on the sampled token."""
    extra = ["trainer.save_freq=-1", "mrtpo.mode=opsd", "mrtpo.opsd_loss_mode=k3", "data.max_prompt_length=1024"]
    res = run_cpu("recipe.mrtpo.main_mrtpo", [*tiny_run_overrides(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path, "gdpo", 1), *extra],
                  tmp_path / "run", TIMEOUT_S)
    assert not res.timed_out, f"run did not finish within {TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == [1], f"steps logged {sorted(res.steps)}:\n{res.tail()}"
    s = res.steps[1]
    assert s["mrtpo/opsd/rows_privileged"] == 16 and not any(k.startswith("mrtpo/opsd/fallback/") for k in s)
    assert s["mrtpo/opsd/teacher_prompt_extra_tokens"] > 10  # the verifier block with the gold SQL
    assert abs(s["mrtpo/opsd/teacher_logprob_gain"]) > 1e-6  # the privileged context moves the sampled tokens
    assert s["actor/distillation/loss"] > 0 and math.isfinite(s["actor/distillation/loss"])
    assert "actor/distillation/abs_loss" in s and "actor/distillation/overlap_ratio" not in s  # the estimator path
    print(f"\n[e2e opsd text2sql k3] wall {res.wall_s:.0f}s, peak PSS {res.peak_pss_gib:.1f} GiB, teacher "
          f"{s['mrtpo/opsd/teacher_time_s']:.2f}s vs step {s.get('timing_s/step', float('nan')):.2f}s, extra prompt tokens "
          f"{s['mrtpo/opsd/teacher_prompt_extra_tokens']:.0f}, gain {s['mrtpo/opsd/teacher_logprob_gain']:.2e}, "
          f"k3 loss {s['actor/distillation/loss']:.2e}")
