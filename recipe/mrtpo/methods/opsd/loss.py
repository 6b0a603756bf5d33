"""The actor's loss for the self-teachers OPSD and gdpo-distill (docs/opsd.md), on verl 0.9.1's distillation path.

The worker's ``update_actor`` (``recipe.mrtpo.step.worker``) installs the function :func:`opsd_loss_fn` returns in
place of ``ppo_loss`` when the batch carries the settings (``driver.distillation_loss_settings``), exactly as
verl's ``init_model`` binds its loss when distillation is enabled, and sets ``distillation_use_topk`` (the flag
verl's ``_update_actor`` derives from ``distillation.enabled``; the FSDP engine then calls the loss twice per
micro-batch: once as a logits processor with the student's temperature-scaled logits, once on the model outputs).

- **OPSD** (``mrtpo.mode=opsd``, siyan-zhao/OPSD's ``generalized_jsd_loss`` with ``top_k``): the distillation
  loss alone. As the logits processor, per token t, with K_T[t] the teacher's top-k ids (:func:`jsd_topk`):

      log q_T(v) = log p_T(v) - log sum_{u in K_T} p_T(u)        (teacher, renormalised over K_T; no gradient)
      log q_S(v) = z_S(v) - log sum_{u in K_T} exp z_S(u)        (student, renormalised over K_T: the same as
                                                                  its log-softmax over V renormalised)
      D[t]       = JSD_beta(q_T, q_S)                             (core.divergence.generalized_jsd)

  then verl's own ``distillation_ppo_loss`` aggregates D with the actor's ``loss_agg_mode`` and, with
  ``use_task_rewards=False`` and ``use_policy_gradient=False``, adds no policy loss: loss = agg_t D[t]. The
  per-token losses reach it through a distillation loss registered in verl's registry
  (:data:`JSD_TOPK_LOSS_MODE`), as verl's own ``forward_kl_topk`` reads what its logits processor computed.
- **gdpo-distill** (``mrtpo.mode=gdpo-distill``): verl's ``distillation_ppo_loss`` unchanged, with
  ``use_task_rewards=True``: GDPO's policy loss + c x verl's top-k forward KL (or a single-sample estimator).

Both pin ``use_policy_gradient=False`` (the driver's settings; verl's dataclass default is True): the
divergence is a loss backpropagated directly, never a reward.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Optional

import torch
from verl.trainer.distillation import distillation_ppo_loss
from verl.trainer.distillation.losses import (
    DISTILLATION_LOSS_REGISTRY,
    DistillationLossSettings,
    get_distillation_loss_settings,
    register_distillation_loss,
)
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import DistillationConfig, DistillationLossConfig
from verl.workers.utils.padding import no_padding_2_padding

from recipe.mrtpo.core.divergence import generalized_jsd, renormalise
from recipe.mrtpo.methods.opsd.driver import BETA_KEY, JSD_TOPK_LOSS_MODE

#: positions whose fp32 [chunk, V] logsumexp is formed at once for the student-mass metric (no gradient)
MASS_CHUNK = 4096


def jsd_topk(student_logits: torch.Tensor, teacher_topk_logprobs: torch.Tensor, teacher_topk_ids: torch.Tensor,
             beta: float) -> dict[str, torch.Tensor]:
    """Per position JSD_beta between the teacher and the student, both renormalised over the teacher's top-k.

    ``student_logits`` [N, V] (temperature-scaled, with gradient), ``teacher_topk_logprobs`` / ``teacher_topk_ids``
    [N, k] (log p_T over the whole vocabulary at those ids). Returns ``distillation_losses`` [N] and, without
    gradient, ``student_mass`` / ``teacher_mass`` [N]: the probability each gives the top-k before renormalising.
    """
    ids = teacher_topk_ids.long()
    z_k = student_logits.gather(-1, ids).float()  # log_softmax(z) at K_T up to one constant per row: renormalise drops it
    lq_s = renormalise(z_k)
    lq_t = renormalise(teacher_topk_logprobs.detach().float())
    out = {"distillation_losses": generalized_jsd(lq_t, lq_s, beta)}
    with torch.no_grad():
        n = student_logits.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=student_logits.device)
        for s in range(0, n, MASS_CHUNK):
            lse[s : s + MASS_CHUNK] = torch.logsumexp(student_logits[s : s + MASS_CHUNK].detach().float(), dim=-1)
        out["student_mass"] = (z_k.detach() - lse.unsqueeze(-1)).exp().sum(-1)
        out["teacher_mass"] = teacher_topk_logprobs.detach().float().exp().sum(-1)
    return out


def jsd_topk_logits_processor(student_logits: torch.Tensor, data, beta: float) -> dict[str, torch.Tensor]:
    """OPSD's loss as verl's FSDP engine calls a top-k loss (``prepare_model_outputs``): ``student_logits`` [1,
    total_nnz, V] over the micro-batch's packed sequences, the teacher fields nested [L_i, k] in verl's sequence
    layout (row j: the distribution of token j + 1). Returns each output [1, total_nnz], as verl's
    ``fsdp.losses.compute_forward_kl_topk`` (no Ulysses slicing: OPSD refuses sequence parallelism)."""
    lp, ids = data["teacher_logprobs"], data["teacher_ids"]
    if not (lp.is_nested and ids.is_nested):
        raise ValueError("OPSD's loss reads teacher_logprobs / teacher_ids as nested tensors (verl's layout)")
    lp, ids = lp.values(), ids.values()
    if lp.shape[0] != student_logits.shape[1]:
        raise ValueError(f"OPSD's loss: {lp.shape[0]} teacher rows for {student_logits.shape[1]} student positions "
                         "(sequence parallelism or packing padding, which OPSD does not run with)")
    out = jsd_topk(student_logits[0], lp, ids, beta)
    return {k: v.unsqueeze(0) for k, v in out.items()}


def jsd_topk_losses(config, distillation_config, model_output: dict, data) -> tuple[torch.Tensor, dict]:
    """OPSD's entry in verl's distillation loss registry (:data:`JSD_TOPK_LOSS_MODE`): the per-token JSD the logits
    processor computed, padded as verl's losses return theirs ([bsz, resp_len]), and the top-k masses as metrics
    (verl's ``distillation/student_mass``, ``teacher_mass`` names)."""
    losses = no_padding_2_padding(model_output["distillation_losses"], data)
    student = no_padding_2_padding(model_output["student_mass"], data)
    teacher = no_padding_2_padding(model_output["teacher_mass"], data)
    mask = data["response_mask"]
    mask = (mask.to_padded_tensor(0) if mask.is_nested else mask).bool()
    metrics = {
        "distillation/student_mass": student[mask].mean().item(),
        "distillation/teacher_mass": teacher[mask].mean().item(),
        "distillation/teacher_mass_min": Metric(AggregationType.MIN, teacher[mask].min()),
    }
    return losses, metrics


if JSD_TOPK_LOSS_MODE not in DISTILLATION_LOSS_REGISTRY:  # once per process (verl refuses a second registration)
    register_distillation_loss(DistillationLossSettings(names=[JSD_TOPK_LOSS_MODE], use_topk=True))(jsd_topk_losses)


def opsd_jsd_loss(config, distillation_config: DistillationConfig, beta: float, model_output: Optional[dict] = None,
                  data=None, dp_group=None, student_logits: Optional[torch.Tensor] = None, data_format: str = "thd"):
    """``distillation_ppo_loss``'s two calls with OPSD's logits processor: with ``student_logits`` the per-token
    JSD (:func:`jsd_topk_logits_processor`); else verl's own final loss (aggregation, no policy loss)."""
    if student_logits is not None:
        return jsd_topk_logits_processor(student_logits, data, beta)
    return distillation_ppo_loss(config, distillation_config, model_output, data, dp_group)


def build_distillation_config(settings: dict) -> DistillationConfig:
    """verl's ``DistillationConfig`` for the actor's loss; ``enabled`` stays False (no teacher servers)."""
    verl = {k: v for k, v in dict(settings).items() if k != BETA_KEY}
    return DistillationConfig(enabled=False, distillation_loss=DistillationLossConfig(**verl))


def opsd_loss_fn(actor_config, settings: dict):
    """The actor's loss bound as ``ActorRolloutRefWorker.init_model`` binds verl's: OPSD's JSD when the settings
    name :data:`JSD_TOPK_LOSS_MODE`, else verl's ``distillation_ppo_loss`` itself (gdpo-distill)."""
    dist = build_distillation_config(settings)
    if settings["loss_mode"] == JSD_TOPK_LOSS_MODE:
        return partial(opsd_jsd_loss, config=actor_config, distillation_config=dist, beta=float(settings[BETA_KEY]))
    return partial(distillation_ppo_loss, config=actor_config, distillation_config=dist)


def uses_topk_logits(settings: dict) -> bool:
    """Whether the loss runs as a logits processor (verl's registry entry's ``use_topk``): the engine's
    ``distillation_use_topk`` flag for the update."""
    return bool(get_distillation_loss_settings(settings["loss_mode"]).use_topk)


def settings_key(settings: dict) -> str:
    """A stable key of the settings (the installed loss is rebuilt only when they change)."""
    return json.dumps(dict(settings), sort_keys=True, default=str)
