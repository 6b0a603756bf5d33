"""Each self-teacher baseline's shipped defaults pinned against its named reference's values (docs/departures.md,
docs/opsd.md): OPSD (siyan-zhao/OPSD), RLSD (the knobs' defaults are ms-swift's ``--advantage_reweight rlsd``;
``ALGO=rlsd`` is the RLSD authors' shipped script), SDPO (lasgroup/SDPO's config) and GRPO's scalar reward (the mean
the reward manager passes). The reference values are written out here, once, from the references' shipped configs."""

from __future__ import annotations

import pytest
import torch

from recipe.mrtpo.config.schema import MRTPOConfig
from recipe.mrtpo.methods.registry import METHODS

# siyan-zhao/OPSD, scripts/run_opsd_topkloss.sh and its generalized_jsd_loss
OPSD_REFERENCE = {"opsd_beta": 0.5, "topk": 50}
# ms-swift --advantage_reweight rlsd defaults
MS_SWIFT_RLSD = {"rlsd_lambda": 0.5, "rlsd_reweight_clip_range": 0.2, "rlsd_lambda_warmup_steps": 0,
                 "rlsd_lambda_decay_steps": 0, "rlsd_negative_only": False, "rlsd_teacher": "live"}
# iie-ycx/RLSD rlsd_train.sh: lambda decays to 0 over 60 steps
RLSD_AUTHORS_DECAY_STEPS = 60
# iie-ycx/RLSD examples/visual_rl/rlsd_train.sh + rlsd_config.yaml: opsd.rlsd_lambda=0.5, rlsd_reweight_clip_range=0.2,
# rlsd_lambda_warmup_steps=0, rlsd_lambda_decay_steps=60 (its trainer's global_step: training steps from 1),
# freeze_teacher_model=True (the reference module, the initial policy) synced every rlsd_teacher_sync_interval=20,
# algorithm.disable_kl=True / use_kl_loss: false
RLSD_AUTHORS = {"rlsd_lambda": 0.5, "rlsd_reweight_clip_range": 0.2, "rlsd_lambda_warmup_steps": 0,
                "rlsd_lambda_decay_steps": 60, "rlsd_schedule": "steps", "rlsd_teacher": "initial",
                "rlsd_teacher_sync_steps": 20, "rlsd_negative_only": False}
# lasgroup/SDPO's config: JSD alpha 0.5 over the student's top-100 + tail, EMA rate 0.05, IS clip 2.0
SDPO_REFERENCE = {"sdpo_alpha": 0.5, "sdpo_topk": 100, "sdpo_add_tail": True, "sdpo_ema_rate": 0.05,
                  "sdpo_is_clip": 2.0}
# lasgroup/SDPO verl/trainer/config/sdpo.yaml: algorithm.rollout_correction {rollout_is: token, rollout_is_threshold:
# 2.0}, rollout.calculate_log_probs: True; no KL term (its actor adds none unless use_kl_loss, off by default)
SDPO_SHIPPED_VERL = {"algorithm.rollout_correction.rollout_is": "token",
                     "algorithm.rollout_correction.rollout_is_threshold": "2.0",
                     "actor_rollout_ref.rollout.calculate_log_probs": "True",
                     "actor_rollout_ref.actor.use_kl_loss": "False"}


def _overrides(name: str) -> dict[str, str]:
    return dict(o.split("=", 1) for o in METHODS[name].overrides)


