"""The MRTPO token advantage (docs/design.md §1.1, §1.3-1.6). Pure torch/numpy.

Notation: B samples (N prompts x n rollouts), group g(i) = samples sharing a prompt (``index``, verl's
``uid``), K rewards with scores r[i, k] (NaN where reward k does not exist for sample i), T response
positions with ``response_mask`` marking the valid ones, relevance q[i, k, t] from the replay.

    1. A[i,k]   = (r[i,k] - mean_g r_k) / (std_g r_k + eps)          per reward, within the group
                  (verl's ``compute_grpo_outcome_advantage``: unbiased std; a group of one sample has
                  mean 0 and std 1; a group without variance in r_k gets A = 0; absent rewards 0)
    3. qbar     = mean_t q[i,k,t]                                     over valid t
       w[i,k,t] = (1 - beta_s) + beta_s * q[i,k,t] / qbar            so mean_t w = 1
                  (uniform w = 1 if qbar < floor)
    4. beta_s   = beta * smoothstep(min(s / warmup_steps, 1)),  smoothstep(x) = x^2 (3 - 2x)
    5. d = w - 1;  if mean_t d^2 > rho^2:  d *= rho / sqrt(mean_t d^2)   (keeps mean_t w = 1, w > 0)
   5b. optional, off by default (a departure, docs/design.md §1.5): d_t+ = min(d_t, c - 1) on the positive
       part, the negative part scaled by sum d+ / sum |d-|, so that w_t <= c and mean_t w = 1 still hold
    6. adv[i,t] = whiten_batch( sum_k lambda_k A[i,k] w[i,k,t] )        (verl's masked_whiten)

beta = 0 or uniform q is verl's GDPO exactly; K = 1 and beta = 0 is GRPO up to the final whitening.
Response-level reward weights lambda_k compose with the token weights: fixed (``reward_weights``),
SAW (batch coefficient of variation of r_k) or DVAO (mean in-group variance of r_k), see
:func:`response_level_weights`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

QBAR_FLOOR = 1e-6
REWARD_WEIGHTINGS = ("none", "saw", "dvao")


# ----------------------------------------------------------------------------------------------
# Step 4: warm-up
# ----------------------------------------------------------------------------------------------
def smoothstep_beta(step: int, beta: float, warmup_steps: int) -> float:
    """beta_s = beta * smoothstep(min(s / warmup_steps, 1)), smoothstep(x) = x^2 (3 - 2x).

    ``step`` is the number of completed training steps before this one (0 at the first step, which is
    therefore plain GDPO). ``warmup_steps <= 0`` disables the warm-up (beta_s = beta from the start).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps <= 0:
        return float(beta)
    x = min(step / warmup_steps, 1.0)
    return float(beta) * x * x * (3.0 - 2.0 * x)


# ----------------------------------------------------------------------------------------------
# Steps 3 and 5: relevance weights
# ----------------------------------------------------------------------------------------------
def cap_token_weight(d: torch.Tensor, mask: torch.Tensor, max_token_weight: float) -> torch.Tensor:
    """Step 5b (a departure from the paper, off by default; docs/design.md §1.5): cap one token's weight at c.

        d+_t = min(max(d_t, 0), c - 1);   d-_t = min(d_t, 0) * (sum_t d+_t / sum_t |min(d_t, 0)|)
        d'_t = d+_t + d-_t                                            w_t = 1 + d'_t <= c

    Why: the RMS constraint bounds the reallocated part on average only, so a nearly one-hot q can put it all on one
    token (w_max = 1 + rho sqrt(T - 1)). The cap clips the positive part and shrinks the negative part by the same
    mass, so sum_t d' = 0 (mean_t w = 1) still holds, each |d'_t| <= |d_t| (w >= 1 - beta and RMS(d') <= rho still
    hold) and the order of the weights is kept. ``d`` and ``mask`` are [..., T]; c >= 1 (c = 1: uniform weights).
    """
    if max_token_weight < 1.0:
        raise ValueError(f"max_token_weight must be >= 1 or None, got {max_token_weight}")
    m = mask.to(d.dtype)
    pos = d.clamp(min=0.0) * m
    neg = d.clamp(max=0.0) * m
    pos_c = pos.clamp(max=float(max_token_weight) - 1.0)
    neg_mass = -neg.sum(-1, keepdim=True)
    scale = torch.where(neg_mass > 0, pos_c.sum(-1, keepdim=True) / neg_mass.clamp(min=1e-30), torch.zeros_like(neg_mass))
    return pos_c + neg * scale


