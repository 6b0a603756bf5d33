"""The recipe's methods, one entry each, resolved once from the composed config before Ray starts.

A method is what ``ALGO=<name>`` selects in the run scripts and what a report row is named after. Its
:class:`Method` entry declares everything the trainer's advantage step does differently for it:

- ``overrides``: the Hydra overrides that select it (``algorithm.adv_estimator`` and the ``mrtpo.*``
  selectors ``mode`` / ``shuffle``); :func:`resolve` maps a composed config back to exactly one entry;
- ``reads``: the ``mrtpo.*`` knobs it reads. A knob another method reads, set to anything but its
  default, is refused with the knob and the method named (it would do nothing);
- ``replay``: the replay pass it needs (:class:`ReplayPass`: per-reward P_minus_k variants, CoRT's joint
  P_none, whose log-probs to return), or None;
- ``strength``: the schedule of its token-level part (MRTPO's beta_s, RLSD's lambda_s); the replay runs
  only when it is > 0 (at 0 the method is GDPO exactly, so nothing is replayed);
- ``advantage``: the token advantage from the step's inputs (:class:`AdvantageInputs`), or None for
  verl's own estimator step (GRPO);
- ``after_step``: a hook after the advantage is written (OPSD's teacher pass and loss settings);
- ``checks``: verl settings the method cannot run with, refused with what to change.

The module imports no torch and no verl at import time (the run scripts call its command line for every
launch): ``python -m recipe.mrtpo.methods`` lists the methods, ``python -m recipe.mrtpo.methods overrides
NAME`` prints a method's Hydra overrides, one per line; ``reads NAME`` the ``mrtpo.*`` knobs it reads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Optional

#: knobs that select the method (part of its ``overrides``), never "unread"
SELECTORS = ("mode", "shuffle")
#: how a pass runs, not what it computes: per-machine presets the run scripts set for every method of a
#: (model, task) the same way, so they are not refused where no pass runs (they change no number)
RESOURCE_KNOBS = ("replay_micro_batch_size", "chunk_size", "compile_js")
#: knobs of the recipe's own advantage step, read by every method that runs it
STEP_KNOBS = ("reward_weighting", "reward_weights", "dump")
#: knobs of the replay pass, read by every method that replays
PASS_KNOBS = ("max_replay_prompt_length", "fused_check_every")


@dataclass(frozen=True)
class ReplayPass:
    """What a method needs from the replay (``replay_driver.run_replay``)."""

    joint: bool = False  # CoRT's one P_none variant per sample instead of one P_minus_k per reward
    measure: Optional[str] = None  # the worker's measure; None: ``mrtpo.measure``
    p_all_logprobs: bool = False  # return log p(y | P_all) of every replayed row (else the rollout prompt's)

    def measure_of(self, cfg) -> str:
        return self.measure or cfg.measure


@dataclass
class AdvantageInputs:
    """What a method's advantage reads: the batch's rewards, groups and mask, the replay, verl's log-probs."""

    cfg: Any  # MRTPOConfig
    table: Any  # RewardTable
    index: Any  # [B] group ids (verl's uid)
    mask: Any  # [B, T] float response mask
    valid: Any  # [B] bool: not one of verl's padding rows
    step: int  # completed training steps
    strength: float  # the method's schedule at this step (beta_s, lambda_s; 0 for GDPO)
    replay: Any = None  # ReplayResult or None
    old_log_probs: Any = None  # [B, T] verl's old_log_probs (the behaviour policy under the rollout prompt)


