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
    mrtpo_config(config.get("mrtpo", None))  # types and ranges of every mrtpo.* knob
    est = str(config.algorithm.adv_estimator)
    if est in RECIPE_ESTIMATORS and config.algorithm.use_kl_in_reward:
        raise ValueError(
            f"algorithm.use_kl_in_reward=True has no effect with adv_estimator={est}: its advantage is built from "
            "the per-reward scores, not the token-level reward. Use the KL loss instead "
            "(actor_rollout_ref.actor.use_kl_loss=True, kl_loss_coef, kl_loss_type)."
        )
    if est in RECIPE_ESTIMATORS and not config.algorithm.get("norm_adv_by_std_in_grpo", True):
        raise ValueError(f"adv_estimator={est} normalises each reward by its group std (GDPO): norm_adv_by_std_in_grpo=False is not supported")


def run(config) -> None:
    check_config(config)
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=MRTPOTaskRunner)


@hydra.main(config_path="config", config_name="mrtpo_trainer", version_base=None)
def main(config) -> None:
    run(config)


if __name__ == "__main__":
    main()
