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

from recipe.mrtpo import config as _config  # noqa: F401  (registers the mrtpo group's schema with Hydra)
from recipe.mrtpo import methods


@ray.remote(num_cpus=1)
class MRTPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 task runner; imports the recipe so its trainer, estimator and worker are registered."""

    def run(self, config):
        import recipe.mrtpo.step.trainer  # noqa: F401  (@register_trainer("mrtpo"))
        from recipe.mrtpo.launch.node_check import check_run

        check_run(config)  # every node holds the files its workers read and sees the checkpoint folder, or one line stops it
        return super().run(config)


def check_config(config):
    """Refuse, before Ray starts, every composed configuration the recipe cannot run, saying what to change.

    Returns the run's method (:func:`recipe.mrtpo.methods.resolve`: every ``mrtpo.*`` value checked, a setting
    the method does not read or a combination it cannot run refused with the setting and the method named),
    after :func:`recipe.mrtpo.launch.pass_checks.check_pass_support` (a vision-language or unknown recurrent model,
    LoRA: refused for a method that replays or teaches).
    """
    if not config.trainer.use_v1:
        raise ValueError("the MRTPO recipe runs on verl's v1 trainer (trainer.use_v1=True)")
    method = methods.resolve(config)
    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.launch.pass_checks import check_pass_support

    check_pass_support(config, method, mrtpo_config(config.get("mrtpo", None)))  # the passes' models and adapters
    return method


def check_launch(config, local_paths: bool = True):
    """Every check a launch makes before Ray starts, in order; returns the run's method.

    :func:`check_config` (the recipe), :func:`recipe.mrtpo.launch.launch_errors.check_local_paths` (a local model
    folder or data file that does not exist; ``local_paths=False`` for a dry run, which composes on a machine
    without the data) and verl's own ``validate_config`` (batch sizes against the GPUs, token budgets).
    ``run_scripts/dry_run.py`` (``DRY_RUN=1``) runs the same function.
    """
    from recipe.mrtpo.launch.launch_errors import check_local_paths

    method = check_config(config)  # first: its errors name the key that was typed
    if local_paths:
        check_local_paths(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return method


def run(config) -> None:
    auto_set_device(config)
    check_launch(config)
    run_ppo(config, task_runner_class=MRTPOTaskRunner)


@hydra.main(config_path="config", config_name="mrtpo_trainer", version_base=None)
def main(config) -> None:
    from recipe.mrtpo.launch.launch_errors import launch_errors_in_one_line

    with launch_errors_in_one_line():
        run(config)


if __name__ == "__main__":
    from recipe.mrtpo.launch.launch_errors import run_hydra_main

    run_hydra_main(main)  # a refused launch in one line (--debug: the traceback)
