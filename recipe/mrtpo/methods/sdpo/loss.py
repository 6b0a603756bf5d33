"""SDPO's loss on the actor: the generalised JSD over the student's top-k plus a tail bucket (docs/opsd.md, SDPO).

The reference (lasgroup/SDPO, ``core_algos.compute_self_distillation_loss`` with its ``actor.yaml`` defaults)
takes, per response token t, the student's top-k ids K_S[t] (k = 100), the student's and the teacher's
log-probs at those ids, one tail bucket each for the rest of the vocabulary, and

    D[t]  = JSD_alpha(T~[t], S~[t])                  (core.divergence.generalized_jsd, alpha = 0.5)
    T~[t] = (log p_T(v|t) for v in K_S[t], log(1 - sum_{v in K_S[t]} p_T(v|t)))      (with_tail_bucket)
    S~[t] = the same for the student
    w[t]  = min(exp(log pi(y_t) - log pi_old(y_t)), is_clip)   (detached; is_clip = 2, null: w = 1)
    rho[t] = min(pi_old(y_t) / pi_rollout(y_t), 2)    (verl's token-level rollout correction, ``rollout_is_weights``,
                                                      where configured: ALGO=sdpo sets it, as SDPO's config; else 1)
    loss  = agg_t rho[t] w[t] D[t]                   (no RL term: the distillation loss replaces the policy loss)
            (+ verl's entropy bonus and KL loss to the reference where configured, as SDPO's dp_actor adds them)

Here the ids K_S[t] are the behaviour policy's (the old policy under the rollout prompt), taken in the
teacher pass before the update (``methods.sdpo.teacher``), and reach the loss as verl's ``teacher_ids``
with the EMA teacher's log-probs at them as ``teacher_logprobs``. Two pieces of verl 0.9.1 carry it:

1. the FSDP engine calls the actor's loss function as a logits processor (``student_logits=``) when the
   micro-batch's ``distillation_use_topk`` is set, and keeps what it returns per token in the model
   output: :func:`sdpo_loss` answers that call with :func:`sdpo_topk_outputs` (verl's own logits processor,
   ``compute_topk_loss``, is hard-wired to the forward KL);
2. the final call goes to verl's ``distillation_ppo_loss`` with ``loss_mode`` :data:`SDPO_LOSS_MODE`,
   registered here in verl's distillation-loss registry (:func:`compute_sdpo_jsd_topk`, the IS weight and
   metrics), ``use_task_rewards`` and ``use_policy_gradient`` off: verl aggregates it over the response
   mask with ``actor.loss_agg_mode`` and adds no policy loss.

The settings alpha, add_tail and is_clip travel as non-tensor entries of the update batch (as verl's own
``distillation_use_topk``), set by SDPO's actor part (``actor.SDPOActorPart``) from the batch's SDPO settings
(``methods.sdpo.LOSS_SETTINGS_KEY``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from verl.trainer.distillation import distillation_ppo_loss
from verl.trainer.distillation.losses import DistillationLossSettings, register_distillation_loss
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import DistillationConfig, DistillationLossConfig
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from recipe.mrtpo.core.divergence import generalized_jsd, renormalise, with_tail_bucket

#: SDPO's loss in verl's distillation-loss registry (a top-k loss: verl runs it as a logits processor)
SDPO_LOSS_MODE = "mrtpo_sdpo_jsd_topk"
#: the non-tensor entries of the update batch the loss reads (``actor.SDPOActorPart`` sets them)
ALPHA, ADD_TAIL, IS_CLIP = "mrtpo_sdpo_alpha", "mrtpo_sdpo_add_tail", "mrtpo_sdpo_is_clip"


def sdpo_token_divergence(student_logp_k: torch.Tensor, teacher_logp_k: torch.Tensor, alpha: float, add_tail: bool = True) -> torch.Tensor:
    """Per token ``D = JSD_alpha(T~, S~)`` over the top-k ids plus a tail bucket (``add_tail``) or over the top-k
    renormalised (``add_tail=False``, SDPO's ``renorm_topk_log_probs``); inputs [..., k] log-probs at the same
    ids, output [...]. Differentiable in the student."""
    support = with_tail_bucket if add_tail else renormalise
    return generalized_jsd(support(teacher_logp_k.float()), support(student_logp_k.float()), float(alpha))


def sdpo_topk_outputs(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, teacher_ids: torch.Tensor,
                      alpha: float, add_tail: bool = True) -> dict[str, torch.Tensor]:
    """The logits processor's per-token outputs, each [1, N] over the micro-batch's packed tokens:

        s[n, j] = log_softmax(z[n])_{K[n, j]}   (the student at the ids K = teacher_ids, z the scaled logits)
        distillation_losses[n] = sdpo_token_divergence(s[n], teacher_logprobs[n])
        student_mass[n] = sum_j exp(s[n, j]),  teacher_mass[n] = sum_j exp(teacher_logprobs[n, j])

    ``student_logits`` [1, N, V]; ``teacher_logprobs`` / ``teacher_ids`` nested [L_i, k] (verl's layout,
    ``methods.opsd.teacher.sequence_teacher_fields``) or dense [1, N, k]. Rows outside the responses carry
    log-prob 0 and the pad id: their (finite) values are dropped by verl's response mask.
    """
    t_lp = teacher_logprobs.values().unsqueeze(0) if teacher_logprobs.is_nested else teacher_logprobs
    ids = teacher_ids.values().unsqueeze(0) if teacher_ids.is_nested else teacher_ids
    if t_lp.shape[:2] != student_logits.shape[:2]:
        raise ValueError(f"SDPO's teacher fields cover {tuple(t_lp.shape[:2])} tokens, the student's logits {tuple(student_logits.shape[:2])}")
    t_lp = t_lp.to(student_logits.device).float()
    ids = ids.to(student_logits.device).long().clamp(0, student_logits.shape[-1] - 1)
    s_lp = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, ids)
    return {
        "distillation_losses": sdpo_token_divergence(s_lp, t_lp, alpha, add_tail),
        "student_mass": s_lp.detach().exp().sum(-1),
        "teacher_mass": t_lp.exp().sum(-1),
    }


def is_weights(log_prob: torch.Tensor, old_log_prob: torch.Tensor, clip) -> torch.Tensor:
    """SDPO's per-token IS weight ``min(exp(clamp(log pi - log pi_old, -20, 20)), clip)``, detached (1 when
    ``clip`` is None or 0)."""
    if not clip:
        return torch.ones_like(log_prob)
    return torch.exp((log_prob - old_log_prob).detach().clamp(-20.0, 20.0)).clamp(max=float(clip))


@register_distillation_loss(DistillationLossSettings(names=[SDPO_LOSS_MODE], use_topk=True))  # type: ignore[arg-type]
def compute_sdpo_jsd_topk(config, distillation_config: DistillationConfig, model_output: dict, data) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's distillation-loss contract: the per-token SDPO loss [B, T] (the logits processor's
    ``distillation_losses`` times the IS weight and verl's rollout-correction weight where the batch carries one:
    verl's ``distillation_loss`` applies that weight only on its policy-gradient path, which SDPO's loss is not) and
    its metrics."""
    losses = no_padding_2_padding(model_output["distillation_losses"], data)
    student_mass = no_padding_2_padding(model_output["student_mass"], data)
    teacher_mass = no_padding_2_padding(model_output["teacher_mass"], data)
    mask = data["response_mask"]
    mask = (mask.to_padded_tensor(0) if mask.is_nested else mask).bool()
    clip = tu.get_non_tensor_data(data=data, key=IS_CLIP, default=None)
    metrics: dict[str, Any] = {
        "distillation/student_mass": Metric(AggregationType.MEAN, student_mass[mask].mean()),
        "distillation/teacher_mass": Metric(AggregationType.MEAN, teacher_mass[mask].mean()),
    }
    if clip:
        log_prob = no_padding_2_padding(model_output["log_probs"], data)
        old = data["old_log_probs"]
        old = old.to_padded_tensor(0.0) if old.is_nested else old
        w = is_weights(log_prob, old, clip)
        metrics["distillation/is_weight"] = Metric(AggregationType.MEAN, w[mask].mean())
        losses = losses * w
    rollout_w = data.get("rollout_is_weights", None)
    if rollout_w is not None:  # verl's rollout correction (ALGO=sdpo: token level, threshold 2), as SDPO weighs its loss
        rollout_w = rollout_w.to_padded_tensor(0.0) if rollout_w.is_nested else rollout_w
        rollout_w = rollout_w.to(losses.device, losses.dtype)
        metrics["distillation/rollout_is_weight"] = Metric(AggregationType.MEAN, rollout_w[mask].mean())
        losses = losses * rollout_w
    return losses, metrics


