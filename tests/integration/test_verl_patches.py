"""verl_patches: each CPU patch applies, is idempotent, refuses other versions, and (in a fresh process, the
way verl loads it through VERL_USE_EXTERNAL_MODULES) takes effect where verl and vLLM look. No Ray.

In-process tests restore every global they touch (platform registry, importlib.metadata.version,
sys.meta_path, verl's process-group function) through monkeypatch, so the rest of the suite is unaffected.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import json
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from recipe.mrtpo.cpu.runtime import cpu_env
from verl_patches import _versions

REPO_ROOT = Path(__file__).resolve().parents[2]
PATCHES = REPO_ROOT / "verl_patches"


def _exec_fresh(module_file: str):
    """Execute a patch module's file as a new module (what importing it the first time does)."""
    name = f"verl_patches._fresh_{module_file[:-3]}"
    spec = importlib.util.spec_from_file_location(name, PATCHES / module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- version guards


def test_pinned_versions_are_the_installed_ones():
    import verl

    assert verl.__version__ == _versions.VERL_VERSION == "0.9.1"
    assert _versions.vllm_version() == _versions.VLLM_CPU_VERSION == "0.28.0+cpu"


@pytest.mark.parametrize("module_file", ["cpu_platform.py", "distributed.py", "fsdp_offload.py", "trl_value_head.py"])
def test_verl_version_check_raises_at_import(monkeypatch, module_file):
    import verl

    monkeypatch.setattr(verl, "__version__", "0.9.2")
    with pytest.raises(_versions.UnsupportedVersionError, match=r"written for verl 0\.9\.1.*found verl 0\.9\.2"):
        _exec_fresh(module_file)


@pytest.mark.parametrize(
    "installed,found",
    [
        ({"vllm-cpu": "0.28.1"}, "0.28.1+cpu"),  # another vllm-cpu release
        ({"vllm": "0.28.0"}, "0.28.0"),  # the GPU build of the same release
    ],
)
def test_vllm_version_check_raises_at_import(monkeypatch, installed, found):
    def fake(name):
        if name in installed:
            return installed[name]
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_versions, "_dist_version", fake)
    assert _versions.vllm_version() == found
    expected = rf"vllm 0\.28\.0\+cpu.*found vllm {re.escape(found)}\."
    with pytest.raises(_versions.UnsupportedVersionError, match=expected):
        _exec_fresh("vllm_cpu.py")


def test_vllm_version_check_raises_when_vllm_is_missing(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_versions, "_dist_version", missing)
    with pytest.raises(_versions.UnsupportedVersionError, match="found vllm None"):
        _versions.require_vllm_cpu("vllm_cpu")


# ---------------------------------------------------------------- cpu_platform


def test_cpu_platform_registers_idempotently(monkeypatch):
    from verl.plugin.platform import PlatformRegistry

    from verl_patches import cpu_platform

    monkeypatch.setattr(PlatformRegistry, "_platforms", dict(PlatformRegistry._platforms))
    PlatformRegistry._platforms.pop("cpu", None)
    assert not cpu_platform.is_registered()
    assert cpu_platform.register() is cpu_platform.PlatformCPU
    before = dict(PlatformRegistry._platforms)
    cpu_platform.register()
    assert PlatformRegistry._platforms == before and cpu_platform.is_registered()
    assert PlatformRegistry.get("CPU") is cpu_platform.PlatformCPU  # verl lower-cases names
    assert "nvidia" in PlatformRegistry.registered_names()  # the built-ins stay


def test_cpu_platform_answers():
    from verl_patches.cpu_platform import PlatformCPU

    p = PlatformCPU()
    assert (p.device_name, p.communication_backend_name(), p.current_device()) == ("cpu", "gloo", "cpu")
    assert p.is_available() and not p.is_platform_available(use_smi_check=True)  # never auto-detected
    assert not p.is_ipc_supported()  # verl then syncs weights through shared memory
    assert p.ray_resource_name() == "GPU" and p.ray_resource_options(1) == {"num_gpus": 1}
    assert torch.ones(2).to(p.current_device()).device.type == "cpu"
    with p.nvtx_range("x"):
        pass
    p.manual_seed(3)
    a = torch.rand(3)
    p.manual_seed(3)
    assert torch.equal(a, torch.rand(3))


