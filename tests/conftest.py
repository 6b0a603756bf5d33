"""Suite-wide fixtures and the GPU marker: GPU tests skip with a reason on CPU-only machines."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub in tests
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into the test ids
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (run_scripts/test.sh: two workers, --dist loadgroup) the end-to-end runs go to one
    # worker, one at a time, in collection order: each is a process tree of ~8-13 GiB that takes both cores
    # at moments, so two at once would not fit the machine; the other worker runs everything else beside them.
    group = pytest.mark.xdist_group(name="e2e")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(group)
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_global_rngs():
    """Every test starts from the same global RNG state, whatever ran before it (order-independent draws)."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
