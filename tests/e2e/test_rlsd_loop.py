"""End-to-end: RLSD (``ALGO=rlsd``: ``adv_estimator=gdpo``, ``mrtpo.mode=rlsd``) through verl 0.9.1's real v1 loop on CPU.

Two steps on the Chinook text-to-SQL prompts, whose gold SQL and execution feedback are appended contexts, so
every P_all differs from the rollout prompt. The method is resolved from the registry in the driver and again
in Ray's task runner. ``ALGO=rlsd`` is the RLSD authors' shipped script: lambda_s = 0.5 (1 - s / 60) at training
step s from 1, the frozen teacher in verl's reference model (the replay's P_all-only pass runs there, not fused
with verl's old_log_prob step), synced to the policy after every N-th update (here N = 1, so step 2's teacher is
the policy after step 1's update: ``actor/rlsd/teacher_synced`` 1 after each update), no KL. GDPO's final
advantage is scaled per token by r in [1 - lambda eps, 1 + lambda eps], never changing its sign, and verl's
update trains on it. A random tiny model almost never writes a ```sql
block, so its groups usually have no reward variance: GDPO's advantage is then 0 and no weight acts (1).
The reweight against the worker's own pass is pinned in tests/integration/test_advantage_step.py.
"""

from __future__ import annotations

import math

import pytest

from recipe.mrtpo.cpu.launcher import run_cpu, tiny_run_overrides
from recipe.mrtpo.methods import get

TIMEOUT_S = 600


@pytest.mark.slow  # the CI tier (.ci/run), past the default suite's 20 minutes
@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_rlsd_two_steps_on_text2sql(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path):
    rlsd = get("rlsd")
    extra = [*rlsd.overrides[1:], "mrtpo.rlsd_teacher_sync_steps=1", "trainer.save_freq=-1", "data.max_prompt_length=1024",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16"]  # the initial teacher: verl's reference worker
    res = run_cpu("recipe.mrtpo.main_mrtpo",
                  [*tiny_run_overrides(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path, rlsd.estimator, 2, lr=1.0), *extra],
                  tmp_path / "run", TIMEOUT_S)
    assert not res.timed_out, f"run did not finish within {TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == [1, 2], f"steps logged {sorted(res.steps)}:\n{res.tail()}"
    for step, s in sorted(res.steps.items()):
        lam = 0.5 * (1 - step / 60)  # the authors' decay over 60 training steps, counted from 1
        assert s["mrtpo/rlsd/lambda"] == pytest.approx(lam) and "mrtpo/replay_skipped" not in s  # the pass is planned
        assert s["mrtpo/rlsd/teacher_initial"] == 1 and s["actor/rlsd/teacher_synced"] == 1  # synced after each update
        assert "actor/kl_loss" not in s or s["actor/kl_loss"] == 0 or s.get("actor/kl_coef", 0) == 0
        for key in ("mrtpo/reward/format/mean", "mrtpo/reward/execution_match/mean", "actor/pg_loss", "mrtpo/adv_abs_mean"):
            assert key in s and math.isfinite(s[key]), f"{key} not logged: {sorted(s)}"
        # every response has a teacher row, and each one's P_all carries the gold SQL block; no P_minus / P_none
        rows = s["mrtpo/rlsd/rows_teacher"]
        assert 0 < rows <= 16 and s["mrtpo/rlsd/rows_privileged"] == rows and s["mrtpo/pairs_replayed"] == 0
        assert s["mrtpo/replay_fused_old_log_prob"] == 0 and s["mrtpo/rlsd/sign_flips"] == 0  # on the reference
        assert 1 - lam * 0.2 - 1e-6 <= s["mrtpo/rlsd/weight_min"] <= s["mrtpo/rlsd/weight_max"] <= 1 + lam * 0.2 + 1e-6
        if s["mrtpo/adv_abs_mean"] == 0:  # no reward variance anywhere: GDPO's advantage is 0, no weight acts
            assert s["mrtpo/rlsd/weight_min"] == s["mrtpo/rlsd/weight_max"] == 1.0
        print(f"\n[e2e rlsd text2sql] step {step}: teacher rows {rows:.0f}, delta mean {s['mrtpo/rlsd/delta_mean']:.3f}, "
              f"weights {s['mrtpo/rlsd/weight_min']:.3f}..{s['mrtpo/rlsd/weight_max']:.3f}, "
              f"|A| mean {s['mrtpo/adv_abs_mean']:.3f}, format {s['mrtpo/reward/format/mean']:.2f}")
    print(f"\n[e2e rlsd text2sql] wall {res.wall_s:.0f}s, peak PSS {res.peak_pss_gib:.1f} GiB")
