"""``python -m recipe.mrtpo.doctor``: one screen of what a node has and lacks; exit 0 on this CPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.mrtpo import doctor, verl_seam

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "recipe.mrtpo.doctor", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=300)


def test_cpu_node_reports_no_cuda_and_exits_0():
    res = _run()
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout.splitlines()
    assert len(out) <= 40  # one screen
    body = "\n".join(out)
    for label in ("verl", "vllm", "torch", "transformers", "flash-attn", "numpy"):
        assert any(line.split()[1:2] == [label] for line in out), label
    assert "no CUDA" in body
    assert "seam advantage step" in body and "matches the pinned hash" in body
    assert "asset qwen/qwen.tiktoken" in body
    assert out[-1] == "verdict: 0 problem(s)"
    assert res.stderr == ""  # verl's import-time notices are not findings


def test_gpu_flag_counts_the_gpu_stack_on_a_cpu_node():
    res = _run("--gpu")
    assert res.returncode == 1
    verdict = res.stdout.splitlines()[-1]
    assert "CUDA devices" in verdict and "flash-attn" in verdict


def test_missing_assets_are_named_with_the_command_that_fetches_them(tmp_path):
    res = _run(MRTPO_ASSETS=str(tmp_path))
    assert res.returncode == 1
    missing = [line for line in res.stdout.splitlines() if line.split()[:1] == ["MISSING"]]
    assert missing and all("fetch_assets.py --dest" in line for line in missing)
    assert any("qwen/qwen.tiktoken" in line for line in missing)


def test_a_changed_verl_shows_as_a_seam_that_differs(monkeypatch):
    monkeypatch.setattr(verl_seam, "UPSTREAM_SOURCE_SHA256", "0" * 64)
    lines, status = doctor.report(gpu=False)
    seam = next(line for line in lines if "seam advantage step" in line)
    assert seam.split()[0] == "DIFFERS" and "_compute_advantage changed" in seam
    assert status == 1


def test_gpu_pins_are_read_from_the_pinned_file(tmp_path):
    f = tmp_path / "req.txt"
    f.write_text("# c\nverl[vllm]==0.9.1\nflash_attn==2.8.3 ; python_version < '3.13'\n--no-deps\nnumpy>=2\nTorch==2.11.0  # x\n")
    assert doctor.gpu_pins(f) == {"verl": "0.9.1", "flash-attn": "2.8.3", "torch": "2.11.0"}
    pins = doctor.gpu_pins()
    if not doctor.GPU_REQUIREMENTS.is_file():
        pytest.fail("requirements-gpu.txt is missing from the repository")
    assert pins["verl"] == "0.9.1" and pins["torch"] == "2.11.0" and pins["vllm"] == "0.24.0"


def test_the_driver_line_checks_what_cuda_13_builds_need():
    from recipe.mrtpo.doctor import MIN_DRIVER_CUDA13, driver_line

    assert MIN_DRIVER_CUDA13 == 580
    ok = driver_line(True, "580.65.06", "13.0")
    assert ok.status == "ok" and "580.65.06" in ok.detail
    old = driver_line(True, "550.54.15", "13.0")
    assert old.status == "DIFFERS" and old.counts and ">= 580" in old.detail and "550.54.15" in old.detail
    assert driver_line(True, "550.54.15", "12.8").status == "ok"  # a CUDA 12 build runs on it
    assert driver_line(True, None, "13.0").status == "MISSING" and driver_line(True, None, "13.0").counts
    assert driver_line(False, None, None).status == "note" and not driver_line(False, None, None).counts
    assert driver_line(True, "garbage", "13.0").status == "DIFFERS"
