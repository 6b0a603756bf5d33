"""Suite-wide fixtures and the GPU marker: GPU tests skip with a reason on CPU-only machines.

The suite's test model is defined here once: :func:`tiny` (``(tokenizer, model)``) and :func:`tiny_lm` (the
model alone), one per test module, seeded by the module's ``TINY_SEED`` (default 5).
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub in tests
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (run_scripts/test.sh: two workers) every test of ``tests/e2e`` goes to one worker, one
    at a time, in collection order: each is a process tree of 7-12 GiB that takes both cores at moments, so two
    at once would not fit the machine; the other worker runs the rest of the suite beside them. (xdist's own
    ``--dist loadgroup`` renames test ids to group them, which pytest 9 no longer lets a plugin do.)"""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneE2EWorker(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "e2e" if nodeid.startswith("tests/e2e/") else nodeid

    return OneE2EWorker(config, log)


def _utf8_safe(text):
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(text, str) else text


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report):
    """A worker sends each report to the controller as UTF-8 (execnet); the hostile corpora's lone surrogates
    reach a report through the captured log (third-party checkers log the text they reject), which would end
    the whole session. Escaped here, before xdist serialises the report; the test's outcome is untouched."""
    report.sections = [(title, _utf8_safe(content)) for title, content in report.sections]


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a keyword: a checkout folder named gpu is one
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


@pytest.fixture(scope="session", autouse=True)
def _tree_attention_registered():
    """The shared forwards' attention registered with transformers, as the worker's ``_no_grad_pass`` and the benchmarks
    do before a pass: the tests that run the worker's row functions on a plain module (``hf_forward(model)``) skip that
    method, and would otherwise depend on another test having registered it first."""
    from recipe.mrtpo.passes.tree_attention import register_tree_attention

    register_tree_attention()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


#: the test model's seed where a module sets no ``TINY_SEED``
TINY_SEED = 5


def build_test_model(folder: Path, seed: int = TINY_SEED, sharpen: float = 8.0):
    """``(tokenizer, model)``: ``recipe.mrtpo.cpu.tiny_model``'s Qwen2 (hidden size 64) written to ``folder`` and
    loaded in fp32 with SDPA attention, in eval mode, every weight multiplied by ``sharpen`` (a random init at
    std 0.02 barely reacts to the prompt; sharpened, prompts matter measurably)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    path = build_tiny_qwen2(folder, hidden_size=64, seed=seed)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(sharpen)
    return tok, model.eval()


@pytest.fixture(scope="module")
def tiny(request, tmp_path_factory):
    """The suite's test model for this module, ``(tokenizer, model)`` (:func:`build_test_model`), seeded by the
    module's ``TINY_SEED`` (default 5). Module-scoped: a test that changes its weights changes them for the
    module's later tests (copy it first)."""
    seed = getattr(request.module, "TINY_SEED", TINY_SEED)
    return build_test_model(tmp_path_factory.mktemp("tiny") / "model", seed=seed)


@pytest.fixture(scope="module")
def tiny_lm(tiny):
    """The test model alone (:func:`tiny`'s model)."""
    return tiny[1]
