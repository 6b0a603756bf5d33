"""RLSD (self-distilled RLVR, ``docs/design.md`` §1.8): GDPO's final advantage times a clipped token weight from
the teacher / rollout-prompt log-prob gap, as ms-swift's ``--advantage_reweight rlsd`` and the RLSD authors'
``_build_stgca_advantages``. Its entry, its schedule, its pass needs, its advantage and its checks.

    A_t  = GDPO's final advantage (per-reward group normalisation, sum, batch whitening: what verl trains on)
    d_t  = log p_T(y_t | P_all) - log pi_old(y_t | rollout prompt)                       (no gradient)
    r_t  = (1 - lambda_s) + lambda_s * clip(exp(sign(A_t) * d_t), 1 - eps, 1 + eps)
    A'_t = A_t * r_t                                                   (no second whitening)

r_t > 0, so A'_t has A_t's sign, and r_t lies in [1 - lambda_s eps, 1 + lambda_s eps] on every valid token.
The teacher p_T is the policy under the teacher prompt (P_all, or the rollout prompt where P_all cannot be
built): ``mrtpo.rlsd_teacher=live``, the behaviour policy (the weights that sampled y, ms-swift's default:
its log-probs come from the replay's P_all-only pass on the actor, fused with verl's old_log_prob step), or
``initial``, the policy at step 0 (verl's reference worker holds exactly that model; the pass runs there),
re-synced to the policy after every N-th actor update with ``mrtpo.rlsd_teacher_sync_steps`` = N (the RLSD
authors' frozen teacher synced every 20 steps; ``actor.py``: the copy into verl's reference model, kept with the
actor's checkpoint; ``step.py``: the hook that asks for it).

The package: this module is the entry (standard library only), its schedule, its pass needs, its advantage and its
checks; ``step`` its after-step hook; ``actor`` its part on the actor's workers.

``ALGO=rlsd`` (the entry's ``settings``, the run scripts' overrides) runs the RLSD authors' shipped script
(iie-ycx/RLSD ``examples/visual_rl/rlsd_train.sh`` with its ``rlsd_config.yaml``, :data:`AUTHORS_SCRIPT`): the
frozen initial teacher synced every 20 steps, lambda 0.5 decaying to 0 over 60 training steps, no KL. The knobs'
defaults (``config/schema.py``) are ms-swift's ``--advantage_reweight rlsd`` (the live teacher, no decay).
"""

from __future__ import annotations

from dataclasses import replace

from recipe.mrtpo.methods.checks import check_module_forward, check_per_reward_step, check_reference_teacher
from recipe.mrtpo.methods.gdpo import gdpo_advantage
from recipe.mrtpo.methods.types import (
    PASS_KNOBS,
    ROWS_PRIVILEGED,
    STEP_KNOBS,
    TEACHER_KNOBS,
    ActorPartRef,
    AdvantageInputs,
    GlueRef,
    Method,
    ReplayPass,
    get_key,
)

RLSD_KNOBS = ("rlsd_lambda", "rlsd_reweight_clip_range", "rlsd_lambda_warmup_steps", "rlsd_lambda_decay_steps",
              "rlsd_negative_only", "rlsd_teacher", "rlsd_teacher_sync_steps", "rlsd_schedule")

#: the key of RLSD's settings in the actor update's batch (``step.write_rlsd_settings``; ``actor.RLSDActorPart``)
LOSS_SETTINGS_KEY = "mrtpo_rlsd_teacher"
#: the RLSD authors' shipped script (iie-ycx/RLSD rlsd_train.sh): ``opsd.freeze_teacher_model=True``,
#: ``opsd.rlsd_teacher_sync_interval=20``, ``opsd.rlsd_lambda=0.5``, ``opsd.rlsd_lambda_warmup_steps=0``,
#: ``opsd.rlsd_lambda_decay_steps=60`` (counted in its trainer's ``global_step``, the training step from 1),
#: ``opsd.rlsd_reweight_clip_range=0.2``, ``algorithm.disable_kl=True`` (its config: ``use_kl_loss: false``). What
#: ``ALGO=rlsd`` sets; lambda 0.5 and the clip range 0.2 are the knobs' defaults already.
AUTHORS_SCRIPT = (
    "mrtpo.rlsd_teacher=initial",
    "mrtpo.rlsd_teacher_sync_steps=20",
    "mrtpo.rlsd_lambda_decay_steps=60",
    "mrtpo.rlsd_schedule=steps",
    # verl builds its reference worker (which holds the frozen teacher) only for the KL loss; coefficient 0: no KL
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0",
)


