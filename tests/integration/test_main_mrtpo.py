"""The entry point's config: verl's ppo_trainer + the mrtpo group composes, overrides work, bad combos fail early."""

import pytest
from hydra import compose, initialize_config_module


def compose_cfg(*overrides):
    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=list(overrides))


def test_recipe_config_composes_with_verl_and_overrides():
    from verl.trainer.config import AlgoConfig
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose_cfg("mrtpo.beta=0.3", "algorithm.adv_estimator=gdpo", "actor_rollout_ref.rollout.n=8")
    assert cfg.mrtpo.beta == 0.3 and cfg.algorithm.adv_estimator == "gdpo" and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.reward.reward_manager.name == "MRTPORewardManager" and cfg.reward.reward_manager.source == "importlib"
    assert cfg.trainer.v1.trainer_mode == "mrtpo" and cfg.trainer.use_v1 and cfg.data.return_raw_chat
    assert isinstance(omega_conf_to_dataclass(cfg.algorithm), AlgoConfig)  # the recipe adds nothing under algorithm.*
    for knob in ("warmup_steps", "max_realloc_rms", "measure", "mode", "replay", "shuffle", "reward_weighting",
                 "reward_weights", "replay_micro_batch_size", "chunk_size", "max_replay_prompt_length", "dump"):
        assert knob in cfg.mrtpo


def test_kl_in_reward_is_refused_for_per_reward_estimators():
    """use_kl_in_reward would be silently ignored by mrtpo/gdpo (they read per-reward scores): a clear error."""
    from recipe.mrtpo.main_mrtpo import run

    with pytest.raises(ValueError, match="use_kl_loss"):
        run(compose_cfg("algorithm.use_kl_in_reward=True"))


def test_v0_trainer_is_refused():
    from recipe.mrtpo.main_mrtpo import run

    with pytest.raises(ValueError, match="use_v1"):
        run(compose_cfg("trainer.use_v1=False"))


def test_typed_config_is_the_one_place_of_defaults_and_checks():
    """The YAML's mrtpo group becomes MRTPOConfig (its _target_); bad values and unknown keys fail before Ray."""
    from dataclasses import fields

    from verl.utils.config import omega_conf_to_dataclass

    from recipe.mrtpo.config import MRTPOConfig, mrtpo_config
    from recipe.mrtpo.main_mrtpo import check_config

    cfg = compose_cfg()
    typed = mrtpo_config(cfg.mrtpo)
    assert isinstance(typed, MRTPOConfig) and isinstance(omega_conf_to_dataclass(cfg.mrtpo), MRTPOConfig)
    defaults = MRTPOConfig()
    for f in fields(MRTPOConfig):  # the YAML states the dataclass defaults, never its own
        if f.name not in ("_target_", "dump"):
            assert getattr(typed, f.name) == getattr(defaults, f.name), f.name
    assert typed.dump.every_n_steps == 0 and typed.dump.max_samples == 8
    for bad, msg in (("mrtpo.beta=1.0", r"\[0, 1\)"), ("mrtpo.beta=-0.1", "beta"), ("mrtpo.measure=kl", "measure"),
                     ("mrtpo.mode=x", "mode"), ("mrtpo.replay_micro_batch_size=0", "micro_batch"),
                     ("+mrtpo.bta=0.3", "unknown"), ("mrtpo.dump.max_samples=0", "max_samples")):
        with pytest.raises(ValueError, match=msg):
            check_config(compose_cfg(bad))
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo"):
        check_config(compose_cfg("algorithm.norm_adv_by_std_in_grpo=False"))
    check_config(compose_cfg("mrtpo.beta=0.99", "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=False"))