def sdpo_loss(config, distillation_config: DistillationConfig, model_output: dict = None, data=None, dp_group=None,
              student_logits: torch.Tensor = None, data_format: str = "thd"):
    """The actor's loss function under SDPO: verl's ``distillation_ppo_loss`` contract, with SDPO's logits processor.

    The final loss is SDPO's distillation loss plus, as SDPO's ``dp_actor`` adds them to it, verl's entropy bonus
    (``actor.entropy_coeff``) and KL loss to the reference (``actor.use_kl_loss``): verl's own ``ppo_loss`` on the
    micro-batch with the advantages zeroed (its vanilla policy term is then 0 with no gradient), so those two terms
    are verl's arithmetic exactly.
    """
    if student_logits is not None:
        alpha = float(tu.get_non_tensor_data(data=data, key=ALPHA, default=0.5))
        add_tail = bool(tu.get_non_tensor_data(data=data, key=ADD_TAIL, default=True))
        return sdpo_topk_outputs(student_logits, data["teacher_logprobs"], data["teacher_ids"], alpha, add_tail)
    loss, metrics = distillation_ppo_loss(config, distillation_config, model_output, data, dp_group)
    if getattr(config, "use_kl_loss", False) or float(getattr(config, "entropy_coeff", 0.0) or 0.0) != 0.0:
        plain = data.clone(recurse=False)
        plain.set("advantages", data["advantages"] * 0.0)
        extra, extra_metrics = ppo_loss(config, model_output, plain, dp_group)
        loss = loss + extra
        metrics.update({k: v for k, v in extra_metrics.items() if k in ("actor/entropy_loss", "kl_loss", "kl_coef")})
    return loss, metrics


