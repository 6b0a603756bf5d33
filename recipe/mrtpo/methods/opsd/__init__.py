"""OPSD, on-policy self-distillation with the verifier information as privileged context (``docs/opsd.md``).

The entry (this module: standard library only) and its code, one module per side:

- ``step``: the after-step hook on verl's batch (``write_opsd_teacher``: the teacher pass of the batch, its
  fields in TransferQueue, the loss settings for the update), named in the entry by its import path;
- ``driver``: the driver's side of the teacher pass (teacher prompts, dispatch, verl's field layout, the loss
  settings);
- ``teacher``: the worker's side, pure torch (the teacher's top-k per response token);
- ``loss``: the actor's loss, verl's own ``distillation_ppo_loss`` bound to the recipe's settings.
"""

from __future__ import annotations

from recipe.mrtpo.methods.checks import check_module_forward, check_per_reward_step
from recipe.mrtpo.methods.gdpo import gdpo_advantage
from recipe.mrtpo.methods.types import PASS_KNOBS, STEP_KNOBS, TEACHER_KNOBS, GlueRef, Method


def check_opsd(config, method: Method, cfg) -> None:
    """What OPSD adds to the pass checks of its entry (no fused kernels, Ulysses SP 1, FSDP):
    ``distillation.enabled`` would start verl's teacher servers besides the self-teacher."""
    dist = config.get("distillation", None)
    if dist is not None and bool(dist.get("enabled", False)):
        raise ValueError("method opsd (mrtpo.mode=opsd) is the actor's own teacher: leave distillation.enabled=False "
                         "(True starts verl's teacher servers)")


#: what OPSD is where no row has privileged information (its entry's ``no_privileged``)
OPSD_WITHOUT_PRIVILEGED = (
    "the teacher is the behaviour policy under the student's own prompt, so the distillation term's value is 0 at the "
    "first update of the step and later only measures how far the update moved the policy; the RL loss is GDPO's"
)

OPSD = Method("opsd", "OPSD: GDPO + verl's distillation loss to the policy under P_all (docs/opsd.md)", "gdpo",
              mode="opsd", reads=(*STEP_KNOBS, *PASS_KNOBS, *TEACHER_KNOBS, "opsd_topk", "opsd_loss_mode", "opsd_loss_coef"),
              advantage=gdpo_advantage, after_step=GlueRef("recipe.mrtpo.methods.opsd.step", "write_opsd_teacher"),
              checks=(check_per_reward_step, check_module_forward, check_opsd),
              no_privileged=lambda metrics: ("≈ GDPO here", OPSD_WITHOUT_PRIVILEGED))