@dataclass
class StepContext:
    """What an ``after_step`` hook may use: the batch, its reward table and the actor's workers, no trainer."""

    config: Any  # the composed config
    cfg: Any  # MRTPOConfig
    batch: Any  # verl's batch meta (TransferQueue keys)
    metrics: dict
    table: Any  # RewardTable
    fields: dict  # the step's own fetch: extra_fields, raw_prompt, prompts
    tokenizer: Any
    render: Callable[[list], list]  # chat messages -> prompt ids, as the rollout rendered them
    worker_group: Any  # the actor's worker group (its registered methods, e.g. compute_opsd_teacher)
    dp_size: Callable[[], int]  # the actor's data-parallel size


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    estimator: str  # algorithm.adv_estimator
    mode: str = "mrtpo"  # mrtpo.mode
    shuffle: bool = False  # mrtpo.shuffle
    reads: tuple[str, ...] = ()
    replay: Optional[ReplayPass] = None
    strength: Optional[Callable[[Any, int], float]] = None
    advantage: Optional[Callable[[AdvantageInputs], tuple]] = None
    after_step: Optional[Callable[[StepContext], Any]] = None
    checks: tuple[Callable[[Any, Method, Any], None], ...] = field(default=())  # (config, method, MRTPOConfig)

    @property
    def overrides(self) -> tuple[str, ...]:
        out = [f"algorithm.adv_estimator={self.estimator}"]
        if self.mode != "mrtpo":
            out.append(f"mrtpo.mode={self.mode}")
        if self.shuffle:
            out.append("mrtpo.shuffle=True")
        return tuple(out)

    @property
    def recipe_step(self) -> bool:
        """The recipe computes its advantage (else verl's estimator step runs unchanged)."""
        return self.advantage is not None

    def reads_knob(self, knob: str) -> bool:
        return knob in self.reads or knob in SELECTORS or knob in RESOURCE_KNOBS


# ------------------------------------------------------------------------------------------------ checks
def _get(config, dotted: str, default=None):
    """``config.a.b.c`` or ``default`` when any part is absent (composed DictConfig or plain dict)."""
    node = config
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(part, None)
    return default if node is None else node


def check_module_forward(config, method: Method, cfg) -> None:
    """verl settings a pass through the actor's plain Hugging Face module cannot run with (the replay,
    OPSD's teacher; ``docs/design.md`` §5), refused before Ray starts with what to change.

    - ``use_fused_kernels=True``: verl replaces the model's forward with one that returns log-probs and
      entropy only, no ``.logits``; the passes need the full next-token distributions.
    - Ulysses sequence parallel > 1: verl patches attention with all-to-alls over the sequence-parallel
      group and shards each sequence over it; the passes feed every rank whole sequences of its own rows.
    - an actor strategy other than FSDP: the passes call ``engine.module`` as one Hugging Face model.
    ``use_remove_padding=True`` is supported: it patches only the flash-attention function, which with
    sequence parallel 1 calls the original one with the same arguments (tests/integration/test_main_mrtpo.py).
    """
    if method.reads_knob("replay") and not cfg.replay:
        return  # the replay is off: the run is GDPO, no pass runs
    arr = "actor_rollout_ref"
    who = f"method {method.name} ({', '.join(method.overrides)})"
    if method.reads_knob("replay"):
        off = "or turn the replay off (mrtpo.replay=False: the run is then GDPO)"
    else:
        off = "or choose a method without the pass (ALGO=gdpo)"
    fused = [k for k in (f"{arr}.model.use_fused_kernels", f"{arr}.actor.use_fused_kernels") if bool(_get(config, k, False))]
    if fused:
        raise ValueError(
            f"{fused[0]}=True is not supported with {who}: verl's fused-kernel forward returns log-probs without "
            f"logits, and the method's pass needs the full next-token distributions. Set {arr}.model.use_fused_kernels=False, {off}."
        )
    for key in (f"{arr}.actor.ulysses_sequence_parallel_size", f"{arr}.actor.fsdp_config.ulysses_sequence_parallel_size"):
        sp = int(_get(config, key, 1) or 1)
        if sp > 1:
            raise ValueError(
                f"{key}={sp} is not supported with {who}: the pass runs whole sequences through the plain model "
                f"forward, which Ulysses sequence parallel shards across ranks. Set {arr}.actor.ulysses_sequence_parallel_size=1 "
                "(and fsdp_config.ulysses_sequence_parallel_size=1; fit long sequences with use_dynamic_bsz / "
                f"ppo_max_token_len_per_gpu instead), {off}."
            )
    strategy = str(_get(config, f"{arr}.actor.strategy", "fsdp"))
    if strategy not in ("fsdp", "fsdp2"):
        raise ValueError(
            f"{arr}.actor.strategy={strategy} is not supported with {who}: the pass runs on the FSDP engine's "
            f"Hugging Face module. Use {arr}.actor.strategy=fsdp2 (or fsdp), {off}."
        )


