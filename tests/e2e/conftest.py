"""Shared set-up of the end-to-end tests: the ``e2e`` marker, the tiny models and the tiny datasets.

Two tiny models: ``tiny_qwen2_dir`` has the real Qwen2 tokenizer (151,936 tokens), for the runs whose
subject is the tokenizer (rendering through the real BPE, token ids fed to vLLM); ``tiny_task_qwen2_dir``
has Qwen2's tokenizer pipeline, special tokens and chat template over a 1,024-token BPE trained on the
test data's prompts, for the runs whose subject is the loop (a step's LM head is then ~150x smaller).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from launches import LAUNCH_TIMEOUT_S, assert_launch_ok, method_overrides  # tests/e2e/launches.py

REPO_ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "e2e: end-to-end runs of the whole loop (minutes; Ray + vLLM subprocesses); select with -m e2e"
    )


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 with the real tokenizer (``recipe.mrtpo.cpu.tiny_model``), built once per session.

    ``MRTPO_TINY_MODEL_DIR`` points it at a persistent directory instead (rebuilt only when its key
    changes), so repeated runs skip the ~10 s build.
    """
    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    out = os.environ.get("MRTPO_TINY_MODEL_DIR") or tmp_path_factory.mktemp("tiny-qwen2") / "model"
    return build_tiny_qwen2(out)


#: the task vocabulary's size (BPE merges over the bytes, then Qwen2's added tokens)
TASK_VOCAB = 1024


def prompt_texts(*parquets: Path) -> list[str]:
    """The chat roles and every prompt message of ``parquets`` (verl rows): what a task vocabulary is trained on."""
    import pyarrow.parquet as pq

    texts = ["system", "user", "assistant"]
    for path in parquets:
        for prompt in pq.read_table(path, columns=["prompt"]).column("prompt").to_pylist():
            texts += [m["content"] for m in prompt]
    return texts


@pytest.fixture(scope="session")
def tiny_task_qwen2_dir(tmp_path_factory, if_train_parquet, chinook_train_parquet) -> Path:
    """The tiny Qwen2 of ``tiny_qwen2_dir`` (same shape and seed) on a task vocabulary of the IF and Chinook
    training prompts (``recipe.mrtpo.cpu.tiny_model.build_task_tokenizer``)."""
    from recipe.mrtpo.cpu.tiny_model import build_task_tokenizer, build_tiny_qwen2

    root = tmp_path_factory.mktemp("tiny-task-qwen2")
    tok = build_task_tokenizer(root / "tokenizer", prompt_texts(if_train_parquet, chinook_train_parquet), TASK_VOCAB)
    return build_tiny_qwen2(root / "model", tokenizer_dir=tok)


@pytest.fixture(scope="session")
def if_train_parquet(tmp_path_factory) -> Path:
    """8 instruction-following prompts with 2-3 constraints a random model passes part of the time
    (no commas, no all-caps word, no letter z, under 30 words), built by the project's own builder."""
    out = tmp_path_factory.mktemp("if-data")
    cmd = [sys.executable, "-m", "data_prep.instruction_following", "train", "--out-dir", str(out),
           "--constraints", "random_passable", "--min-constraints", "2", "--max-constraints", "3",
           "--limit", "8", "--samples-per-prompt", "1", "--test-fraction", "0", "--seed", "0"]
    subprocess.run(cmd, cwd=REPO_ROOT, check=True, capture_output=True, timeout=300)
    return out / "train.parquet"


@pytest.fixture(scope="session")
def chinook_train_parquet(tmp_path_factory):
    """The Chinook text-to-SQL set (``python -m data_prep.build_offline --only chinook``): its gold SQL is an
    appended context, so every P_all differs from the rollout prompt."""
    out = tmp_path_factory.mktemp("chinook")
    subprocess.run([sys.executable, "-m", "data_prep.build_offline", "--out", str(out), "--only", "chinook"], cwd=REPO_ROOT,
                   check=True, capture_output=True, timeout=300)
    return out / "chinook" / "train.parquet"


@pytest.fixture(scope="session")
def mrtpo_run(tiny_task_qwen2_dir, if_train_parquet, tmp_path_factory):
    """Two MRTPO steps (the replay from step 2), relevance dumps every step, the step-2 checkpoint saved: the
    launch the replay test reads, the resume test continues from and the same-seed test pairs with ``gdpo_run``
    (test_mrtpo_loop.py). -> (result, out folder, the overrides the resume repeats)."""
    from recipe.mrtpo.cpu.launcher import run_cpu

    out = tmp_path_factory.mktemp("mrtpo")
    common = ["trainer.save_freq=2", "mrtpo.dump.every_n_steps=1", "mrtpo.dump.max_samples=16", f"mrtpo.dump.dir={out / 'dumps'}"]
    res = run_cpu("recipe.mrtpo.main_mrtpo", method_overrides(tiny_task_qwen2_dir, if_train_parquet, out, "mrtpo", 2, *common),
                  out / "run1", LAUNCH_TIMEOUT_S)
    assert_launch_ok(res, [1, 2])
    return res, out, common


@pytest.fixture(scope="session")
def gdpo_run(tiny_task_qwen2_dir, if_train_parquet, tmp_path_factory):
    """Two GDPO steps under the MRTPO launch's seed, data, model and learning rate, the step-2 checkpoint saved:
    the GDPO baseline and the checkpoint the export test exports (test_export_eval.py), and the launch the
    same-seed test compares with ``mrtpo_run`` (test_mrtpo_loop.py). -> (result, out folder)."""
    from recipe.mrtpo.cpu.launcher import run_cpu

    out = tmp_path_factory.mktemp("gdpo")
    res = run_cpu("recipe.mrtpo.main_mrtpo", method_overrides(tiny_task_qwen2_dir, if_train_parquet, out, "gdpo", 2,
                                                              "trainer.save_freq=2"), out / "run", LAUNCH_TIMEOUT_S)
    assert_launch_ok(res, [1, 2])
    return res, out