def relevance_weights(
    q: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    max_realloc_rms: Optional[float],
    qbar_floor: float = QBAR_FLOOR,
    max_token_weight: Optional[float] = None,
) -> torch.Tensor:
    """Relevance-normalised token weights of one reward, [B, T] (docs/design.md §1.3 and §1.5).

        qbar = mean_t q_t (valid t);   w_t = (1 - beta) + beta * q_t / qbar
        d_t = w_t - 1;  if mean_t d_t^2 > rho^2:  d_t *= rho / sqrt(mean_t d_t^2);   w_t = 1 + d_t

    Rows whose qbar is below ``qbar_floor`` (no replay, identical prompts, no valid token) get w = 1.
    Masked positions get w = 0. ``max_realloc_rms=None`` disables the second-moment constraint.
    ``max_token_weight`` = c applies :func:`cap_token_weight` after it (None, the default: no cap).
    Guarantees on valid positions: mean_t w = 1, w >= 1 - beta > 0 for beta < 1, RMS(w - 1) <= rho, w <= c.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if max_realloc_rms is not None and max_realloc_rms < 0:
        raise ValueError(f"max_realloc_rms must be >= 0 or None, got {max_realloc_rms}")
    m = mask.to(torch.float32)
    q = torch.nan_to_num(q.to(torch.float32), nan=0.0, posinf=0.0, neginf=0.0).clamp(min=0.0) * m
    n = m.sum(-1, keepdim=True)
    qbar = q.sum(-1, keepdim=True) / n.clamp(min=1.0)
    ok = (qbar >= qbar_floor) & (n > 0)
    d = beta * (q / qbar.clamp(min=qbar_floor) - 1.0) * m
    if max_realloc_rms is not None:
        ms = (d * d).sum(-1, keepdim=True) / n.clamp(min=1.0)
        rho2 = float(max_realloc_rms) ** 2
        scale = torch.where(ms > rho2, (rho2 / ms.clamp(min=1e-30)).sqrt(), torch.ones_like(ms))
        d = d * scale
    if max_token_weight is not None:
        d = cap_token_weight(d, m, max_token_weight)
    d = torch.where(ok, d, torch.zeros_like(d))
    return (1.0 + d) * m


def shuffle_within_mask(q: torch.Tensor, mask: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """The paper's control: permute q[..., t] over the valid positions of each row, independently.

    Works on [B, T] or [B, K, T]; masked positions keep their value (0 from the replay).
    """
    out = q.clone()
    flat_q = out.reshape(-1, q.shape[-1])
    flat_m = mask.bool()
    if q.dim() == 3:
        flat_m = flat_m.unsqueeze(1).expand(-1, q.shape[1], -1)
    flat_m = flat_m.reshape(-1, q.shape[-1])
    for r in range(flat_q.shape[0]):
        pos = flat_m[r].nonzero(as_tuple=False).squeeze(-1)
        if pos.numel() > 1:
            perm = torch.randperm(pos.numel(), generator=generator, device="cpu").to(pos.device)
            flat_q[r, pos] = flat_q[r, pos[perm]]
    return flat_q.view_as(q)


# ----------------------------------------------------------------------------------------------
# Step 1: per-reward group advantage
# ----------------------------------------------------------------------------------------------
def _group_ids(index) -> np.ndarray:
    """Map any per-sample group labels (uids: str, int, object) to dense int ids."""
    _, inv = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
    return inv.reshape(-1)


def group_normalized_scores(scores: torch.Tensor, index, epsilon: float = 1e-6) -> torch.Tensor:
    """A[i, k] = (r[i,k] - mean_g r_k) / (std_g r_k + eps) per reward column; [B, K] fp32.

    Conventions of verl 0.9.1's ``compute_grpo_outcome_advantage`` (so beta = 0 is its GDPO):
    ``torch.std`` (unbiased) over the group; a group with a single (present) sample has mean 0 and
    std 1. Added: a group whose present scores are all equal gets exactly 0 (verl gives 0 up to
    rounding of the mean), and NaN (absent) scores give 0 and are left out of their group's stats.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, K], got {tuple(scores.shape)}")
    scores = scores.to(torch.float32)
    B, K = scores.shape
    gid = _group_ids(index)
    if gid.shape[0] != B:
        raise ValueError(f"index has {gid.shape[0]} entries for {B} samples")
    out = torch.zeros_like(scores)
    for g in np.unique(gid):
        rows = torch.as_tensor(np.nonzero(gid == g)[0], device=scores.device)
        block = scores.index_select(0, rows)  # [n_g, K]
        for k in range(K):
            col = block[:, k]
            present = ~torch.isnan(col)
            vals = col[present]
            if vals.numel() == 0:
                continue
            if vals.numel() == 1:
                adv = (vals - 0.0) / (1.0 + epsilon)
            elif bool((vals == vals[0]).all()):
                adv = torch.zeros_like(vals)
            else:
                adv = (vals - vals.mean()) / (vals.std() + epsilon)
            out[rows[present], k] = adv
    return out


