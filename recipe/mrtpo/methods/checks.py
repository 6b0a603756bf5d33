"""The verl settings several methods cannot run with, refused before Ray starts with what to change.

Each check is ``check(config, method, cfg)`` (the composed config, the method's entry, its MRTPOConfig) and
raises ValueError naming the setting, the method and the fix. Config reads only: no torch, no verl.
"""

from __future__ import annotations

from recipe.mrtpo.methods.types import Method, get_key


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
    fused = [k for k in (f"{arr}.model.use_fused_kernels", f"{arr}.actor.use_fused_kernels") if bool(get_key(config, k, False))]
    if fused:
        raise ValueError(
            f"{fused[0]}=True is not supported with {who}: verl's fused-kernel forward returns log-probs without "
            f"logits, and the method's pass needs the full next-token distributions. Set {arr}.model.use_fused_kernels=False, {off}."
        )
    for key in (f"{arr}.actor.ulysses_sequence_parallel_size", f"{arr}.actor.fsdp_config.ulysses_sequence_parallel_size"):
        sp = int(get_key(config, key, 1) or 1)
        if sp > 1:
            raise ValueError(
                f"{key}={sp} is not supported with {who}: the pass runs whole sequences through the plain model "
                f"forward, which Ulysses sequence parallel shards across ranks. Set {arr}.actor.ulysses_sequence_parallel_size=1 "
                "(and fsdp_config.ulysses_sequence_parallel_size=1; fit long sequences with use_dynamic_bsz / "
                f"ppo_max_token_len_per_gpu instead), {off}."
            )
    strategy = str(get_key(config, f"{arr}.actor.strategy", "fsdp"))
    if strategy not in ("fsdp", "fsdp2"):
        raise ValueError(
            f"{arr}.actor.strategy={strategy} is not supported with {who}: the pass runs on the FSDP engine's "
            f"Hugging Face module. Use {arr}.actor.strategy=fsdp2 (or fsdp), {off}."
        )


def check_per_reward_step(config, method: Method, cfg) -> None:
    """Settings the recipe's advantage step (built from the per-reward scores) does not read."""
    if bool(get_key(config, "algorithm.use_kl_in_reward", False)):
        raise ValueError(
            f"algorithm.use_kl_in_reward=True has no effect with method {method.name} (adv_estimator={method.estimator}): "
            "its advantage is built from the per-reward scores, not the token-level reward. Use the KL loss instead "
            "(actor_rollout_ref.actor.use_kl_loss=True, kl_loss_coef, kl_loss_type)."
        )
    if not bool(get_key(config, "algorithm.norm_adv_by_std_in_grpo", True)):
        raise ValueError(
            f"method {method.name} normalises each reward by its group std (GDPO): algorithm.norm_adv_by_std_in_grpo=False "
            "is not supported"
        )


def check_reference_teacher(config, what: str, instead: str) -> None:
    """A teacher taken from verl's reference worker (the initial policy: RLSD's ``rlsd_teacher=initial``, OPSD's
    frozen teacher) needs the config to build it as a full model the pass can run: no LoRA reference, Ulysses
    SP 1, FSDP; refused before Ray starts. ``what``: the setting that asks for it; ``instead``: the alternative."""
    arr = "actor_rollout_ref"
    lora = int(get_key(config, f"{arr}.model.lora.rank", 0) or 0) or int(get_key(config, f"{arr}.model.lora_rank", 0) or 0)
    if lora > 0 or get_key(config, f"{arr}.model.lora_adapter_path") is not None:
        raise ValueError(f"{what} is not supported with LoRA: verl's reference policy is then the actor "
                         f"with its adapter off, which the teacher pass does not run. {instead}.")
    if not bool(get_key(config, f"{arr}.actor.use_kl_loss", False)):
        raise ValueError(f"{what} takes the initial policy from verl's reference worker, which verl "
                         f"builds only for a KL loss: set {arr}.actor.use_kl_loss=True (with kl_loss_coef=0 the loss is "
                         f"unchanged) or {instead[0].lower()}{instead[1:]}.")
    sp = int(get_key(config, f"{arr}.ref.ulysses_sequence_parallel_size", 1) or 1)
    if sp > 1:
        raise ValueError(f"{arr}.ref.ulysses_sequence_parallel_size={sp} is not supported with {what}: "
                         f"the teacher pass runs whole sequences through the reference model. Set it to 1.")
    strategy = str(get_key(config, f"{arr}.ref.strategy", "fsdp"))
    if strategy not in ("fsdp", "fsdp2"):
        raise ValueError(f"{arr}.ref.strategy={strategy} is not supported with {what}: the teacher "
                         "pass runs on the FSDP engine's Hugging Face module. Use fsdp2 (or fsdp).")


#: verl 0.9.1's ``distillation.distillation_loss`` defaults (``verl/trainer/config/distillation/distillation.yaml``,
#: checked against the installed file by tests/unit/test_methods.py) for the fields a self-teacher may leave unread
VERL_DISTILLATION_LOSS_DEFAULTS = {
    "loss_mode": "k3", "topk": 32, "use_task_rewards": True, "distillation_loss_coef": 1.0, "loss_max_clamp": None,
    "log_prob_min_clamp": None, "use_policy_gradient": False, "policy_loss_mode": "vanilla", "clip_ratio": 0.2,
    "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
}


def check_distillation_group_unread(config, method: Method, unread: dict[str, str]) -> None:
    """verl's ``distillation.distillation_loss`` fields a self-teacher does not read (it builds its loss from its
    own ``mrtpo.*`` knobs), refused when set away from verl's default: they would do nothing. ``unread``: field ->
    what to use instead (the recipe's knob, or why nothing applies)."""
    group = "distillation.distillation_loss"
    for key, instead in unread.items():
        default = VERL_DISTILLATION_LOSS_DEFAULTS[key]
        value = get_key(config, f"{group}.{key}", default)
        if value != default:
            raise ValueError(f"{group}.{key}={value} is not read by method {method.name}: {instead}. "
                             f"Leave it at verl's default ({default}).")
