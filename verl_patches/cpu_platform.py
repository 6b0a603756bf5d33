"""Patch ``cpu_platform``: a ``cpu`` platform for verl 0.9.1, so its trainer and workers run without a GPU.

What verl lacks: verl 0.9.1 resolves every device question through one platform object
(``verl/plugin/platform/platform_manager.py:140`` ``get_platform``), and registers only ``nvidia``,
``npu`` and ``rocm`` (``platform_manager.py:172-174``). With no GPU it falls back to ``nvidia``
(``platform_manager.py:117``), whose collective backend is NCCL, and the first ``init_process_group``
fails with "Distributed package doesn't have NCCL built in".

This is not a patch of verl's code: it uses verl's own extension point,
``PlatformRegistry.register`` (``platform_manager.py:43``), and is selected with ``VERL_PLATFORM=cpu``
(read at ``platform_manager.py:92``). verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES``
in every process that imports verl (``verl/__init__.py:49-52``), Ray actors and vLLM workers included,
so ``VERL_USE_EXTERNAL_MODULES=verl_patches.cpu`` makes the platform exist wherever verl looks it up.

The platform: device name ``cpu``; ``current_device()`` returns ``"cpu"`` (so verl's
``tensor.to(get_device_id())`` keeps tensors on the CPU); collective backend ``gloo``; no IPC (verl then
passes weights to vLLM through shared memory, ``vllm_rollout/vllm_rollout.py:143``); Ray resource
``GPU``, which the CPU run declares with ``ray_init.num_gpus`` so that verl's resource pools, written
for accelerators, can be placed. ``device_module`` is :data:`cpu_device_module`: ``torch.cpu`` plus
stand-ins for the ``torch.cuda`` calls verl makes through ``get_torch_device()`` (memory statistics
report 0, ``empty_cache``/``ipc_collect``/``set_per_process_memory_fraction`` do nothing,
``mem_get_info`` reports host memory, RNG state is torch's CPU generator).

verl's FSDP engine is registered for devices ``cuda``/``npu`` only
(``verl/workers/engine/fsdp/transformer_impl.py:1143``); ``VERL_ENGINE_DEVICE=cuda`` (an override verl
reads at ``verl/workers/engine/base.py:405``) selects it, and it runs on CPU as is. That is set by
``recipe.mrtpo.cpu.runtime.cpu_env``, not here. verl's worker process group needs one more patch with
this platform (its backend string would name ``cpu`` twice): :mod:`verl_patches.distributed`.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Optional

import torch

from ._versions import require_verl

require_verl("cpu_platform")

from verl.plugin.platform import PlatformBase, PlatformRegistry  # noqa: E402

PLATFORM_NAME = "cpu"


def _noop(*args, **kwargs) -> None:
    return None


def _zero(*args, **kwargs) -> int:
    return 0


def _mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of host memory, as ``torch.cuda.mem_get_info`` reports device memory."""
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


class _CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` with stand-ins for the ``torch.cuda`` functions verl calls on ``get_torch_device()``.

    Anything not defined here is looked up on ``torch.cpu`` (``Stream``, ``Event``, ``stream``,
    ``current_stream``, ``synchronize``, ``amp`` ...), so an unknown call fails loudly with the name.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(torch.cpu, name)
        except AttributeError:
            raise AttributeError(
                f"verl_patches.cpu_platform: the CPU device module has no {name!r} (neither a stand-in here "
                "nor torch.cpu); add a stand-in if verl calls it on CPU"
            ) from None


cpu_device_module = _CpuDeviceModule("verl_patches.cpu_platform.cpu_device_module")
for _name, _fn in {
    # device management
    "is_available": lambda: True,
    "is_initialized": lambda: True,
    "device_count": lambda: 1,
    "current_device": lambda: "cpu",
    "set_device": _noop,
    "synchronize": _noop,
    "get_device_name": lambda device=None: "cpu",
    "get_device_capability": lambda device=None: (None, None),
    # memory: host memory is not a device pool, so statistics are 0 and cache calls do nothing
    "empty_cache": _noop,
    "ipc_collect": _noop,
    "reset_peak_memory_stats": _noop,
    "reset_max_memory_allocated": _noop,
    "set_per_process_memory_fraction": _noop,
    "memory_allocated": _zero,
    "memory_reserved": _zero,
    "max_memory_allocated": _zero,
    "max_memory_reserved": _zero,
    "memory_stats": lambda device=None: {},
    "memory_summary": lambda device=None, abbreviated=False: "",
    "mem_get_info": _mem_get_info,
    # RNG: the CPU generator
    "manual_seed": lambda seed: torch.manual_seed(seed),
    "manual_seed_all": lambda seed: torch.manual_seed(seed),
    "seed": lambda: torch.seed(),
    "initial_seed": lambda: torch.initial_seed(),
    "get_rng_state": lambda device="cpu": torch.get_rng_state(),
    "set_rng_state": lambda new_state, device="cpu": torch.set_rng_state(new_state),
    "get_rng_state_all": lambda: [torch.get_rng_state()],
    "set_rng_state_all": lambda new_states: torch.set_rng_state(new_states[0]),
}.items():
    setattr(cpu_device_module, _name, _fn)


class PlatformCPU(PlatformBase):
    """verl platform for CPU-only hosts (see the module docstring)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return cpu_device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: chosen only with VERL_PLATFORM=cpu.
        return False

    def current_device(self) -> str:  # verl annotates int; "cpu" is what torch.cpu.current_device() returns
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # CUDA caching-allocator settings (expandable_segments) have no CPU counterpart

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for actors holding its (declared) GPU resource; verl copies it around.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register() -> type[PlatformCPU]:
    """Register :class:`PlatformCPU` as verl platform ``cpu``. Idempotent (registering the same class again
    is a no-op; verl's registry would otherwise log an "overriding" message)."""
    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    return PlatformCPU


def is_registered() -> bool:
    return PlatformRegistry.get(PLATFORM_NAME) is PlatformCPU

