"""The seed of one rollout request, from the run's seed: what makes a run with the same seed the same run.

verl 0.9.1 seeds vLLM's requests only under ``rollout.full_determinism``, and then gives every request of a
replica the same seed (``vllm_async_server.py``: ``replica_rank + seed``), so the samples of one group
would be identical; otherwise a request draws from the engine's global generator in the order the scheduler
happens to batch it, and two runs with the same seed sample differently. The recipe's agent-loop manager
(:mod:`recipe.mrtpo.rollout.rollout_seed`) gives each request its own seed instead, from what identifies the
request in a run and nothing that varies between runs (no uid, no request id, no arrival order).

Pure standard library: hashed with SHA-256, never Python's ``hash()`` (salted per process by PYTHONHASHSEED).
"""

from __future__ import annotations

import hashlib

#: vLLM, SGLang and torch generators all take a non-negative 63-bit integer
SEED_BITS = 63


def request_seed(seed: int, step: int, position: int, sample: int, validate: bool = False) -> int:
    """s = int(SHA-256("mrtpo-request|seed|step|train or val|position|sample")[:8], big-endian) >> 1.

    ``seed`` is the run's ``actor_rollout_ref.rollout.seed``; ``step`` verl's ``global_steps`` (restored on
    resume, so a resumed run draws what an uninterrupted one draws); ``position`` the prompt's place in the
    step's batch (0..B-1, before the batch is split among agent-loop workers); ``sample`` its sample within the
    group (verl's ``session_id``, 0..n-1); ``validate`` separates a validation pass from the training step of the
    same number. Distinct inputs give distinct seeds up to a 2^-63 collision; the same inputs the same seed in
    every process and run."""
    for name, v in (("seed", seed), ("step", step), ("position", position), ("sample", sample)):
        if isinstance(v, bool) or int(v) != v or v < 0:
            raise ValueError(f"request_seed: {name} must be a non-negative integer, got {v!r}")
    text = f"mrtpo-request|{int(seed)}|{int(step)}|{'val' if validate else 'train'}|{int(position)}|{int(sample)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> (64 - SEED_BITS)


def generation_seed(seed: int, generation: int) -> int:
    """The seed of a trajectory's ``generation``-th call to the server (0, 1, ...), from its request's seed:
    ``seed`` itself for the first (a single-turn request samples exactly as :func:`request_seed` says), else
    int(SHA-256("mrtpo-generation|seed|generation")[:8]) >> 1. An agent loop calls the server once per step with
    the same sampling parameters; without this every step would restart the same random stream."""
    for name, v in (("seed", seed), ("generation", generation)):
        if isinstance(v, bool) or int(v) != v or v < 0:
            raise ValueError(f"generation_seed: {name} must be a non-negative integer, got {v!r}")
    if generation == 0:
        return int(seed)
    text = f"mrtpo-generation|{int(seed)}|{int(generation)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> (64 - SEED_BITS)


def submission_order(keys: list[str], rank: dict) -> tuple[list[int], int]:
    """The permutation that puts a sampled batch's rows in the order their prompts were submitted, and how many
    rows it could not place. -> (order, unplaced); ``order[j]`` is the row that goes to place j.

    verl 0.9.1 hands the trainer a step's rows in the order its requests finished; its sums over the batch (the
    update's loss, the balancing's ties) then run in an order that differs between two runs of the same seed, so
    the runs drift apart after the first update. A row's key is verl's ``f"{uid}_{session_id}_{index}"``
    (``agent_loop_tq.py``; uids hold no ``_``); ``rank[uid]`` is its prompt's place in submission (the trainer's
    count of prompts submitted). The order is by (rank, session_id, index); a row whose uid has no rank or whose
    key does not parse (a prompt verl re-issued after a resume) goes after the placed rows, by its key, and is
    counted in ``unplaced``."""
    placed, unplaced = [], []
    for j, key in enumerate(keys):
        parts = str(key).rsplit("_", 2)
        try:
            placed.append(((rank[parts[0]], int(parts[1]), int(parts[2])), j))
        except (KeyError, IndexError, ValueError):
            unplaced.append((str(key), j))
    return [j for _, j in sorted(placed)] + [j for _, j in sorted(unplaced)], len(unplaced)