def check_per_reward_step(config, method: Method, cfg) -> None:
    """Settings the recipe's advantage step (built from the per-reward scores) does not read."""
    if bool(_get(config, "algorithm.use_kl_in_reward", False)):
        raise ValueError(
            f"algorithm.use_kl_in_reward=True has no effect with method {method.name} (adv_estimator={method.estimator}): "
            "its advantage is built from the per-reward scores, not the token-level reward. Use the KL loss instead "
            "(actor_rollout_ref.actor.use_kl_loss=True, kl_loss_coef, kl_loss_type)."
        )
    if not bool(_get(config, "algorithm.norm_adv_by_std_in_grpo", True)):
        raise ValueError(
            f"method {method.name} normalises each reward by its group std (GDPO): algorithm.norm_adv_by_std_in_grpo=False "
            "is not supported"
        )


def check_opsd(config, method: Method, cfg) -> None:
    from recipe.mrtpo.opsd_step import check_opsd_settings

    check_opsd_settings(config)


# ------------------------------------------------------------------------------------------------ advantages
def mrtpo_strength(cfg, step: int) -> float:
    """beta_s (§1.4): 0 with the replay off (then the run is GDPO)."""
    from recipe.mrtpo.core.advantage import smoothstep_beta

    return smoothstep_beta(step, cfg.beta, cfg.warmup_steps) if cfg.replay else 0.0


def gdpo_advantage(inp: AdvantageInputs, whiten: bool = True):
    """The per-reward group-normalised advantage (§1.1, §1.6), token weights from the replay where it ran."""
    import torch

    from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats

    cfg, replay = inp.cfg, inp.replay
    gen = torch.Generator().manual_seed(cfg.seed * 100003 + inp.step) if cfg.shuffle else None
    return compute_mrtpo_advantage_with_stats(
        inp.table.scores, inp.index, inp.mask, replay.relevance if replay is not None else None,
        beta=inp.strength if replay is not None else 0.0,
        reward_weights=[cfg.reward_weight(n) for n in inp.table.names], max_realloc_rms=cfg.max_realloc_rms,
        shuffle=cfg.shuffle, generator=gen, reward_weighting=cfg.reward_weighting, valid=inp.valid, whiten=whiten,
    )


def rlsd_strength(cfg, step: int) -> float:
    """RLSD's lambda_s (ms-swift's warm-up / decay schedule)."""
    from recipe.mrtpo.core.advantage import rlsd_lambda

    return rlsd_lambda(step, cfg.rlsd_lambda, cfg.rlsd_lambda_warmup_steps, cfg.rlsd_lambda_decay_steps)


def rlsd_advantage(inp: AdvantageInputs):
    """RLSD on GDPO (§1.8): GDPO's per-reward sum reweighted by the P_all / rollout-prompt log-prob gap, then
    batch-whitened as GDPO. Rows without P_all log-probs (not replayed, or P_all is the rollout prompt) keep
    GDPO's advantage exactly (delta = 0)."""
    import torch

    from recipe.mrtpo.core.advantage import masked_whiten, rlsd_reweight

    raw, stats = gdpo_advantage(replace(inp, replay=None, strength=0.0), whiten=False)
    teacher, student = torch.zeros_like(raw), torch.zeros_like(raw)
    rows = 0
    rp, old = inp.replay, inp.old_log_probs
    if rp is not None and rp.replay_logprobs is not None and old is not None:
        for r, i in enumerate(rp.rows):
            if not rp.logprobs_are_rollout_prompt[r]:  # the row's P_all differs from its rollout prompt
                teacher[i], student[i] = rp.replay_logprobs[r].to(raw.device), old[i].float().to(raw.device)
                rows += 1
    cfg = inp.cfg
    adv, weight = rlsd_reweight(raw, inp.mask, teacher, student, inp.strength, cfg.rlsd_reweight_clip_range,
                                cfg.rlsd_negative_only)
    w = weight[(inp.mask > 0) & (raw != 0)]  # the weights that act (valid positions of a non-zero advantage)
    bound = inp.strength * cfg.rlsd_reweight_clip_range  # r lies in [1 - bound, 1 + bound]
    stats.extra.update({
        "mrtpo/rlsd/lambda": inp.strength,
        "mrtpo/rlsd/rows_privileged": rows,
        "mrtpo/rlsd/weight_mean": float(w.mean()) if w.numel() else 1.0,
        "mrtpo/rlsd/weight_min": float(w.min()) if w.numel() else 1.0,
        "mrtpo/rlsd/weight_max": float(w.max()) if w.numel() else 1.0,
        "mrtpo/rlsd/clip_share": float(((w - 1).abs() >= bound - 1e-6).float().mean()) if w.numel() and bound > 0 else 0.0,
    })
    return masked_whiten(adv, inp.mask) * inp.mask, stats


