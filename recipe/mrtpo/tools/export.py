"""Export a training checkpoint to a Hugging Face model folder (for ``tools.eval --model``), with verl's own merger.

::

    python -m recipe.mrtpo.tools.export CHECKPOINT_DIR --out HF_DIR [--step N] [--overwrite]

CHECKPOINT_DIR is any of

- the run's ``trainer.default_local_dir`` (default ``checkpoints/<project_name>/<experiment_name>``), holding
  ``global_step_<N>/`` folders: the latest step is exported (the highest N with a complete actor
  checkpoint), or the one ``--step N`` names;
- one ``global_step_<N>/`` folder, or its ``actor/`` folder.

The actor folder is what verl 0.9.1's FSDP / FSDP2 checkpoint manager writes: ``fsdp_config.json`` (the
world size), ``model_world_size_<W>_rank_<r>.pt`` (one shard per rank) and ``huggingface/`` (the model's
config and tokenizer). The shards are merged by verl's ``verl.model_merger`` (``FSDPModelMerger``, the same
code as ``python -m verl.model_merger merge --backend fsdp --local_dir .../actor --target_dir HF_DIR``): its
DTensor shards concatenated by placement, plain tensors checked identical on every rank, the weights saved
in **bfloat16** (verl's merger casts every tensor to bf16) with the checkpoint's config, generation config
and tokenizer. Nothing is re-implemented here: this module finds the step, runs the merger into a
temporary folder beside HF_DIR and moves it into place only when verl's own output check passed, so an
interrupted export never leaves a half-written model at HF_DIR. ``HF_DIR/mrtpo_export.json`` records the
checkpoint and step it came from.

Megatron checkpoints are not handled (``python -m verl.model_merger merge --backend megatron``); a LoRA
adapter in the checkpoint is written by verl's merger to ``HF_DIR/lora_adapter``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from recipe.mrtpo.cluster.checkpoint_shards import missing_shards_line

__all__ = ["ExportError", "Checkpoint", "find_checkpoint", "export_checkpoint", "main"]

_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class ExportError(RuntimeError):
    """A checkpoint that cannot be exported as asked: reported in one line, without a traceback."""


@dataclass
class Checkpoint:
    actor_dir: Path
    step: Optional[int]  # None when the folder name does not say


def _is_actor_dir(path: Path) -> bool:
    return (path / "fsdp_config.json").is_file() and any(path.glob("model_world_size_*_rank_0.pt"))


def _actor_of(step_dir: Path) -> Optional[Path]:
    for candidate in (step_dir / "actor", step_dir):
        if _is_actor_dir(candidate):
            return candidate
    return None


def _step_of(path: Path) -> Optional[int]:
    for part in (path.name, path.parent.name):
        m = _STEP_DIR.match(part)
        if m:
            return int(m.group(1))
    return None


def find_checkpoint(path, step: Optional[int] = None) -> Checkpoint:
    """The actor checkpoint to export under ``path`` (module docstring); :class:`ExportError` if none."""
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"checkpoint folder {path} does not exist")
    if _is_actor_dir(path) or _STEP_DIR.match(path.name):
        actor = _actor_of(path)
        if actor is None:
            raise ExportError(f"{path} has no complete FSDP actor checkpoint (fsdp_config.json and "
                              f"model_world_size_*_rank_0.pt, in it or under actor/)")
        found = _step_of(actor)
        if step is not None and found is not None and found != step:
            raise ExportError(f"{path} is the checkpoint of step {found}, not of --step {step}")
        return Checkpoint(actor, found)
    steps = {}
    for child in path.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir():
            steps[int(m.group(1))] = child
    if not steps:
        hint = ""
        if any(path.rglob("dist_ckpt")):
            hint = " (a Megatron checkpoint? use: python -m verl.model_merger merge --backend megatron)"
        raise ExportError(f"no global_step_<N>/ checkpoint folders in {path}{hint}; a run saves them every "
                          f"trainer.save_freq steps into trainer.default_local_dir")
    if step is not None:
        if step not in steps:
            raise ExportError(f"no global_step_{step}/ in {path} (steps saved: {sorted(steps)})")
        actor = _actor_of(steps[step])
        if actor is None:
            raise ExportError(f"{steps[step]} has no FSDP actor checkpoint (fsdp_config.json and "
                              f"model_world_size_*_rank_0.pt under actor/)")
        return Checkpoint(actor, step)
    incomplete = []
    for n in sorted(steps, reverse=True):  # the latest complete one: a save cut off leaves a partial folder
        actor = _actor_of(steps[n])
        if actor is not None:
            if incomplete:
                print(f"export: skipped incomplete checkpoint(s) of step {incomplete}", file=sys.stderr)
            return Checkpoint(actor, n)
        incomplete.append(n)
    raise ExportError(f"no complete FSDP actor checkpoint in {path} (steps {sorted(steps)} lack "
                      f"actor/fsdp_config.json or actor/model_world_size_*_rank_0.pt)")


def export_checkpoint(path, out, step: Optional[int] = None, overwrite: bool = False) -> dict:
    """Merge the chosen actor checkpoint into a Hugging Face folder ``out`` with verl's
    ``FSDPModelMerger``; returns the provenance written to ``out/mrtpo_export.json``."""
    ckpt = find_checkpoint(path, step)
    refusal = missing_shards_line(ckpt.actor_dir)
    if refusal:
        raise ExportError(refusal)
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise ExportError(f"{out} exists and is not empty; pass --overwrite to replace it")
    hf_config = ckpt.actor_dir / "huggingface"
    if not (hf_config / "config.json").is_file():
        raise ExportError(f"{hf_config}/config.json is missing: verl writes the model config there with every "
                          f"checkpoint; without it the shards cannot be turned into a model")

    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        config = ModelMergerConfig(operation="merge", backend="fsdp", local_dir=str(ckpt.actor_dir),
                                   target_dir=str(tmp), hf_model_config_path=str(hf_config))
        merger = FSDPModelMerger(config)
        merger.merge_and_save()  # ends with verl's validate_hf_model_output(target_dir)
        merger.cleanup()
        info = {"checkpoint": str(ckpt.actor_dir.resolve()), "step": ckpt.step,
                "merger": "verl.model_merger.fsdp_model_merger.FSDPModelMerger", "dtype": "bfloat16"}
        (tmp / "mrtpo_export.json").write_text(json.dumps(info, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return info


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.mrtpo.tools.export", description=__doc__.split("\n\n")[0],
                                 epilog="e.g. python -m recipe.mrtpo.tools.export outputs/quickstart/checkpoints "
                                        "--out outputs/quickstart/model_trained",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint_dir", type=Path,
                    help="trainer.default_local_dir (the latest global_step_<N>/ is taken), a global_step_<N>/ "
                         "folder or its actor/ folder")
    ap.add_argument("--out", type=Path, required=True, help="Hugging Face model folder to write")
    ap.add_argument("--step", type=int, default=None, help="export global_step_<STEP>/ instead of the latest")
    ap.add_argument("--overwrite", action="store_true", help="replace --out if it exists and is not empty")
    args = ap.parse_args(argv)
    try:
        info = export_checkpoint(args.checkpoint_dir, args.out, args.step, args.overwrite)
    except ExportError as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 2
    print(f"export: step {info['step']} of {info['checkpoint']} -> {args.out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