def test_cpu_device_module_stand_ins():
    from verl_patches.cpu_platform import cpu_device_module as dm

    assert dm.is_available() and dm.device_count() == 1 and dm.current_device() == "cpu"
    assert dm.memory_allocated() == dm.max_memory_reserved() == 0
    assert dm.empty_cache() is None and dm.synchronize() is None and dm.ipc_collect() is None
    free, total = dm.mem_get_info()
    assert 0 < free <= total
    state = dm.get_rng_state()
    x = torch.rand(2)
    dm.set_rng_state(state)
    assert torch.equal(x, torch.rand(2))
    assert dm.Stream is torch.cpu.Stream  # everything else comes from torch.cpu
    with pytest.raises(AttributeError, match="no 'cudart'"):
        _ = dm.cudart


# ---------------------------------------------------------------- distributed


def test_gloo_process_group_patch(monkeypatch):
    import verl.utils.distributed as dist

    from verl_patches import distributed

    calls = []
    def recorder(timeout_second=None, backend=None):
        calls.append(backend)

    monkeypatch.setattr(dist, "initialize_global_process_group_ray", recorder)
    original = dist.initialize_global_process_group_ray
    holder = types.ModuleType("holder_of_the_original")  # a module that imported the function by name
    holder.initialize_global_process_group_ray = original
    monkeypatch.setitem(sys.modules, holder.__name__, holder)

    distributed.apply()
    distributed.apply()
    assert distributed.applied()
    patched = dist.initialize_global_process_group_ray
    assert holder.initialize_global_process_group_ray is patched
    assert patched.__wrapped__ is original  # wrapped once, not twice

    import verl.utils.device as device

    monkeypatch.setattr(device, "get_device_name", lambda: "cpu")
    patched()
    patched(backend="cpu:gloo,cuda:nccl")  # explicit backends pass through
    monkeypatch.setattr(device, "get_device_name", lambda: "cuda")
    patched()
    assert calls == ["cpu:gloo", "cpu:gloo,cuda:nccl", None]


# ---------------------------------------------------------------- vllm_cpu


def test_vllm_version_lookup_patch(monkeypatch):
    from verl_patches import vllm_cpu

    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)
    vllm_cpu.apply_vllm_version_lookup()
    patched = importlib.metadata.version
    vllm_cpu.apply_vllm_version_lookup()
    assert importlib.metadata.version is patched and vllm_cpu.vllm_version_lookup_applied()
    assert importlib.metadata.version("vllm") == "0.28.0+cpu"  # keeps "+cpu": vLLM infers its device from it
    assert importlib.metadata.version("vllm-cpu") == "0.28.0"  # other lookups unchanged
    assert importlib.metadata.version("torch") == torch.__version__
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("no-such-distribution-here")


def _fake_gemm_module(name):
    module = types.ModuleType(name)
    module.calls = []

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):  # stands in for vLLM's: packs, drops the weight
        module.calls.append(remove_weight)
        packed = layer.weight.detach().clone()
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, packed, bias)
        if remove_weight:
            layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)

    module.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    return module


