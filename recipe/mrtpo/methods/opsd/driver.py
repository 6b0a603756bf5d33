"""The driver's side of OPSD (``mrtpo.mode=opsd``, docs/opsd.md): teacher prompts, the teacher pass, verl's fields.

:func:`run_opsd_teacher` is what the trainer's advantage step calls: it builds each sample's teacher prompt
(:func:`teacher_prompts`: the rollout prompt with the sample's appended Z_k framed by an instruction, as the
references frame privileged information, ``mrtpo.teacher_template``; prompt-placed ones in place), packs the
rows, pads them to the data-parallel size, calls ``dispatch`` (the worker group's ``compute_opsd_teacher``, or
any function with the same contract in tests) and maps the answer back to the batch. :func:`teacher_fields`
turns it into verl's ``teacher_logprobs`` / ``teacher_ids`` in verl's per-sequence layout, the fields verl's
distillation losses read; :func:`distillation_loss_settings` is the loss configuration the actor installs.
No verl import: the trainer passes the worker call and the chat-template renderer in.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch

from recipe.mrtpo.config import MRTPOConfig
from recipe.mrtpo.config.schema import OPSD_TOPK_LOSS_MODES
from recipe.mrtpo.core.passes import PassSettings
from recipe.mrtpo.core.replay_plan import p_all_prompts
from recipe.mrtpo.methods.opsd import JSD_UNREAD
from recipe.mrtpo.methods.opsd.teacher import sequence_teacher_fields, topk_mass
from recipe.mrtpo.methods.types import ROWS_PRIVILEGED
from recipe.mrtpo.passes.pass_driver import PassRequest, pass_metrics

# dispatch(inputs: {"prompt_ids" [R', P], "prompt_lens" [R'], "responses" [R', T], "response_mask" [R', T]}, settings)
#   -> {"teacher_topk_logprobs" [R', T, k], "teacher_topk_ids" [R', T, k], "teacher_token_logprobs" [R', T],
#       optionally "teacher_forwards" [R', 2] (each row's rank: own and agreed forward counts)}
Dispatch = Callable[[dict, dict], dict]

#: the non-tensor settings sent with the rows (``worker.compute_opsd_teacher``): the pass engine's and ``topk``
TEACHER_SETTINGS = (*PassSettings.WIRE_KEYS, "topk")

#: the key of the loss settings in the actor update's batch (``worker.update_actor`` installs the loss from it)
LOSS_SETTINGS_KEY = "mrtpo_opsd_loss"


@dataclass
class OPSDTeacher:
    """The teacher of every sample of the batch (the rollout prompt's rows where P_all cannot be built)."""

    topk_logprobs: torch.Tensor  # [B, T, k] fp32, 0 at masked positions
    topk_ids: torch.Tensor  # [B, T, k] int64
    token_logprobs: torch.Tensor  # [B, T] log p_T(y_t), 0 at masked positions
    privileged: list[bool] = field(default_factory=list)  # teacher prompt != rollout prompt
    metrics: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)  # the worker's other answers (per row), e.g. SDPO's teacher fingerprint


def teacher_prompts(
    contexts: Sequence[Optional[dict]],
    messages: Sequence[Optional[list]],
    rollout_prompts: Sequence[Sequence[int]],
    render: Callable[[list[dict]], list[int]],
    max_prompt_length: Optional[int] = None,
    row_render: Optional[Callable[[int], Callable[[list[dict]], list[int]]]] = None,
    template: Optional[str] = None,
) -> tuple[list[list[int]], list[Optional[str]]]:
    """Per sample: its teacher prompt ids and, where it could not be built, the reason. ``row_render``:
    sample index -> its render, where samples were rendered with different tools (as the replay's planner).

    The self-teachers' one teacher prompt, RLSD's too (:func:`recipe.mrtpo.core.replay_plan.p_all_prompts`):
    the rollout prompt with the sample's appended Z_k framed by ``template`` (``mrtpo.teacher_template``;
    None: :data:`recipe.mrtpo.core.prompt_variants.TEACHER_TEMPLATE`), prompt-placed ones in place, no framing
    where there is no appended Z (the teacher prompt is then the rollout prompt). A sample without contexts
    (``no_contexts``) or whose teacher prompt cannot be built (``no_messages``, ``too_long``) is taught from
    its rollout prompt: the teacher is then the behaviour policy itself.
    """
    return p_all_prompts(contexts, messages, rollout_prompts, render, max_prompt_length, row_render, template)


