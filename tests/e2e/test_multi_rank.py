"""End-to-end: verl 0.9.1's real loop with two data-parallel actor ranks on CPU (docs/design.md §3, §5).

The same run as ``test_mrtpo_loop.py`` (vLLM-CPU rollout, FSDP2 actor on gloo, IFEval checkers), with the
actor on two ranks, 4 steps (the replay runs from step 2): 4 prompts x 3 responses a step, 6 a rank
(``ppo_micro_batch_size_per_gpu`` and ``log_prob_micro_batch_size_per_gpu`` 3). The replay runs one
sequence per forward (``mrtpo.replay_micro_batch_size=1``), so a rank's forward count is the number of
its prompt variants. The prompts carry 2-3 constraints each and the variants of a row are its group's
(variance is per group), so the work of a rank depends on which groups' rows it holds. verl lays a batch
out as prompt 1..4, 1..4, ...: with 4 responses a prompt each rank holds two rows of every group and the
work is even by construction (measured: 14 and 14, then 18/18, 10/10, 18/18 forwards); with 3 it holds
two rows of some groups and one of the others, which makes it uneven. ``trainer.balance_batch=False``
keeps that layout (verl's balancing reorders rows to even out the ranks' tokens). The replay then assigns its
own rows to the ranks by their tokens (``pass_driver.balanced_order``, verl's sequence-length balancing) and
reports each rank's tokens and forwards; token balance does not even out forward counts, so the ranks still
differ in work. Each FSDP2 forward all-gathers across both ranks; the run completes only because the ranks
agree on the forward count before the first one (short ranks pad).

Measured on the 2-core machine (other jobs running): 4 steps in 402 s (the first logged at 340 s, most of
it start-up; steps 48, 19, 17, 20 s), peak PSS 13.1 GiB (summed RSS 16.9 GiB); real replay forwards of the
two ranks at steps 2-4: 10/11, 7/8, 11/16 (1, 1 and 5 padding forwards).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from recipe.mrtpo.core.advantage import group_has_variance, smoothstep_beta
from recipe.mrtpo.cpu import launcher
from recipe.mrtpo.cpu.runtime import cpu_overrides

TIMEOUT_S = 1200  # generous: the machine is shared (measured below)
BETA, WARMUP = 0.5, 4
# the CPU overrides declare one logical GPU and one actor rank; two ranks need two of each
TWO_RANKS = {"+ray_kwargs.ray_init.num_gpus=1": "+ray_kwargs.ray_init.num_gpus=2",
             "trainer.n_gpus_per_node=1": "trainer.n_gpus_per_node=2"}


def two_rank_cpu_overrides() -> list[str]:
    base = cpu_overrides()
    assert all(k in base for k in TWO_RANKS), f"the CPU overrides changed: {base}"
    return [TWO_RANKS.get(o, o) for o in base]


@pytest.mark.slow  # the CI tier (.ci/run), past the default suite's 20 minutes (uneven FSDP2 replay: tests/unit/test_replay_distributed.py)
@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 300)
def test_mrtpo_two_actor_ranks_uneven_replay(tiny_task_qwen2_dir, if_train_parquet, tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "cpu_overrides", two_rank_cpu_overrides)  # run_cpu appends these last
    dump_dir = tmp_path / "dumps"
    steps = 4
    ov = [
        *launcher.tiny_run_overrides(tiny_task_qwen2_dir, if_train_parquet, tmp_path, "mrtpo", steps),
        # 4 prompts x 3 responses, 6 a rank: micro-batches that divide a rank's share (later overrides win)
        "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        f"mrtpo.beta={BETA}", f"mrtpo.warmup_steps={WARMUP}", "mrtpo.replay_micro_batch_size=1",
        # rows reach the ranks in group order (verl's balance_batch would even out the ranks' token counts)
        "trainer.balance_batch=False",
        "trainer.save_freq=-1",
        "mrtpo.dump.every_n_steps=1", "mrtpo.dump.max_samples=16", f"mrtpo.dump.dir={dump_dir}",
    ]
    res = launcher.run_cpu("recipe.mrtpo.main_mrtpo", ov, tmp_path / "run", TIMEOUT_S)
    assert not res.timed_out, f"run did not finish within {TIMEOUT_S} s (ranks out of step?):\n{res.tail()}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == list(range(1, steps + 1)), f"steps {sorted(res.steps)}:\n{res.tail()}"
    assert "n_gpus_per_node=2" in res.log_text.splitlines()[0]

    uneven = []  # (fewest, most) real replay forwards of a rank, per replayed step
    for s in range(2, steps + 1):
        m = res.steps[s]
        assert m["mrtpo/beta"] == pytest.approx(smoothstep_beta(s - 1, BETA, WARMUP), abs=1e-6)
        d = torch.load(dump_dir / f"step_{s:06d}.pt", weights_only=False)
        variance = group_has_variance(d["scores"], np.array(d["uid"], dtype=object))
        assert m["mrtpo/pairs_replayed"] == int(variance.sum())
        assert torch.equal(d["replayed"], variance)
        rel = d["relevance"]
        if not variance.any():
            # the random model's samples differ with the CPU's arithmetic: a step whose 4 groups all agree on
            # every reward replays nothing, and must say so (the checks after the loop need one replayed step)
            assert (rel == 0).all() and m.get("mrtpo/replay_forwards_max", 0) == 0, m
            continue
        assert ((rel >= 0) & (rel <= 1)).all() and (rel[~variance] == 0).all() and (rel.sum(-1)[variance] > 0).all()
        assert torch.isfinite(d["advantages"]).all() and (d["advantages"][~d["response_mask"].bool()] == 0).all()
        assert math.isfinite(m["mrtpo/adv_abs_mean"]) and m["mrtpo/adv_max_abs_diff_vs_gdpo"] > 1e-4
        # the replay runs in the old_log_prob step: both ranks' rows map back to the right samples when the
        # fused old_log_probs make the update's PPO ratio 1 up to numerics (one update from those weights, fp32)
        assert m["mrtpo/replay_fused_old_log_prob"] == 1 and m["mrtpo/consistency/fused_rows"] > 0
        assert abs(m["actor/ppo_kl"]) < 1e-4, m["actor/ppo_kl"]
        fmax, fmin, pad = m["mrtpo/replay_forwards_max"], m["mrtpo/replay_forwards_min"], m["mrtpo/replay_padding_forwards"]
        assert pad == fmax - fmin  # two ranks: the short one pads up to the long one
        tmax, tmin = m["mrtpo/replay_tokens_max"], m["mrtpo/replay_tokens_min"]
        # shared prompts: a row's variants share their prefix (the template's header at least), so the replay
        # forwards fewer tokens than its sequences hold, also where a group is split over the ranks, except where the
        # cost model ran every shared forward unshared (counted): on this tiny model attention is a large part of a
        # forward's FLOPs, and a short shared row pays whole 128-token tiles
        ratio = m["mrtpo/replay_tokens_over_existing"]
        assert 0 < tmin <= tmax and 0 < ratio <= 1.0
        assert ratio < 1.0 or m["mrtpo/replay_unshared_by_cost"] > 0, m
        uneven.append((fmin, fmax, tmin, tmax))
    print(f"\n[e2e 2 ranks] wall {res.wall_s:.0f}s, first step at {res.first_step_at_s:.0f}s, peak PSS {res.peak_pss_gib:.1f} GiB "
          f"(RSS {res.peak_rss_gib:.1f}), per-rank replay forwards and tokens (min, max, min, max) by step {uneven}, "
          f"step s {[round(res.steps[s].get('timing_s/step', float('nan'))) for s in sorted(res.steps)]}")
    assert uneven, "nothing varied at steps 2-4: the test data lost its variance"
    assert all(lo > 0 for lo, *_ in uneven), f"a rank replayed nothing although rows were balanced by tokens: {uneven}"
