"""OPSD's loss on the actor: verl 0.9.1's own ``distillation_ppo_loss``, with the teacher fields from the self-replay.

verl's distillation losses (``verl/trainer/distillation/losses.py``) read ``teacher_logprobs`` /
``teacher_ids`` from the actor's micro-batch, wherever they come from. verl fills them from teacher model
servers, and only when ``distillation.enabled``: that switch also adds a ``teacher_pool`` resource pool,
starts the servers (``MultiTeacherModelManager``) and makes the agent loop query them with the student's
prompt. OPSD's teacher is the actor itself under P_all, so the switch stays off and the recipe does the
three things it would have done on the actor's side:

1. the trainer writes the two fields to TransferQueue in verl's layout (``driver.teacher_fields``);
2. the actor worker's ``update_actor`` installs :func:`opsd_loss_fn` (verl's ``distillation_ppo_loss`` with
   a ``DistillationConfig`` built from the recipe's knobs) in place of ``ppo_loss``, exactly as verl's
   ``init_model`` does when distillation is enabled, and restores verl's loss when the batch carries no
   OPSD settings;
3. for the top-k loss it sets ``distillation_use_topk`` on the update batch, the flag verl's ``_update_actor``
   derives from ``distillation.enabled`` and the FSDP engine reads to run the loss as a logits processor.

Nothing of verl is patched; the loss, its top-k forward KL (``fsdp/losses.compute_forward_kl_topk``),
its metrics (``distillation/loss``, ``overlap_ratio``, ``teacher_mass``, ``student_mass``) and the
combination with the policy loss (``use_task_rewards``: policy loss + ``distillation_loss_coef`` x
distillation loss) are verl's.
"""

from __future__ import annotations

import json
from functools import partial

from verl.trainer.distillation import distillation_ppo_loss
from verl.workers.config import DistillationConfig, DistillationLossConfig


def build_distillation_config(settings: dict) -> DistillationConfig:
    """verl's ``DistillationConfig`` for the actor's loss; ``enabled`` stays False (no teacher servers)."""
    return DistillationConfig(enabled=False, distillation_loss=DistillationLossConfig(**dict(settings)))


def opsd_loss_fn(actor_config, settings: dict):
    """verl's ``distillation_ppo_loss`` bound as ``ActorRolloutRefWorker.init_model`` binds it."""
    return partial(distillation_ppo_loss, config=actor_config, distillation_config=build_distillation_config(settings))


def settings_key(settings: dict) -> str:
    """A stable key of the settings (the installed loss is rebuilt only when they change)."""
    return json.dumps(dict(settings), sort_keys=True, default=str)