def sdpo_distillation_config(topk: int) -> DistillationConfig:
    """verl's ``DistillationConfig`` for SDPO: its registered loss alone (no task reward, no policy gradient, no
    clamp: the JSD with alpha in (0, 1) is bounded by log 2 and the reference clamps nothing); ``enabled``
    stays False (no teacher servers)."""
    loss = DistillationLossConfig(loss_mode=SDPO_LOSS_MODE, topk=int(topk), use_task_rewards=False, use_policy_gradient=False,
                                  distillation_loss_coef=1.0, loss_max_clamp=None, log_prob_min_clamp=None)
    return DistillationConfig(enabled=False, distillation_loss=loss)


def sdpo_loss_fn(actor_config, settings: dict):
    """:func:`sdpo_loss` bound as verl's ``init_model`` binds ``distillation_ppo_loss``."""
    return partial(sdpo_loss, config=actor_config, distillation_config=sdpo_distillation_config(int(settings["topk"])))


def batch_settings(settings: dict) -> dict:
    """The non-tensor entries of the update batch for ``settings`` (``methods.sdpo.step.loss_settings``)."""
    return {ALPHA: float(settings["alpha"]), ADD_TAIL: bool(settings["add_tail"]), IS_CLIP: float(settings["is_clip"] or 0.0),
            "distillation_use_topk": True}
