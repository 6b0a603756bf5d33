"""The run scripts' ``DRY_RUN=1``: compose the config a launch would, run the launch's checks on it, print it.

    python run_scripts/dry_run.py [hydra overrides...]     # what `DRY_RUN=1 bash run_scripts/qwen*.sh` runs

The config is composed through Hydra's compose API from the recipe's ``mrtpo_trainer.yaml`` with the same
overrides as ``python -m recipe.mrtpo.main_mrtpo``, then checked as ``main_mrtpo.run`` checks it before Ray
starts: :func:`recipe.mrtpo.main_mrtpo.check_config` (the recipe's knobs and the verl settings the replay
needs) and verl's own ``validate_config`` (batch sizes against the GPUs, token budgets). A config either
passes (resolved YAML on stdout, exit 0) or is refused with one line on stderr and exit status 2; the
traceback behind it with ``MRTPO_TRACEBACK=1``. Nothing is started.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
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


def check_launch(config) -> None:
    """The checks ``recipe.mrtpo.main_mrtpo.run`` makes before it starts Ray (all but the device choice)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from recipe.mrtpo.main_mrtpo import check_config

    check_config(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def one_line(exc: BaseException) -> str:
    """The exception as one line: its type and the first line of its message (Hydra's cause when it wraps one)."""
    while exc.__cause__ is not None and type(exc).__name__ in ("ConfigCompositionException", "InstantiationException"):
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    full_key = getattr(exc, "full_key", None)  # OmegaConf names the whole dotted key apart from its message
    return f"{line} (key {full_key})" if full_key and str(full_key) not in line else line


def main(argv: list[str] | None = None) -> int:
    overrides = sys.argv[1:] if argv is None else argv
    if overrides[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    from omegaconf import OmegaConf

    try:
        config = compose_config(overrides)
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the YAML only (verl prints its verdict)
            check_launch(config)
        text = OmegaConf.to_yaml(config, resolve=True)
    except Exception as exc:  # every refusal, whatever raised it, as one line (the traceback behind a flag)
        if os.environ.get("MRTPO_TRACEBACK") == "1":
            traceback.print_exc()
        print(f"[mrtpo] config refused: {one_line(exc)}  (MRTPO_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return REFUSED
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