def test_opsd_defaults_are_the_references_and_it_aggregates_per_sequence():
    from verl.trainer.ppo.core_algos import agg_loss

    cfg = MRTPOConfig()
    assert cfg.opsd_beta == OPSD_REFERENCE["opsd_beta"]
    ov = _overrides("opsd")
    assert ov["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert ov["actor_rollout_ref.actor.kl_loss_coef"] == "0"
    # the reference: one sequence per device, each normalised by its own length, averaged over devices
    g = torch.Generator().manual_seed(0)
    loss = torch.rand(3, 8, generator=g, dtype=torch.float64)
    mask = torch.zeros(3, 8, dtype=torch.float64)
    for i, n in enumerate((2, 8, 5)):
        mask[i, :n] = 1
    reference = torch.stack([loss[i][mask[i] > 0].mean() for i in range(3)]).mean()
    ours = agg_loss(loss, mask, ov["actor_rollout_ref.actor.loss_agg_mode"])
    torch.testing.assert_close(ours, reference, rtol=1e-7, atol=1e-7)
    # verl's token-mean weighs the long responses more: a different number on unequal lengths
    assert abs(float(agg_loss(loss, mask, "token-mean")) - float(reference)) > 1e-3


def test_opsd_topk_resolves_to_the_references():
    assert MRTPOConfig(mode="opsd").opsd_topk_of() == OPSD_REFERENCE["topk"]


def test_rlsd_defaults_are_ms_swifts_and_the_authors_decay_is_a_knob():
    from recipe.mrtpo.core.advantage import rlsd_lambda

    cfg = MRTPOConfig()
    assert {k: getattr(cfg, k) for k in MS_SWIFT_RLSD} == MS_SWIFT_RLSD
    lam = cfg.rlsd_lambda
    assert rlsd_lambda(0, lam, 0, RLSD_AUTHORS_DECAY_STEPS) == lam
    assert rlsd_lambda(RLSD_AUTHORS_DECAY_STEPS // 2, lam, 0, RLSD_AUTHORS_DECAY_STEPS) == lam / 2
    assert rlsd_lambda(RLSD_AUTHORS_DECAY_STEPS, lam, 0, RLSD_AUTHORS_DECAY_STEPS) == 0.0
    assert rlsd_lambda(1000, lam, 0, 0) == lam  # ms-swift's default: constant


def test_algo_rlsd_is_the_authors_shipped_script():
    """ALGO=rlsd's overrides, composed over the knobs' defaults, are the RLSD authors' script's settings, KL off."""
    from recipe.mrtpo.config import mrtpo_config

    ov = _overrides("rlsd")
    import yaml

    cfg = mrtpo_config({k.removeprefix("mrtpo."): yaml.safe_load(v) for k, v in ov.items() if k.startswith("mrtpo.")})
    assert {k: getattr(cfg, k) for k in RLSD_AUTHORS} == RLSD_AUTHORS
    assert ov["actor_rollout_ref.actor.kl_loss_coef"] == "0"  # disable_kl; use_kl_loss=True only builds the reference
    assert ov["actor_rollout_ref.actor.use_kl_loss"] == "True"


def test_sdpo_defaults_are_its_configs():
    cfg = MRTPOConfig()
    assert {k: getattr(cfg, k) for k in SDPO_REFERENCE} == SDPO_REFERENCE


def test_algo_sdpo_sets_sdpos_rollout_correction_in_verls_settings_and_no_kl():
    from omegaconf import OmegaConf

    from recipe.mrtpo.methods.sdpo import SDPO, check_sdpo

    ov = _overrides("sdpo")
    assert {k: ov[k] for k in SDPO_SHIPPED_VERL} == SDPO_SHIPPED_VERL
    # verl 0.9.1's own settings, as its config names them (the group the advantage step's rollout correction reads)
    import verl

    group = OmegaConf.load(f"{verl.__path__[0]}/trainer/config/algorithm/rollout_correction.yaml")
    assert {"rollout_is", "rollout_is_threshold"} <= set(group) and group.bypass_mode is False
    # the run scripts' shared KL to the initial policy, passed again on the command line: refused
    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_coef": 0.001,
                                                               "strategy": "fsdp2"}}})
    with pytest.raises(ValueError, match="SDPO has no KL"):
        check_sdpo(config, SDPO, MRTPOConfig(mode="sdpo"))


def test_grpo_trains_on_the_mean_of_the_rewards_as_its_summary_says(monkeypatch):
    from recipe.mrtpo.rewards import reward_manager
    from recipe.mrtpo.tasks import Context, RewardResult

    assert "mean" in METHODS["grpo"].summary and "summed" not in METHODS["grpo"].summary
    scores = {"a": 1.0, "b": 0.0, "c": 0.5}
    result = RewardResult(scores=scores, contexts={k: Context(text=k, placement="prompt") for k in scores})
    monkeypatch.setattr(reward_manager, "get_task", lambda name: lambda *args: result)
    assert reward_manager.score_sample("t", "y", None, None)["reward_score"] == 0.5  # mean, not the sum 1.5
