"""MRTPO's token advantage under TRL's GDPO conventions (``multi_objective_aggregation="normalize_then_sum"``).

Pure torch (no TRL import). Notation as ``recipe/mrtpo/core/advantage.py``: B completions in groups of G
consecutive rows (TRL's layout), K rewards r[i, k] (NaN: absent), token weights w[i, k, t] from
:func:`recipe.mrtpo.core.advantage.relevance_weights` (mean_t w = 1 over valid t; w = 1 everywhere is GDPO).

    1. A[i,k] = (r[i,k] - nanmean_g r_k) / (nanstd_g r_k + 1e-4)              TRL's per-reward group normalisation
                (nanstd: Bessel-corrected over the present values; NaN where r is absent or the group has one value)
    2. s[i]   = nansum_k lambda_k A[i,k];  NaN where every r[i, :] is absent    TRL's weighted sum (``reward_weights``)
    3. mu, sigma = nanmean_i s[i], nanstd_i s[i]                               TRL's batch normalisation, over the
                                                                               whole (gathered) batch
    4. s[i,t] = s[i] + sum_k lambda_k A[i,k] (w[i,k,t] - 1)                    the reward-specific token credit
       adv[i,t] = (s[i,t] - mu) / (sigma + 1e-4);  0 where s[i] is NaN or t is not valid

Step 4 adds to TRL's sum only the reallocation d = w - 1, which has mean_t d = 0: mean_t s[i, t] = s[i], so
mu and sigma are TRL's own (the weights never change the batch statistics, and no other process's weights are
needed), and w = 1 gives TRL's advantage bit for bit (the added term is exactly 0).
"""

from __future__ import annotations

from typing import Optional

import torch

TRL_EPS = 1e-4  # TRL's constant in both normalisations (grpo_trainer.py, normalize_then_sum)


def nanstd(x: torch.Tensor, dim: Optional[int] = None, keepdim: bool = False) -> torch.Tensor:
    """Bessel-corrected std over the non-NaN values (TRL's ``trl.trainer.utils.nanstd``): NaN with fewer than two."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    var = var * torch.where(count > 1, count / (count - 1), torch.full_like(var, float("nan")))
    std = torch.sqrt(var)
    return std if keepdim or dim is None else std.squeeze(dim)


def trl_reward_advantages(scores: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Step 1: A [B, K] from scores [B, K] (NaN absent), groups of ``num_generations`` consecutive rows."""
    B, K = scores.shape
    if num_generations < 1 or B % num_generations:
        raise ValueError(f"{B} completions do not form groups of num_generations={num_generations}")
    grouped = scores.float().view(-1, num_generations, K)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
    return ((grouped - mean) / (std + TRL_EPS)).view(B, K)


def trl_sequence_sums(reward_adv: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """Step 2: s [B] = nansum_k lambda_k A[i,k], NaN where the row has no reward at all (``reward_adv`` [B, K])."""
    s = (reward_adv * reward_weights.to(reward_adv).unsqueeze(0)).nansum(dim=1)
    s[torch.isnan(reward_adv).all(dim=1)] = torch.nan
    return s


def trl_token_advantages(
    scores: torch.Tensor,
    num_generations: int,
    reward_weights: torch.Tensor,
    mask: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    rows: Optional[slice] = None,
) -> torch.Tensor:
    """Steps 1-4: adv [B_rows, T] fp32 (module docstring).

    Args:
        scores: [B, K] every process's scores (TRL gathers them before normalising).
        reward_weights: [K] lambda_k (TRL's ``reward_weights``).
        mask: [B_rows, T] the valid completion tokens of ``rows``.
        weights: [B_rows, K, T] token weights w of ``rows`` (None: uniform, TRL's GDPO).
        rows: this process's rows of the batch (default all).
    """
    adv_k = trl_reward_advantages(scores, num_generations)
    s = trl_sequence_sums(adv_k, reward_weights)
    mu = torch.nanmean(s)
    sigma = nanstd(s) if s.numel() > 1 else torch.zeros_like(mu)
    rows = rows if rows is not None else slice(0, scores.shape[0])
    m = mask.float()
    s_t = s[rows].unsqueeze(-1).expand_as(m).clone()
    if weights is not None:
        lam_a = torch.nan_to_num(adv_k[rows] * reward_weights.to(adv_k).unsqueeze(0), nan=0.0)  # [B_rows, K]
        d = (weights.float() - 1.0) * m.unsqueeze(1)
        s_t = s_t + (lam_a.unsqueeze(-1) * d).sum(dim=1)
    adv = (s_t - mu) / (sigma + TRL_EPS)
    return torch.nan_to_num(adv, nan=0.0) * m
