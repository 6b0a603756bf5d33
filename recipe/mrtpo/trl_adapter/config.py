"""``MRTPOGRPOConfig``: TRL's ``GRPOConfig`` plus the ``mrtpo_*`` knobs (the recipe's ``mrtpo.*``, same meaning).

A refused value or combination raises one ``ValueError`` line in ``__post_init__``, as TRL's own config does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from trl import GRPOConfig

from recipe.mrtpo.core.relevance import MEASURES

NORMALIZATIONS = ("trl", "verl")


@dataclass
class MRTPOGRPOConfig(GRPOConfig):
    """GRPOConfig with MRTPO's knobs; ``multi_objective_aggregation`` defaults to GDPO's ``normalize_then_sum``."""

    multi_objective_aggregation: str = field(
        default="normalize_then_sum",
        metadata={"help": "MRTPO builds on GDPO: only 'normalize_then_sum' is accepted."},
    )
    mrtpo_beta: float = field(default=0.5, metadata={"help": "Reallocation strength in [0, 1); 0 is TRL's GDPO exactly."})
    mrtpo_warmup_steps: int = field(
        default=10, metadata={"help": "beta_s = beta * smoothstep(step / warmup): the first step is GDPO; 0 disables the warm-up."})
    mrtpo_max_realloc_rms: Optional[float] = field(
        default=1.0, metadata={"help": "rho of the second-moment constraint on w - 1 (None disables it)."})
    mrtpo_max_token_weight: Optional[float] = field(
        default=None, metadata={"help": "A cap c >= 1 on one token's weight (a departure from the paper, off by default)."})
    mrtpo_measure: str = field(default="js_distance", metadata={"help": "js_distance or js_divergence."})
    mrtpo_normalization: str = field(
        default="trl",
        metadata={"help": "'trl': TRL's GDPO normalisation (eps 1e-4, per-sequence batch statistics; beta = 0 is TRL's "
                          "normalize_then_sum exactly); 'verl': the verl recipe's (eps 1e-6, token-level batch whitening; "
                          "equal to the recipe's advantage; one process only)."})
    mrtpo_replay_micro_batch_size: int = field(default=8, metadata={"help": "Sequences per replay forward."})
    mrtpo_max_replay_prompt_length: Optional[int] = field(
        default=None, metadata={"help": "A prompt variant longer than this is not replayed (uniform weights, counted)."})

    def __post_init__(self):
        if self.multi_objective_aggregation != "normalize_then_sum":
            raise ValueError("MRTPOGRPOConfig: multi_objective_aggregation must be 'normalize_then_sum' (MRTPO weights each "
                             f"reward's own advantage), got {self.multi_objective_aggregation!r}")
        if not 0.0 <= self.mrtpo_beta < 1.0:
            raise ValueError(f"MRTPOGRPOConfig: mrtpo_beta must be in [0, 1), got {self.mrtpo_beta}")
        if self.mrtpo_warmup_steps < 0:
            raise ValueError(f"MRTPOGRPOConfig: mrtpo_warmup_steps must be >= 0, got {self.mrtpo_warmup_steps}")
        if self.mrtpo_max_realloc_rms is not None and self.mrtpo_max_realloc_rms < 0:
            raise ValueError(f"MRTPOGRPOConfig: mrtpo_max_realloc_rms must be >= 0 or None, got {self.mrtpo_max_realloc_rms}")
        if self.mrtpo_max_token_weight is not None and self.mrtpo_max_token_weight < 1.0:
            raise ValueError(f"MRTPOGRPOConfig: mrtpo_max_token_weight must be >= 1 or None, got {self.mrtpo_max_token_weight}")
        if self.mrtpo_measure not in MEASURES:
            raise ValueError(f"MRTPOGRPOConfig: mrtpo_measure must be one of {MEASURES}, got {self.mrtpo_measure!r}")
        if self.mrtpo_normalization not in NORMALIZATIONS:
            raise ValueError(f"MRTPOGRPOConfig: mrtpo_normalization must be one of {NORMALIZATIONS}, got {self.mrtpo_normalization!r}")
        if self.mrtpo_replay_micro_batch_size < 1:
            raise ValueError(f"MRTPOGRPOConfig: mrtpo_replay_micro_batch_size must be >= 1, got {self.mrtpo_replay_micro_batch_size}")
        super().__post_init__()
