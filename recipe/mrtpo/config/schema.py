"""The recipe's typed configuration: every ``mrtpo.*`` default and its validation live here.

``mrtpo_trainer.yaml`` (beside this file) points at :class:`MRTPOConfig` with ``_target_`` (as verl's own configs
point at theirs), and :func:`mrtpo_config` turns the composed ``mrtpo`` group into this dataclass once,
when the run's config is checked (before Ray starts) and again in the trainer. Code reads typed
attributes; nothing else writes a default. The maths behind each knob is in ``docs/design.md`` §1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig

from recipe.mrtpo.core.advantage import REWARD_WEIGHTINGS  # noqa: F401  (re-exported: the choices live with the maths)
from recipe.mrtpo.core.prompt_variants import check_teacher_template
from recipe.mrtpo.core.relevance import MEASURES  # noqa: F401

#: mrtpo.mode's values: the ``mode`` of the methods registry's entries (recipe/mrtpo/methods/; the registry
#: validates against this config, never the other way: tests/unit/test_advantage.py checks the two agree)
MODES = ("mrtpo", "cort", "opsd", "gdpo-distill", "rlsd", "sdpo")
#: verl's distillation losses gdpo-distill (GDPO + a distillation term to the live self-teacher, docs/opsd.md) runs
#: with: the top-k forward KL, or a single-sample estimator on the sampled token (k1/kl are left out: backpropagated
#: directly, their gradient ignores the teacher)
OPSD_TOPK_LOSS_MODES = ("forward_kl_topk",)
OPSD_LOSS_MODES = OPSD_TOPK_LOSS_MODES + ("k3", "low_var_kl", "k2", "mse", "abs")
#: OPSD's support of the generalised JSD: the teacher's top-k renormalised (siyan-zhao/OPSD's --top_k_loss), or the
#: full vocabulary (its default), which the recipe does not run (docs/opsd.md, "The full vocabulary")
OPSD_SUPPORTS = ("topk", "full")
#: mrtpo.opsd_topk when null: OPSD's (the reference's top-k script, --top_k_loss 50) and gdpo-distill's (verl's
#: distillation topk default, 32)
OPSD_TOPK_DEFAULTS = {"opsd": 50, "gdpo-distill": 32}
#: RLSD's teacher: the behaviour policy under P_all (live, ms-swift's default) or the initial policy under P_all
#: (initial: verl's reference policy, the RLSD authors' shipped configuration)
RLSD_TEACHERS = ("live", "initial")
#: what RLSD's lambda schedule counts: ``updates``, the optimizer updates completed before the step (ms-swift's Hugging
#: Face ``global_step``, 0 at the first step), or ``steps``, the training step's number (the RLSD authors'
#: ``global_step``, 1 at the first step)
RLSD_SCHEDULES = ("updates", "steps")


@dataclass
class DumpConfig(BaseConfig):
    """Relevance dumps for the heatmap viewer (``python -m recipe.mrtpo.tools.viz``)."""

    every_n_steps: int = 0  # write a dump every N training steps; 0 = never
    max_samples: int = 8  # responses per dump (the first ones of the batch)
    dir: Optional[str] = None  # folder; None = <trainer.default_local_dir>/relevance_dumps

    def __post_init__(self) -> None:
        if self.every_n_steps < 0:
            raise ValueError(f"mrtpo.dump.every_n_steps must be >= 0, got {self.every_n_steps}")
        if self.max_samples < 1:
            raise ValueError(f"mrtpo.dump.max_samples must be >= 1, got {self.max_samples}")


@dataclass
class MRTPOConfig(BaseConfig):
    """The ``mrtpo`` config group (``docs/design.md`` §1 and §4)."""

    beta: float = 0.5  # reallocation strength after warm-up (§1.3); 0 = GDPO exactly
    warmup_steps: int = 10  # beta_s = beta * smoothstep(s / warmup_steps) (§1.4); 0 = no warm-up
    max_realloc_rms: Optional[float] = 1.0  # rho of the second-moment constraint (§1.5); None disables
    max_token_weight: Optional[float] = None  # c, a cap on one token's weight (§1.5, a departure); None: no cap
    measure: str = "js_distance"  # js_distance | js_divergence (§1.2)
    mode: str = "mrtpo"  # mrtpo | cort (one joint replay, log-likelihood contrast; §1.7) | opsd | gdpo-distill (docs/opsd.md) | rlsd (§1.8)
    replay: bool = True  # False: no replay, mrtpo == gdpo (timing baselines)
    shuffle: bool = False  # the control ablation: q permuted over each response's valid tokens (§1.7)
    seed: int = 0  # seed of the shuffle (combined with the step)
    reward_weighting: str = "none"  # none | saw | dvao: per-batch lambda_k (§1.6)
    # fixed lambda_k by reward name ({name: float}); unnamed rewards 1. Typed Any for Hydra: OmegaConf cannot merge a
    # command-line dict into a node typed Optional[dict] whose default is None; __post_init__ checks the mapping.
    reward_weights: Any = None
    replay_micro_batch_size: int = 8  # prompt variants per replay forward
    chunk_size: Optional[int] = None  # positions expanded to fp32 [chunk, V] in the JS; None = ~64 MiB
    share_prompts: bool = True  # each distinct prompt variant once per pass forward, block-sparse, where it pays (core.shared_prompts)
    compile_js: bool = False  # torch.compile the JS with its log-softmaxes fused
    fused_check_every: int = 10  # verl's own old_log_prob beside the fused pass every N steps and the first; 0 = never
    max_replay_prompt_length: Optional[int] = None  # longer variants fall back to uniform weights
    # OPSD / RLSD: the framing of the privileged information in the teacher prompt, a str.format string with
    # {prompt} (the last user turn) and {information} (the appended Z_k); None = core.prompt_variants.TEACHER_TEMPLATE
    teacher_template: Optional[str] = None
    # OPSD and gdpo-distill: teacher log-probs kept per response token; None = OPSD_TOPK_DEFAULTS[mode]
    opsd_topk: Optional[int] = None
    opsd_beta: float = 0.5  # OPSD: beta of the generalised JSD (0 forward KL, 1 reverse KL; the reference's 0.5)
    opsd_support: str = "topk"  # OPSD: topk (the teacher's top-k, renormalised) | full (refused: docs/opsd.md)
    opsd_loss_mode: str = "forward_kl_topk"  # gdpo-distill: verl distillation loss (OPSD_LOSS_MODES)
    opsd_loss_coef: float = 1.0  # gdpo-distill: policy loss of the advantage + coef * distillation loss
    rlsd_lambda: float = 0.5  # RLSD: mixing weight, 0 = GDPO, 1 = the full reweight (ms-swift's default)
    rlsd_reweight_clip_range: float = 0.2  # RLSD: eps_w, the evidence weight is clipped to [1 - eps_w, 1 + eps_w]
    rlsd_lambda_warmup_steps: int = 0  # RLSD: lambda ramps linearly from 0 over these optimizer steps (ms-swift's)
    rlsd_lambda_decay_steps: int = 0  # RLSD: after the warm-up, lambda decays linearly to 0 over these optimizer steps
    rlsd_negative_only: bool = False  # RLSD: reweight only responses with a negative advantage
    rlsd_teacher: str = "live"  # RLSD: live (the behaviour policy under P_all) | initial (verl's reference policy)
    rlsd_teacher_sync_steps: int = 0  # RLSD, initial teacher: copy the policy into it after every N-th update; 0 = never
    rlsd_schedule: str = "updates"  # RLSD: what the warm-up / decay count (RLSD_SCHEDULES)
    sdpo_topk: int = 100  # SDPO: the student's top-k ids the divergence is taken over (SDPO's distillation_topk)
    sdpo_add_tail: bool = True  # SDPO: one tail bucket for the rest of the vocabulary (False: the top-k renormalised)
    sdpo_alpha: float = 0.5  # SDPO: the generalised JSD's alpha; 0 forward KL(T||S), 1 reverse KL(S||T)
    sdpo_ema_rate: float = 0.05  # SDPO: theta_T <- (1 - rate) theta_T + rate theta_S after each actor update
    sdpo_is_clip: Optional[float] = 2.0  # SDPO: per-token IS weight min(pi/pi_old, clip) (detached); null: none
    dump: DumpConfig = field(default_factory=DumpConfig)

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.beta) < 1.0:
            raise ValueError(f"mrtpo.beta must be in [0, 1) (beta = 1 gives weight 0 to tokens the replay did not move), got {self.beta}")
        if self.warmup_steps < 0:
            raise ValueError(f"mrtpo.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.max_realloc_rms is not None and self.max_realloc_rms < 0:
            raise ValueError(f"mrtpo.max_realloc_rms must be >= 0 or null, got {self.max_realloc_rms}")
        if self.max_token_weight is not None and not float(self.max_token_weight) >= 1.0:
            raise ValueError(f"mrtpo.max_token_weight must be >= 1 (1: uniform weights) or null, got {self.max_token_weight}")
        _choice("measure", self.measure, MEASURES)
        _choice("mode", self.mode, MODES)
        _choice("reward_weighting", self.reward_weighting, REWARD_WEIGHTINGS)
        if self.fused_check_every < 0:
            raise ValueError(f"mrtpo.fused_check_every must be >= 0 (0: never), got {self.fused_check_every}")
        if self.replay_micro_batch_size < 1:
            raise ValueError(f"mrtpo.replay_micro_batch_size must be >= 1, got {self.replay_micro_batch_size}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"mrtpo.chunk_size must be >= 1 or null, got {self.chunk_size}")
        if self.max_replay_prompt_length is not None and self.max_replay_prompt_length < 1:
            raise ValueError(f"mrtpo.max_replay_prompt_length must be >= 1 or null, got {self.max_replay_prompt_length}")
        check_teacher_template(self.teacher_template)
        if self.opsd_topk is not None and self.opsd_topk < 1:
            raise ValueError(f"mrtpo.opsd_topk must be >= 1 or null, got {self.opsd_topk}")
        if not 0.0 <= float(self.opsd_beta) <= 1.0:
            raise ValueError(f"mrtpo.opsd_beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {self.opsd_beta}")
        _choice("opsd_support", self.opsd_support, OPSD_SUPPORTS)
        if self.opsd_support == "full":
            raise ValueError(
                "mrtpo.opsd_support=full is not supported: the JSD over the full vocabulary needs the teacher's whole "
                "distribution at every response token, which cannot be stored per token (V x tokens, 152k x 4 bytes a "
                "token for Qwen) and which the recipe does not yet compute inside the actor update from the reference "
                "model. Use mrtpo.opsd_support=topk (the reference's --top_k_loss: the teacher's top-k, renormalised; "
                "mrtpo.opsd_topk, default 50). docs/opsd.md, 'The full vocabulary'.")
        _choice("opsd_loss_mode", self.opsd_loss_mode, OPSD_LOSS_MODES)
        if not float(self.opsd_loss_coef) >= 0.0:
            raise ValueError(f"mrtpo.opsd_loss_coef must be >= 0, got {self.opsd_loss_coef}")
        if not 0.0 <= float(self.rlsd_lambda) <= 1.0:
            raise ValueError(f"mrtpo.rlsd_lambda must be in [0, 1], got {self.rlsd_lambda}")
        if not float(self.rlsd_reweight_clip_range) >= 0.0:
            raise ValueError(f"mrtpo.rlsd_reweight_clip_range must be >= 0, got {self.rlsd_reweight_clip_range}")
        if self.rlsd_lambda_warmup_steps < 0 or self.rlsd_lambda_decay_steps < 0:
            raise ValueError("mrtpo.rlsd_lambda_warmup_steps and rlsd_lambda_decay_steps must be >= 0, got "
                             f"{self.rlsd_lambda_warmup_steps} and {self.rlsd_lambda_decay_steps}")
        _choice("rlsd_teacher", self.rlsd_teacher, RLSD_TEACHERS)
        _choice("rlsd_schedule", self.rlsd_schedule, RLSD_SCHEDULES)
        if self.rlsd_teacher_sync_steps < 0:
            raise ValueError(f"mrtpo.rlsd_teacher_sync_steps must be >= 0, got {self.rlsd_teacher_sync_steps}")
        if self.rlsd_teacher_sync_steps > 0 and self.rlsd_teacher != "initial":
            raise ValueError(f"mrtpo.rlsd_teacher_sync_steps={self.rlsd_teacher_sync_steps} re-syncs a frozen teacher: it "
                             f"needs mrtpo.rlsd_teacher=initial (got {self.rlsd_teacher}: the live teacher is the policy "
                             "already). Use mrtpo.rlsd_teacher=initial or leave rlsd_teacher_sync_steps=0")
        if self.sdpo_topk < 1:
            raise ValueError(f"mrtpo.sdpo_topk must be >= 1, got {self.sdpo_topk}")
        if not 0.0 <= float(self.sdpo_alpha) <= 1.0:
            raise ValueError(f"mrtpo.sdpo_alpha must be in [0, 1], got {self.sdpo_alpha}")
        if not 0.0 <= float(self.sdpo_ema_rate) <= 1.0:
            raise ValueError(f"mrtpo.sdpo_ema_rate must be in [0, 1] (0: the teacher stays the initial policy), got {self.sdpo_ema_rate}")
        if self.sdpo_is_clip is not None and not float(self.sdpo_is_clip) > 0.0:
            raise ValueError(f"mrtpo.sdpo_is_clip must be > 0 or null, got {self.sdpo_is_clip}")
        if self.reward_weights is not None:
            if not isinstance(self.reward_weights, Mapping):
                raise ValueError(f"mrtpo.reward_weights must map reward names to numbers, got {self.reward_weights!r}")
            bad = {k: v for k, v in dict(self.reward_weights).items() if not isinstance(v, (int, float))}
            if bad:
                raise ValueError(f"mrtpo.reward_weights must map reward names to numbers, got {bad}")

    def opsd_topk_of(self) -> int:
        """k of the self-teacher's top-k: ``opsd_topk``, or the mode's default (:data:`OPSD_TOPK_DEFAULTS`)."""
        return int(self.opsd_topk) if self.opsd_topk is not None else OPSD_TOPK_DEFAULTS.get(self.mode, OPSD_TOPK_DEFAULTS["opsd"])

    def reward_weight(self, name: str) -> float:
        """Fixed lambda_k of reward ``name`` (1 unless named in ``reward_weights``)."""
        return float((self.reward_weights or {}).get(name, 1.0))

def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"mrtpo.{name} must be one of {allowed}, got {value!r}")


def mrtpo_config(cfg: Any) -> MRTPOConfig:
    """The typed :class:`MRTPOConfig` of a composed ``mrtpo`` group (DictConfig, dict or instance).

    Unknown keys are an error (a typo such as ``mrtpo.bta=0.3`` must not run with the default).
    """
    if isinstance(cfg, MRTPOConfig):
        return cfg
    from omegaconf import DictConfig, OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg or {})
    raw.pop("_target_", None)
    dump = dict(raw.pop("dump", None) or {})
    dump.pop("_target_", None)
    known = set(MRTPOConfig.__dataclass_fields__) - {"_target_", "dump"}
    unknown = sorted(set(raw) - known) + [f"dump.{k}" for k in sorted(set(dump) - set(DumpConfig.__dataclass_fields__))]
    if unknown:
        raise ValueError(f"unknown mrtpo config keys: {unknown}; known: {sorted(known)} and dump.*")
    return MRTPOConfig(**raw, dump=DumpConfig(**dump))