def pack_prompts(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids [B, P] and their lengths [B]."""
    P = max((len(p) for p in prompts), default=1) or 1
    ids = torch.full((len(prompts), P), int(pad_id), dtype=torch.long)
    lens = torch.zeros(len(prompts), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, P - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        lens[i] = len(p)
    return ids, lens


def pad_to_multiple(inputs: dict[str, torch.Tensor], multiple: int) -> dict[str, torch.Tensor]:
    """Pad the rows to a multiple of the data-parallel size with rows of prompt length 0 (no forward)."""
    B = inputs["prompt_lens"].shape[0]
    n_pad = (-B) % multiple if multiple > 1 else 0
    if n_pad == 0:
        return inputs
    return {k: torch.cat([v, torch.zeros((n_pad, *v.shape[1:]), dtype=v.dtype)], dim=0) for k, v in inputs.items()}


def run_opsd_teacher(
    request: PassRequest,
    *,
    old_log_probs: Optional[torch.Tensor] = None,
    topk: Optional[int] = None,
    student_prompts: bool = False,
    prefix: str = "mrtpo/opsd",
) -> OPSDTeacher:
    """Plan, dispatch and map back the teacher pass of one batch (module docstring); ``request.dispatch`` has the
    contract of :data:`Dispatch`. ``old_log_probs``: [B, T] verl's, for the teacher's log-prob gain.
    ``topk`` (None: ``mrtpo.opsd_topk``), ``student_prompts`` (also send the rollout prompts, as
    ``student_prompt_ids`` / ``student_prompt_lens``: SDPO's worker takes the student's top-k ids there) and
    the metrics' ``prefix`` let SDPO (``methods.sdpo``) run the same pass.
    """
    t0 = time.perf_counter()
    cfg, messages, responses, response_mask = request.cfg, request.messages, request.responses, request.response_mask
    rollout_prompts, dp_size, pad_id = request.rollout_prompts, request.dp_size, request.pad_id
    B, T = responses.shape
    prompts, reasons = teacher_prompts(request.table.contexts, messages, rollout_prompts, request.render,
                                       cfg.max_replay_prompt_length, request.row_render, cfg.teacher_template)
    privileged = [p != list(r) for p, r in zip(prompts, rollout_prompts)]
    ids, lens = pack_prompts(prompts, pad_id)
    inputs = {"prompt_ids": ids, "prompt_lens": lens, "responses": responses.long().cpu(), "response_mask": response_mask.long().cpu()}
    if student_prompts:
        inputs["student_prompt_ids"], inputs["student_prompt_lens"] = pack_prompts(rollout_prompts, pad_id)
    inputs = pad_to_multiple(inputs, dp_size)
    k = cfg.opsd_topk_of() if topk is None else int(topk)
    settings = {**request.settings().to_wire(), "topk": k}
    out = request.dispatch(inputs, settings)
    teacher = OPSDTeacher(
        topk_logprobs=out["teacher_topk_logprobs"][:B].float(),
        topk_ids=out["teacher_topk_ids"][:B].long(),
        token_logprobs=out["teacher_token_logprobs"][:B].float(),
        privileged=privileged,
    )
    m = teacher.metrics
    m[f"{prefix}/rows_privileged"] = sum(privileged)
    m[ROWS_PRIVILEGED] = sum(privileged)  # the self-teachers' common name (recipe.mrtpo.methods.types)
    m[f"{prefix}/rows_same_prompt"] = sum(1 for p, r in zip(privileged, reasons) if not p and r is None)
    for reason, n in Counter(r for r in reasons if r).items():
        m[f"{prefix}/fallback/{reason}"] = n
    extra = [len(p) - len(r) for p, r in zip(prompts, rollout_prompts)]
    m[f"{prefix}/teacher_prompt_extra_tokens"] = sum(extra) / max(1, len(extra))
    m.update({f"{prefix}/{k.removeprefix('mrtpo/opsd/')}": v for k, v in teacher_metrics(teacher, responses, response_mask, old_log_probs).items()})
    if out.get("teacher_forwards", None) is not None:
        m.update(pass_metrics(out["teacher_forwards"], dp_size, f"{prefix}/teacher"))
    teacher.raw = {k: v[:B] for k, v in out.items() if k not in ("teacher_topk_logprobs", "teacher_topk_ids", "teacher_token_logprobs")}
    m[f"{prefix}/teacher_time_s"] = time.perf_counter() - t0
    return teacher


def teacher_metrics(teacher: OPSDTeacher, responses: torch.Tensor, response_mask: torch.Tensor, old_log_probs=None) -> dict:
    """Teacher-side metrics over the valid response tokens (the student-side ones come from verl's loss):

    - ``teacher_topk_mass``: mean of sum_{v in K_T} p_T(v), the share of the teacher kept by the top-k;
    - ``sampled_in_teacher_topk``: share of sampled tokens y_t inside the teacher's top-k;
    - ``teacher_logprob_gain``: mean of log p_T(y_t) - log pi_old(y_t | rollout prompt) (what the
      privileged context changes on the sampled tokens; 0 where P_all is the rollout prompt).
    """
    mask = response_mask.bool().cpu()
    n = mask.sum().clamp(min=1)
    mass = topk_mass(teacher.topk_logprobs)
    inside = (teacher.topk_ids == responses.long().cpu().unsqueeze(-1)).any(-1)
    out = {
        "mrtpo/opsd/teacher_topk_mass": float((mass * mask).sum() / n),
        "mrtpo/opsd/sampled_in_teacher_topk": float((inside & mask).sum() / n),
    }
    if old_log_probs is not None:
        gain = (teacher.token_logprobs - old_log_probs.float().cpu()) * mask
        out["mrtpo/opsd/teacher_logprob_gain"] = float(gain.sum() / n)
    return out


def teacher_fields(
    teacher: OPSDTeacher,
    responses: torch.Tensor,
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    use_topk: bool,
    pad_id: int = 0,
) -> dict[str, torch.Tensor]:
    """verl's ``teacher_logprobs`` / ``teacher_ids`` for every sample, nested over the batch.

    Each sample's tensors cover its whole sequence (prompt + response rows, :func:`sequence_teacher_fields`):
    [L_i, k] top-k log-probs and ids for ``forward_kl_topk``, [L_i, 1] the sampled token's teacher log-prob
    (and its id) for verl's single-sample estimators (``k3``...).
    """
    lps, idss = [], []
    for i in range(len(prompt_lens)):
        if use_topk:
            lp, ids = teacher.topk_logprobs[i], teacher.topk_ids[i]
        else:
            lp, ids = teacher.token_logprobs[i].unsqueeze(-1), responses[i].long().cpu().unsqueeze(-1)
        a, b = sequence_teacher_fields(lp, ids, int(prompt_lens[i]), int(response_lens[i]), pad_id)
        lps.append(a)
        idss.append(b)
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    return {"teacher_logprobs": nested(lps), "teacher_ids": nested(idss)}


#: the name OPSD's renormalised top-k JSD is registered under in verl's distillation loss registry (``loss.py``)
JSD_TOPK_LOSS_MODE = "mrtpo_opsd_jsd_topk"
#: the recipe's own key in the loss settings (not a ``DistillationLossConfig`` field): OPSD's beta
BETA_KEY = "jsd_beta"

#: the mode of OPSD as its paper defines it (the distillation loss alone, to the initial policy) and of gdpo-distill
#: (GDPO's policy loss + c x verl's distillation loss, to the live policy)
OPSD_MODE, GDPO_DISTILL_MODE = "opsd", "gdpo-distill"


def frozen_teacher(cfg: MRTPOConfig) -> bool:
    """OPSD's teacher is the initial policy (the reference's ``--fixed_teacher``: verl's reference worker); gdpo-distill's
    is the behaviour policy (the actor)."""
    return cfg.mode == OPSD_MODE


def distillation_loss_settings(cfg: MRTPOConfig, verl_loss_group: Optional[dict] = None) -> dict:
    """The settings the actor's loss is built with (``loss.py``): ``DistillationLossConfig`` fields, plus OPSD's beta.

    Start from verl's ``distillation.distillation_loss`` group (``loss_max_clamp``...; its defaults when absent),
    then the method's:

    - OPSD (the paper's objective): ``loss_mode`` = the recipe's registered renormalised top-k JSD, ``topk`` = k,
      ``use_task_rewards = False`` (no policy loss: the distillation loss alone), coefficient 1, and
      ``jsd_beta = mrtpo.opsd_beta``;
    - gdpo-distill: ``loss_mode = mrtpo.opsd_loss_mode``, ``topk`` = k, ``distillation_loss_coef =
      mrtpo.opsd_loss_coef``, ``use_task_rewards = True`` (GDPO's policy loss + coef x distillation loss).

    Both pin ``use_policy_gradient = False``: the divergence is a loss backpropagated directly, never a reward
    (verl's YAML default, but its dataclass default is True; ``check_opsd`` refuses True in the group).
    """
    skip = {"_target_", "global_batch_info", "loss_settings"}
    if cfg.mode == OPSD_MODE:
        skip |= {*JSD_UNREAD, "chunked_topk_chunk_size"}
    out = {k: v for k, v in dict(verl_loss_group or {}).items() if k not in skip}
    if cfg.mode == OPSD_MODE:
        out.update(loss_mode=JSD_TOPK_LOSS_MODE, topk=cfg.opsd_topk_of(), distillation_loss_coef=1.0,
                   use_task_rewards=False, use_policy_gradient=False)
        out.setdefault("loss_max_clamp", None)  # verl's YAML default (no clamp, as the reference), not its dataclass's 10
        out[BETA_KEY] = float(cfg.opsd_beta)
        return out
    out.update(loss_mode=cfg.opsd_loss_mode, topk=cfg.opsd_topk_of(), distillation_loss_coef=float(cfg.opsd_loss_coef),
               use_task_rewards=True, use_policy_gradient=False)
    return out


def uses_topk(cfg: MRTPOConfig) -> bool:
    """Whether the loss reads the teacher's top-k (OPSD's JSD, ``forward_kl_topk``) or the sampled token's log-prob."""
    return cfg.mode == OPSD_MODE or cfg.opsd_loss_mode in OPSD_TOPK_LOSS_MODES
