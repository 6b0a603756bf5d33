"""The driver's side of every no-grad pass over the actor (the replay, the OPSD teacher): what they share.

What a pass is handed (:class:`PassRequest`: the batch's rows, how to render and dispatch them, the settings
it sends, the core's :class:`PassSettings` on the wire, :meth:`PassRequest.settings`), the one call into the
worker group (:func:`dispatch_rows`), the assignment of rows to data-parallel ranks by
their tokens (:func:`balanced_order`, verl's sequence-length balancing) and the per-rank cost the workers
report (:func:`pass_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

from recipe.mrtpo.config import MRTPOConfig
from recipe.mrtpo.core.passes import PassSettings

#: a worker-group pass method as the drivers call it: (packed rows [R', ...], non-tensor settings) -> its answer
#: (each driver names its contract: ``replay_driver.Dispatch``, ``methods.opsd.driver.Dispatch``)
Dispatch = Callable[[dict, dict], dict]
#: chat messages -> prompt ids, as the rollout rendered them
Render = Callable[[list], list]


@dataclass(frozen=True, eq=False)
class PassRequest:
    """One no-grad pass over a batch, as both drivers take it (the replay, ``replay_driver.run_replay``; the
    self-teachers' teacher pass, ``methods.opsd.driver.run_opsd_teacher``): the batch's rows, how to render and
    dispatch them, and the pass engine's settings.

    ``token_budget``: padded tokens per forward (verl's ``log_prob_max_token_len_per_gpu`` under
    ``log_prob_use_dynamic_bsz``, :func:`token_budget`); 0 packs ``mrtpo.replay_micro_batch_size`` sequences per
    forward. ``row_render``: per sample its render where samples were rendered with different tools.
    """

    cfg: MRTPOConfig
    table: Any  # RewardTable: per-reward scores and each sample's contexts Z_k
    messages: Sequence[Optional[list]]  # each sample's chat messages (verl's raw_prompt), None where absent
    responses: torch.Tensor  # [B, T] sampled ids
    response_mask: torch.Tensor  # [B, T]
    rollout_prompts: Sequence[Sequence[int]]  # each sample's prompt ids as the rollout rendered them
    render: Render
    dispatch: Dispatch  # the worker group's pass method (or any function with its contract, in tests)
    dp_size: int  # the data-parallel size of the mesh the pass runs on (rows are padded to a multiple)
    temperature: float  # the rollout's
    pad_id: int
    token_budget: int = 0
    row_render: Optional[Callable[[int], Render]] = None

    def settings(self) -> PassSettings:
        """The pass engine's settings: ``mrtpo.replay_micro_batch_size`` sequences per forward (or the token
        budget), ``mrtpo.chunk_size``, the layout the worker picks for its attention (``auto``),
        ``mrtpo.share_prompts``."""
        cfg = self.cfg
        return PassSettings(
            temperature=float(self.temperature),
            micro_batch_size=int(cfg.replay_micro_batch_size),
            token_budget=int(self.token_budget) if self.token_budget else None,
            chunk_size=int(cfg.chunk_size) if cfg.chunk_size else None,
            pad_id=int(self.pad_id),
            layout="auto",
            share_prompts=bool(cfg.share_prompts),
        )


def pass_metrics(counts: torch.Tensor, dp_size: int, prefix: str) -> dict:
    """Per-rank cost of a pass from the workers' [R', 7] counts (each rank's rows carry its own: forwards,
    agreed forwards, tokens forwarded, tokens existing, the share_prompts fallback, by cost, attention pairs; the rows are split over
    ranks in contiguous chunks): the most and fewest forwards and tokens of a rank, the agreement's padding
    forwards, the forwarded over existing tokens, the ranks that could not share prompts, the shared forwards the
    cost model ran unshared and the most attention pairs a rank computed."""
    chunks = [c[0] for c in torch.as_tensor(counts).long().chunk(max(1, dp_size)) if c.shape[0]]
    own = [int(c[0]) for c in chunks]
    m = {
        f"{prefix}_forwards_max": max(own),
        f"{prefix}_forwards_min": min(own),
        f"{prefix}_padding_forwards": sum(int(c[1]) - int(c[0]) for c in chunks),
    }
    if chunks[0].shape[0] >= 4:
        tokens = [int(c[2]) for c in chunks]
        m[f"{prefix}_tokens_max"] = max(tokens)
        m[f"{prefix}_tokens_min"] = min(tokens)
        m[f"{prefix}_tokens_over_existing"] = sum(tokens) / max(1, sum(int(c[3]) for c in chunks))
    if chunks[0].shape[0] >= 5:  # ranks whose pass ran unshared although mrtpo.share_prompts is on (recurrent layers)
        m[f"{prefix}_unshared_fallback"] = sum(int(c[4]) for c in chunks)
    if chunks[0].shape[0] >= 7:  # shared forwards the cost model ran unshared; attention pairs computed (docs/design.md §5.3)
        m[f"{prefix}_unshared_by_cost"] = sum(int(c[5]) for c in chunks)
        m[f"{prefix}_attention_pairs_max"] = max(int(c[6]) for c in chunks)
    return m


def token_budget(config, reference: bool = False) -> int:
    """A pass's tokens per forward: verl's log-prob budget (``log_prob_max_token_len_per_gpu`` under
    ``log_prob_use_dynamic_bsz``: the rollout group's for the actor, the ``ref`` group's for a pass on the
    reference policy), else 0 (``mrtpo.replay_micro_batch_size`` sequences per forward)."""
    group = config.actor_rollout_ref.ref if reference else config.actor_rollout_ref.rollout
    return int(group.get("log_prob_max_token_len_per_gpu", 0) or 0) if group.get("log_prob_use_dynamic_bsz", False) else 0


def dispatch_rows(method, inputs: dict, settings: dict) -> dict:
    """Call a worker-group pass method (``compute_replay_relevance``, ``compute_opsd_teacher``) on the padded
    rows ``inputs`` with the non-tensor ``settings``; the answer as a TensorDict (resolved if it is a future)."""
    n = next(iter(inputs.values())).shape[0]
    td = TensorDict(dict(inputs), batch_size=[n])
    tu.assign_non_tensor(td, **settings)
    out = method(td)
    return out.get() if hasattr(out, "get") and not isinstance(out, TensorDict) else out


def balanced_order(tokens: Sequence[int], dp_size: int) -> list[int]:
    """A permutation of the rows (their count a multiple of ``dp_size``) whose contiguous chunks, one per
    rank as the dispatch splits them, hold similar token counts: verl's ``get_seqlen_balanced_partitions``
    (equal-size partitions, the one ``_balance_batch`` uses). ``order[j]`` is the row sent in position j."""
    n = len(tokens)
    if dp_size <= 1 or n == 0:
        return list(range(n))
    if n % dp_size:
        raise ValueError(f"{n} rows do not split over {dp_size} ranks: pad them first")
    parts = get_seqlen_balanced_partitions([int(t) for t in tokens], k_partitions=dp_size, equal_size=True)
    return [j for part in parts for j in sorted(part)]
