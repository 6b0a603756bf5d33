"""``python -m recipe.mrtpo.doctor``: one screen of what a node has and lacks; exit 0 on this CPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.mrtpo import doctor
from recipe.mrtpo.seams import verl_seam

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
    # and what to do without it (test_without_flash_attn_...): the line is on the screen, not counted
    assert any(ln.split()[:2] == ["note", "attention"] and doctor.FLASH_ATTN_BUILD in ln for ln in res.stdout.splitlines())


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


def test_without_flash_attn_the_doctor_says_what_to_do_and_the_sdpa_overrides_compose():
    """No flash-attn wheel for CUDA 13 + torch 2.11: the line names the build (and its cost) and the SDPA overrides;
    those are keys of verl 0.9.1's config and the very ones every CPU run of verl's loop uses (e2e tests)."""
    from hydra import compose, initialize_config_dir

    import recipe.mrtpo.config  # noqa: F401  (the mrtpo group's schema)
    from recipe.mrtpo.cpu.runtime import cpu_overrides
    from recipe.mrtpo.doctor import FLASH_ATTN_BUILD, SDPA_OVERRIDES, attention_line

    line = attention_line(True, None)
    assert line.status == "note" and not line.counts  # the flash-attn package line counts it already
    assert FLASH_ATTN_BUILD in line.detail and "2 h" in line.detail and all(o in line.detail for o in SDPA_OVERRIDES)
    assert attention_line(True, "2.8.3").status == "ok"
    assert set(SDPA_OVERRIDES) <= set(cpu_overrides())
    with initialize_config_dir(config_dir=str(REPO / "recipe" / "mrtpo" / "config"), version_base=None):
        cfg = compose(config_name="mrtpo_trainer", overrides=list(SDPA_OVERRIDES))
    model = cfg.actor_rollout_ref.model  # one model config: the actor's, the reference's and the rollout's
    assert model.override_config.attn_implementation == "sdpa" and model.use_remove_padding is False


# --------------------------------------------------------------------- the launch's preflight (the run scripts')
def test_preflight_says_one_line_per_check_and_fails_on_a_missing_one(tmp_path, monkeypatch, capsys):
    from recipe.mrtpo.cluster import node_files

    monkeypatch.setattr(doctor, "nvidia_driver", lambda: "575.57.08")
    monkeypatch.setattr(doctor, "_flash_attn_error", lambda: "ModuleNotFoundError: No module named 'flash_attn'")
    monkeypatch.setattr(doctor, "installed", lambda dists: ("torch", "2.11.0+cu130") if dists == ("torch",) else (None, None))
    empty = tmp_path / "assets"
    empty.mkdir(mode=0o700)
    monkeypatch.delenv(node_files.NLTK_DATA_ENV, raising=False)
    monkeypatch.setenv(node_files.ASSETS_ENV, str(empty))
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(tmp_path / "no_data"))
    assert doctor.main(["--preflight", "--task", "ifbench", "--", "trainer.nnodes=1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in out] == ["preflight DIFFERS NVIDIA driver", "preflight MISSING attention",
                                                "preflight MISSING NLTK data", "preflight MISSING data root"], out
    assert ">= 580" in out[0] and all(o in out[1] for o in doctor.SDPA_OVERRIDES)
    assert f"under {empty / 'nltk_data'}" in out[2] and f"fetch_assets.py --dest {empty}" in out[2]
    # a driver >= 580, the SDPA overrides (the last value of a key wins), the data, the data root: passes
    monkeypatch.setattr(doctor, "nvidia_driver", lambda: "580.65.06")
    monkeypatch.setenv(node_files.NLTK_DATA_ENV, str(REPO / ".assets" / "nltk_data"))
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(tmp_path))
    sdpa = ["actor_rollout_ref.model.use_remove_padding=True", *doctor.SDPA_OVERRIDES]
    assert doctor.main(["--preflight", "--task", "ifbench", "--", *sdpa]) == 0
    assert all(ln.startswith("preflight ok ") for ln in capsys.readouterr().out.splitlines())
    assert not doctor.sdpa_given([*doctor.SDPA_OVERRIDES, "actor_rollout_ref.model.use_remove_padding=True"])
    assert doctor.main(["--preflight", "--task", "text2sql", "--", *sdpa]) == 0  # no IF rows: NLTK not needed
    assert "preflight note NLTK data: not read by task text2sql" in capsys.readouterr().out
    assert doctor._torch_cuda_build() == "13.0"
