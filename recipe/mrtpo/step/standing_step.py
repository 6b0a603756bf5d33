"""The standing check's part of the fused old_log_prob step (``MRTPOTrainer._compute_old_log_prob`` on a step with
``StepPlan.standing_check``; docs/fused_pass.md): verl's own old_log_prob of the batch, the same packed otherwise
(the floor), the per-row decision (``core.standing_check``), and what a failed check does: the step trains on
verl's own log-probs and entropy, warned in one line and counted.
"""

from __future__ import annotations

import logging
import os

import torch

from recipe.mrtpo.core.standing_check import FUSED_CHECK_THRESHOLDS, failure_line, standing_check
from recipe.mrtpo.seams import verl_seam

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


def verl_passes(config, batch, actor_rollout_wg, ob: verl_seam.AdvantageBatch, prompts: list) -> tuple:
    """The check's calls of verl's own old_log_prob (its calls write log_probs / entropy; the fused step's entropy
    is written after them): on the batch (log-probs, entropy), then on the rows in reverse order at the floor's
    token budget (``verl_seam.floor_settings``: packed otherwise, what rounding alone reaches). ``prompts``: the
    rows' prompt ids (their lengths, with the responses', bound the floor's budget from below).

    Returns ``(log_probs, entropy, floor log_probs, floor settings)``, [B, T] in the batch's order."""
    lengths = [len(p) + int(r) for p, r in zip(prompts, ob.response_lengths.tolist())]
    log_probs, entropy = verl_seam.verl_old_log_probs(config, batch, actor_rollout_wg, entropy=True)
    floor = verl_seam.floor_settings(config, lengths)
    repacked = verl_seam.verl_old_log_probs(config, batch, actor_rollout_wg, order=list(range(len(batch)))[::-1],
                                            settings=floor)
    return log_probs, entropy, repacked, floor


def dtype_key(config) -> str:
    """``fp32`` for an fp32 actor (``actor.fsdp_config.mixed_precision.param_dtype``), else ``bf16`` (verl's default)."""
    from omegaconf import OmegaConf

    dtype = OmegaConf.select(config, "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", default=None)
    return "fp32" if str(dtype or "bf16") in ("fp32", "float32", "float") else "bf16"


def fused_check_failed(config, fused: torch.Tensor, verl: tuple, response_mask: torch.Tensor, valid: torch.Tensor,
                       metrics: dict, step) -> bool:
    """Log ``mrtpo/consistency/*`` (``core.standing_check``: per row, against the step's floor); a failed check is
    warned in one line and counted (``fused_vs_verl_warning``, ``trained_on_verl_log_probs``: the caller writes
    verl's own log-probs). ``verl``: :func:`verl_passes`' result; ``valid``: [B] bool, verl's padding rows False.
    Returns whether the check failed."""
    key = dtype_key(config)
    log_probs, _, repacked, floor = verl
    m, failed = standing_check(fused, log_probs, repacked, response_mask, valid, FUSED_CHECK_THRESHOLDS[key])
    metrics.update(m)
    if floor:
        metrics["mrtpo/consistency/floor_token_budget"] = floor["max_token_len_per_gpu"]
    if failed:
        logger.warning(failure_line(m, step, key, FUSED_CHECK_THRESHOLDS[key]))
        metrics["mrtpo/consistency/fused_vs_verl_warning"] = 1
        metrics["mrtpo/consistency/trained_on_verl_log_probs"] = 1
    return failed