def group_has_variance(scores: torch.Tensor, index) -> torch.Tensor:
    """[B, K] bool: True where sample i's group has more than one distinct present value of r_k.

    This is the replay rule: only these (i, k) pairs are replayed; all others have A[i, k] = 0
    (or are single-sample groups, whose advantage does not depend on any token weighting choice).
    """
    B, K = scores.shape
    gid = _group_ids(index)
    out = torch.zeros(B, K, dtype=torch.bool)
    s = scores.detach().to(torch.float32).cpu()
    for g in np.unique(gid):
        rows = torch.as_tensor(np.nonzero(gid == g)[0])
        block = s.index_select(0, rows)
        for k in range(K):
            col = block[:, k]
            vals = col[~torch.isnan(col)]
            if vals.numel() > 1 and not bool((vals == vals[0]).all()):
                out[rows[~torch.isnan(col)], k] = True
    return out


# ----------------------------------------------------------------------------------------------
# Response-level reward weights (SAW, DVAO)
# ----------------------------------------------------------------------------------------------
def response_level_weights(
    scores: torch.Tensor, index, method: str = "none", eps: float = 1e-8, valid: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """lambda_k per reward, [K], normalised to mean 1 over the rewards present in the batch.

    - ``none``: 1 for every reward.
    - ``saw``:  s_k = std_batch(r_k) / (|mean_batch(r_k)| + eps)   (coefficient of variation).
    - ``dvao``: s_k = mean over groups of the in-group (population) variance of r_k.
    lambda_k = K' * s_k / sum_j s_j over the K' rewards present; if every s_k is 0 the weights are 1.
    A reward absent from the whole batch gets lambda_k = 0 (it contributes nothing anyway).
    ``valid`` ([B] bool) leaves rows out of every statistic: verl's padding rows (copies of a real sample
    that pad the batch to a multiple of the data-parallel size) must not count twice.
    """
    if method not in REWARD_WEIGHTINGS:
        raise ValueError(f"reward weighting must be one of {REWARD_WEIGHTINGS}, got {method!r}")
    s = scores.to(torch.float32)
    if valid is not None:
        keep = torch.as_tensor(valid, dtype=torch.bool).cpu().reshape(-1)
        if keep.numel() != s.shape[0]:
            raise ValueError(f"valid has {keep.numel()} entries for {s.shape[0]} samples")
        s = s[keep.to(s.device)]
        index = np.asarray(index, dtype=object)[keep.numpy()]
    K = s.shape[1]
    present = ~torch.isnan(s).all(0)
    if method == "none":
        return present.to(torch.float32)
    stat = torch.zeros(K)
    for k in range(K):
        col = s[:, k]
        ok = ~torch.isnan(col)
        if not ok.any():
            continue
        v = col[ok]
        if method == "saw":
            stat[k] = v.std(unbiased=False) / (v.mean().abs() + eps) if v.numel() > 1 else 0.0
        else:
            gid = _group_ids(np.asarray(index, dtype=object)[ok.numpy()])
            per_group = [v[torch.as_tensor(gid == g)].var(unbiased=False) for g in np.unique(gid)]
            stat[k] = torch.stack(per_group).mean()
    n_present = int(present.sum())
    total = float(stat[present].sum())
    if n_present == 0 or total <= 0:
        return present.to(torch.float32)
    return torch.where(present, stat * n_present / total, torch.zeros_like(stat))


# ----------------------------------------------------------------------------------------------
# Step 6: the token advantage
# ----------------------------------------------------------------------------------------------
def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's ``masked_whiten`` (shift_mean=True): (x - mean) * rsqrt(var_unbiased + 1e-8) over mask."""
    m = mask.to(values.dtype)
    n = m.sum()
    if n < 2:
        raise ValueError("batch whitening needs at least two valid tokens")
    mean = (values * m).sum() / (n + 1e-8)
    var = (((values - mean) ** 2) * m).sum() / (n + 1e-8) * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


@dataclass
class AdvantageStats:
    """Diagnostics of one advantage computation (logged by the trainer as ``mrtpo/*`` metrics)."""

    beta: float = 0.0
    reward_weights: list = field(default_factory=list)
    weight_max: float = 1.0
    weight_min: float = 1.0
    uniform_pairs: int = 0  # weighted pairs (A != 0) that fell back to uniform weights (qbar < floor)
    weighted_pairs: int = 0  # pairs (A != 0) whose weights were not uniform
    extra: dict = field(default_factory=dict)  # a method's own diagnostics (``mrtpo/...`` metric -> value)


def compute_mrtpo_advantage_with_stats(
    scores: torch.Tensor,
    index,
    response_mask: torch.Tensor,
    relevance: Optional[torch.Tensor],
    beta: float,
    max_realloc_rms: Optional[float],
    reward_weights: Optional[Sequence[float]] = None,
    epsilon: float = 1e-6,
    shuffle: bool = False,
    generator: Optional[torch.Generator] = None,
    reward_weighting: str = "none",
    whiten: bool = True,
    valid: Optional[torch.Tensor] = None,
    max_token_weight: Optional[float] = None,
) -> tuple[torch.Tensor, AdvantageStats]:
    """MRTPO token advantages [B, T] (§1.1, 1.3, 1.5, 1.6; the module docstring) and an :class:`AdvantageStats`.

    Args:
        scores: [B, K] per-reward scores, NaN where reward k is absent for sample i (ragged rewards).
        index: [B] group ids (verl's ``uid``).
        response_mask: [B, T] valid response tokens.
        relevance: [B, K, T] replay measure q (0 where not replayed), or None: no replay, i.e. GDPO.
        beta: the (already warmed-up) reallocation strength beta_s in [0, 1].
        max_realloc_rms: rho of the second-moment constraint; None disables it.
        reward_weights: fixed lambda_k (default 1), multiplied with the response-level weighting.
        epsilon: the group std epsilon (verl's default 1e-6).
        shuffle: the ablation: permute q over each sample's valid positions before weighting.
        generator: torch.Generator for the shuffle.
        reward_weighting: ``none`` | ``saw`` | ``dvao`` response-level weights (composes with the above).
        whiten: batch-whiten the result (verl's masked_whiten); False returns sum_k lambda_k A_k w_k.
        valid: [B] bool (default all): rows left out of the response-level weighting's statistics
            (:func:`response_level_weights`; verl's padding rows).
        max_token_weight: c, the cap on one token's weight (:func:`cap_token_weight`); None (default) disables it.

    Returns:
        [B, T] advantages (batch-whitened over valid tokens unless ``whiten=False``, 0 on padding) and the stats.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, K], got {tuple(scores.shape)}")
    B, K = scores.shape
    mask = response_mask.to(torch.float32)
    if mask.shape[0] != B:
        raise ValueError(f"response_mask has {mask.shape[0]} rows for {B} samples")
    if relevance is not None and relevance.shape != (B, K, mask.shape[1]):
        raise ValueError(f"relevance must be [B, K, T] = {(B, K, mask.shape[1])}, got {tuple(relevance.shape)}")

    adv_k = group_normalized_scores(scores, index, epsilon).to(mask.device)  # [B, K]
    lam = response_level_weights(scores, index, reward_weighting, valid=valid).to(mask.device)
    if reward_weights is not None:
        rw = torch.as_tensor(list(reward_weights), dtype=torch.float32, device=mask.device)
        if rw.numel() != K:
            raise ValueError(f"reward_weights has {rw.numel()} entries for {K} rewards")
        lam = lam * rw
    stats = AdvantageStats(beta=float(beta), reward_weights=[float(x) for x in lam])

    token_adv = torch.zeros_like(mask)
    use_q = relevance is not None and beta > 0
    if use_q:
        q = relevance.to(torch.float32).to(mask.device)
        if shuffle:
            q = shuffle_within_mask(q, mask, generator)
    wmax, wmin = 1.0, 1.0
    for k in range(K):
        a = (lam[k] * adv_k[:, k]).unsqueeze(-1)  # [B, 1]
        if use_q:
            w = relevance_weights(q[:, k], mask, beta, max_realloc_rms, max_token_weight=max_token_weight)
            active = (adv_k[:, k] != 0) & (mask.sum(-1) > 0)  # a row without valid tokens has no weights to count
            if active.any():
                wa = w[active]
                ma = mask[active] > 0
                uniform = ((wa - 1.0).abs() * ma).amax(-1) == 0
                stats.uniform_pairs += int(uniform.sum())
                stats.weighted_pairs += int((~uniform).sum())
                wmax = max(wmax, float(wa[ma].max())) if ma.any() else wmax
                wmin = min(wmin, float(wa[ma].min())) if ma.any() else wmin
            token_adv = token_adv + a * w
        else:
            token_adv = token_adv + a * mask
    stats.weight_max, stats.weight_min = wmax, wmin
    if not whiten:
        return token_adv, stats
    return masked_whiten(token_adv, mask) * mask, stats


# ----------------------------------------------------------------------------------------------
# RLSD: token weights from the policy's own privileged-context log-probs (docs/design.md §1.8)
# ----------------------------------------------------------------------------------------------
def top_token_share(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: s_i = max_t A_{i,t}^2 / sum_t A_{i,t}^2 over response i's valid tokens (mask > 0); NaN where the sum is 0.

    How much of a response's squared advantage (its share of the update's size) one token carries: 1 / L_i when
    every token has the same advantage (GRPO, GDPO), up to 1 when one token carries all of it (MRTPO with q nearly
    one-hot: w_max = 1 + rho sqrt(T - 1))."""
    sq = adv.float().pow(2) * (mask > 0)
    total = sq.sum(-1)
    return torch.where(total > 0, sq.amax(-1) / total.clamp(min=torch.finfo(torch.float32).tiny), torch.nan)


def rlsd_lambda(step: int, lam: float, warmup_steps: int = 0, decay_steps: int = 0) -> float:
    """lambda_s of RLSD at ``step`` completed steps (ms-swift's schedule):

        lambda * s / warmup                      for s < warmup  (warmup > 0)
        lambda * max(1 - (s - warmup) / decay, 0)  for s >= warmup (decay > 0)
        lambda                                   otherwise
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps > 0 and step < warmup_steps:
        return float(lam) * step / warmup_steps
    if decay_steps > 0 and step >= warmup_steps:
        return float(lam) * max(1.0 - (step - warmup_steps) / decay_steps, 0.0)
    return float(lam)


def rlsd_reweight(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    student_logprobs: torch.Tensor,
    lam: float,
    clip_range: float,
    negative_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLSD's token-level reweighting of an advantage (arXiv 2604.03128; ms-swift ``--advantage_reweight rlsd``).

        delta_t = log p(y_t | P_all) - log p(y_t | rollout prompt)          (no gradient)
        w_t     = exp(sign(A_t) * delta_t)
        r_t     = (1 - lambda) + lambda * clip(w_t, 1 - eps, 1 + eps)      eps = ``clip_range``
        A'_t    = A_t * r_t                                                  (r_t > 0: never flips A's sign)

    ``negative_only``: rows whose advantage is negative are reweighted, the others keep r = 1. A position
    with delta = 0 (P_all is the rollout prompt, or no P_all log-probs: pass equal tensors) keeps r = 1.

    Shapes: ``advantages``, ``response_mask``, ``teacher_logprobs``, ``student_logprobs`` [B, T] (the
    advantage may vary over t; ms-swift's is one value per sequence, broadcast). Returns (A' [B, T] masked,
    r [B, T] with 1 at masked positions).
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    if clip_range < 0:
        raise ValueError(f"clip_range must be >= 0, got {clip_range}")
    m = response_mask.to(torch.float32)
    adv = advantages.to(torch.float32)
    delta = (teacher_logprobs.detach().float() - student_logprobs.detach().float()) * m
    w = torch.exp(torch.sign(adv) * delta)
    r = (1.0 - lam) + lam * w.clamp(min=1.0 - clip_range, max=1.0 + clip_range)
    if negative_only:
        neg = ((adv * m).sum(-1, keepdim=True) < 0).float()  # the row's direction (one value per sequence in GDPO)
        r = neg * r + (1.0 - neg)
    r = torch.where(m > 0, r, torch.ones_like(r))
    return adv * r * m, r
