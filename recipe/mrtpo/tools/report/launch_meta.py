"""A run's identity from how it was launched: the command line in its log, a wandb run's name and config.

Used by :mod:`recipe.mrtpo.tools.report.discovery` for the fields a run's path does not give:

- the console log of a launch holds its command line: the run scripts echo it (``[mrtpo] .../python -m
  recipe.mrtpo.main_mrtpo ... trainer.experiment_name=...``, on stderr) and the CPU launcher writes it as the
  log's first line (``$ python -m recipe.mrtpo.main_mrtpo ...``); Hydra takes the last of repeated keys, so
  does :func:`meta_from_command_line`;
- a wandb run stores verl's ``trainer.experiment_name`` as its display name and the whole config.

The experiment name is returned as ``"name"``, for the caller to parse like a folder name
(``<model>_<task>_<method>[_seed<k>]``); what that leaves open comes from the settings that tell the compared methods apart (as ``run_scripts/common.sh``'s ``ALGO``
sets them, read through the methods registry): ``algorithm.adv_estimator``, ``mrtpo.mode``, ``mrtpo.shuffle``; the model
from the basename of ``actor_rollout_ref.model.path``; the seed from ``mrtpo.seed`` / ``data.seed``.
"""

from __future__ import annotations

import re
from typing import Any, Optional

__all__ = ["method_from_settings", "meta_from_command_line", "meta_from_config"]

_LAUNCH = re.compile(r"-m\s+recipe\.mrtpo\.main_mrtpo\b|-m\s+verl\.trainer\.main_ppo\b")
_OVERRIDE = re.compile(r"(?:^|\s)\+{0,2}([A-Za-z_][\w.]*)=(\S+)")
_KEYS = ("trainer.experiment_name", "algorithm.adv_estimator", "mrtpo.mode", "mrtpo.shuffle",
         "actor_rollout_ref.model.path", "mrtpo.seed", "data.seed")


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def method_from_settings(estimator: Optional[str], mode: Optional[str] = None, shuffle: Any = None) -> Optional[str]:
    """The compared method a run's settings select (the methods registry, :func:`recipe.mrtpo.methods.name_of`);
    settings no method selects give the estimator's name (a run of another recipe's estimator), or None."""
    from recipe.mrtpo.methods import name_of

    mode = (str(mode).strip().lower() if mode not in (None, "", "null") else "mrtpo")
    est = str(estimator).strip().lower() if estimator not in (None, "", "null") else None
    return name_of(est, mode, shuffle is not None and _truthy(shuffle)) or est


def _unquote(value: str) -> str:
    value = value.replace("\\'", "'")  # printf %q
    return value.strip("'\"")


def _identity(settings: dict) -> dict:
    """``{"name"?, "method"?, "model"?, "seed"?}`` of a run's settings (dotted keys)."""
    meta: dict = {}
    if settings.get("trainer.experiment_name"):
        meta["name"] = str(settings["trainer.experiment_name"])
    method = method_from_settings(settings.get("algorithm.adv_estimator"), settings.get("mrtpo.mode"),
                                  settings.get("mrtpo.shuffle"))
    if method:
        meta["method"] = method
    if settings.get("actor_rollout_ref.model.path"):
        meta["model"] = str(settings["actor_rollout_ref.model.path"]).rstrip("/").rsplit("/", 1)[-1]
    for key in ("mrtpo.seed", "data.seed"):
        seed = str(settings.get(key))
        if "seed" not in meta and seed.isdigit():
            meta["seed"] = int(seed)
    return meta


def meta_from_command_line(text: str) -> dict:
    """Experiment name, method, model and seed from the last launch command line in a console log (module
    docstring); ``{}`` when the log holds none."""
    settings: dict = {}
    for line in text.splitlines():
        m = _LAUNCH.search(line)
        if not m:
            continue
        found = {k: _unquote(v) for k, v in _OVERRIDE.findall(line[m.end():]) if k in _KEYS}
        if found:
            settings = found  # the last launch in the log (a resumed run appends its own)
    return _identity(settings) if settings else {}


def meta_from_config(name: Optional[str], config: dict) -> dict:
    """Experiment name, method, model and seed of a wandb run from its display name and logged config."""
    def get(dotted: str):
        node: Any = config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    settings = {k: get(k) for k in _KEYS}
    if name:
        settings["trainer.experiment_name"] = name
    return _identity({k: v for k, v in settings.items() if v is not None})
