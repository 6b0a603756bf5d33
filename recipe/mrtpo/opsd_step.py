"""OPSD's part of the trainer's advantage step (``mrtpo.mode=opsd``, docs/opsd.md), on verl's batch.

After the advantage is written (GDPO's for ``adv_estimator`` gdpo/mrtpo, verl's own for grpo),
:func:`write_opsd_teacher` reads what the teacher pass needs from TransferQueue, runs it on the actor's
workers (``compute_opsd_teacher``, through :func:`recipe.mrtpo.opsd_driver.run_opsd_teacher`), writes
verl's ``teacher_logprobs`` / ``teacher_ids`` back, and puts the loss settings in the batch's
``extra_info`` for the actor update (``worker.update_actor`` installs verl's distillation loss from them).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from recipe.mrtpo import verl_seam
from recipe.mrtpo.opsd_driver import LOSS_SETTINGS_KEY, distillation_loss_settings, run_opsd_teacher, teacher_fields, uses_topk
from recipe.mrtpo.reward_extras import RewardTable, read_reward_table, reward_extras

FIELDS = ["raw_prompt", "prompts", "responses", "old_log_probs", "extra_fields"]


def _list(x) -> list:
    return list(x.tolist()) if hasattr(x, "tolist") else list(x)


def _padded(x, value=0):
    return x.to_padded_tensor(value) if getattr(x, "is_nested", False) else x


def _lengths(x) -> torch.Tensor:
    if getattr(x, "is_nested", False):
        return x.offsets().diff()
    return torch.tensor([len(t) for t in x])


def token_budget(config) -> int:
    """verl's log-prob token budget (``log_prob_max_token_len_per_gpu`` under ``log_prob_use_dynamic_bsz``), as the replay's."""
    rollout = config.actor_rollout_ref.rollout
    return int(rollout.get("log_prob_max_token_len_per_gpu", 0) or 0) if rollout.get("log_prob_use_dynamic_bsz", False) else 0


def verl_loss_group(config) -> Optional[dict]:
    """The composed ``distillation.distillation_loss`` group as a dict (None when absent)."""
    group = config.get("distillation", None)
    group = group.get("distillation_loss", None) if group is not None else None
    return OmegaConf.to_container(group, resolve=True) if group is not None else None


def check_opsd_settings(config) -> None:
    """verl settings OPSD cannot run with, refused with what to change (docs/opsd.md, Limits): the teacher pass
    is the replay's plain module forward (no fused kernels, Ulysses SP 1), verl's top-k loss needs the logits,
    and ``distillation.enabled`` would start verl's teacher servers besides the self-teacher."""
    arr = config.actor_rollout_ref
    if bool(arr.model.get("use_fused_kernels", False)) or bool(arr.actor.get("use_fused_kernels", False)):
        raise ValueError("mrtpo.mode=opsd needs the logits (teacher pass, top-k loss): set actor_rollout_ref.model.use_fused_kernels=False")
    if int(arr.actor.get("ulysses_sequence_parallel_size", 1) or 1) > 1:
        raise ValueError("mrtpo.mode=opsd runs whole sequences through the plain module forward: set actor_rollout_ref.actor.ulysses_sequence_parallel_size=1")
    dist = config.get("distillation", None)
    if dist is not None and bool(dist.get("enabled", False)):
        raise ValueError("mrtpo.mode=opsd is the actor's own teacher: leave distillation.enabled=False (True starts verl's teacher servers)")


def write_opsd_teacher(trainer, batch, metrics: dict, table: Optional[RewardTable] = None):
    """The teacher pass of ``batch`` and its fields in TransferQueue; returns the batch meta for the update."""
    check_opsd_settings(trainer.config)
    cfg = trainer.mrtpo
    d = verl_seam.fetch_fields(batch, FIELDS)
    if table is None:
        extras = reward_extras(_list(d["extra_fields"]))
        table = read_reward_table(extras, np.arange(len(extras)))
    pad_id = int(trainer.tokenizer.pad_token_id or 0)
    resp_lens = _lengths(d["responses"])
    responses = _padded(d["responses"], pad_id).long()
    valid = (torch.arange(responses.shape[1]).unsqueeze(0) < resp_lens.unsqueeze(1)).long()
    old = d.get("old_log_probs", None)
    prompts = [[int(t) for t in _list(p)] for p in (d["prompts"].unbind() if getattr(d["prompts"], "is_nested", False) else d["prompts"])]
    messages = [[dict(x) for x in m] if m is not None and len(m) else None for m in _list(d["raw_prompt"])]

    def dispatch(inputs: dict, settings: dict) -> dict:
        td = TensorDict(inputs, batch_size=[inputs["prompt_lens"].shape[0]])
        tu.assign_non_tensor(td, **settings)
        out = trainer.actor_rollout_wg.compute_opsd_teacher(td)
        return out.get() if hasattr(out, "get") and not isinstance(out, TensorDict) else out

    teacher = run_opsd_teacher(
        cfg, table, messages, responses, valid, prompts, trainer._render, dispatch, trainer._actor_dp_size(),
        temperature=float(trainer.config.actor_rollout_ref.rollout.temperature), pad_id=pad_id,
        token_budget=token_budget(trainer.config), old_log_probs=_padded(old, 0.0) if old is not None else None,
    )
    metrics.update(teacher.metrics)
    fields = teacher_fields(teacher, responses, [len(p) for p in prompts], resp_lens.tolist(), uses_topk(cfg), pad_id)
    out = verl_seam.write_fields(batch, fields)
    extra = getattr(out, "extra_info", None)
    if extra is None:
        extra = out.extra_info = {}
    extra[LOSS_SETTINGS_KEY] = distillation_loss_settings(cfg, verl_loss_group(trainer.config))
    return out
