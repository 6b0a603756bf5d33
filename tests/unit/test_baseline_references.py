"""Each self-teacher baseline's shipped defaults pinned against its named reference's values (docs/departures.md,
docs/opsd.md): OPSD (siyan-zhao/OPSD), RLSD (ms-swift's ``--advantage_reweight rlsd``; the RLSD authors' schedule
offered through the knobs), SDPO (lasgroup/SDPO's config) and GRPO's scalar reward (the mean the reward manager
passes). The reference values are written out here, once, from the references' shipped configs."""

from __future__ import annotations

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
# lasgroup/SDPO's config: JSD alpha 0.5 over the student's top-100 + tail, EMA rate 0.05, IS clip 2.0
SDPO_REFERENCE = {"sdpo_alpha": 0.5, "sdpo_topk": 100, "sdpo_add_tail": True, "sdpo_ema_rate": 0.05,
                  "sdpo_is_clip": 2.0}


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


def test_sdpo_defaults_are_its_configs():
    cfg = MRTPOConfig()
    assert {k: getattr(cfg, k) for k in SDPO_REFERENCE} == SDPO_REFERENCE


def test_grpo_trains_on_the_mean_of_the_rewards_as_its_summary_says(monkeypatch):
    from recipe.mrtpo import reward_manager
    from recipe.mrtpo.tasks import Context, RewardResult

    assert "mean" in METHODS["grpo"].summary and "summed" not in METHODS["grpo"].summary
    scores = {"a": 1.0, "b": 0.0, "c": 0.5}
    result = RewardResult(scores=scores, contexts={k: Context(text=k, placement="prompt") for k in scores})
    monkeypatch.setattr(reward_manager, "get_task", lambda name: lambda *args: result)
    assert reward_manager.score_sample("t", "y", None, None)["reward_score"] == 0.5  # mean, not the sum 1.5
