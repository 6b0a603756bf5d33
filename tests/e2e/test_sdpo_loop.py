"""End-to-end: SDPO (``ALGO=sdpo``: ``adv_estimator=gdpo``, ``mrtpo.mode=sdpo``) through verl 0.9.1's real v1 loop
on CPU, then a resume of its step-1 checkpoint.

Two steps on the Chinook text-to-SQL prompts (every teacher prompt carries the gold SQL): the actor worker's
``compute_sdpo_teacher`` takes the behaviour policy's top-k ids on the rollout prompts and the EMA teacher's
log-probs at them on P_all, the update runs SDPO's loss alone (verl's distillation path with the recipe's
registered loss: no ``actor/pg_loss``), and the EMA teacher moves after each update (rate 0.05, a large
learning rate: its fingerprint changes from step 1 to step 2). Every step saves a checkpoint; a second launch
resumes from step 1's and runs step 2 again: its teacher is the one saved, bit for bit, so its fingerprint at
step 2 equals the first run's exactly (a teacher rebuilt from the resumed actor would not).
"""

from __future__ import annotations

import math

import pytest

from recipe.mrtpo.cpu.launcher import run_cpu, tiny_run_overrides
from recipe.mrtpo.methods import get

TIMEOUT_S = 600
TOPK = 16


def assert_ok(res, steps):
    assert not res.timed_out, f"run did not finish within {TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == steps, f"steps logged {sorted(res.steps)}:\n{res.tail()}"


@pytest.mark.slow  # the CI tier (.ci/run), past the default suite's 20 minutes
@pytest.mark.e2e
@pytest.mark.timeout(2 * TIMEOUT_S + 120)
def test_sdpo_two_steps_on_text2sql_and_its_ema_teacher_resumes(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path):
    sdpo = get("sdpo")
    extra = [*sdpo.overrides[1:], f"mrtpo.sdpo_topk={TOPK}", "data.max_prompt_length=1024", "trainer.save_freq=1"]
    base = tiny_run_overrides(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path, sdpo.estimator, 2, lr=1.0)
    res = run_cpu("recipe.mrtpo.main_mrtpo", [*base, *extra, "trainer.resume_mode=disable"], tmp_path / "run", TIMEOUT_S)
    assert_ok(res, [1, 2])
    s1, s2 = res.steps[1], res.steps[2]
    for s in (s1, s2):
        # the pass: every response taught from its P_all (the gold SQL), the teacher at the student's top-k
        assert s["mrtpo/sdpo/rows_privileged"] == 16 and s["mrtpo/rows_privileged"] == 16
        assert not any(k.startswith("mrtpo/sdpo/fallback/") for k in s)
        assert s["mrtpo/sdpo/teacher_prompt_extra_tokens"] > 10
        assert 0 < s["mrtpo/sdpo/teacher_topk_mass"] <= 1 + 1e-6
        # SDPO's loss alone in the update (verl's distillation path, no policy loss)
        for key in ("actor/distillation/loss", "actor/distillation/teacher_mass", "actor/distillation/student_mass",
                    "actor/distillation/is_weight"):
            assert key in s and math.isfinite(s[key]), f"{key} not logged: {sorted(k for k in s if 'distill' in k)}"
        assert "actor/pg_loss" not in s or s["actor/pg_loss"] == 0
        assert s["actor/distillation/loss"] > 0  # the teacher reads the gold SQL the student does not
        # one mini-batch per step: the student's first forward is the behaviour policy, so the IS weight is 1
        assert s["actor/distillation/is_weight"] == pytest.approx(1.0, abs=1e-4)
        assert s["actor/distillation/teacher_mass"] == pytest.approx(s["mrtpo/sdpo/teacher_topk_mass"], rel=1e-2, abs=1e-6)
    # the EMA teacher moved after step 1's update
    assert s2["mrtpo/sdpo/teacher_sumsq"] != s1["mrtpo/sdpo/teacher_sumsq"]
    ckpt = tmp_path / "checkpoints" / "global_step_1"
    assert (ckpt / "actor" / "sdpo_ema_teacher" / "rank_0_of_1.pt").exists()

    # resume from step 1's checkpoint and run step 2 again: the teacher at step 2's pass is the saved one
    again = run_cpu("recipe.mrtpo.main_mrtpo", [*base, *extra, "trainer.resume_mode=resume_path",
                                                f"trainer.resume_from_path={ckpt}"],
                    tmp_path / "run_resumed", TIMEOUT_S)
    assert_ok(again, [2])
    r2 = again.steps[2]
    assert (r2["mrtpo/sdpo/teacher_sum"], r2["mrtpo/sdpo/teacher_sumsq"]) == (s2["mrtpo/sdpo/teacher_sum"], s2["mrtpo/sdpo/teacher_sumsq"])
    print(f"\n[e2e sdpo text2sql] wall {res.wall_s:.0f}s + resume {again.wall_s:.0f}s, peak PSS {res.peak_pss_gib:.1f} GiB, "
          f"teacher pass {s2['mrtpo/sdpo/teacher_time_s']:.2f}s vs step {s2.get('timing_s/step', float('nan')):.2f}s; "
          f"JSD loss {s1['actor/distillation/loss']:.3e} -> {s2['actor/distillation/loss']:.3e}, teacher mass "
          f"{s2['actor/distillation/teacher_mass']:.3f}, student mass {s2['actor/distillation/student_mass']:.3f}")
