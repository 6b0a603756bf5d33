"""The self-teachers' part of the trainer's advantage step (``mrtpo.mode=opsd`` or ``gdpo-distill``, docs/opsd.md).

Both entries (:mod:`recipe.mrtpo.methods.opsd`) name :func:`write_opsd_teacher` as their after-step hook: after
GDPO's advantage is written, it takes the step's inputs from its :class:`~recipe.mrtpo.methods.types.StepContext`
(the reward table, the prompts, the renderer, the worker groups), fetches the responses and verl's old
log-probs from TransferQueue, runs the teacher pass (:func:`recipe.mrtpo.methods.opsd.driver.run_opsd_teacher`:
OPSD's on verl's reference worker, the frozen initial policy, ``compute_ref_opsd_teacher``; gdpo-distill's on the
actor's workers, the live policy, ``compute_opsd_teacher``), writes verl's ``teacher_logprobs`` / ``teacher_ids``
back, and puts the loss settings in the batch's ``extra_info`` for the actor update (``worker.update_actor``
installs the method's loss from them).
"""

from __future__ import annotations

from typing import Optional

import torch
from omegaconf import OmegaConf

from recipe.mrtpo.methods.opsd.driver import (
    LOSS_SETTINGS_KEY,
    distillation_loss_settings,
    frozen_teacher,
    run_opsd_teacher,
    teacher_fields,
    uses_topk,
)
from recipe.mrtpo.methods.types import StepContext
from recipe.mrtpo.passes.pass_driver import PassRequest, dispatch_rows, token_budget
from recipe.mrtpo.seams import verl_seam

#: what the teacher pass reads of the batch (the step's own fetch, ``StepContext.fields``, brings the first three)
FIELDS = ["raw_prompt", "prompts", "extra_fields", "responses", "old_log_probs"]


def _list(x) -> list:
    return list(x.tolist()) if hasattr(x, "tolist") else list(x)


def _padded(x, value=0):
    return x.to_padded_tensor(value) if getattr(x, "is_nested", False) else x


def _lengths(x) -> torch.Tensor:
    if getattr(x, "is_nested", False):
        return x.offsets().diff()
    return torch.tensor([len(t) for t in x])


def verl_loss_group(config) -> Optional[dict]:
    """The composed ``distillation.distillation_loss`` group as a dict (None when absent)."""
    group = config.get("distillation", None)
    group = group.get("distillation_loss", None) if group is not None else None
    return OmegaConf.to_container(group, resolve=True) if group is not None else None


def teacher_pass(ctx: StepContext, worker_method: str = "compute_opsd_teacher", **run_kwargs):
    """The teacher pass of the step's batch through the actor worker group's ``worker_method``
    (:func:`run_opsd_teacher`; ``run_kwargs``: its ``topk`` / ``student_prompts`` / ``prefix``, which SDPO sets);
    the pass's metrics go into ``ctx.metrics``. Returns ``(teacher, responses, prompt_lens, response_lens, pad_id)``."""
    cfg, config = ctx.cfg, ctx.config
    d = ctx.fields
    extra = verl_seam.fetch_fields(ctx.batch, [f for f in FIELDS if f not in d])
    pad_id = int(ctx.tokenizer.pad_token_id or 0)
    resp_lens = _lengths(extra["responses"])
    responses = _padded(extra["responses"], pad_id).long()
    valid = (torch.arange(responses.shape[1]).unsqueeze(0) < resp_lens.unsqueeze(1)).long()
    old = extra.get("old_log_probs", None)
    prompts = [[int(t) for t in _list(p)] for p in (d["prompts"].unbind() if getattr(d["prompts"], "is_nested", False) else d["prompts"])]
    messages = [[dict(x) for x in m] if m is not None and len(m) else None for m in _list(d["raw_prompt"])]
    frozen = frozen_teacher(cfg)
    if frozen:  # OPSD: the initial policy, held by verl's reference worker (its own dispatch, mesh "ref")
        if ctx.reference_group is None:
            raise RuntimeError("OPSD's teacher is verl's reference policy: the step context names no reference worker group")
        wg, dp_size = ctx.reference_group(), ctx.reference_dp_size()
        call = wg.compute_ref_opsd_teacher
    else:  # gdpo-distill (and SDPO): the behaviour policy, the actor itself
        call, dp_size = getattr(ctx.worker_group, worker_method), ctx.dp_size()

    def dispatch(inputs: dict, settings: dict) -> dict:
        return dispatch_rows(call, inputs, settings)

    request = PassRequest(cfg, ctx.table, messages, responses, valid, prompts, ctx.render, dispatch, dp_size,
                          temperature=float(config.actor_rollout_ref.rollout.temperature), pad_id=pad_id,
                          token_budget=token_budget(config, reference=frozen), row_render=ctx.row_render)
    teacher = run_opsd_teacher(request, old_log_probs=_padded(old, 0.0) if old is not None else None, **run_kwargs)
    ctx.metrics[f"{run_kwargs.get('prefix', 'mrtpo/opsd')}/teacher_initial"] = float(frozen)
    ctx.metrics.update(teacher.metrics)
    return teacher, responses, [len(p) for p in prompts], resp_lens.tolist(), pad_id


def write_opsd_teacher(ctx: StepContext):
    """OPSD's after-step hook (named by its entry, :mod:`recipe.mrtpo.methods.opsd`): the teacher pass of the batch and its
    fields in TransferQueue; returns the batch meta for the update."""
    cfg = ctx.cfg
    teacher, responses, prompt_lens, resp_lens, pad_id = teacher_pass(ctx)
    fields = teacher_fields(teacher, responses, prompt_lens, resp_lens, uses_topk(cfg), pad_id)
    out = verl_seam.write_fields(ctx.batch, fields)
    info = getattr(out, "extra_info", None)
    if info is None:
        info = out.extra_info = {}
    info[LOSS_SETTINGS_KEY] = distillation_loss_settings(cfg, verl_loss_group(ctx.config))
    return out