def test_cpu_gemm_patch_uses_the_live_weight(monkeypatch):
    from verl_patches import vllm_cpu

    module = _fake_gemm_module("fake_vllm_layers_utils")
    monkeypatch.setattr(vllm_cpu, "_GEMM_MODULE", module.__name__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    vllm_cpu.apply_cpu_gemm_live_weight()
    vllm_cpu.apply_cpu_gemm_live_weight()
    assert vllm_cpu.cpu_gemm_live_weight_applied()
    dispatch = module.dispatch_cpu_unquantized_gemm
    assert dispatch.__wrapped__.__name__ == "dispatch_cpu_unquantized_gemm"
    assert not hasattr(dispatch.__wrapped__, "__wrapped__")  # wrapped once, not twice

    layer = torch.nn.Linear(4, 3, bias=False)
    dispatch(layer, remove_weight=True)
    assert layer.weight.shape == (3, 4)  # kept: verl's weight loader writes into it
    x = torch.randn(2, 4)
    with torch.no_grad():
        layer.weight.add_(1.0)  # a weight sync
    assert torch.equal(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.T)
    assert module.calls == []  # vLLM's packing never ran for a 2-D weight

    conv = types.SimpleNamespace(weight=torch.zeros(3, 1, 4))
    dispatch(conv, remove_weight=False)  # non-2-D weights still go to vLLM's own dispatch
    assert module.calls == [False]


def test_cpu_gemm_patch_waits_for_the_import(monkeypatch, tmp_path):
    from verl_patches import vllm_cpu

    name = "fake_vllm_utils_on_disk"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            def dispatch_cpu_unquantized_gemm(layer, remove_weight):
                raise AssertionError("vLLM's own dispatch ran")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(vllm_cpu, "_GEMM_MODULE", name)
    monkeypatch.delitem(sys.modules, name, raising=False)

    vllm_cpu.apply_cpu_gemm_live_weight()
    vllm_cpu.apply_cpu_gemm_live_weight()
    assert sum(isinstance(f, vllm_cpu._PatchOnImport) for f in sys.meta_path) == 1
    assert vllm_cpu.cpu_gemm_live_weight_applied()

    module = importlib.import_module(name)
    try:
        layer = torch.nn.Linear(2, 2)
        module.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        assert layer.cpu_linear is torch.nn.functional.linear
    finally:
        sys.modules.pop(name, None)


# ---------------------------------------------------------------- the entry module, as verl loads it

_PROBE = r"""
import json, sys
import verl  # imports VERL_USE_EXTERNAL_MODULES=verl_patches.cpu
import verl_patches.cpu as cpu
first = cpu.applied()
cpu.apply()  # idempotent
from verl.plugin.platform import get_platform
from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device
import verl.utils.distributed as dist
import verl.third_party.vllm as verl_vllm  # verl's vLLM version check
import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers import utils as vutils
layer = torch.nn.Module()
layer.weight = torch.nn.Parameter(torch.randn(8, 4), requires_grad=False)
UnquantizedLinearMethod().process_weights_after_loading(layer)  # where vLLM would pack and drop the weight
with torch.no_grad():
    layer.weight.mul_(2.0)
x = torch.randn(3, 4)
live = torch.allclose(UnquantizedLinearMethod().apply(layer, x), x @ layer.weight.T)
# what every FSDP actor build runs: it imports TRL's value-head model wherever verl thinks TRL is available
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl.models.transformers.monkey_patch import apply_monkey_patch
tiny = Qwen2ForCausalLM(Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, vocab_size=64))
apply_monkey_patch(tiny, use_remove_padding=False)
print("PROBE" + json.dumps({
    "first": first, "again": cpu.applied(), "platform": type(get_platform()).__name__,
    "device": get_device_name(), "backend": get_nccl_backend(), "mem": get_torch_device().memory_allocated(),
    "dist_patched": getattr(dist.initialize_global_process_group_ray, "__verl_patches__", None),
    "verl_vllm_version": verl_vllm.vllm_version, "weight_kept": tuple(layer.weight.shape), "live": live,
    "dispatch": getattr(vutils.dispatch_cpu_unquantized_gemm, "__verl_patches__", None),
}))
"""


def _probe(env, code=_PROBE, timeout=240):
    cmd = [sys.executable, "-c", code]
    return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def test_entry_module_through_verl_external_modules():
    proc = _probe(cpu_env(REPO_ROOT))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("PROBE") :])
    names = ("cpu_platform", "cpu_gloo_process_group", "vllm_version_lookup", "cpu_gemm_live_weight", "fsdp2_offload_unpinned",
             "trl_value_head_optional")
    expected = dict.fromkeys(names, True)
    assert r["first"] == r["again"] == expected
    assert (r["platform"], r["device"], r["backend"], r["mem"]) == ("PlatformCPU", "cpu", "gloo", 0)
    assert r["dist_patched"] == "cpu_gloo_process_group"
    assert r["verl_vllm_version"] == "0.28.0+cpu"
    assert r["dispatch"] == "cpu_gemm_live_weight"
    assert r["weight_kept"] == [8, 4] and r["live"] is True


def test_fsdp2_offload_patch_leaves_shards_unpinned(monkeypatch):
    """verl builds its reference module with CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator. After
    the patch the policy verl constructs does not pin (idempotent), and the shards of a module fully sharded with it
    on a one-rank gloo group are built without the error verl's reference worker raised."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    from verl_patches import fsdp_offload

    monkeypatch.setattr(CPUOffloadPolicy, "__init__", CPUOffloadPolicy.__init__)  # restored after the test
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="accelerator"):
            torch.zeros(2).pin_memory()  # what FSDP2 does with pin_memory=True
    fsdp_offload.apply()
    fsdp_offload.apply()
    assert fsdp_offload.applied() and CPUOffloadPolicy(pin_memory=True).pin_memory is False
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        module = torch.nn.Linear(4, 3)
        want = module(torch.ones(1, 4)).detach()
        fully_shard(module, mesh=init_device_mesh("cpu", (1,)), offload_policy=CPUOffloadPolicy(pin_memory=True))
        assert torch.allclose(module(torch.ones(1, 4)), want)
    finally:
        dist.destroy_process_group()


def test_entry_module_refuses_without_cpu_platform():
    env = cpu_env(REPO_ROOT)
    env["VERL_PLATFORM"] = "nvidia"
    proc = _probe(env, code="import verl")
    assert proc.returncode != 0 and "verl_patches.cpu needs VERL_PLATFORM=cpu" in proc.stderr


# ---------------------------------------------------------------- the settings that go with the patches


def test_cpu_overrides_compose_with_verls_config():
    """Every override in recipe.mrtpo.cpu.runtime names a real key (or adds one with '+'), and the rollout
    section still validates as verl's RolloutConfig."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    from recipe.mrtpo.cpu.runtime import cpu_overrides

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=cpu_overrides())
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert (rollout.name, rollout.enable_sleep_mode, rollout.enforce_eager) == ("vllm", False, True)
    assert cfg.actor_rollout_ref.actor.strategy == cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    assert cfg.trainer.device == "cpu" and cfg.trainer.use_v1  # the stock v1 trainer, unchanged
    assert cfg.ray_kwargs.ray_init.num_gpus == 1
    assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    # the actor in fp32: verl 0.9.1's FSDP engine reads these three keys (default param_dtype bf16)
    mp = cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision
    assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == ("fp32", "fp32", "fp32")
    from verl.workers.engine.fsdp import transformer_impl

    src = inspect.getsource(transformer_impl)
    assert 'mixed_precision_config.get("param_dtype", "bf16")' in src and "self.engine_config.mixed_precision" in src


