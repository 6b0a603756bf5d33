"""The worker's side of a pass's wire, shared by the worker (``recipe.mrtpo.step.worker``) and the methods' worker parts
(``methods/opsd/actor.py``, ``methods/sdpo/actor.py``): the settings sent with the rows, the forward counts
answered per row, and the agreement on the number of forwards across ranks.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from recipe.mrtpo.core.passes import PassSettings, sync_max_over_ranks
from recipe.mrtpo.core.shared_prompts import share_fallback_reason

#: the per-row forward counts a pass answers (``pass_counts``), in this order; the share_prompts fallback after them,
#: then :data:`COST_KEYS`
COUNT_KEYS = ("n_forwards", "n_forwards_global", "tokens_forwarded", "tokens_existing")
#: the shared forwards the cost model ran unshared and the attention pairs computed (``core.passes.PassCounts``)
COST_KEYS = ("unshared_by_cost", "attention_pairs")


def sync_max(n: int) -> int:
    """Largest local forward count over all ranks (every rank must run the same number of FSDP forwards,
    agreed before the first one: docs/design.md §5)."""
    return sync_max_over_ranks(n)


def wire(data: TensorDict, keys: tuple[str, ...]) -> dict:
    """The non-tensor entries ``keys`` of ``data`` (None where absent)."""
    return {k: tu.get(data, key=k) for k in keys}


def wire_settings(data: TensorDict, keys: tuple[str, ...], method: str, attn: str = "", **model) -> tuple[PassSettings, dict]:
    """The pass settings of ``data`` and its other settings ``keys``; a clear error naming ``method`` when
    one is missing. ``model``: what the worker knows of the model and verl (``model_type``, ``logprob_dtype``,
    ``entropy_dtype``)."""
    got = wire(data, tuple(dict.fromkeys((*PassSettings.WIRE_KEYS, *keys))))
    missing = [k for k in keys if k not in ("layout", "share_prompts") and got.get(k) is None]
    if missing:
        raise ValueError(f"{method}: settings {missing} missing (the trainer sends them from mrtpo.*)")
    return PassSettings.from_wire(got, method, attn, **model), got


def pass_counts(out: dict, rows: int, settings: PassSettings) -> torch.Tensor:
    """[rows, 7] long: this rank's own and agreed forward counts, its forwarded and existing tokens, 1 where
    ``share_prompts`` was on but could not apply (``core.shared_prompts.share_fallback_reason``), its shared forwards
    run unshared by the cost model and its attention pairs computed (0 where ``out`` lacks them), the same on each
    of its rows (the driver reads one row per rank)."""
    fallback = int(share_fallback_reason(settings) is not None)
    cost = [int(out.get(k, 0)) for k in COST_KEYS]
    counts = torch.tensor([int(out[k]) for k in COUNT_KEYS] + [fallback] + cost, dtype=torch.long)
    return counts.expand(rows, counts.numel()).clone()
