"""Entry point: ``python -m recipe.mrtpo.main_mrtpo [hydra overrides...]``.

verl 0.9.1's ``main_ppo`` with the recipe's config (``config/mrtpo_trainer.yaml``: verl's
``ppo_trainer.yaml`` + the ``mrtpo`` group) and a task runner that imports the recipe in the
runner's process, so that ``trainer.v1.trainer_mode=mrtpo`` resolves to :class:`MRTPOTrainer`.
"""

from __future__ import annotations

import hydra
import ray
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from recipe.mrtpo.config import RECIPE_ESTIMATORS, mrtpo_config


@ray.remote(num_cpus=1)
class MRTPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 task runner; imports the recipe so its trainer, estimator and worker are registered."""

    def run(self, config):
        import recipe.mrtpo.trainer  # noqa: F401  (@register_trainer("mrtpo"))

        return super().run(config)


def check_config(config) -> None:
    """Refuse, before Ray starts, every composed configuration the recipe cannot run, saying what to change."""
    if not config.trainer.use_v1:
        raise ValueError("the MRTPO recipe runs on verl's v1 trainer (trainer.use_v1=True)")
    cfg = mrtpo_config(config.get("mrtpo", None))  # types and ranges of every mrtpo.* knob
    est = str(config.algorithm.adv_estimator)
    if est in RECIPE_ESTIMATORS and config.algorithm.use_kl_in_reward:
        raise ValueError(
            f"algorithm.use_kl_in_reward=True has no effect with adv_estimator={est}: its advantage is built from "
            "the per-reward scores, not the token-level reward. Use the KL loss instead "
            "(actor_rollout_ref.actor.use_kl_loss=True, kl_loss_coef, kl_loss_type)."
        )
    if est in RECIPE_ESTIMATORS and not config.algorithm.get("norm_adv_by_std_in_grpo", True):
        raise ValueError(f"adv_estimator={est} normalises each reward by its group std (GDPO): norm_adv_by_std_in_grpo=False is not supported")
    if est == "mrtpo" and cfg.replay and cfg.mode != "opsd":
        check_replay_settings(config)
    if cfg.mode == "opsd":
        from recipe.mrtpo.opsd_step import check_opsd_settings

        check_opsd_settings(config)


def _get(config, dotted: str, default=None):
    """``config.a.b.c`` or ``default`` when any part is absent (composed DictConfig or plain dict)."""
    node = config
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(part, None)
    return default if node is None else node


def check_replay_settings(config) -> None:
    """verl settings the replay (a plain Hugging Face forward of the actor's module, ``core/replay.py``)
    cannot run with, refused before Ray starts with what to change (``docs/design.md`` §5).

    - ``use_fused_kernels=True``: verl replaces the model's forward with one that returns log-probs and
      entropy only, no ``.logits``; the replay needs the full next-token distributions.
    - Ulysses sequence parallel > 1: verl patches attention with all-to-alls over the sequence-parallel
      group and shards each sequence over it; the replay feeds every rank whole sequences of its own rows.
    - an actor strategy other than FSDP: the replay calls ``engine.module`` as one Hugging Face model.
    ``use_remove_padding=True`` is supported: it patches only the flash-attention function, which with
    sequence parallel 1 calls the original one with the same arguments (tests/integration/test_main_mrtpo.py).
    """
    arr = "actor_rollout_ref"
    off = "or turn the replay off (mrtpo.replay=False: the run is then GDPO)"
    fused = [k for k in (f"{arr}.model.use_fused_kernels", f"{arr}.actor.use_fused_kernels") if bool(_get(config, k, False))]
    if fused:
        raise ValueError(
            f"{fused[0]}=True is not supported with adv_estimator=mrtpo: verl's fused-kernel forward returns "
            "log-probs without logits, and the MRTPO replay compares full next-token distributions. Set "
            f"{arr}.model.use_fused_kernels=False, {off}."
        )
    for key in (f"{arr}.actor.ulysses_sequence_parallel_size", f"{arr}.actor.fsdp_config.ulysses_sequence_parallel_size"):
        sp = int(_get(config, key, 1) or 1)
        if sp > 1:
            raise ValueError(
                f"{key}={sp} is not supported with adv_estimator=mrtpo: the replay runs whole sequences through the "
                "plain model forward, which Ulysses sequence parallel shards across ranks. Set "
                f"{arr}.actor.ulysses_sequence_parallel_size=1 (and fsdp_config.ulysses_sequence_parallel_size=1; "
                f"fit long sequences with use_dynamic_bsz / ppo_max_token_len_per_gpu instead), {off}."
            )
    strategy = str(_get(config, f"{arr}.actor.strategy", "fsdp"))
    if strategy not in ("fsdp", "fsdp2"):
        raise ValueError(
            f"{arr}.actor.strategy={strategy} is not supported with adv_estimator=mrtpo: the replay runs on the FSDP "
            f"engine's Hugging Face module. Use {arr}.actor.strategy=fsdp2 (or fsdp), {off}."
        )


def run(config) -> None:
    check_config(config)
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=MRTPOTaskRunner)


@hydra.main(config_path="config", config_name="mrtpo_trainer", version_base=None)
def main(config) -> None:
    from recipe.mrtpo.launch_errors import check_local_paths, launch_errors_in_one_line

    with launch_errors_in_one_line():
        check_config(config)  # first: its errors name the key that was typed (run() repeats it, cheaply)
        check_local_paths(config)
        run(config)


if __name__ == "__main__":
    from recipe.mrtpo.launch_errors import run_hydra_main

    run_hydra_main(main)  # a refused launch in one line (--debug: the traceback)
