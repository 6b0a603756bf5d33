"""Patch ``cpu_gloo_process_group``: verl's worker process group on the ``cpu`` platform.

What verl lacks: ``verl.utils.distributed.initialize_global_process_group_ray``
(``verl/utils/distributed.py:83-98``), which every training worker calls
(``verl/workers/engine_workers.py:89``), builds the backend string
``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"`` (``distributed.py:89``). With device ``cpu``
that is ``"cpu:gloo,cpu:gloo"``, and torch refuses it: "Duplicate device type cpu in backend string"
(``torch/distributed/distributed_c10d.py:460``, torch 2.13). verl has no hook for the backend string.

The patch wraps the function so that, when the caller passes no backend and the platform's device is
``cpu``, the backend is ``"cpu:gloo"``; any explicit ``backend=`` and every other device pass through
unchanged. ``engine_workers.py:38`` imports the function by name, so the wrapper must be in place before
that module is imported: :mod:`verl_patches.cpu` applies it while verl itself is importing (it is named
in ``VERL_USE_EXTERNAL_MODULES``), and :func:`apply` also rebinds the name in any already-imported module
that holds the original. (verl's SFT entry ``initialize_global_process_group``, ``distributed.py:62``, has
the same string and is not patched: the PPO loop does not use it.)
"""

from __future__ import annotations

import functools
import sys
import threading

from ._versions import require_verl

require_verl("distributed")

_MARK = "__verl_patches__"
_NAME = "cpu_gloo_process_group"
_FUNCTION = "initialize_global_process_group_ray"
_lock = threading.Lock()


def apply() -> None:
    """Install the wrapper (idempotent)."""
    import verl.utils.distributed as dist

    with _lock:
        original = getattr(dist, _FUNCTION)
        if getattr(original, _MARK, None) == _NAME:
            return

        @functools.wraps(original)
        def initialize_global_process_group_ray(timeout_second=None, backend=None):
            if backend is None:
                from verl.utils.device import get_device_name

                if get_device_name() == "cpu":
                    backend = "cpu:gloo"
            return original(timeout_second=timeout_second, backend=backend)

        setattr(initialize_global_process_group_ray, _MARK, _NAME)
        setattr(dist, _FUNCTION, initialize_global_process_group_ray)
        for module in list(sys.modules.values()):  # modules that imported the original by name
            # __dict__, not getattr: lazy modules (transformers') must not be triggered into importing.
            if module is not None and module is not dist and getattr(module, "__dict__", {}).get(_FUNCTION) is original:
                setattr(module, _FUNCTION, initialize_global_process_group_ray)


def applied() -> bool:
    import verl.utils.distributed as dist

    return getattr(getattr(dist, _FUNCTION, None), _MARK, None) == _NAME