# ------------------------------------------------------------------------------------------------ the registry
_MRTPO_KNOBS = ("beta", "warmup_steps", "max_realloc_rms", "replay", *STEP_KNOBS, *PASS_KNOBS)


def _opsd_after_step(ctx: StepContext):
    from recipe.mrtpo.opsd_step import write_opsd_teacher

    return write_opsd_teacher(ctx)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("grpo", "verl's GRPO: one summed reward, verl's estimator step unchanged", "grpo"),
        Method("gdpo", "GDPO: each reward normalised in its group, summed, batch-whitened; no replay", "gdpo",
               reads=STEP_KNOBS, advantage=gdpo_advantage, checks=(check_per_reward_step,)),
        Method("mrtpo", "MRTPO: GDPO with per-reward token weights from one P_minus_k replay per reward (§1)", "mrtpo",
               reads=(*_MRTPO_KNOBS, "measure"), replay=ReplayPass(), strength=mrtpo_strength,
               advantage=gdpo_advantage, checks=(check_per_reward_step, check_module_forward)),
        Method("cort", "CoRT-style: one joint P_none replay, |log p(y|P_all) - log p(y|P_none)| for every reward (§1.7)",
               "mrtpo", mode="cort", reads=_MRTPO_KNOBS, replay=ReplayPass(joint=True, measure="logprob_contrast"),
               strength=mrtpo_strength, advantage=gdpo_advantage, checks=(check_per_reward_step, check_module_forward)),
        Method("shuffle", "control: MRTPO with q permuted over each response's valid positions (§1.7)", "mrtpo",
               shuffle=True, reads=(*_MRTPO_KNOBS, "measure", "seed"), replay=ReplayPass(), strength=mrtpo_strength,
               advantage=gdpo_advantage, checks=(check_per_reward_step, check_module_forward)),
        Method("opsd", "OPSD: GDPO + verl's distillation loss to the policy under P_all (docs/opsd.md)", "gdpo",
               mode="opsd", reads=(*STEP_KNOBS, *PASS_KNOBS, "opsd_topk", "opsd_loss_mode", "opsd_loss_coef"),
               advantage=gdpo_advantage, after_step=_opsd_after_step,
               checks=(check_per_reward_step, check_module_forward, check_opsd)),
        Method("rlsd", "RLSD: GDPO reweighted per token by exp(sign(A) (log p(y|P_all) - log p(y|prompt))), clipped (§1.8)",
               "gdpo", mode="rlsd", reads=(*STEP_KNOBS, *PASS_KNOBS, "rlsd_lambda", "rlsd_reweight_clip_range",
                                            "rlsd_lambda_warmup_steps", "rlsd_lambda_decay_steps", "rlsd_negative_only"),
               replay=ReplayPass(joint=True, measure="logprob_contrast", p_all_logprobs=True), strength=rlsd_strength,
               advantage=rlsd_advantage, checks=(check_per_reward_step, check_module_forward)),
    )
}


def names() -> list[str]:
    return list(METHODS)


def modes() -> tuple[str, ...]:
    """The values of ``mrtpo.mode`` (each method's, once)."""
    return tuple(dict.fromkeys(m.mode for m in METHODS.values()))


