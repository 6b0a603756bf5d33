"""Patch ``fsdp2_offload_unpinned``: FSDP2's CPU offload policy without pinned memory on a CPU-only host.

What fails: verl 0.9.1's FSDP engine builds every forward-only module (the reference policy: RLSD's and OPSD's
initial teacher) with ``CPUOffloadPolicy(pin_memory=True)`` (``verl/workers/engine/fsdp/transformer_impl.py``,
``_build_fsdp_module``, the fsdp2 branch: ``if self.engine_config.offload_policy or
self.engine_config.forward_only``), and FSDP2 then calls ``Tensor.pin_memory()`` on every shard
(``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``, ``_init_sharded_param``), which raises "Cannot access
accelerator device when none is available" without an accelerator. Pinned memory only speeds host-to-device
copies; on a CPU-only host there are none.

The patch makes ``torch.distributed.fsdp.CPUOffloadPolicy`` ignore ``pin_memory=True`` (the shards stay in
ordinary memory, nothing else changes). It edits the class itself, so every module that imported it by name
(verl's ``fsdp_utils``, ``transformer_impl``) sees it. Applied by :mod:`verl_patches.cpu` only, which refuses
a host with CUDA.
"""

from __future__ import annotations

import functools
import threading

from ._versions import require_verl

require_verl("fsdp_offload")

_MARK = "__verl_patches__"
_NAME = "fsdp2_offload_unpinned"
_lock = threading.Lock()


def apply() -> None:
    """Install the unpinned ``__init__`` (idempotent)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    with _lock:
        original = CPUOffloadPolicy.__init__
        if getattr(original, _MARK, None) == _NAME:
            return

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.pin_memory = False  # no accelerator to copy to: pinning would raise

        setattr(__init__, _MARK, _NAME)
        CPUOffloadPolicy.__init__ = __init__


def applied() -> bool:
    from torch.distributed.fsdp import CPUOffloadPolicy

    return getattr(CPUOffloadPolicy.__init__, _MARK, None) == _NAME
