"""Driver side of the replay: which (sample, reward) pairs to replay, and the packed worker input.

Rule (docs/design.md §1.2): a pair (i, k) is replayed only if sample i's group has variance in r_k (otherwise
A_{i,k} = 0 and its weights do not matter); a pair whose variant cannot be built falls back to
uniform weights and is counted by reason. Pure torch + :mod:`prompt_variants`; no verl.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from recipe.mrtpo.core.advantage import group_has_variance
from recipe.mrtpo.core.prompt_variants import render_variants, rollout_prompt_variant, variant_messages


@dataclass
class ReplayPlan:
    rows: list[int]  # sample index of each packed row
    inputs: dict[str, torch.Tensor]  # variant_ids, variant_lens, responses, response_mask, pair_variant
    pairs_replayed: int = 0
    pairs_skipped: int = 0  # present pairs without group variance: never replayed
    pairs_fallback: int = 0
    fallback_reasons: Counter = field(default_factory=Counter)
    variants: int = 0  # distinct prompt variants forwarded (P_all included)
    deduplicated: int = 0
    replayed_mask: Optional[torch.Tensor] = None  # [B, K] bool
    rollout_variant: list[int] = field(default_factory=list)  # per row: the variant that is the rollout prompt, -1 none

    def metrics(self) -> dict[str, float]:
        m = {
            "mrtpo/pairs_replayed": self.pairs_replayed,
            "mrtpo/pairs_skipped_no_variance": self.pairs_skipped,
            "mrtpo/pairs_fallback": self.pairs_fallback,
            "mrtpo/variants_replayed": self.variants,
            "mrtpo/variants_deduplicated": self.deduplicated,
        }
        for reason, n in self.fallback_reasons.items():
            m[f"mrtpo/fallback/{reason}"] = n
        return m


def build_replay_plan(
    scores: torch.Tensor,
    index,
    reward_names: Sequence[str],
    contexts: Sequence[dict],
    messages: Sequence[Optional[list]],
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    render: Callable[[list[dict]], list[int]],
    max_prompt_length: Optional[int] = None,
    joint: bool = False,
    pad_id: int = 0,
    rollout_prompts: Optional[Sequence[Sequence[int]]] = None,
    row_render: Optional[Callable[[int], Callable[[list[dict]], list[int]]]] = None,
) -> ReplayPlan:
    """Plan and pack the replay of a batch.

    Args:
        scores: [B, K] per-reward scores (NaN = absent), ``reward_names`` their column names.
        index: [B] group ids.
        contexts: per sample {reward: {"text", "placement"}}.
        messages: per sample chat messages (the dataset's prompt) or None.
        responses, response_mask: [B, T] sampled ids and mask.
        render: messages -> prompt ids (chat template with generation prompt). One with a ``prepare``
            method (:class:`~recipe.mrtpo.core.render_cache.CachedRender`) is first given every message
            list the batch will render, so that it tokenizes them in one batched call.
        joint: CoRT-style single P_none replay shared by every reward of the sample.
        rollout_prompts: per sample its rollout prompt ids: ``plan.rollout_variant`` then says, per row,
            which variant they are (:func:`rollout_prompt_variant`).
        row_render: sample index -> its render, where samples were rendered differently (the tools the
            rollout rendered each with: ``recipe.mrtpo.rollout_render``); ``render`` for all when None.
    """
    B, K = scores.shape
    variance = group_has_variance(scores, index)
    present = ~torch.isnan(scores)
    plan = ReplayPlan(rows=[], inputs={})
    plan.pairs_skipped = int((present & ~variance).sum())
    plan.replayed_mask = torch.zeros(B, K, dtype=torch.bool)
    per_row = []
    wanted = {i: [reward_names[k] for k in range(K) if variance[i, k]] for i in range(B)}
    built = {i: variant_messages(messages[i], contexts[i] or {}, want, joint=joint) for i, want in wanted.items() if want}
    renders = {i: row_render(i) if row_render is not None else render for i in built}
    for r in {id(r): r for r in renders.values()}.values():
        prepare = getattr(r, "prepare", None)
        if prepare is not None:  # the batch's prompts rendered and tokenized at once (CachedRender)
            prepare([m for i, vm in built.items() if renders[i] is r for m in vm.all_messages()])
    for i, vm in built.items():
        sv = render_variants(vm, renders[i], max_prompt_length)
        plan.pairs_fallback += len(sv.fallbacks)
        plan.fallback_reasons.update(sv.fallbacks.values())
        if not sv.pair_variant:
            continue
        plan.pairs_replayed += len(sv.pair_variant)
        plan.deduplicated += sv.deduplicated
        plan.variants += len(set(sv.pair_variant.values()) | {0})
        for name in sv.pair_variant:
            plan.replayed_mask[i, reward_names.index(name)] = True
        plan.rows.append(i)
        per_row.append(sv)
        if rollout_prompts is not None:
            plan.rollout_variant.append(rollout_prompt_variant(sv.variants, rollout_prompts[i]))
    R = len(per_row)
    T = responses.shape[1]
    NV = max((len(sv.variants) for sv in per_row), default=1)
    P = max((len(v) for sv in per_row for v in sv.variants), default=1)
    # int32 ids (every vocabulary fits): half the bytes to the workers; numpy fills rows from lists without a
    # tensor per variant
    ids = np.full((R, NV, P), pad_id, dtype=np.int32)
    lens = np.zeros((R, NV), dtype=np.int64)
    pair = np.full((R, K), -1, dtype=np.int64)
    col = {n: k for k, n in enumerate(reward_names)}
    for r, sv in enumerate(per_row):
        for j, v in enumerate(sv.variants):
            ids[r, j, P - len(v) :] = v
            lens[r, j] = len(v)
        for name, j in sv.pair_variant.items():
            pair[r, col[name]] = j
    ids, lens, pair = torch.from_numpy(ids), torch.from_numpy(lens), torch.from_numpy(pair)
    rows = torch.tensor(plan.rows, dtype=torch.long)
    plan.inputs = {
        "variant_ids": ids,
        "variant_lens": lens,
        "responses": responses.index_select(0, rows).long() if R else torch.zeros(0, T, dtype=torch.long),
        "response_mask": response_mask.index_select(0, rows).long() if R else torch.zeros(0, T, dtype=torch.long),
        "pair_variant": pair,
    }
    return plan


def pad_rows(inputs: dict[str, torch.Tensor], multiple: int) -> tuple[dict[str, torch.Tensor], int]:
    """Pad the packed rows to a multiple of the data-parallel size with rows that replay nothing."""
    R = inputs["pair_variant"].shape[0]
    n_pad = (-R) % multiple if multiple > 1 else 0
    if R == 0:
        n_pad = multiple
    if n_pad == 0:
        return inputs, 0
    out = {}
    for k, v in inputs.items():
        fill = -1 if k == "pair_variant" else 0
        out[k] = torch.cat([v, torch.full((n_pad, *v.shape[1:]), fill, dtype=v.dtype)], dim=0)
    return out, n_pad


def q_mass_top_share(relevance: torch.Tensor, replayed: torch.Tensor, response_mask: torch.Tensor, frac: float = 0.1) -> float:
    """Mean over replayed pairs of the share of q mass on the top ``frac`` of valid tokens (concentration)."""
    shares = []
    for i, k in replayed.nonzero(as_tuple=False).tolist():
        m = response_mask[i] > 0
        q = relevance[i, k][m]
        if q.numel() == 0 or float(q.sum()) <= 0:
            continue
        top = max(1, int(round(frac * q.numel())))
        shares.append(float(torch.topk(q, top).values.sum() / q.sum()))
    return sum(shares) / len(shares) if shares else 0.0
