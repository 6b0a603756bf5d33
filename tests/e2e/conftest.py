"""Shared set-up of the end-to-end tests: the ``e2e`` marker, the tiny model and the tiny IF dataset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
