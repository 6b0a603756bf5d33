"""The recipe's config: ``mrtpo_trainer.yaml`` (verl's ppo_trainer + the ``mrtpo`` group) and its typed schema."""

from hydra.core.config_store import ConfigStore

from recipe.mrtpo.config.schema import MEASURES, MODES, REWARD_WEIGHTINGS, DumpConfig, MRTPOConfig, mrtpo_config

# the mrtpo group's keys and defaults for Hydra: mrtpo_trainer.yaml's defaults list composes this node at `mrtpo`
ConfigStore.instance().store(name="mrtpo_schema", node=MRTPOConfig)

__all__ = ["MEASURES", "MODES", "REWARD_WEIGHTINGS", "DumpConfig", "MRTPOConfig", "mrtpo_config"]
