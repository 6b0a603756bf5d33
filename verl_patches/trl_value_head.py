"""Patch ``trl_value_head_optional``: verl asks "is TRL installed?" where it means "does TRL have the value head?".

What fails: verl 0.9.1 reads ``is_trl_available()`` (``verl/utils/import_utils.py:64``: TRL importable at all) in
two places, and each then imports ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo`` or ``trl``:
``apply_monkey_patch`` (``verl/models/transformers/monkey_patch.py:352-356``), which every FSDP actor build runs, to
give that class a plain ``state_dict``, and ``load_valuehead_model`` (``verl/utils/model.py:654-664``), the PPO
critic's loader. TRL 1.13 and later ship no value-head model (``trl.experimental.ppo`` is gone), so with the recipe's
TRL adapter installed (``trl==1.16.0`` in the CPU lock) every actor build raises ``ImportError`` before training.

The patch gives verl's question the meaning its callers need: TRL is "available" to verl when the value-head class
imports. With an older TRL nothing changes; with a newer one ``apply_monkey_patch`` skips a patch of a class that does
not exist, and a PPO critic built from a value-head model gets verl's own "trl is not installed" refusal instead of
an ImportError (the recipe trains no critic). It replaces the function in ``verl.utils.import_utils`` and in the two
modules that imported it by name, where they are already loaded. Applied by :mod:`verl_patches.cpu` only.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading

from ._versions import require_verl

require_verl("trl_value_head")

_MARK = "__verl_patches__"
_NAME = "trl_value_head_optional"
_lock = threading.Lock()
#: the modules of verl 0.9.1 that import ``is_trl_available`` by name (module docstring)
IMPORTERS = ("verl.models.transformers.monkey_patch", "verl.utils.model")


def trl_has_value_head() -> bool:
    """True where ``AutoModelForCausalLMWithValueHead`` imports the way verl 0.9.1 imports it."""
    if importlib.util.find_spec("trl") is None:
        return False
    for module in ("trl.experimental.ppo", "trl"):
        try:  # TRL's lazy module raises RuntimeError where a submodule fails to import
            if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                return True
        except (ImportError, RuntimeError):
            continue
    return False


def is_trl_available() -> bool:
    """verl's ``is_trl_available`` as its callers use it: TRL with its value-head model."""
    return trl_has_value_head()


setattr(is_trl_available, _MARK, _NAME)


def apply() -> None:
    """Install :func:`is_trl_available` where verl reads it (idempotent)."""
    import verl.utils.import_utils as import_utils

    with _lock:
        import_utils.is_trl_available = is_trl_available
        for name in IMPORTERS:
            module = sys.modules.get(name)
            if module is not None and hasattr(module, "is_trl_available"):
                module.is_trl_available = is_trl_available


def applied() -> bool:
    import verl.utils.import_utils as import_utils

    loaded = [sys.modules[n] for n in IMPORTERS if n in sys.modules]
    return all(getattr(getattr(m, "is_trl_available", None), _MARK, None) == _NAME for m in [import_utils, *loaded])
