"""verl registration of the ``mrtpo`` advantage estimator (``algorithm.adv_estimator=mrtpo``).

verl 0.9.1 passes a custom estimator only ``token_level_rewards``, ``response_mask``, ``config``
(``config.algorithm``), ``index`` (``uid``) and ``reward_baselines``; only an estimator named ``gdpo``
also receives ``non_tensor_batch`` and ``batch``. The recipe's trainer therefore calls this function
itself with the batch (as verl does for ``gdpo``), plus ``mrtpo_config``: the warmed-up beta and the
recipe's knobs. Per-reward scores arrive in ``non_tensor_batch[SCORES_KEY]`` (one JSON object of
``{reward: score}`` per sample, written by the ``mrtpo`` reward manager) and relevance in
``batch[RELEVANCE_KEY]`` ([B, K, T], reward order ``mrtpo_config["reward_names"]``).
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats

SCORES_KEY = "mrtpo_rewards"  # reward_extra_info: JSON {reward_name: score} per sample
CONTEXTS_KEY = "mrtpo_contexts"  # reward_extra_info: JSON {reward_name: {"text", "placement"}} per sample
RELEVANCE_KEY = "mrtpo_relevance"  # batch tensor [B, K, T] written by the replay


def _parse(obj: Any) -> dict:
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, (bytes, str)):
        return json.loads(obj) if obj else {}
    if obj is None:
        return {}
    raise TypeError(f"per-reward scores must be a JSON object or dict, got {type(obj).__name__}")


def reward_names_of(per_sample: Sequence[Any]) -> list[str]:
    """Sorted union of the reward names over a batch (ragged rewards: each sample has a subset)."""
    names: set[str] = set()
    for s in per_sample:
        names.update(_parse(s).keys())
    return sorted(names)


def scores_matrix(per_sample: Sequence[Any], reward_names: Sequence[str]) -> torch.Tensor:
    """[B, K] float32 scores; NaN where a sample has no such reward."""
    out = torch.full((len(per_sample), len(reward_names)), float("nan"))
    col = {n: j for j, n in enumerate(reward_names)}
    for i, s in enumerate(per_sample):
        for name, v in _parse(s).items():
            if name in col and v is not None:
                out[i, col[name]] = float(v)
    return out


def reward_extras(extra_fields: list) -> list[dict]:
    """Per sample ``reward_extra_info`` dicts from TransferQueue's ``extra_fields``."""
    out = []
    for ef in extra_fields:
        ef = getattr(ef, "data", ef)
        info = ef.get("reward_extra_info", {}) if isinstance(ef, dict) else {}
        out.append(info if isinstance(info, dict) else {})
    return out


def fill_errored_samples(scores: torch.Tensor, errored: list[bool], index) -> torch.Tensor:
    """A sample whose verifier raised scores 0 on every reward its group has (never NaN, never dropped)."""
    if not any(errored):
        return scores
    scores = scores.clone()
    index = np.asarray(index, dtype=object).astype(str)
    present = ~torch.isnan(scores)
    for i, bad in enumerate(errored):
        if not bad:
            continue
        group = torch.as_tensor(index == index[i])
        cols = present[group].any(0)
        scores[i, cols & torch.isnan(scores[i])] = 0.0
    return scores


@register_adv_est("mrtpo")
def compute_mrtpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Optional[np.ndarray] = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Optional[dict] = None,
    batch: Optional[dict] = None,
    mrtpo_config: Optional[dict] = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MRTPO advantage in verl's estimator signature; returns (advantages, returns) like GDPO.

    ``mrtpo_config`` keys: ``beta`` (already warmed up), ``max_realloc_rms``, ``shuffle``,
    ``reward_weighting``, ``reward_weights`` (dict name -> weight, or None), ``reward_names``
    (order of the relevance tensor's K axis), ``seed`` (for the shuffle ablation). The last metrics are
    left in ``mrtpo_config["stats"]`` for the trainer to log.
    """
    if non_tensor_batch is None or SCORES_KEY not in non_tensor_batch or mrtpo_config is None:
        raise ValueError(
            "the 'mrtpo' estimator needs per-reward scores (non_tensor_batch['mrtpo_rewards'] from the "
            "'mrtpo' reward manager) and mrtpo_config: run it through `python -m recipe.mrtpo.main_mrtpo`."
        )
    if not norm_adv_by_std_in_grpo:
        raise ValueError("mrtpo normalises each reward by its group std (GDPO); norm_adv_by_std_in_grpo=False is not supported")
    per_sample = list(non_tensor_batch[SCORES_KEY])
    names = list(mrtpo_config.get("reward_names") or reward_names_of(per_sample))
    scores = scores_matrix(per_sample, names).to(response_mask.device)
    relevance = None if batch is None else batch.get(RELEVANCE_KEY, None)
    rw_cfg = mrtpo_config.get("reward_weights") or {}
    reward_weights = [float(rw_cfg.get(n, 1.0)) for n in names]
    gen = None
    if mrtpo_config.get("shuffle"):
        gen = torch.Generator().manual_seed(int(mrtpo_config.get("seed", 0)))
    adv, stats = compute_mrtpo_advantage_with_stats(
        scores,
        index,
        response_mask,
        relevance,
        beta=float(mrtpo_config.get("beta", 0.0)),
        reward_weights=reward_weights,
        max_realloc_rms=mrtpo_config.get("max_realloc_rms", 1.0),
        epsilon=epsilon,
        shuffle=bool(mrtpo_config.get("shuffle", False)),
        generator=gen,
        reward_weighting=mrtpo_config.get("reward_weighting", "none"),
    )
    mrtpo_config["stats"] = stats
    return adv, adv
