"""Before the first step: every file a worker will read is there on every Ray node, or the run stops in one line.

The files are the SQL databases the training and validation rows name (``reward_model.ground_truth.db_path``,
resolved against ``$MRTPO_DATA_ROOT`` on each node: :mod:`recipe.mrtpo.node_files`) and the model path when it is
a local path. One task pinned to each alive node (Ray's ``NodeAffinitySchedulingStrategy``) looks them up there;
the first missing file stops the run with :func:`recipe.mrtpo.node_files.missing_line` (the file and the node).
"""

from __future__ import annotations

import json
import os

from recipe.mrtpo import node_files


def row_files(frame) -> list[str]:
    """The distinct files (as stored) that the rows of a verl parquet frame name: SQL rows' ``db_path``."""
    out: dict[str, None] = {}
    if "reward_model" not in getattr(frame, "columns", ()):
        return []
    for rm in frame["reward_model"]:
        gt = rm.get("ground_truth") if isinstance(rm, dict) else None
        if isinstance(gt, str) and gt.startswith("{"):
            try:
                gt = json.loads(gt)
            except ValueError:
                continue
        path = gt.get("db_path") if isinstance(gt, dict) else None
        if isinstance(path, str) and path:
            out[path] = None
    return list(out)


def run_files(config) -> list[str]:
    """Every file of the run a worker reads (the rows' databases; the model path when it is a local path)."""
    import pandas as pd

    files: dict[str, None] = {}
    for key in ("train_files", "val_files"):
        value = config.data.get(key, None)
        for f in ([value] if isinstance(value, str) else list(value or [])):
            if os.path.isfile(str(f)):
                files.update(dict.fromkeys(row_files(pd.read_parquet(str(f), columns=["reward_model"]))))
    model = str(config.actor_rollout_ref.model.path)
    if os.path.isabs(model):
        files[model] = None
    return list(files)


def _missing_here(paths: list[str]) -> str | None:
    import ray

    for stored in paths:
        if not os.path.exists(node_files.resolve(stored)):
            node = f"ray node {ray.get_runtime_context().get_node_id()[:12]}"
            return node_files.missing_line(node_files.resolve(stored), stored) + f" [{node}]"
    return None


def check_every_node(paths: list[str]) -> None:
    """Raise ``FileNotFoundError`` (one line: the file and the node) when a file is missing on an alive Ray node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not paths:
        return
    probe = ray.remote(num_cpus=0)(_missing_here)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n, soft=False)).remote(paths)
            for n in nodes]
    for line in ray.get(refs):
        if line:
            raise FileNotFoundError(line)
