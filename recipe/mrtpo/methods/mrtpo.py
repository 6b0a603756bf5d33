"""The replay family: MRTPO (one P_minus_k per reward), CoRT (one joint P_none) and the shuffle control.

All three run GDPO's advantage with token weights from the replay's relevance (``docs/design.md`` §1), under
the schedule beta_s (§1.4); they differ in the prompts replayed and the measure.
"""

from __future__ import annotations

from recipe.mrtpo.methods.checks import check_module_forward, check_per_reward_step
from recipe.mrtpo.methods.gdpo import gdpo_advantage
from recipe.mrtpo.methods.types import PASS_KNOBS, STEP_KNOBS, Method, ReplayPass

#: the knobs every method of the family reads
MRTPO_KNOBS = ("beta", "warmup_steps", "max_realloc_rms", "max_token_weight", "replay", *STEP_KNOBS, *PASS_KNOBS)


def mrtpo_strength(cfg, step: int, config=None) -> float:
    """beta_s (§1.4) at ``step`` completed training steps: 0 with the replay off (then the run is GDPO)."""
    from recipe.mrtpo.core.advantage import smoothstep_beta

    return smoothstep_beta(step, cfg.beta, cfg.warmup_steps) if cfg.replay else 0.0


_CHECKS = (check_per_reward_step, check_module_forward)

MRTPO = Method("mrtpo", "MRTPO: GDPO with per-reward token weights from one P_minus_k replay per reward (§1)", "mrtpo",
               reads=(*MRTPO_KNOBS, "measure"), replay=ReplayPass(), strength=mrtpo_strength,
               advantage=gdpo_advantage, checks=_CHECKS)
CORT = Method("cort", "CoRT-style: one joint P_none replay, |log p(y|P_all) - log p(y|P_none)| for every reward (§1.7)",
              "mrtpo", mode="cort", reads=MRTPO_KNOBS, replay=ReplayPass(variants="joint", measure="logprob_contrast"),
              strength=mrtpo_strength, advantage=gdpo_advantage, checks=_CHECKS)
SHUFFLE = Method("shuffle", "control: MRTPO with q permuted over each response's valid positions (§1.7)", "mrtpo",
                 shuffle=True, reads=(*MRTPO_KNOBS, "measure", "seed"), replay=ReplayPass(), strength=mrtpo_strength,
                 advantage=gdpo_advantage, checks=_CHECKS)
