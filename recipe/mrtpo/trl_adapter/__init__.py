"""MRTPO for TRL users: ``MRTPOTrainer`` (a ``GRPOTrainer``), ``MRTPOGRPOConfig`` (a ``GRPOConfig``) and the Z_k
protocol of reward functions (``with_context``, ``task_rewards``). It imports TRL, the recipe's core and its task
registry, nothing of the verl glue (``tests/unit/test_import_graph.py`` holds it to that).

    from recipe.mrtpo.trl_adapter import MRTPOGRPOConfig, MRTPOTrainer, with_context
"""

from recipe.mrtpo.trl_adapter.config import MRTPOGRPOConfig
from recipe.mrtpo.trl_adapter.rewards import task_rewards, with_context
from recipe.mrtpo.trl_adapter.trainer import MRTPOTrainer

__all__ = ["MRTPOGRPOConfig", "MRTPOTrainer", "task_rewards", "with_context"]
