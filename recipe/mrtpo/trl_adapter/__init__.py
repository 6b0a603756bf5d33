"""MRTPO for TRL users: ``MRTPOTrainer`` (a ``GRPOTrainer``), ``MRTPOGRPOConfig`` (a ``GRPOConfig``) and the Z_k
protocol of reward functions (``with_context``, ``task_rewards``). It imports TRL, the recipe's core and its task
registry, nothing of the verl glue (``tests/unit/test_import_graph.py`` holds it to that).

    from recipe.mrtpo.trl_adapter import MRTPOGRPOConfig, MRTPOTrainer, with_context
"""

import trl as _trl
from packaging.version import Version as _Version

#: the TRL release the adapter is tested on. TRL 0.27.0 (what verl[fsdp]==0.9.1 pins) cannot build a GRPOTrainer under
#: transformers 5.9.0, the project's: its optional-package probes take transformers' now tuple-valued
#: ``_is_package_available`` for True (it imports weave) and it reads ``model.warnings_issued``, gone in transformers 5.
MIN_TRL = "1.16.0"
if _Version(_trl.__version__) < _Version(MIN_TRL):
    raise ImportError(f"recipe.mrtpo.trl_adapter needs trl>={MIN_TRL} (pip install -e .[trl]), found trl {_trl.__version__}")

from recipe.mrtpo.trl_adapter.config import MRTPOGRPOConfig  # noqa: E402
from recipe.mrtpo.trl_adapter.rewards import task_rewards, with_context  # noqa: E402
from recipe.mrtpo.trl_adapter.trainer import MRTPOTrainer  # noqa: E402

__all__ = ["MIN_TRL", "MRTPOGRPOConfig", "MRTPOTrainer", "task_rewards", "with_context"]
