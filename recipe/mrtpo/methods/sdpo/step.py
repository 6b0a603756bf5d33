"""SDPO's part of the trainer's advantage step (``mrtpo.mode=sdpo``, docs/opsd.md), on verl's batch.

SDPO's entry names :func:`write_sdpo_teacher` as its after-step hook. It runs OPSD's teacher pass
(``methods.opsd.step.teacher_pass``: the teacher prompts P_all, the dispatch, verl's field layout) through
the worker group's ``compute_sdpo_teacher`` with the rollout prompts sent too (the student's top-k ids come
from them) and ``k = mrtpo.sdpo_topk``, writes verl's ``teacher_logprobs`` / ``teacher_ids`` (the EMA
teacher's log-probs at the student's top-k ids, and those ids), and puts SDPO's loss settings in the
batch's ``extra_info`` (the worker hands them to ``actor.SDPOActorPart``: SDPO's loss, then the EMA teacher's update).
"""

from __future__ import annotations

from recipe.mrtpo.methods.opsd.driver import teacher_fields
from recipe.mrtpo.methods.opsd.step import teacher_pass
from recipe.mrtpo.methods.sdpo import LOSS_SETTINGS_KEY
from recipe.mrtpo.methods.types import StepContext
from recipe.mrtpo.seams import verl_seam

#: the metrics' prefix of SDPO's pass
PREFIX = "mrtpo/sdpo"


def loss_settings(cfg) -> dict:
    """What the actor's update reads (``actor.SDPOActorPart``): the loss's ``topk``, ``alpha``, ``add_tail``,
    ``is_clip`` and the EMA teacher's ``ema_rate``."""
    return {"topk": int(cfg.sdpo_topk), "alpha": float(cfg.sdpo_alpha), "add_tail": bool(cfg.sdpo_add_tail),
            "is_clip": None if cfg.sdpo_is_clip is None else float(cfg.sdpo_is_clip), "ema_rate": float(cfg.sdpo_ema_rate)}


def write_sdpo_teacher(ctx: StepContext):
    """SDPO's after-step hook: the teacher pass of the batch, its fields in TransferQueue, the loss settings;
    returns the batch meta for the update."""
    cfg = ctx.cfg
    teacher, responses, prompt_lens, resp_lens, pad_id = teacher_pass(
        ctx, "compute_sdpo_teacher", topk=int(cfg.sdpo_topk), student_prompts=True, prefix=PREFIX)
    fp = teacher.raw.get("teacher_fingerprint", None)
    if fp is not None and len(fp):
        ctx.metrics[f"{PREFIX}/teacher_sum"] = float(fp[0, 0])
        ctx.metrics[f"{PREFIX}/teacher_sumsq"] = float(fp[0, 1])
    fields = teacher_fields(teacher, responses, prompt_lens, resp_lens, True, pad_id)
    out = verl_seam.write_fields(ctx.batch, fields)
    info = getattr(out, "extra_info", None)
    if info is None:
        info = out.extra_info = {}
    info[LOSS_SETTINGS_KEY] = loss_settings(cfg)
    return out