def updates_per_step(config) -> int:
    """The optimizer updates verl's actor makes in one training step: ``ppo_epochs`` x (``data.train_batch_size``
    // ``ppo_mini_batch_size``), both in prompts (verl's update splits the step's train_batch_size x n
    responses into mini-batches of ppo_mini_batch_size x n, every epoch)."""
    actor = "actor_rollout_ref.actor"
    epochs = int(get_key(config, f"{actor}.ppo_epochs", 1) or 1)
    batch = int(get_key(config, "data.train_batch_size", 1) or 1)
    mini = int(get_key(config, f"{actor}.ppo_mini_batch_size", batch) or batch)
    return max(1, epochs) * max(1, batch // max(1, mini))


def optimizer_steps(config, step: int) -> int:
    """Optimizer updates completed before the advantage of training step ``step`` + 1 is computed (``step``
    completed training steps): ms-swift's ``state.global_step`` (the Hugging Face Trainer's counter) at the
    same point, 0 at the first step."""
    return int(step) * updates_per_step(config)


def schedule_step(cfg, step: int, config) -> int:
    """What the schedule counts at training step ``step`` + 1 (``step`` completed): ``mrtpo.rlsd_schedule=updates``
    :func:`optimizer_steps` (ms-swift's, 0 at the first step); ``steps`` the training step's number, ``step`` + 1
    (the RLSD authors' trainer's ``global_step``, incremented before its step runs)."""
    return int(step) + 1 if cfg.rlsd_schedule == "steps" else optimizer_steps(config, step)


def rlsd_strength(cfg, step: int, config) -> float:
    """lambda_s: the warm-up / decay schedule (``core.advantage.rlsd_lambda``, the same in ms-swift and the RLSD
    authors' trainer) at :func:`schedule_step`."""
    from recipe.mrtpo.core.advantage import rlsd_lambda

    return rlsd_lambda(schedule_step(cfg, step, config), cfg.rlsd_lambda, cfg.rlsd_lambda_warmup_steps,
                       cfg.rlsd_lambda_decay_steps)


def initial_teacher(cfg) -> bool:
    """The pass runs on verl's reference policy (``mrtpo.rlsd_teacher=initial``)."""
    return cfg.rlsd_teacher == "initial"


def rlsd_advantage(inp: AdvantageInputs):
    """GDPO's final advantage times r (module docstring). Rows the pass did not forward (the live teacher on a
    row whose teacher prompt is its rollout prompt: the teacher is then the behaviour policy itself) have
    d = 0 and keep GDPO's advantage exactly."""
    import torch

    from recipe.mrtpo.core.advantage import rlsd_reweight

    adv, stats = gdpo_advantage(replace(inp, replay=None, strength=0.0))  # whitened and masked, as verl trains on it
    cfg, rp, mask = inp.cfg, inp.replay, inp.mask
    student = torch.zeros_like(adv)
    teacher = student
    rows = list(rp.rows) if rp is not None and rp.replay_logprobs is not None else []
    if rows:
        if inp.old_log_probs is None:
            raise RuntimeError("method rlsd needs verl's old_log_probs in the batch (the student side of its weight)")
        student = inp.old_log_probs.float().to(adv.device)
        teacher = student.clone()
        teacher[torch.tensor(rows, dtype=torch.long, device=adv.device)] = rp.replay_logprobs.float().to(adv.device)
    out, weight = rlsd_reweight(adv, mask, teacher, student, inp.strength, cfg.rlsd_reweight_clip_range,
                                cfg.rlsd_negative_only)
    valid = mask > 0
    acting = valid & (adv != 0)  # the weights that act (valid positions of a non-zero advantage)
    w = weight[acting]
    bound = inp.strength * cfg.rlsd_reweight_clip_range  # r lies in [1 - bound, 1 + bound]
    delta = ((teacher - student) * mask)[torch.tensor(rows, dtype=torch.long, device=adv.device)] if rows else None
    n_delta = mask[torch.tensor(rows, dtype=torch.long, device=adv.device)].sum() if rows else 0
    stats.extra.update({
        "mrtpo/rlsd/lambda": inp.strength,
        "mrtpo/rlsd/teacher_initial": float(initial_teacher(cfg)),
        "mrtpo/rlsd/rows_teacher": len(rows),  # rows with the teacher's own log-probs
        "mrtpo/rlsd/rows_privileged": int(sum(rp.privileged)) if rp is not None else 0,  # P_all != rollout prompt
        "mrtpo/rlsd/delta_mean": float(delta.sum() / n_delta) if rows and float(n_delta) > 0 else 0.0,
        "mrtpo/rlsd/weight_mean": float(w.mean()) if w.numel() else 1.0,
        "mrtpo/rlsd/weight_min": float(w.min()) if w.numel() else 1.0,
        "mrtpo/rlsd/weight_max": float(w.max()) if w.numel() else 1.0,
        "mrtpo/rlsd/clip_share": float(((w - 1).abs() >= bound - 1e-6).float().mean()) if w.numel() and bound > 0 else 0.0,
        "mrtpo/rlsd/sign_flips": int(((torch.sign(out) != torch.sign(adv)) & valid).sum()),  # 0 by construction
    })
    if rp is not None:  # measured only where the pass ran (lambda_s > 0)
        stats.extra[ROWS_PRIVILEGED] = int(sum(rp.privileged))
    return out, stats


def rlsd_without_privileged(metrics: dict) -> tuple[str, str]:
    """What RLSD is where no row has privileged information (its entry's ``no_privileged``), from a step's metrics:
    with the live teacher GDPO exactly; with the initial one (``mrtpo/rlsd/teacher_initial`` 1) not GDPO."""
    if metrics.get("mrtpo/rlsd/teacher_initial"):
        return ("no privileged information", "the teacher is the initial policy under the rollout prompt itself, so r_t "
                "reweights by the drift log p_0(y_t) - log pi_old(y_t), not by privileged information")
    return ("= GDPO here", "the live teacher under the rollout prompt is the behaviour policy, so d_t = 0, every "
            "weight r_t is 1 and the advantage is GDPO's exactly")


def check_rlsd_teacher(config, method: Method, cfg) -> None:
    """``mrtpo.rlsd_teacher=initial`` reads verl's reference worker: the config must build it, as a full model
    the pass can run (no LoRA reference, Ulysses SP 1, FSDP), or the run is refused before Ray starts."""
    if initial_teacher(cfg):
        check_reference_teacher(config, "mrtpo.rlsd_teacher=initial", "Use mrtpo.rlsd_teacher=live")
    if cfg.rlsd_teacher_sync_steps > 0:
        actor = "actor_rollout_ref.actor"
        coef = float(get_key(config, f"{actor}.kl_loss_coef", 0.0) or 0.0)
        if bool(get_key(config, f"{actor}.use_kl_loss", False)) and coef != 0.0:
            raise ValueError(f"{actor}.kl_loss_coef={coef} with mrtpo.rlsd_teacher_sync_steps="
                             f"{cfg.rlsd_teacher_sync_steps}: the synced teacher lives in verl's reference model, so the KL "
                             f"would pull towards the last synced policy, not the initial one (the RLSD authors run no KL). "
                             f"Set {actor}.kl_loss_coef=0 or mrtpo.rlsd_teacher_sync_steps=0")
        warmup = int(get_key(config, "trainer.critic_warmup", 0) or 0)
        if warmup > 0:
            raise ValueError(f"trainer.critic_warmup={warmup} with mrtpo.rlsd_teacher_sync_steps: the sync counts actor "
                             "updates, which the warm-up skips. Set trainer.critic_warmup=0")


RLSD = Method(
    "rlsd", "RLSD: GDPO's final advantage times a clipped token weight from log p_T(y|P_all) - log p(y|prompt) (§1.8)",
    "gdpo",
    mode="rlsd", reads=(*STEP_KNOBS, *PASS_KNOBS, *TEACHER_KNOBS, *RLSD_KNOBS),
    replay=ReplayPass(variants="p_all", reference=initial_teacher), strength=rlsd_strength,
    advantage=rlsd_advantage, checks=(check_per_reward_step, check_module_forward, check_rlsd_teacher),
    no_privileged=rlsd_without_privileged,
    after_step=GlueRef("recipe.mrtpo.methods.rlsd.step", "write_rlsd_settings"),
    actor_part=ActorPartRef(LOSS_SETTINGS_KEY, "recipe.mrtpo.methods.rlsd.actor", "RLSDActorPart", "rlsd_synced_teacher"),
    settings=AUTHORS_SCRIPT,
)
