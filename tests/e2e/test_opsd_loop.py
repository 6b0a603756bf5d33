"""End-to-end: OPSD (``ALGO=opsd``) and gdpo-distill (``ALGO=gdpo-distill``) through verl 0.9.1's real v1 loop on CPU.

OPSD, as its paper defines it: the teacher pass runs on verl's reference worker (``compute_ref_opsd_teacher``: the
initial policy, built by ``use_kl_loss=True``), the teacher fields go through TransferQueue, and the actor update
runs the recipe's renormalised top-k JSD (beta 0.5) as verl's logits processor with no policy loss. The IF data's
contexts are all in the prompt, so the teacher is the initial policy under the rollout prompt: at step 1 the actor
is still the initial policy (one mini-batch, fp32), so the JSD is ~0; a large learning rate (as in the GRPO e2e
test) moves the policy at step 1, so at step 2 the frozen teacher differs from the student and the JSD is clearly
positive (a live teacher would give ~0 again). gdpo-distill (the recipe's earlier "OPSD": GDPO's loss + verl's top-k
forward KL to the live policy) runs one text-to-SQL step where every teacher prompt carries the gold SQL. (The maths
is pinned against direct computations in tests/unit/test_opsd.py and tests/unit/test_opsd_loss.py.)
"""

from __future__ import annotations

import math

import pytest

from recipe.mrtpo.cpu.launcher import run_cpu, tiny_run_overrides

TIMEOUT_S = 600
TOPK = 8


def with_reference(overrides: list[str]) -> list[str]:
    """The tiny run's overrides with verl's reference worker built (OPSD's frozen teacher; kl_loss_coef 0, and
    OPSD's loss adds no policy loss, so no KL term enters it)."""
    out = [o for o in overrides if not o.startswith("actor_rollout_ref.actor.use_kl_loss=")]
    return [*out, "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.0",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
            # the reference in fp32 as the CPU runs' actor (runtime.FP32_ACTOR): step 1's JSD is then 0 up to fp32
            "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"]


@pytest.mark.slow  # the CI tier (.ci/run), past the default suite's 20 minutes
@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_opsd_two_steps_with_the_frozen_teacher(tiny_task_qwen2_dir, if_train_parquet, tmp_path):
    extra = ["trainer.save_freq=-1", "mrtpo.mode=opsd", f"mrtpo.opsd_topk={TOPK}"]
    overrides = with_reference(tiny_run_overrides(tiny_task_qwen2_dir, if_train_parquet, tmp_path, "gdpo", 2, lr=1.0))
    res = run_cpu("recipe.mrtpo.main_mrtpo", [*overrides, *extra], tmp_path / "run", TIMEOUT_S)
    assert not res.timed_out, f"run did not finish within {TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == [1, 2], f"steps logged {sorted(res.steps)}:\n{res.tail()}"
    s1, s2 = res.steps[1], res.steps[2]
    for s in (s1, s2):
        # the teacher pass: every response taught, from its P_all (= the rollout prompt for IF constraints), on the reference
        assert s["mrtpo/opsd/rows_same_prompt"] == 16 and s["mrtpo/opsd/rows_privileged"] == 0
        assert s["mrtpo/opsd/teacher_initial"] == 1.0
        assert 0 < s["mrtpo/opsd/teacher_topk_mass"] <= 1 + 1e-6
        # the recipe's JSD ran in the actor update as verl's logits processor, and no policy loss did
        for key in ("actor/distillation/loss", "actor/distillation/teacher_mass", "actor/distillation/student_mass"):
            assert key in s and math.isfinite(s[key]), f"{key} not logged: {sorted(k for k in s if 'distill' in k)}"
        assert "actor/pg_loss" not in s and "actor/distillation/overlap_ratio" not in s
        assert s["actor/distillation/teacher_mass"] == pytest.approx(s["mrtpo/opsd/teacher_topk_mass"], rel=1e-2, abs=1e-6)
    # step 1: the initial policy is the behaviour policy (same sampled-token log-probs) and the student
    assert abs(s1["mrtpo/opsd/teacher_logprob_gain"]) < 1e-4
    assert s1["actor/distillation/loss"] < 1e-5
    # step 2: the policy moved at step 1, the frozen teacher did not
    assert abs(s2["mrtpo/opsd/teacher_logprob_gain"]) > 2e-4  # 1.5e-3 measured; fp32 noise ~1e-6
    assert s2["actor/distillation/loss"] > 100 * max(s1["actor/distillation/loss"], 1e-7)
    print(f"\n[e2e opsd] wall {res.wall_s:.0f}s, peak PSS {res.peak_pss_gib:.1f} GiB, teacher "
          f"{s2['mrtpo/opsd/teacher_time_s']:.2f}s vs step {s2.get('timing_s/step', float('nan')):.2f}s; JSD step 1 "
          f"{s1['actor/distillation/loss']:.2e} -> step 2 {s2['actor/distillation/loss']:.2e}, teacher gain step 2 "
          f"{s2['mrtpo/opsd/teacher_logprob_gain']:.2e}, teacher mass {s2['actor/distillation/teacher_mass']:.3f}")


@pytest.mark.slow  # the CI tier (.ci/run), past the default suite's 20 minutes
@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_gdpo_distill_privileged_text2sql_step(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path):
    """One gdpo-distill step on text-to-SQL prompts (the schema, a few hundred tokens of the task vocabulary): the live
    teacher reads the gold SQL the student does not; GDPO's policy loss + verl's top-k forward KL."""
    extra = ["trainer.save_freq=-1", "mrtpo.mode=gdpo-distill", f"mrtpo.opsd_topk={TOPK}", "data.max_prompt_length=1024"]
    res = run_cpu("recipe.mrtpo.main_mrtpo", [*tiny_run_overrides(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path, "gdpo", 1), *extra],
                  tmp_path / "run", TIMEOUT_S)
    assert not res.timed_out, f"run did not finish within {TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == [1], f"steps logged {sorted(res.steps)}:\n{res.tail()}"
    s = res.steps[1]
    assert s["mrtpo/opsd/rows_privileged"] == 16 and not any(k.startswith("mrtpo/opsd/fallback/") for k in s)
    assert s["mrtpo/opsd/teacher_initial"] == 0.0
    assert s["mrtpo/opsd/teacher_prompt_extra_tokens"] > 10  # the framed gold SQL
    assert abs(s["mrtpo/opsd/teacher_logprob_gain"]) > 1e-6  # the privileged context moves the sampled tokens
    for key in ("actor/distillation/loss", "actor/distillation/overlap_ratio", "actor/pg_loss"):
        assert key in s and math.isfinite(s[key]), f"{key} not logged: {sorted(k for k in s if 'distill' in k)}"
    assert s["actor/distillation/loss"] > 0  # the privileged teacher differs from the student
    print(f"\n[e2e gdpo-distill text2sql] wall {res.wall_s:.0f}s, peak PSS {res.peak_pss_gib:.1f} GiB, teacher "
          f"{s['mrtpo/opsd/teacher_time_s']:.2f}s vs step {s.get('timing_s/step', float('nan')):.2f}s, extra prompt tokens "
          f"{s['mrtpo/opsd/teacher_prompt_extra_tokens']:.0f}, gain {s['mrtpo/opsd/teacher_logprob_gain']:.2e}, "
          f"top-{TOPK} forward KL {s['actor/distillation/loss']:.2e}, overlap {s['actor/distillation/overlap_ratio']:.3f}")
