"""RLSD's after-step hook (``mrtpo.mode=rlsd``): the settings of its part on the actor's workers, in the update's batch.

With ``mrtpo.rlsd_teacher_sync_steps`` = N > 0 the hook puts ``{"teacher_sync_steps": N}`` in the batch's
``extra_info`` under :data:`recipe.mrtpo.methods.rlsd.LOSS_SETTINGS_KEY`; the worker hands it to
``actor.RLSDActorPart``, which copies the policy into the frozen teacher after every N-th update. With N = 0 it
adds nothing (verl's update runs unchanged). It writes no field: it returns the advantage step's batch meta.
"""

from __future__ import annotations

from recipe.mrtpo.methods.rlsd import LOSS_SETTINGS_KEY
from recipe.mrtpo.methods.types import StepContext


def part_settings(cfg) -> dict:
    """What the part reads: the sync period in actor updates (0: never)."""
    return {"teacher_sync_steps": int(cfg.rlsd_teacher_sync_steps)}


def write_rlsd_settings(ctx: StepContext):
    """RLSD's after-step hook: the batch meta for the update, with the part's settings where the teacher syncs."""
    out = ctx.written if ctx.written is not None else ctx.batch
    if int(ctx.cfg.rlsd_teacher_sync_steps) > 0:
        info = getattr(out, "extra_info", None)
        if info is None:
            info = out.extra_info = {}
        info[LOSS_SETTINGS_KEY] = part_settings(ctx.cfg)
    return out
