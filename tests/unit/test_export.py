"""``python -m recipe.mrtpo.tools.export``: choosing the step, refusing what it cannot export, and verl's own
merger run on a checkpoint laid out as verl's FSDP checkpoint manager writes it (world size 1 and 2).

The checkpoint of a real training run is exported in ``tests/e2e/test_export_eval.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from recipe.mrtpo.tools.export import ExportError, export_checkpoint, find_checkpoint, main


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model")


def _fake_actor(step_dir: Path, model_dir: Path, world_size: int = 1, scale: float = 1.0) -> dict:
    """``step_dir/actor`` as verl's FSDPCheckpointManager leaves it: fsdp_config.json, one model shard per rank
    (plain tensors here: what a world-size-1 FSDP2 run saves, replicated on every rank), huggingface/."""
    from transformers import AutoModelForCausalLM

    actor = step_dir / "actor"
    actor.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    state = {k: v * scale for k, v in model.state_dict().items()}
    for rank in range(world_size):
        torch.save(state, actor / f"model_world_size_{world_size}_rank_{rank}.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world_size}))
    hf = actor / "huggingface"
    hf.mkdir()
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, hf / f.name)
    return state


def test_find_checkpoint_latest_complete_step(tmp_path, tiny_model):
    for n in (2, 10):
        _fake_actor(tmp_path / f"global_step_{n}", tiny_model)
    (tmp_path / "global_step_11" / "actor").mkdir(parents=True)  # a save that was cut off
    ck = find_checkpoint(tmp_path)
    assert ck.step == 10 and ck.actor_dir == tmp_path / "global_step_10" / "actor"
    assert find_checkpoint(tmp_path, step=2).step == 2
    assert find_checkpoint(tmp_path / "global_step_2").actor_dir == tmp_path / "global_step_2" / "actor"
    assert find_checkpoint(tmp_path / "global_step_2" / "actor").step == 2
    with pytest.raises(ExportError, match=r"no global_step_3/ .*\[2, 10, 11\]"):
        find_checkpoint(tmp_path, step=3)
    with pytest.raises(ExportError, match="has no complete FSDP actor checkpoint"):
        find_checkpoint(tmp_path / "global_step_11")
    with pytest.raises(ExportError, match="not of --step 10"):
        find_checkpoint(tmp_path / "global_step_2", step=10)


def test_find_checkpoint_errors(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        find_checkpoint(tmp_path / "nope")
    with pytest.raises(ExportError, match="no global_step_<N>/ checkpoint folders"):
        find_checkpoint(tmp_path)


@pytest.mark.parametrize("world_size", [1, 2])
def test_export_with_verls_merger_loads_and_matches(tmp_path, tiny_model, world_size):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    state = _fake_actor(tmp_path / "ckpt" / "global_step_3", tiny_model, world_size, scale=0.5)
    out = tmp_path / "hf"
    info = export_checkpoint(tmp_path / "ckpt", out)
    assert info["step"] == 3 and json.loads((out / "mrtpo_export.json").read_text())["step"] == 3
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    for key, value in merged.items():  # verl's merger saves bf16: equal up to bf16 rounding
        torch.testing.assert_close(value, state[key].bfloat16().float(), rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(out).chat_template
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf.export-")]  # no temporary left


def test_export_refuses_non_empty_out_and_cli_says_one_line(tmp_path, tiny_model, capsys):
    _fake_actor(tmp_path / "ckpt" / "global_step_1", tiny_model)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    capsys.readouterr()
    assert main([str(tmp_path / "ckpt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty; pass --overwrite" in err[0]
    assert (out / "keep.txt").is_file()
    assert main([str(tmp_path / "ckpt"), "--out", str(out), "--overwrite"]) == 0
    assert (out / "config.json").is_file() and not (out / "keep.txt").exists()
    assert main([str(tmp_path / "missing"), "--out", str(out)]) == 2


def test_export_and_resume_refuse_a_checkpoint_with_missing_shards(tmp_path, tiny_model, capsys):
    """A node-local default_local_dir with NNODES > 1: this node holds ranks 0-1 of 4. One line: found, expected."""
    from types import SimpleNamespace

    from recipe.mrtpo.cluster.checkpoint_shards import missing_shards_line, shard_counts
    from recipe.mrtpo.seams import verl_seam

    step = tmp_path / "ckpt" / "global_step_3"
    _fake_actor(step, tiny_model, world_size=4)
    for rank in (2, 3):
        (step / "actor" / f"model_world_size_4_rank_{rank}.pt").unlink()
    assert shard_counts(step / "actor") == ({0, 1}, 4)
    capsys.readouterr()
    assert main([str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 of 4 model shards found" in err[0] and "ranks 2, 3 missing" in err[0], err
    assert not (tmp_path / "hf").exists()
    # the resume finds the same folder verl's _load_checkpoint would (latest_checkpointed_iteration.txt) and refuses it
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("3")
    cfg = SimpleNamespace(trainer=SimpleNamespace(resume_mode="auto", default_local_dir=str(tmp_path / "ckpt"),
                                                  resume_from_path=None))
    folder = verl_seam.resume_folder(cfg)
    assert folder is not None and Path(folder) == step
    assert "2 of 4 model shards found" in missing_shards_line(Path(folder) / "actor")
    cfg.trainer.resume_mode = "disable"
    assert verl_seam.resume_folder(cfg) is None
    _fake_actor(tmp_path / "ok" / "global_step_1", tiny_model, world_size=2)
    assert missing_shards_line(tmp_path / "ok" / "global_step_1" / "actor") == ""


def test_the_trainers_resume_refuses_missing_shards_before_verl_loads(tmp_path, tiny_model, monkeypatch):
    from types import SimpleNamespace

    from recipe.mrtpo.seams import verl_seam
    from recipe.mrtpo.step.trainer import MRTPOTrainer

    step = tmp_path / "global_step_2"
    _fake_actor(step, tiny_model, world_size=2)
    (step / "actor" / "model_world_size_2_rank_1.pt").unlink()
    monkeypatch.setattr(verl_seam, "resume_folder", lambda config: str(step))
    trainer = MRTPOTrainer.__new__(MRTPOTrainer)
    trainer.config = SimpleNamespace(trainer=SimpleNamespace(resume_mode="auto", default_local_dir=str(tmp_path),
                                                             nnodes=1, n_gpus_per_node=2))
    with pytest.raises(RuntimeError, match=r"cannot resume: .*1 of 2 model shards found"):
        trainer._load_checkpoint()
