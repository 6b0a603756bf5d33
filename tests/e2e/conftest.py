"""Shared set-up of the end-to-end tests: the ``e2e`` marker (registered here, since pytest.ini is not
this directory's to change) and the tiny model they train."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "e2e: end-to-end runs of the whole loop (minutes; Ray + vLLM subprocesses); select with -m e2e"
    )


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 with the real tokenizer (``recipe.mrtpo.tiny_model``), built once per session.

    ``MRTPO_TINY_MODEL_DIR`` points it at a persistent directory instead (rebuilt only when its key
    changes), so repeated runs skip the ~10 s build.
    """
    from recipe.mrtpo.tiny_model import build_tiny_qwen2

    out = os.environ.get("MRTPO_TINY_MODEL_DIR") or tmp_path_factory.mktemp("tiny-qwen2") / "model"
    return build_tiny_qwen2(out)