def test_with_cpu_overrides_leaves_a_key_the_run_sets_to_the_run():
    from recipe.mrtpo.cpu.runtime import FP32_ACTOR, cpu_overrides, override_key, with_cpu_overrides

    cpu = cpu_overrides()
    assert FP32_ACTOR in cpu and "trainer.n_gpus_per_node=1" in cpu
    bf16 = "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:bf16,reduce_dtype:fp32,buffer_dtype:fp32}"
    own = [bf16, "trainer.n_gpus_per_node=2", "data.train_batch_size=4"]
    merged = with_cpu_overrides(own, cpu)
    assert merged[:3] == own and FP32_ACTOR not in merged and "trainer.n_gpus_per_node=1" not in merged
    assert merged[3:] == [o for o in cpu if o not in (FP32_ACTOR, "trainer.n_gpus_per_node=1")]
    # a key below or above one the run sets is the run's too; a sibling with a common prefix is not
    assert with_cpu_overrides(["a.b.c=1"], ["+a.b={c:2}", "a.bc=3", "++a=4", "~a.b.c"]) == ["a.b.c=1", "a.bc=3"]
    assert override_key("++a.b=1") == "a.b" and override_key("~a.b") == "a.b" and override_key("+x={y:1}") == "x"
    assert with_cpu_overrides([], cpu) == cpu


def test_cpu_env():
    env = cpu_env("/some/repo", base={"PYTHONPATH": "/x:/some/repo", "KEEP": "1"})
    assert env["KEEP"] == "1" and env["PYTHONPATH"] == "/some/repo:/x"
    assert (env["VERL_PLATFORM"], env["VERL_USE_EXTERNAL_MODULES"]) == ("cpu", "verl_patches.cpu")
    assert env["VERL_ENGINE_DEVICE"] == "cuda" and env["OMP_NUM_THREADS"] == "1"


def test_trl_value_head_patch_asks_for_the_value_head(monkeypatch):
    """verl 0.9.1 imports TRL's AutoModelForCausalLMWithValueHead wherever ``is_trl_available()`` (TRL importable at
    all); TRL 1.13+ has none. After the patch verl's question is "does the value head import": True for a TRL that has
    it (a stand-in module here), False for one that has not, whatever the installed TRL is."""
    import verl.utils.import_utils as import_utils

    from verl_patches import trl_value_head

    monkeypatch.setattr(import_utils, "is_trl_available", import_utils.is_trl_available)  # restored after the test
    for name in trl_value_head.IMPORTERS:
        if name in sys.modules:
            monkeypatch.setattr(sys.modules[name], "is_trl_available", sys.modules[name].is_trl_available)
    trl_value_head.apply()
    trl_value_head.apply()
    assert trl_value_head.applied() and import_utils.is_trl_available is trl_value_head.is_trl_available

    with_head = types.ModuleType("trl")
    with_head.__spec__ = importlib.machinery.ModuleSpec("trl", None)
    with_head.AutoModelForCausalLMWithValueHead = object
    monkeypatch.setitem(sys.modules, "trl", with_head)
    monkeypatch.setitem(sys.modules, "trl.experimental.ppo", None)  # "import trl.experimental.ppo" raises ImportError
    assert import_utils.is_trl_available() is True
    without = types.ModuleType("trl")
    without.__spec__ = importlib.machinery.ModuleSpec("trl", None)
    monkeypatch.setitem(sys.modules, "trl", without)
    assert import_utils.is_trl_available() is False