def get(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; one of {names()}")
    return METHODS[name]


def replay_pass_of(cfg) -> ReplayPass:
    """The replay pass of the method of ``mrtpo.mode`` (what ``replay_driver.run_replay`` plans and asks for)."""
    for m in METHODS.values():
        if m.mode == cfg.mode and m.replay is not None:
            return m.replay
    raise ValueError(f"mrtpo.mode={cfg.mode} runs no replay")


def _estimator(config) -> str:
    est = _get(config, "algorithm.adv_estimator", "gae")
    return str(getattr(est, "value", est))


def name_of(estimator: str, mode: str = "mrtpo", shuffle: bool = False) -> Optional[str]:
    """The method that (``algorithm.adv_estimator``, ``mrtpo.mode``, ``mrtpo.shuffle``) select, or None."""
    for m in METHODS.values():
        if (m.estimator, m.mode, m.shuffle) == (estimator, mode, bool(shuffle)):
            return m.name
    return None


def _match(est: str, cfg) -> Method:
    """The one entry of (estimator, mode, shuffle), or a message naming the setting that contradicts it."""
    name = name_of(est, cfg.mode, cfg.shuffle)
    if name is not None:
        return METHODS[name]
    if cfg.mode != "mrtpo":
        m = next(m for m in METHODS.values() if m.mode == cfg.mode)
        if cfg.shuffle:
            raise ValueError(f"mrtpo.shuffle=True is not read by method {m.name} (mrtpo.mode={cfg.mode}): leave it False")
        raise ValueError(
            f"mrtpo.mode={cfg.mode} is method {m.name}, which runs with algorithm.adv_estimator={m.estimator}; "
            f"with adv_estimator={est} it would not run as {m.name}. Use {' '.join(m.overrides)} (ALGO={m.name})"
        )
    if cfg.shuffle:
        raise ValueError(
            f"mrtpo.shuffle=True is read only by method shuffle (algorithm.adv_estimator=mrtpo); with adv_estimator={est} "
            "it would do nothing. Use ALGO=shuffle or leave it False"
        )
    known = sorted({m.estimator for m in METHODS.values()})
    raise ValueError(f"algorithm.adv_estimator={est} is none of the recipe's methods (estimators {known}; methods {names()})")


def resolve(config) -> Method:
    """The method of a composed config, after refusing every setting it does not read or cannot run with.

    Raises ValueError naming the setting and the method. Also validates every ``mrtpo.*`` value
    (:func:`recipe.mrtpo.config.mrtpo_config`).
    """
    from dataclasses import fields

    from recipe.mrtpo.config import MRTPOConfig, mrtpo_config

    cfg = mrtpo_config(config.get("mrtpo", None))
    method = _match(_estimator(config), cfg)
    defaults = MRTPOConfig()
    for f in fields(MRTPOConfig):
        if f.name == "_target_" or method.reads_knob(f.name):
            continue
        value, default = getattr(cfg, f.name), getattr(defaults, f.name)
        if f.name == "dump":  # the switch is every_n_steps; the other dump knobs are read only when it is on
            if value.every_n_steps != default.every_n_steps:
                raise ValueError(f"mrtpo.dump.every_n_steps={value.every_n_steps} is not read by method {method.name}: "
                                 "verl's own advantage step writes no relevance dumps")
            continue
        if value != default:
            readers = [m.name for m in METHODS.values() if f.name in m.reads]
            raise ValueError(
                f"mrtpo.{f.name}={value} is not read by method {method.name} ({', '.join(method.overrides)}): it would do "
                f"nothing. Leave it at its default ({default}) or choose a method that reads it ({', '.join(readers) or 'none'})"
            )
    for check in method.checks:
        check(config, method, cfg)
    return method


def main(argv: list[str]) -> int:
    if not argv or argv == ["list"]:
        for m in METHODS.values():
            print(f"{m.name:8s} {' '.join(m.overrides):45s} {m.summary}")
        return 0
    if argv[0] == "names" and len(argv) == 1:
        print(" ".join(names()))
        return 0
    if argv[0] == "overrides" and len(argv) == 2:
        if argv[1] not in METHODS:
            print(f"unknown method '{argv[1]}' (one of: {' '.join(names())})", file=sys.stderr)
            return 2
        print("\n".join(METHODS[argv[1]].overrides))
        return 0
    if argv[0] == "reads" and len(argv) == 2:  # the mrtpo.* knobs NAME reads (the run scripts set only these)
        if argv[1] not in METHODS:
            print(f"unknown method '{argv[1]}' (one of: {' '.join(names())})", file=sys.stderr)
            return 2
        m = METHODS[argv[1]]
        print(" ".join(dict.fromkeys((*m.reads, *SELECTORS, *RESOURCE_KNOBS))))
        return 0
    print("usage: python -m recipe.mrtpo.methods [list | names | overrides NAME | reads NAME]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
