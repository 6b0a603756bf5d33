"""SDPO, self-distillation with an EMA teacher (lasgroup/SDPO; ``docs/opsd.md``, section SDPO).

The entry (this module: standard library only) and its code, one module per side:

- ``step``: the after-step hook on verl's batch (``write_sdpo_teacher``: OPSD's teacher pass through the
  worker's ``compute_sdpo_teacher``, verl's teacher fields, the loss settings), named in the entry by its path;
- ``teacher``: the worker's side of the pass, pure torch (the student's top-k ids, the EMA teacher at them);
- ``ema``: the EMA teacher, a sharded copy of the actor's parameters on the actor's workers;
- ``actor``: its part on the actor's workers (the EMA teacher's life: taken, swapped in for the pass, updated after
  an update with a finite gradient norm, checkpointed; the pass's rows; the loss swap);
- ``loss``: the actor's loss (the generalised JSD over the student's top-k plus a tail bucket), through verl's
  distillation-loss registry and its logits-processor path.

What is SDPO's own is the teacher (an EMA of the policy, rate ``mrtpo.sdpo_ema_rate``), the support (the
student's top-k plus a tail bucket) and the loss replacing the policy loss; the teacher prompt is the
self-teachers' one (P_all framed by ``mrtpo.teacher_template``), as OPSD's and RLSD's.
"""

from __future__ import annotations

from recipe.mrtpo.methods.checks import check_distillation_group_unread, check_module_forward
from recipe.mrtpo.methods.gdpo import gdpo_advantage
from recipe.mrtpo.methods.types import PASS_KNOBS, TEACHER_KNOBS, ActorPartRef, GlueRef, Method, get_key

#: the key of SDPO's settings in the actor update's batch (the worker hands them to ``actor.SDPOActorPart``)
LOSS_SETTINGS_KEY = "mrtpo_sdpo_loss"
#: SDPO's own knobs (recipe/mrtpo/config/schema.py)
SDPO_KNOBS = ("sdpo_topk", "sdpo_add_tail", "sdpo_alpha", "sdpo_ema_rate", "sdpo_is_clip")


#: lasgroup/SDPO's shipped config (``verl/trainer/config/sdpo.yaml``) as verl 0.9.1 settings, what ``ALGO=sdpo``
#: passes besides FSDP2: its token-level rollout correction (``algorithm.rollout_correction.rollout_is: token``,
#: ``rollout_is_threshold: 2.0``: w_t = min(pi_old(y_t) / pi_rollout(y_t), 2), verl's own, computed in the advantage
#: step from the rollout's log-probs, ``rollout.calculate_log_probs: True``; SDPO's loss multiplies each token by it,
#: ``loss.compute_sdpo_jsd_topk``), and no KL term (SDPO has none: ``use_kl_loss=False`` overrides the run scripts'
#: shared KL to the initial policy; ``check_sdpo`` refuses it when set again)
SHIPPED_CONFIG = (
    "actor_rollout_ref.actor.strategy=fsdp2",  # its EMA teacher swaps FSDP2's shards (check_sdpo)
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_is_threshold=2.0",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.actor.use_kl_loss=False",
)


def check_sdpo(config, method: Method, cfg) -> None:
    """verl settings SDPO's loss would silently ignore or cannot run with, refused with what to change.

    SDPO's loss replaces verl's policy loss (it keeps verl's KL loss and entropy bonus, ``loss.sdpo_loss``), so
    the advantage's settings (KL in the reward, no std normalisation) would do nothing; the EMA teacher swaps FSDP2's local shards (``ema.py``), so the actor runs FSDP2; ``distillation.enabled``
    would start verl's teacher servers besides the self-teacher.
    """
    arr = "actor_rollout_ref.actor"
    dist = config.get("distillation", None)
    if dist is not None and bool(dist.get("enabled", False)):
        raise ValueError("method sdpo (mrtpo.mode=sdpo) is the actor's own teacher: leave distillation.enabled=False "
                         "(True starts verl's teacher servers)")
    own = "SDPO builds its loss from mrtpo.sdpo_* (docs/opsd.md#sdpo)"
    check_distillation_group_unread(config, method, {k: own for k in (
        "loss_mode", "topk", "use_task_rewards", "distillation_loss_coef", "loss_max_clamp", "log_prob_min_clamp",
        "use_policy_gradient", "policy_loss_mode", "clip_ratio", "clip_ratio_low", "clip_ratio_high")})
    for key, inert in (("algorithm.use_kl_in_reward", True), ("algorithm.norm_adv_by_std_in_grpo", False)):
        if bool(get_key(config, key, not inert)) == inert:
            raise ValueError(f"{key}={inert} has no effect with method sdpo: it trains on no advantage "
                             "(the distillation loss replaces the policy loss)")
    coef = float(get_key(config, f"{arr}.kl_loss_coef", 0.0) or 0.0)
    if bool(get_key(config, f"{arr}.use_kl_loss", False)) and coef != 0.0:
        raise ValueError(f"{arr}.use_kl_loss=True with kl_loss_coef={coef} is not supported with method sdpo: SDPO has no KL "
                         "term (and where it adds one, its reference is the EMA teacher, not verl's initial policy). "
                         f"Leave {arr}.use_kl_loss=False (ALGO=sdpo sets it)")
    strategy = str(get_key(config, f"{arr}.strategy", "fsdp"))
    if strategy != "fsdp2":
        raise ValueError(f"{arr}.strategy={strategy} is not supported with method sdpo: its EMA teacher swaps FSDP2's "
                         f"local parameter shards in place. Use {arr}.strategy=fsdp2")


#: what SDPO is where no row has privileged information (its entry's ``no_privileged``)
SDPO_WITHOUT_PRIVILEGED = (
    "the teacher is the EMA policy under the student's own prompt, so the loss only pulls the policy towards its "
    "running average (there is no RL term)"
)

SDPO = Method("sdpo", "SDPO: JSD to an EMA teacher under P_all over the student's top-k + tail, no RL term (docs/opsd.md)",
              "gdpo", mode="sdpo", reads=(*PASS_KNOBS, *TEACHER_KNOBS, *SDPO_KNOBS),
              advantage=gdpo_advantage, after_step=GlueRef("recipe.mrtpo.methods.sdpo.step", "write_sdpo_teacher"),
              checks=(check_module_forward, check_sdpo),
              no_privileged=lambda metrics: ("= EMA self-regularisation here", SDPO_WITHOUT_PRIVILEGED),
              settings=SHIPPED_CONFIG,
              actor_part=ActorPartRef(LOSS_SETTINGS_KEY, "recipe.mrtpo.methods.sdpo.actor", "SDPOActorPart",
                                      "sdpo_ema_teacher"))
