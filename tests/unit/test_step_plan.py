"""The trainer's per-step decision (``recipe.mrtpo.step.step_plan``): replay, fused old_log_prob, standing check,
teacher pass, as one table over the method's entry, its schedule, the config and the step counter."""

from __future__ import annotations

import pytest

from recipe.mrtpo import methods
from recipe.mrtpo.config import mrtpo_config
from recipe.mrtpo.methods.types import GlueRef, Method, ReplayPass
from recipe.mrtpo.step.step_plan import StepPlan, bypass_mode, plan_step


def method(replay=True, on_reference=False, strength=0.5, teacher=False) -> Method:
    """A stand-in entry: a replay pass (on the actor or verl's reference), a constant schedule, a hook or none."""
    return Method("m", "a stand-in", "mrtpo",
                  replay=ReplayPass(reference=lambda cfg: on_reference) if replay else None,
                  strength=(lambda cfg, step, config: strength) if strength is not None else None,
                  after_step=GlueRef("nowhere", "hook") if teacher else None)


def config(bypass=None) -> dict:
    return {"algorithm": {"rollout_correction": {"bypass_mode": bypass} if bypass is not None else None}}


CFG = mrtpo_config({"fused_check_every": 4})


# (entry, config, global_steps, checked_before) -> (replay, replay_skipped, fused, standing check, teacher pass)
TABLE = [
    ("replays on the actor, first fused step", method(), config(), 7, False, (True, False, True, True, False)),
    ("a later step, not a multiple of N", method(), config(), 9, True, (True, False, True, False, False)),
    ("a later step, a multiple of N", method(), config(), 8, True, (True, False, True, True, False)),
    ("schedule 0: nothing replayed", method(strength=0.0), config(), 8, False, (False, True, False, False, False)),
    ("no schedule at all", method(strength=None), config(), 8, False, (False, True, False, False, False)),
    ("a pass on verl's reference: never fused", method(on_reference=True), config(), 8, False, (True, False, False, False, False)),
    ("verl's bypass mode: never fused", method(), config(bypass=True), 8, False, (True, False, False, False, False)),
    ("bypass off is not bypass", method(), config(bypass=False), 9, True, (True, False, True, False, False)),
    ("no replay pass (GDPO, OPSD)", method(replay=False, strength=None, teacher=True), config(), 8, False,
     (False, False, False, False, True)),
]


@pytest.mark.parametrize("entry, conf, global_steps, checked_before, want", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_the_decision_table(entry, conf, global_steps, checked_before, want):
    plan = plan_step(entry, CFG, conf, global_steps, checked_before)
    got = (plan.replay, plan.replay_skipped, plan.fuse_old_log_prob, plan.standing_check, plan.teacher_pass)
    assert got == want
    assert plan.global_step == global_steps and plan.step == global_steps - 1
    assert plan.strength == (0.0 if entry.strength is None else entry.strength(CFG, plan.step, conf))


def test_the_standing_check_is_off_at_zero_and_the_step_counts_completed_steps():
    assert not plan_step(method(), mrtpo_config({"fused_check_every": 0}), config(), 7, False).standing_check
    first = plan_step(method(), CFG, config(), 1, False)  # verl's first step: s = 0
    assert first.step == 0 and first.global_step == 1
    assert plan_step(method(), CFG, config(), 0, False).step == 0  # never negative
    with pytest.raises(AttributeError):  # frozen: read by both step methods, changed by neither
        first.replay = False  # type: ignore[misc]
    assert isinstance(first, StepPlan)


def test_the_registrys_methods_plan_as_their_entries_say():
    """The real entries: MRTPO's warm-up skips the first step's replay and fuses later; OPSD has no replay and a
    teacher pass; GRPO neither (RLSD's initial teacher, never fused: tests/integration/test_fused_old_log_prob.py)."""
    cfg = mrtpo_config({"beta": 0.5, "warmup_steps": 2, "fused_check_every": 0})
    conf = config()
    first, later = plan_step(methods.get("mrtpo"), cfg, conf, 1, False), plan_step(methods.get("mrtpo"), cfg, conf, 6, False)
    assert (first.replay, first.replay_skipped, first.strength) == (False, True, 0.0)
    assert later.replay and later.fuse_old_log_prob and later.strength == pytest.approx(0.5) and not later.teacher_pass
    opsd = plan_step(methods.get("opsd"), mrtpo_config({"mode": "opsd"}), conf, 6, False)
    assert (opsd.replay, opsd.replay_skipped, opsd.fuse_old_log_prob, opsd.teacher_pass) == (False, False, False, True)
    grpo = plan_step(methods.get("grpo"), cfg, conf, 6, False)
    assert not (grpo.replay or grpo.replay_skipped or grpo.fuse_old_log_prob or grpo.teacher_pass)


def test_bypass_mode_reads_verls_rollout_correction():
    assert bypass_mode(config(bypass=True)) and not bypass_mode(config(bypass=False)) and not bypass_mode(config())
    assert not bypass_mode({})
