"""Checkpoints that every node reads: the folder shared, the shards all there, a resume that finds what was saved.

verl 0.9.1's FSDP checkpoint manager writes one ``model_world_size_<W>_rank_<r>.pt`` per rank into
``trainer.default_local_dir``/global_step_<N>/actor/ on the disk of the node that rank runs on; the trainer (on
the task runner's node) writes ``data.pt`` and ``latest_checkpointed_iteration.txt`` there, and only rank 0 prunes
old steps. With NNODES > 1 and a node-local ``default_local_dir`` the save succeeds split over the nodes' disks, and a
resume whose task runner lands on another node finds no tracker and starts at step 0. What the recipe does:

- before step 1 the task runner writes :data:`MARKER_NAME` (a fresh token) under ``default_local_dir`` and the node
  check (``node_check``) requires every node to read that token there (:func:`marker_line`), else the run stops in
  one line saying the folder is not shared; only where the run saves or resumes (:func:`needs_shared_folder`);
- after each save the trainer appends the step and the world size to :data:`SAVES_NAME` (:func:`record_save`), the
  run's own record; a resume that finds no checkpoint where that record or verl's tracker says one was saved, a
  ``resume_from_path`` that holds none, missing shards or shards of another world size are refused in one line
  (:func:`resume_refusal`; export refuses missing shards with :func:`missing_shards_line`).

Standard library only: the node check's probe reads the marker on every node.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Optional

_SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
#: written under ``trainer.default_local_dir`` by the task runner before step 1; every node must read its token
MARKER_NAME = "mrtpo_shared_marker.json"
#: the run's record of its saves under ``trainer.default_local_dir``: one JSON object per line
SAVES_NAME = "mrtpo_saves.jsonl"
#: how the trainer's refusal of a resume begins (the launch prints it alone, ``launch_errors``)
RESUME_MARK = "mrtpo: cannot resume: "
#: verl's tracker of the latest step saved (``PPOTrainer._save_checkpoint``)
TRACKER_NAME = "latest_checkpointed_iteration.txt"
SHARED_HINT = ("with NNODES > 1 put trainer.default_local_dir on storage every node mounts at the same path "
               "(CHECKPOINT_ROOT of the run scripts)")


def shard_counts(actor_dir: Path) -> tuple[set[int], int]:
    """(the ranks whose model shard is in ``actor_dir``, the world size the shards name; 0 when there is none)."""
    ranks: set[int] = set()
    world = 0
    for f in Path(actor_dir).glob("model_world_size_*_rank_*.pt"):
        m = _SHARD.match(f.name)
        if m:
            world = max(world, int(m.group(1)))
            ranks.add(int(m.group(2)))
    return {r for r in ranks if r < world}, world


def missing_shards_line(actor_dir: Path) -> str:
    """"" when every rank's model shard is in ``actor_dir``, else the one-line refusal."""
    ranks, world = shard_counts(actor_dir)
    if world == 0 or len(ranks) == world:
        return ""
    missing = sorted(set(range(world)) - ranks)
    shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    return (f"{actor_dir}: {len(ranks)} of {world} model shards found (model_world_size_{world}_rank_*.pt; ranks {shown} "
            f"missing): with NNODES > 1 each node writes its own ranks' shards to trainer.default_local_dir on its own "
            f"disk; put it on storage every node shares (CHECKPOINT_ROOT) or gather the shards here first")


def world_size_line(actor_dir: Path, world_now: int) -> str:
    """"" when the shards in ``actor_dir`` were saved by ``world_now`` ranks (or there are none), else the refusal:
    verl loads ``model_world_size_<W>_rank_<r>.pt`` of its own world size W, rank by rank."""
    _, saved = shard_counts(actor_dir)
    if saved == 0 or saved == world_now:
        return ""
    return (f"{actor_dir}: saved by {saved} ranks (model_world_size_{saved}_rank_*.pt), this run has {world_now} "
            f"(trainer.nnodes x trainer.n_gpus_per_node): verl loads each rank's own shard; resume with the "
            f"saved layout, or export the checkpoint (python -m recipe.mrtpo.tools.export) and start from that model")


# ------------------------------------------------------------------ the marker every node must see
def needs_shared_folder(trainer_cfg) -> bool:
    """Whether the run writes or reads checkpoints (``save_freq`` > 0, or a ``resume_mode`` other than disable)."""
    save_freq = int(getattr(trainer_cfg, "save_freq", -1) or -1)
    return save_freq > 0 or str(getattr(trainer_cfg, "resume_mode", "disable")) != "disable"


