"""The run scripts' ``DRY_RUN=1``: compose the config a launch would, run the launch's checks on it, print it.

    python run_scripts/dry_run.py [hydra overrides...]     # what `DRY_RUN=1 bash run_scripts/qwen*.sh` runs

The config is composed through Hydra's compose API from the recipe's ``mrtpo_trainer.yaml`` with the same
overrides as ``python -m recipe.mrtpo.main_mrtpo``, then checked as ``main_mrtpo.run`` checks it before Ray
starts: :func:`recipe.mrtpo.main_mrtpo.check_config` (the recipe's knobs and the verl settings the replay
needs) and verl's own ``validate_config`` (batch sizes against the GPUs, token budgets). A config either
passes (resolved YAML on stdout, exit 0) or is refused with one line on stderr and exit status 2, the
same line a launch prints (:mod:`recipe.mrtpo.launch.launch_errors`; the traceback with ``--debug`` or
``MRTPO_DEBUG=1``). Local data files and model folders are not required (the launch checks them).
Nothing is started.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

REFUSED = 2


def compose_config(overrides: list[str]):
    """The recipe's config with ``overrides`` applied, as the Hydra entry point composes it (no ``hydra`` node)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=list(overrides))


def main(argv: list[str] | None = None) -> int:
    overrides = list(sys.argv[1:] if argv is None else argv)
    if overrides[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    from omegaconf import OmegaConf

    from recipe.mrtpo.launch.launch_errors import DEBUG_ENV, DEBUG_FLAG, launch_errors_in_one_line
    from recipe.mrtpo.main_mrtpo import check_launch

    if DEBUG_FLAG in overrides:
        overrides = [o for o in overrides if o != DEBUG_FLAG]
        os.environ[DEBUG_ENV] = "1"
    try:
        with launch_errors_in_one_line("DRY_RUN"):
            config = compose_config(overrides)
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries the YAML only (verl prints its verdict)
                check_launch(config, local_paths=False)
            text = OmegaConf.to_yaml(config, resolve=True)
    except SystemExit as exc:  # a refused config: its one line is on stderr
        return int(exc.code or REFUSED)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
