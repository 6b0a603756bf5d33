"""MRTPO: reward-specific token-level credit assignment for multi-reward RL, as a verl 0.9.1 recipe.

The maths lives in `relevance` (per-token Jensen-Shannon between two prompt variants) and
`advantage` (relevance weights, the MRTPO/GDPO token advantage, SAW/DVAO reward weighting); both
import torch and numpy only. verl coupling (estimator registration, reward manager, trainer,
worker) sits in their own thin modules.
"""

__version__ = "0.1.0"
