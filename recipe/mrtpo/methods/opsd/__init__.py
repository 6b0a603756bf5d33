"""OPSD, on-policy self-distillation with the verifier information as privileged context (``docs/opsd.md``), and
gdpo-distill, GDPO's loss plus a distillation term to the same self-teacher (the recipe's earlier "OPSD").

The entries (this module: standard library only) and their code, one module per side:

- ``step``: the after-step hook on verl's batch (``write_opsd_teacher``: the teacher pass of the batch, its
  fields in TransferQueue, the loss settings for the update), named in the entry by its import path;
- ``driver``: the driver's side of the teacher pass (teacher prompts, dispatch, verl's field layout, the loss
  settings);
- ``teacher``: the worker's side, pure torch (the teacher's top-k per response token);
- ``actor``: their part on the actor's workers (the pass's rows, the loss swap);
- ``loss``: the actor's loss: OPSD's renormalised top-k JSD on verl's distillation path, or verl's own
  ``distillation_ppo_loss`` (gdpo-distill).
"""

from __future__ import annotations

from recipe.mrtpo.methods.checks import check_module_forward, check_per_reward_step, check_reference_teacher
from recipe.mrtpo.methods.gdpo import gdpo_advantage
from recipe.mrtpo.methods.types import PASS_KNOBS, STEP_KNOBS, TEACHER_KNOBS, ActorPartRef, GlueRef, Method, get_key

#: verl's distillation-group fields OPSD's JSD does not read, at their YAML defaults: refused when set otherwise
#: (they would do nothing) and left out of its loss settings (``driver.distillation_loss_settings``)
JSD_UNREAD = {"log_prob_min_clamp": None, "use_chunked_topk": False}


def check_opsd(config, method: Method, cfg) -> None:
    """What the self-teachers add to the pass checks of their entries (no fused kernels, Ulysses SP 1, FSDP):

    - ``distillation.enabled`` would start verl's teacher servers besides the self-teacher;
    - ``distillation.distillation_loss.use_policy_gradient=True`` would turn the divergence into a reward; the
      recipe pins False (the references backpropagate it as a loss), so True would be a setting that does nothing;
    - OPSD: its frozen teacher is verl's reference worker (:func:`check_reference_teacher`); verl's top-k
      forward-KL knobs its JSD does not read (:data:`JSD_UNREAD`) and the policy loss's KL and entropy
      coefficients (no policy loss is computed) are refused when set.
    """
    dist = config.get("distillation", None)
    if dist is not None and bool(dist.get("enabled", False)):
        raise ValueError(f"method {method.name} (mrtpo.mode={method.mode}) is the policy's own teacher: leave "
                         "distillation.enabled=False (True starts verl's teacher servers)")
    group = "distillation.distillation_loss"
    if bool(get_key(config, f"{group}.use_policy_gradient", False)):
        raise ValueError(f"{group}.use_policy_gradient=True is not supported with method {method.name}: the recipe "
                         "backpropagates the divergence as a loss, as the references do (use_policy_gradient=False is "
                         "pinned). Leave it False.")
    if method.mode != "opsd":
        return
    for key, default in JSD_UNREAD.items():
        value = get_key(config, f"{group}.{key}", default)
        if value != default:
            raise ValueError(f"{group}.{key}={value} is not read by method opsd: its JSD over the teacher's renormalised "
                             f"top-k does not use verl's forward-KL top-k options. Leave it at {default}.")
    check_reference_teacher(config, "method opsd (its teacher is frozen at the initial policy)",
                            "Use ALGO=gdpo-distill (a live teacher, GDPO's loss + a distillation term)")
    actor = "actor_rollout_ref.actor"
    for key in ("kl_loss_coef", "entropy_coeff"):  # terms of verl's policy loss, which OPSD's loss does not compute
        value = float(get_key(config, f"{actor}.{key}", 0.0) or 0.0)
        if value != 0.0:
            raise ValueError(f"{actor}.{key}={value} is not read by method opsd: its loss is the distillation loss alone, and "
                             f"verl adds that term inside its policy loss, which OPSD does not compute. Set {actor}.{key}=0 "
                             "(use_kl_loss=True stays: it builds the reference worker that holds the frozen teacher).")


#: what OPSD is where no row has privileged information (its entry's ``no_privileged``)
OPSD_WITHOUT_PRIVILEGED = (
    "the teacher is the initial policy under the student's own prompt, so the loss only pulls the policy back towards "
    "the initial one (a JSD to it); no reward enters the loss"
)
#: what gdpo-distill is there
GDPO_DISTILL_WITHOUT_PRIVILEGED = (
    "the teacher is the behaviour policy under the student's own prompt, so the distillation term's value is 0 at the "
    "first update of the step and later only measures how far the update moved the policy; the RL loss is GDPO's"
)

HOOK = GlueRef("recipe.mrtpo.methods.opsd.step", "write_opsd_teacher")
#: their part on the actor's workers (``actor.OPSDActorPart``: the loss swap), under ``driver.LOSS_SETTINGS_KEY``
#: (written out here: this module imports no driver)
ACTOR_PART = ActorPartRef("mrtpo_opsd_loss", "recipe.mrtpo.methods.opsd.actor", "OPSDActorPart")

OPSD = Method("opsd", "OPSD (its paper's objective): JSD_beta over the teacher's renormalised top-k, alone, to the "
              "initial policy under P_all (docs/opsd.md)", "gdpo",
              mode="opsd", reads=(*STEP_KNOBS, *PASS_KNOBS, *TEACHER_KNOBS, "opsd_topk", "opsd_beta", "opsd_support"),
              advantage=gdpo_advantage, after_step=HOOK,
              checks=(check_per_reward_step, check_module_forward, check_opsd),
              no_privileged=lambda metrics: ("no privileged information", OPSD_WITHOUT_PRIVILEGED),
              settings=("actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0",
                        # the reference's aggregation: each sequence's JSD averaged over its own tokens (one sequence
                        # per device and micro-batch there), then the mean over sequences (docs/opsd.md)
                        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"),
              actor_part=ACTOR_PART)

GDPO_DISTILL = Method("gdpo-distill", "GDPO + c x verl's top-k forward KL (or an estimator) to the live policy under "
                      "P_all: not OPSD (docs/opsd.md)", "gdpo",
                      mode="gdpo-distill",
                      reads=(*STEP_KNOBS, *PASS_KNOBS, *TEACHER_KNOBS, "opsd_topk", "opsd_loss_mode", "opsd_loss_coef"),
                      advantage=gdpo_advantage, after_step=HOOK,
                      checks=(check_per_reward_step, check_module_forward, check_opsd),
                      no_privileged=lambda metrics: ("≈ GDPO here", GDPO_DISTILL_WITHOUT_PRIVILEGED),
                      actor_part=ACTOR_PART)
