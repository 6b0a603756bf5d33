"""SDPO's part on the actor's workers (``methods.actor_part``): its EMA teacher, the teacher pass's rows, the loss.

SDPO's teacher is an EMA of the actor's weights, which only the actor's workers hold (a sharded copy beside the
actor's shards, ``ema.EMATeacher``). So the part owns it:

- taken from the actor's weights before the first update (the initial policy), or restored from the actor's
  checkpoint (:data:`TEACHER_DIR`); a run resumed from a checkpoint without one is refused (its teacher is lost);
- swapped into the actor's shards for the teacher's forwards of the pass (:func:`sdpo_rows`, the worker's
  ``compute_sdpo_teacher``);
- after each actor update, ``theta_T <- (1 - rate) theta_T + rate theta_S`` (SDPO's ``_update_teacher``), but only
  where one optimizer step of the update had a finite gradient norm (SDPO's ``did_update``: verl skipped every step
  otherwise, and the teacher stays); a skipped update is logged and counted (``actor/sdpo/ema_updated`` 0).
"""

from __future__ import annotations

import logging
import os

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from recipe.mrtpo.methods.actor_part import ActorPart, add_metrics, any_finite, grad_norms, reshard
from recipe.mrtpo.methods.opsd.driver import TEACHER_SETTINGS
from recipe.mrtpo.methods.opsd.loss import settings_key
from recipe.mrtpo.methods.sdpo.ema import EMATeacher
from recipe.mrtpo.methods.sdpo.loss import batch_settings, sdpo_loss_fn
from recipe.mrtpo.methods.sdpo.teacher import sdpo_teacher_rows
from recipe.mrtpo.passes.pass_wire import pass_counts, sync_max, wire_settings

#: the folder of SDPO's EMA teacher in the actor's checkpoint (one file per rank, as verl's model shards)
TEACHER_DIR = "sdpo_ema_teacher"

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


class SDPOActorPart(ActorPart):
    """SDPO's EMA teacher and its update (module docstring)."""

    def __init__(self, worker):
        super().__init__(worker)
        self.ema = None
        self.lost = None  # the checkpoint a resumed run came from when it held no teacher
        self.skipped = 0  # updates after which the teacher did not move (no finite gradient norm)

    def module(self):
        return self.worker.actor.engine.module

    def reshard(self):
        return reshard(self.module())

    def teacher(self) -> EMATeacher:
        """The EMA teacher: restored from the checkpoint, else the actor's weights when first asked (before the first
        update: the initial policy); refused where a resumed run's checkpoint held none."""
        if self.ema is None:
            if self.lost:
                raise RuntimeError(f"SDPO: the run resumed from {self.lost}, which holds no EMA teacher ({TEACHER_DIR}/): "
                                   "the teacher cannot be restored. Resume from an SDPO checkpoint or start a new run")
            self.reshard()  # the local shards, not the root's gathered parameters (FSDP2 after a no-grad forward)
            self.ema = EMATeacher.from_module(self.module())
        return self.ema

    def loss(self, settings: dict):
        return settings_key({"topk": settings["topk"]}), lambda actor_config: sdpo_loss_fn(actor_config, settings)

    def update(self, data, settings: dict, run):
        """verl's update with SDPO's loss (the settings' non-tensor entries on the batch), then the EMA step where an
        optimizer step of it had a finite gradient norm (once per update call, after all its mini-batches)."""
        teacher = self.teacher()  # before the update: the first step's teacher is the initial policy
        tu.assign_non_tensor(data, **batch_settings(settings))
        with grad_norms(self.worker.actor.engine) as norms:
            out = run(data)
        moved = any_finite(norms)
        if moved:
            self.reshard()
            teacher.update(self.module(), float(settings["ema_rate"]))
        else:
            self.skipped += 1
            logger.warning("SDPO: no optimizer step of this update had a finite gradient norm (%s): the EMA teacher is "
                           "not updated (%d such updates so far)", norms, self.skipped)
        add_metrics(out, {"sdpo/ema_updated": float(moved), "sdpo/ema_skipped_total": float(self.skipped)})
        return out

    def state_dict(self):
        return None if self.ema is None else self.ema.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.reshard()
        self.ema, self.lost = EMATeacher.from_state_dict(state, self.module()), None

    def resumed_without(self, path: str) -> None:
        self.ema, self.lost = None, path


def sdpo_rows(forward, data: TensorDict, device, sync=sync_max, attn: str = "", part: SDPOActorPart = None,
              **model) -> TensorDict:
    """This rank's rows through :func:`recipe.mrtpo.methods.sdpo.teacher.sdpo_teacher_rows`, the EMA teacher of
    ``part`` swapped in for the teacher's forwards; answers OPSD's field names (``methods.opsd.driver``) plus
    ``teacher_fingerprint`` [R, 2] (:meth:`EMATeacher.fingerprint`, the same on every row)."""
    settings, wire = wire_settings(data, TEACHER_SETTINGS, "compute_sdpo_teacher", attn, **model)
    teacher, module = part.teacher(), part.module()
    keys = ("prompt_ids", "prompt_lens", "student_prompt_ids", "student_prompt_lens", "responses", "response_mask")
    out = sdpo_teacher_rows(forward, {k: data[k].cpu() for k in keys}, int(wire["topk"]), settings,
                            lambda: teacher.swapped(module, part.reshard), device=device, sync_forward_count=sync)
    R = data["prompt_lens"].shape[0]
    fp = torch.tensor(teacher.fingerprint(), dtype=torch.float64).expand(R, 2).clone()
    return TensorDict(
        {
            "teacher_topk_logprobs": out["topk_logprobs"],
            "teacher_topk_ids": out["topk_ids"].to(torch.int32),  # < 2^31 token ids; half the bytes of k = 100 ids
            "teacher_token_logprobs": out["token_logprobs"],
            "teacher_forwards": pass_counts(out, R, settings),
            "teacher_fingerprint": fp,
        },
        batch_size=[R],
    )
