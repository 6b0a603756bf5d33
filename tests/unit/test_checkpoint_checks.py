"""Checkpoints across nodes (``recipe/mrtpo/cluster/checkpoint_shards.py``, the trainer's resume and save): a resume that
finds no checkpoint where the run's record or verl's tracker says one was saved, a ``resume_from_path`` that holds
none, and shards of another world size are refused in one line before verl loads anything (verl would start at
step 0, or fail rank by rank); every save is recorded; only a run that saves or resumes needs a shared folder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from recipe.mrtpo.cluster import checkpoint_shards as C


def _trainer_cfg(folder: Path, mode: str = "auto", **kw) -> SimpleNamespace:
    return SimpleNamespace(**{"resume_mode": mode, "default_local_dir": str(folder), "resume_from_path": None,
                              "nnodes": 1, "n_gpus_per_node": 8, "save_freq": -1, **kw})


def _shards(actor: Path, world: int, ranks=None) -> None:
    actor.mkdir(parents=True)
    for r in range(world) if ranks is None else ranks:
        (actor / f"model_world_size_{world}_rank_{r}.pt").write_bytes(b"")


def test_a_resume_to_nothing_is_refused_where_the_run_recorded_a_save(tmp_path):
    from recipe.mrtpo.seams import verl_seam

    folder = tmp_path / "ckpt"
    cfg = _trainer_cfg(folder)
    assert C.resume_refusal(cfg, verl_seam.resume_folder(SimpleNamespace(trainer=cfg)), 8) == ""  # nothing saved: fresh
    C.record_save(str(folder), 50, 16)  # the run's record: step 50 was saved (its folder on another node's disk)
    assert C.saved_steps(str(folder)) == [50]
    assert verl_seam.resume_folder(SimpleNamespace(trainer=cfg)) is None  # verl would start at step 0
    line = C.resume_refusal(cfg, None, 8)
    assert "\n" not in line and f"finds no checkpoint in {folder}" in line and "records step 50" in line
    assert "CHECKPOINT_ROOT" in line and "resume_mode=disable" in line
    # verl's own tracker naming a step whose folder is gone: refused too
    other = tmp_path / "other"
    other.mkdir()
    (other / C.TRACKER_NAME).write_text("7")
    line = C.resume_refusal(_trainer_cfg(other), None, 8)
    assert f"{C.TRACKER_NAME} names step 7" in line
    assert C.resume_refusal(_trainer_cfg(folder, "disable"), None, 8) == ""  # a fresh run on purpose


def test_a_resume_path_without_a_checkpoint_is_refused(tmp_path):
    gone = str(tmp_path / "ckpt" / "global_step_40")
    line = C.resume_refusal(_trainer_cfg(tmp_path / "ckpt", "resume_path"), gone, 8)
    assert line.startswith(f"trainer.resume_from_path={gone} holds no checkpoint") and "\n" not in line


def test_shards_of_another_world_size_are_refused(tmp_path):
    actor = tmp_path / "global_step_10" / "actor"
    _shards(actor, 16)
    cfg = _trainer_cfg(tmp_path)
    line = C.resume_refusal(cfg, str(actor.parent), 8)
    assert "saved by 16 ranks (model_world_size_16_rank_*.pt), this run has 8" in line and "\n" not in line
    assert C.resume_refusal(cfg, str(actor.parent), 16) == ""
    half = tmp_path / "global_step_20" / "actor"
    _shards(half, 16, ranks=range(8))  # a node-local folder: this node's ranks only
    assert "8 of 16 model shards found" in C.resume_refusal(cfg, str(half.parent), 16)


def test_the_trainer_refuses_before_verl_loads_and_records_each_save(tmp_path, monkeypatch):
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from recipe.mrtpo.seams import verl_seam
    from recipe.mrtpo.step.trainer import MRTPOTrainer

    folder = tmp_path / "ckpt"
    trainer = MRTPOTrainer.__new__(MRTPOTrainer)
    trainer.config = SimpleNamespace(trainer=_trainer_cfg(folder, nnodes=2))
    trainer.config.trainer.n_gpus_per_node = 4
    assert verl_seam.actor_world_size(trainer.config) == 8
    loaded = []
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: None)  # verl's save, not run here
    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", lambda self: loaded.append(True))
    trainer._load_checkpoint()  # nothing saved yet: verl's own resume (a fresh start)
    assert loaded == [True]
    trainer.global_steps = 5
    trainer._save_checkpoint()
    assert C.saved_steps(str(folder)) == [5]
    with pytest.raises(RuntimeError) as err:  # the save's folder is gone (another node's disk): refused, not step 0
        trainer._load_checkpoint()
    assert str(err.value).startswith(C.RESUME_MARK) and "records step 5" in str(err.value) and loaded == [True]


def test_a_refused_resume_from_the_task_runner_is_printed_alone():
    from ray.exceptions import RayTaskError

    from recipe.mrtpo.launch.launch_errors import is_launch_error, one_line

    line = C.RESUME_MARK + "resume_mode=auto finds no checkpoint in /c although mrtpo_saves.jsonl records step 5"
    err = RayTaskError("run", "Traceback ...\n  many lines", RuntimeError(line)).as_instanceof_cause()
    assert is_launch_error(err) and one_line(err) == line
    assert not is_launch_error(RayTaskError("run", "Traceback", RuntimeError("CUDA out of memory")).as_instanceof_cause())


def test_only_a_run_that_saves_or_resumes_needs_a_shared_folder_and_the_marker_is_this_runs(tmp_path):
    assert not C.needs_shared_folder(SimpleNamespace(save_freq=-1, resume_mode="disable"))  # SMOKE=1
    assert C.needs_shared_folder(SimpleNamespace(save_freq=50, resume_mode="disable"))
    assert C.needs_shared_folder(SimpleNamespace(save_freq=-1, resume_mode="auto"))
    path, token = C.write_marker(str(tmp_path / "new" / "folder"))
    assert Path(path).parent == tmp_path / "new" / "folder" and C.marker_line(path, token) is None
    again, other = C.write_marker(str(tmp_path / "new" / "folder"))  # the next launch: a new token
    assert again == path and other != token and "sees another marker" in C.marker_line(path, token)