def _absolute(folder: str) -> str:
    # verl resolves a relative default_local_dir against the task runner's working directory (_load_checkpoint)
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


def write_marker(folder: str) -> tuple[str, str]:
    """Write :data:`MARKER_NAME` with a fresh token under ``folder`` (created); ``(its path, the token)``."""
    folder = _absolute(str(folder))
    os.makedirs(folder, exist_ok=True)
    token = secrets.token_hex(16)
    path = os.path.join(folder, MARKER_NAME)
    tmp = f"{path}.{token}.tmp"
    with open(tmp, "w") as f:
        json.dump({"token": token, "host": socket.gethostname(), "time": time.time()}, f)
    os.replace(tmp, path)
    return path, token


def marker_line(path: str, token: str) -> Optional[str]:
    """None when this node reads ``token`` in the marker ``path``, else what it sees instead (no file, another
    run's token: a folder of its own), for the node check's one line."""
    try:
        with open(path) as f:
            seen = json.load(f)
    except FileNotFoundError:
        return f"does not see the marker {path}"
    except (OSError, ValueError) as e:
        return f"cannot read the marker {path} ({type(e).__name__}: {e})"
    if not isinstance(seen, dict) or seen.get("token") != token:
        return f"sees another marker at {path} (written by {seen.get('host', '?') if isinstance(seen, dict) else '?'})"
    return None


# ------------------------------------------------------------------ the run's record of its saves
def record_save(folder: str, step: int, world_size: int) -> None:
    """Append ``{"step", "world_size", "host", "time"}`` to :data:`SAVES_NAME` under ``folder``."""
    folder = _absolute(str(folder))
    os.makedirs(folder, exist_ok=True)
    entry = {"step": int(step), "world_size": int(world_size), "host": socket.gethostname(), "time": time.time()}
    with open(os.path.join(folder, SAVES_NAME), "a") as f:
        f.write(json.dumps(entry) + "\n")


def saved_steps(folder: str) -> list[int]:
    """The steps :data:`SAVES_NAME` under ``folder`` records (unreadable lines skipped), in order; [] without it."""
    path = os.path.join(_absolute(str(folder)), SAVES_NAME)
    steps: list[int] = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    steps.append(int(json.loads(line)["step"]))
                except (ValueError, KeyError, TypeError):
                    continue
    except FileNotFoundError:
        return []
    return steps


def resume_refusal(trainer_cfg, found: Optional[str], world_now: int) -> str:
    """"" when the resume may go on, else why not in one line.

    ``found``: the ``global_step_<N>`` folder verl's resume chose (``verl_seam.resume_folder``), None when it found
    none. Refused: ``resume_mode=auto`` finding none where :data:`SAVES_NAME` or verl's tracker says a step was
    saved (verl would start at step 0); ``resume_path`` naming a folder without an actor checkpoint; the actor's
    shards incomplete (:func:`missing_shards_line`) or of another world size (:func:`world_size_line`)."""
    mode = str(trainer_cfg.resume_mode)
    if mode == "disable":
        return ""
    if found is None:
        if mode != "auto":
            return ""
        folder = _absolute(str(trainer_cfg.default_local_dir))
        steps = saved_steps(folder)
        tracker = os.path.join(folder, TRACKER_NAME)
        if not steps and not os.path.exists(tracker):
            return ""  # nothing was saved here: a fresh start
        said = (f"{SAVES_NAME} records step {max(steps)}" if steps
                else f"{TRACKER_NAME} names step {Path(tracker).read_text().strip()}")
        return (f"resume_mode=auto finds no checkpoint in {folder} although {said}: verl would start at step 0 "
                f"(a folder on another node's disk, or a deleted global_step_*: {SHARED_HINT}; "
                f"trainer.resume_mode=disable starts afresh)")
    actor = os.path.join(found, "actor")
    if not os.path.isdir(actor):
        named = f"trainer.resume_from_path={found}" if mode == "resume_path" else f"the latest checkpoint {found}"
        return f"{named} holds no checkpoint (no actor/ folder): nothing to resume"
    return missing_shards_line(Path(actor)) or world_size_line(Path(actor), world_now)
