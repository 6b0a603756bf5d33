"""The recipe's config: ``mrtpo_trainer.yaml`` (verl's ppo_trainer + the ``mrtpo`` group) and its typed schema."""

from recipe.mrtpo.config.schema import MEASURES, MODES, REWARD_WEIGHTINGS, DumpConfig, MRTPOConfig, mrtpo_config

__all__ = ["MEASURES", "MODES", "REWARD_WEIGHTINGS", "DumpConfig", "MRTPOConfig", "mrtpo_config"]
