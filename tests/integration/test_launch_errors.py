"""A refused launch of ``python -m recipe.mrtpo.main_mrtpo`` is one line; ``--debug`` shows the traceback
(``recipe/mrtpo/launch/launch_errors.py``). The messages come from the real Hydra composition of the recipe's config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

import recipe.mrtpo.config  # noqa: F401  (registers the mrtpo group's schema, as the entry point does)
from recipe.mrtpo.launch.launch_errors import check_local_paths, is_launch_error, launch_errors_in_one_line, one_line

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "recipe" / "mrtpo" / "config"


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=list(overrides))


def test_mistyped_key_names_the_key_and_the_near_one():
    with pytest.raises(HydraException) as exc:
        _compose("mrtpo.bta=0.3")
    assert is_launch_error(exc.value)
    assert one_line(exc.value) == "unknown config key 'mrtpo.bta' (did you mean 'mrtpo.beta'?)"
    with pytest.raises(HydraException) as exc:
        _compose("trainer.totl_epochs=3")
    assert one_line(exc.value) == "unknown config key 'trainer.totl_epochs' (did you mean 'trainer.total_epochs'?)"


def test_missing_model_folder_and_data_files(tmp_path):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"x")
    cfg = _compose(f"actor_rollout_ref.model.path={tmp_path / 'nope'}", f"data.train_files={data}",
                   f"data.val_files=[{data},{tmp_path / 'val.parquet'}]")
    with pytest.raises(FileNotFoundError, match="actor_rollout_ref.model.path=.*nope: no such folder"):
        check_local_paths(cfg)
    cfg = _compose("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", f"data.train_files={data}",
                   f"data.val_files=[{data},{tmp_path / 'val.parquet'}]")  # a hub id is left to transformers
    with pytest.raises(FileNotFoundError, match=r"data.val_files: no such file .*val.parquet"):
        check_local_paths(cfg)
    cfg = _compose(f"actor_rollout_ref.model.path={tmp_path}", f"data.train_files={data}", "data.val_files=hdfs://x/y")
    check_local_paths(cfg)


def test_only_launch_errors_are_shortened(capsys, monkeypatch):
    monkeypatch.delenv("MRTPO_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exc, launch_errors_in_one_line("prog"):
        raise ValueError("mrtpo.beta must be in [0, 1),\n got 1.5")
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().startswith("prog: error: mrtpo.beta must be in [0, 1), got 1.5  [traceback:")
    with pytest.raises(ZeroDivisionError), launch_errors_in_one_line("prog"):  # a crash keeps its traceback
        raise ZeroDivisionError("bug")
    monkeypatch.setenv("MRTPO_DEBUG", "1")
    with pytest.raises(ValueError), launch_errors_in_one_line("prog"):
        raise ValueError("shown with its traceback")
    from ray.exceptions import RayTaskError

    assert not is_launch_error(RayTaskError("f", "tb", ValueError("inside the job")).as_instanceof_cause())


@pytest.mark.parametrize("args, message", [
    (["mrtpo.bta=0.3"], "main_mrtpo: error: unknown config key 'mrtpo.bta' (did you mean 'mrtpo.beta'?)"),
    (["actor_rollout_ref.model.path=/nonexistent/model"],
     "main_mrtpo: error: actor_rollout_ref.model.path=/nonexistent/model: no such folder"),
])
def test_entry_point_prints_one_line_and_debug_the_traceback(args, message):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "1"}  # as the run scripts set it
    env.pop("MRTPO_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "recipe.mrtpo.main_mrtpo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(message), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "recipe.mrtpo.main_mrtpo", *args, "--debug"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr


from recipe.mrtpo.main_mrtpo import check_config  # noqa: E402
from recipe.mrtpo.methods import METHODS  # noqa: E402


def _model_folder(tmp_path, name, config):
    import json

    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("config, words", [
    ({"model_type": "qwen2_5_vl", "vision_config": {"depth": 2}}, "vision-language models (model type 'qwen2_5_vl')"),
    ({"model_type": "my_vlm", "vision_config": {}}, "vision-language models (model type 'my_vlm')"),
    ({"model_type": "some_new_hybrid", "layer_types": ["linear_attention", "full_attention"]},
     "do not know model type 'some_new_hybrid', whose config has recurrent"),
])
def test_models_the_passes_cannot_run_exactly_are_refused_in_one_line_before_ray(tmp_path, config, words):
    from recipe.mrtpo.main_mrtpo import check_launch

    folder = _model_folder(tmp_path, "model", config)
    for name in ("mrtpo", "opsd"):
        cfg = _compose(f"actor_rollout_ref.model.path={folder}", *METHODS[name].overrides)
        with pytest.raises(ValueError) as exc:
            check_launch(cfg, local_paths=False)
        line = one_line(exc.value)
        assert words in line and "\n" not in str(exc.value), line
    assert "mrtpo.replay=False" in one_line(pytest.raises(ValueError, check_launch, _compose(
        f"actor_rollout_ref.model.path={folder}"), local_paths=False).value)
    # no pass runs: verl's own methods, and the replay turned off, accept the model
    # (check_config: check_launch's first step, which refuses; verl's own checks after it need batch sizes)
    check_config(_compose(f"actor_rollout_ref.model.path={folder}", "algorithm.adv_estimator=gdpo"))
    check_config(_compose(f"actor_rollout_ref.model.path={folder}", "mrtpo.replay=False"))


def test_known_hybrid_and_dense_models_pass_the_check(tmp_path):
    for cfg in ({"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}, {"model_type": "qwen2"}):
        folder = _model_folder(tmp_path, cfg["model_type"], cfg)
        check_config(_compose(f"actor_rollout_ref.model.path={folder}"))


def test_lora_is_refused_for_methods_that_replay_or_teach():
    from recipe.mrtpo.main_mrtpo import check_launch

    live_rlsd = (*METHODS["rlsd"].overrides, "mrtpo.rlsd_teacher=live", "mrtpo.rlsd_teacher_sync_steps=0")
    for name, overrides in (("mrtpo", METHODS["mrtpo"].overrides), ("gdpo-distill", METHODS["gdpo-distill"].overrides),
                            ("rlsd", live_rlsd)):
        with pytest.raises(ValueError, match=rf"lora_rank=8 \(LoRA\) is not supported with method {name}") as exc:
            check_launch(_compose("actor_rollout_ref.model.lora_rank=8", *overrides), local_paths=False)
        assert "actor_rollout_ref.model.lora_rank=0" in one_line(exc.value)
    # ALGO=rlsd (the authors' preset) teaches from the synced initial policy, verl's reference worker: refused first
    with pytest.raises(ValueError, match=r"mrtpo.rlsd_teacher=initial is not supported with LoRA"):
        check_launch(_compose("actor_rollout_ref.model.lora_rank=8", *METHODS["rlsd"].overrides), local_paths=False)
    # OPSD's frozen teacher is verl's reference worker, which under LoRA is the adapter-free actor: refused first
    with pytest.raises(ValueError, match=r"method opsd \(its teacher is frozen at the initial policy\) is not supported with LoRA"):
        check_launch(_compose("actor_rollout_ref.model.lora_rank=8", *METHODS["opsd"].overrides), local_paths=False)
    check_config(_compose("actor_rollout_ref.model.lora_rank=8", "algorithm.adv_estimator=gdpo"))


def test_prefix_grouper_is_refused_in_one_line_for_methods_that_replay_or_teach():
    from recipe.mrtpo.main_mrtpo import check_launch

    for name in ("mrtpo", "rlsd"):
        with pytest.raises(ValueError, match=r"use_prefix_grouper=True is not supported with method") as exc:
            check_launch(_compose("actor_rollout_ref.actor.use_prefix_grouper=True", *METHODS[name].overrides), local_paths=False)
        assert "actor_rollout_ref.actor.use_prefix_grouper=False" in one_line(exc.value) and "\n" not in one_line(exc.value)
    check_config(_compose("actor_rollout_ref.actor.use_prefix_grouper=True", "algorithm.adv_estimator=gdpo"))
