"""GRPO (verl's own step) and GDPO (the recipe's per-reward advantage step, no replay)."""

from __future__ import annotations

from recipe.mrtpo.methods.checks import check_per_reward_step
from recipe.mrtpo.methods.types import STEP_KNOBS, AdvantageInputs, Method


def gdpo_advantage(inp: AdvantageInputs, whiten: bool = True):
    """The per-reward group-normalised advantage (§1.1, §1.6), token weights from the replay where it ran."""
    import torch

    from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats

    cfg, replay = inp.cfg, inp.replay
    gen = torch.Generator().manual_seed(cfg.seed * 100003 + inp.step) if cfg.shuffle else None
    return compute_mrtpo_advantage_with_stats(
        inp.table.scores, inp.index, inp.mask, replay.relevance if replay is not None else None,
        beta=inp.strength if replay is not None else 0.0,
        reward_weights=[cfg.reward_weight(n) for n in inp.table.names], max_realloc_rms=cfg.max_realloc_rms,
        max_token_weight=cfg.max_token_weight,
        shuffle=cfg.shuffle, generator=gen, reward_weighting=cfg.reward_weighting, valid=inp.valid, whiten=whiten,
    )


GRPO = Method("grpo", "verl's GRPO on one scalar reward, the mean of the sample's rewards (the reward manager's reward_score), "
              "verl's estimator step unchanged", "grpo")
GDPO = Method("gdpo", "GDPO: each reward normalised in its group, summed, batch-whitened; no replay", "gdpo",
              reads=STEP_KNOBS, advantage=gdpo_advantage, checks=(check_per_reward_step,))
