"""OPSD's and gdpo-distill's part on the actor's workers (``methods.actor_part``): the teacher pass's rows and the
loss swap.

- :func:`opsd_teacher_rows`: this rank's rows of the teacher pass (the worker's ``compute_opsd_teacher`` on the
  actor, ``compute_ref_opsd_teacher`` on verl's reference model) through
  :func:`recipe.mrtpo.methods.opsd.teacher.teacher_topk_rows`;
- :class:`OPSDActorPart`: the actor update with the method's loss (``loss.opsd_loss_fn``: OPSD's JSD or verl's
  ``distillation_ppo_loss``), built from the settings the hook put in the batch (``driver.LOSS_SETTINGS_KEY``),
  and the engine's ``distillation_use_topk`` flag set as verl derives it. No state.
"""

from __future__ import annotations

from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from recipe.mrtpo.methods.actor_part import ActorPart
from recipe.mrtpo.methods.opsd.driver import TEACHER_SETTINGS
from recipe.mrtpo.methods.opsd.loss import opsd_loss_fn, settings_key, uses_topk_logits
from recipe.mrtpo.methods.opsd.teacher import teacher_topk_rows
from recipe.mrtpo.passes.pass_wire import pass_counts, sync_max, wire_settings


def opsd_teacher_rows(forward, data: TensorDict, device, sync=sync_max, attn: str = "", **model) -> TensorDict:
    """This rank's rows through :func:`recipe.mrtpo.methods.opsd.teacher.teacher_topk_rows` (the trainer-free part of
    the worker's ``compute_opsd_teacher``; settings: ``methods.opsd.driver.TEACHER_SETTINGS``)."""
    settings, wire = wire_settings(data, TEACHER_SETTINGS, "compute_opsd_teacher", attn, **model)
    out = teacher_topk_rows(
        forward,
        data["prompt_ids"].cpu(),
        data["prompt_lens"].cpu(),
        data["responses"].cpu(),
        data["response_mask"].cpu(),
        k=int(wire["topk"]),
        settings=settings,
        device=device,
        sync_forward_count=sync,
    )
    R = data["prompt_lens"].shape[0]
    return TensorDict(
        {
            "teacher_topk_logprobs": out["topk_logprobs"],
            "teacher_topk_ids": out["topk_ids"],
            "teacher_token_logprobs": out["token_logprobs"],
            "teacher_forwards": pass_counts(out, R, settings),
        },
        batch_size=[R],
    )


class OPSDActorPart(ActorPart):
    """The actor update through the self-teachers' distillation loss (``methods/opsd/loss.py``)."""

    def loss(self, settings: dict):
        return settings_key(settings), lambda actor_config: opsd_loss_fn(actor_config, settings)

    def update(self, data, settings: dict, run):
        tu.assign_non_tensor(data, distillation_use_topk=uses_topk_logits(settings))
        return run(data)
