"""What one training step does, decided once at its start: :class:`StepPlan`, from :func:`plan_step`.

The trainer's old_log_prob and advantage steps both depend on whether the step replays (the method's replay
pass, at a schedule > 0), whether that replay runs in the old_log_prob step (fused), whether verl's own
old_log_prob runs beside it (the standing check) and whether a teacher pass follows the advantage. The
trainer makes the decision once per step (``MRTPOTrainer._step_once``) and both steps read it. Pure: the method
entry, the recipe's config, verl's composed config and the step counter in; no verl import.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipe.mrtpo.methods.types import Method, get_key


@dataclass(frozen=True)
class StepPlan:
    """The decisions of one step (verl's ``global_steps``; s = completed steps, docs/design.md §1.4)."""

    global_step: int
    step: int  # s = global_steps - 1, at least 0: the schedules' argument
    strength: float  # the method's schedule at s (beta_s, lambda_s); 0 for a method without one
    has_replay_pass: bool  # the method has a replay pass at all
    replay: bool  # the advantage step replays (a replay pass and strength > 0)
    fuse_old_log_prob: bool  # the replay runs in the old_log_prob step, its forwards giving verl's old_log_probs
    standing_check: bool  # verl's own old_log_prob runs beside the fused pass (mrtpo.fused_check_every)
    teacher_pass: bool  # the method's after-step hook runs (OPSD's, SDPO's teacher pass)

    @property
    def replay_skipped(self) -> bool:
        """A method with a replay pass whose schedule is 0 at this step (warm-up start, replay off): plain GDPO."""
        return self.has_replay_pass and not self.replay


def bypass_mode(config) -> bool:
    """verl's rollout-correction bypass mode (old_log_probs = the rollout's log-probs; verl recomputes nothing)."""
    corr = get_key(config, "algorithm.rollout_correction", None)
    return bool(corr and corr.get("bypass_mode", False))


def plan_step(method: Method, cfg, config, global_steps: int, checked_before: bool) -> StepPlan:
    """The step's :class:`StepPlan`.

    - ``replay``: the method has a replay pass and its strength at s = max(0, global_steps - 1) is > 0;
    - ``fuse_old_log_prob``: the step replays, the pass runs on the actor (not verl's reference policy:
      ``ReplayPass.on_reference``) and verl recomputes the log-probs (not its bypass mode);
    - ``standing_check``: a fused step, ``mrtpo.fused_check_every`` = N > 0, and either no fused step of the run
      was checked yet (``checked_before`` False: the run's first fused step) or ``global_steps % N == 0``;
    - ``teacher_pass``: the method has an after-step hook.
    """
    step = max(0, int(global_steps) - 1)
    strength = method.strength(cfg, step, config) if method.strength is not None else 0.0
    has_pass = method.replay is not None
    replay = has_pass and strength > 0
    fuse = replay and not method.replay.on_reference(cfg) and not bypass_mode(config)
    every = int(cfg.fused_check_every)
    check = fuse and every > 0 and (not checked_before or int(global_steps) % every == 0)
    return StepPlan(global_step=int(global_steps), step=step, strength=strength, has_replay_pass=has_pass, replay=replay,
                    fuse_old_log_prob=fuse, standing_check=check, teacher_pass=method.after_step is not None)
