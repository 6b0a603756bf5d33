"""Refuse an FSDP checkpoint whose per-rank shards are not all where it is read (export, resume).

verl 0.9.1's FSDP checkpoint manager writes one ``model_world_size_<W>_rank_<r>.pt`` per rank into
``trainer.default_local_dir``/global_step_<N>/actor/ on the disk of the node that rank runs on. With NNODES > 1 and a
node-local ``default_local_dir`` each node holds only its own ranks' shards, so an export or a resume read on one node
finds part of the model. Both refuse it in one line (how many found, how many expected); the run scripts put
``default_local_dir`` under ``CHECKPOINT_ROOT``, which must be storage every node shares (README).
"""

from __future__ import annotations

import re
from pathlib import Path

_SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


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
