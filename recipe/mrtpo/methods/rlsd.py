"""RLSD (self-distilled RLVR, ``docs/design.md`` §1.8): GDPO reweighted per token by the P_all / rollout-prompt
log-prob gap, clipped. Its entry, its schedule and its advantage."""

from __future__ import annotations

from dataclasses import replace

from recipe.mrtpo.methods.checks import check_module_forward, check_per_reward_step
from recipe.mrtpo.methods.gdpo import gdpo_advantage
from recipe.mrtpo.methods.types import PASS_KNOBS, STEP_KNOBS, AdvantageInputs, Method, ReplayPass


def rlsd_strength(cfg, step: int) -> float:
    """RLSD's lambda_s (ms-swift's warm-up / decay schedule)."""
    from recipe.mrtpo.core.advantage import rlsd_lambda

    return rlsd_lambda(step, cfg.rlsd_lambda, cfg.rlsd_lambda_warmup_steps, cfg.rlsd_lambda_decay_steps)


def rlsd_advantage(inp: AdvantageInputs):
    """RLSD on GDPO (§1.8): GDPO's per-reward sum reweighted by the P_all / rollout-prompt log-prob gap, then
    batch-whitened as GDPO. Rows without P_all log-probs (not replayed, or P_all is the rollout prompt) keep
    GDPO's advantage exactly (delta = 0)."""
    import torch

    from recipe.mrtpo.core.advantage import masked_whiten, rlsd_reweight

    raw, stats = gdpo_advantage(replace(inp, replay=None, strength=0.0), whiten=False)
    teacher, student = torch.zeros_like(raw), torch.zeros_like(raw)
    rows = 0
    rp, old = inp.replay, inp.old_log_probs
    if rp is not None and rp.replay_logprobs is not None and old is not None:
        for r, i in enumerate(rp.rows):
            if not rp.logprobs_are_rollout_prompt[r]:  # the row's P_all differs from its rollout prompt
                teacher[i], student[i] = rp.replay_logprobs[r].to(raw.device), old[i].float().to(raw.device)
                rows += 1
    cfg = inp.cfg
    adv, weight = rlsd_reweight(raw, inp.mask, teacher, student, inp.strength, cfg.rlsd_reweight_clip_range,
                                cfg.rlsd_negative_only)
    w = weight[(inp.mask > 0) & (raw != 0)]  # the weights that act (valid positions of a non-zero advantage)
    bound = inp.strength * cfg.rlsd_reweight_clip_range  # r lies in [1 - bound, 1 + bound]
    stats.extra.update({
        "mrtpo/rlsd/lambda": inp.strength,
        "mrtpo/rlsd/rows_privileged": rows,
        "mrtpo/rlsd/weight_mean": float(w.mean()) if w.numel() else 1.0,
        "mrtpo/rlsd/weight_min": float(w.min()) if w.numel() else 1.0,
        "mrtpo/rlsd/weight_max": float(w.max()) if w.numel() else 1.0,
        "mrtpo/rlsd/clip_share": float(((w - 1).abs() >= bound - 1e-6).float().mean()) if w.numel() and bound > 0 else 0.0,
    })
    return masked_whiten(adv, inp.mask) * inp.mask, stats


RLSD = Method("rlsd", "RLSD: GDPO reweighted per token by exp(sign(A) (log p(y|P_all) - log p(y|prompt))), clipped (§1.8)",
              "gdpo", mode="rlsd", reads=(*STEP_KNOBS, *PASS_KNOBS, "rlsd_lambda", "rlsd_reweight_clip_range",
                                           "rlsd_lambda_warmup_steps", "rlsd_lambda_decay_steps", "rlsd_negative_only"),
              replay=ReplayPass(joint=True, measure="logprob_contrast", p_all_logprobs=True), strength=rlsd_strength,
              advantage=rlsd_advantage, checks=(check_per_reward_step, check_module_forward))
