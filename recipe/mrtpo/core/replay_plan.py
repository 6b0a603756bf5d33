"""Driver side of the replay: which (sample, reward) pairs to replay, and the packed worker input.

Rule (docs/design.md §1.2): a pair (i, k) is replayed only if sample i's group has variance in r_k (otherwise
A_{i,k} = 0 and its weights do not matter); a pair whose variant cannot be built falls back to
uniform weights and is counted by reason. :func:`build_p_all_plan` is the pass of a method that needs the
teacher prompt's log-probs alone (RLSD; its teacher prompt, :func:`p_all_prompts`, is OPSD's too: P_all with
the privileged information framed by an instruction): no P_minus_k, no relevance, and no group-variance rule (after GDPO's
batch whitening every response has an advantage). Pure torch + :mod:`prompt_variants`; no verl.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from recipe.mrtpo.core.advantage import group_has_variance
from recipe.mrtpo.core.prompt_variants import as_ids, render_variants, rollout_prompt_variant, teacher_messages, variant_messages
from recipe.mrtpo.core.render_cache import CachedRender


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
    privileged: list[bool] = field(default_factory=list)  # per row (P_all-only plans): its P_all differs from its rollout prompt

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
            rollout rendered each with: ``recipe.mrtpo.rollout.rollout_render``); ``render`` for all when None.
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
    # int32 ids (every vocabulary fits): half the bytes to the workers. Each slot is written once, its left
    # padding and its variant (an int32 array: a block copy), so the array (R x NV x P: 150 MB for a BFCL
    # multi-turn batch of 1,024) is not also filled with padding first
    ids = np.empty((R, NV, P), dtype=np.int32)
    lens = np.zeros((R, NV), dtype=np.int64)
    pair = np.full((R, K), -1, dtype=np.int64)
    col = {n: k for k, n in enumerate(reward_names)}
    for r, sv in enumerate(per_row):
        for j, v in enumerate(sv.variants):
            ids[r, j, : P - len(v)] = pad_id
            ids[r, j, P - len(v) :] = v
            lens[r, j] = len(v)
        ids[r, len(sv.variants) :] = pad_id
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


def p_all_prompts(
    contexts: Sequence[Optional[dict]],
    messages: Sequence[Optional[list]],
    rollout_prompts: Sequence[Sequence[int]],
    render: Callable[[list[dict]], list[int]],
    max_prompt_length: Optional[int] = None,
    row_render: Optional[Callable[[int], Callable[[list[dict]], list[int]]]] = None,
    template: Optional[str] = None,
) -> tuple[list[list[int]], list[Optional[str]]]:
    """Per sample: the self-teachers' teacher prompt ids (OPSD's and RLSD's, :func:`teacher_messages`: the
    rollout prompt with its appended Z_k framed by ``template``, ``mrtpo.teacher_template``; prompt-placed Z_k
    in place; no framing where the sample has no appended Z, so that its teacher prompt is its rollout prompt),
    and, where it cannot be built, the reason (``no_contexts``, ``no_messages``, ``too_long``); such a sample's
    teacher prompt is its rollout prompt. ``row_render``: sample index -> its render, where samples were
    rendered differently (as in :func:`build_replay_plan`)."""
    if not isinstance(render, CachedRender):
        render = CachedRender(render)  # one render per distinct prompt of the batch (a group shares its prompt)
    built = [teacher_messages(messages[i], dict(ctx), template) if ctx else None for i, ctx in enumerate(contexts)]
    renders = [row_render(i) if row_render is not None else render for i in range(len(built))]
    for r in {id(r): r for r in renders}.values():
        prepare = getattr(r, "prepare", None)
        if prepare is not None:  # the batch's prompts rendered and tokenized at once (CachedRender)
            prepare([m for m, ri in zip(built, renders) if ri is r and m is not None])
    prompts: list[list[int]] = []
    reasons: list[Optional[str]] = []
    for i, msgs in enumerate(built):
        if not contexts[i]:
            reason = "no_contexts"
        elif msgs is None:
            reason = "no_messages"
        else:
            ids = as_ids(renders[i](msgs)).tolist()
            if max_prompt_length is None or len(ids) <= max_prompt_length:
                prompts.append(ids)
                reasons.append(None)
                continue
            reason = "too_long"
        prompts.append(list(rollout_prompts[i]))
        reasons.append(reason)
    return prompts, reasons


def build_p_all_plan(
    num_rewards: int,
    contexts: Sequence[Optional[dict]],
    messages: Sequence[Optional[list]],
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    render: Callable[[list[dict]], list[int]],
    rollout_prompts: Sequence[Sequence[int]],
    max_prompt_length: Optional[int] = None,
    pad_id: int = 0,
    every_row: bool = False,
    row_render: Optional[Callable[[int], Callable[[list[dict]], list[int]]]] = None,
    template: Optional[str] = None,
) -> ReplayPlan:
    """The P_all-only pass of a batch: one row per response with a valid token, its one variant the teacher
    prompt (:func:`p_all_prompts`, framed by ``template``), nothing replayed against it (``pair_variant`` -1: the worker returns the
    variant's log-probs of the sampled tokens and no relevance).

    ``every_row`` False plans only the rows whose teacher prompt differs from their rollout prompt (for the
    behaviour policy as teacher, the others' log-probs are verl's ``old_log_probs``); True plans every row
    (a teacher other than the behaviour policy, such as verl's reference policy). ``plan.privileged`` says
    per row whether its P_all differs from its rollout prompt; ``plan.rollout_variant`` is 0 where the teacher
    prompt is the rollout prompt, else -1. Fallback reasons are counted per sample in ``fallback_reasons``.
    """
    prompts, reasons = p_all_prompts(contexts, messages, rollout_prompts, render, max_prompt_length, row_render, template)
    plan = ReplayPlan(rows=[], inputs={})
    plan.replayed_mask = torch.zeros(len(prompts), num_rewards, dtype=torch.bool)
    has_tokens = response_mask.reshape(len(prompts), -1).sum(-1) > 0 if len(prompts) else torch.zeros(0, dtype=torch.bool)
    plan.fallback_reasons.update(r for r, ok in zip(reasons, has_tokens.tolist()) if r and ok)
    for i, p in enumerate(prompts):
        same = list(p) == list(rollout_prompts[i])
        if not bool(has_tokens[i]) or (same and not every_row):
            continue
        plan.rows.append(i)
        plan.privileged.append(not same)
        plan.rollout_variant.append(0 if same else -1)
    R, T = len(plan.rows), responses.shape[1]
    P = max((len(prompts[i]) for i in plan.rows), default=1) or 1
    ids = np.full((R, 1, P), pad_id, dtype=np.int32)
    lens = np.zeros((R, 1), dtype=np.int64)
    for r, i in enumerate(plan.rows):
        if prompts[i]:
            ids[r, 0, P - len(prompts[i]) :] = prompts[i]
        lens[r, 0] = len(prompts[i])
    rows = torch.tensor(plan.rows, dtype=torch.long)
    plan.variants = R
    plan.inputs = {
        "variant_ids": torch.from_numpy(ids),
        "variant_lens": torch.from_numpy(lens),
        "responses": responses.index_select(0, rows).long() if R else torch.zeros(0, T, dtype=torch.long),
        "response_mask": response_mask.index_select(0, rows).long() if R else torch.zeros(0, T, dtype=torch.long),
        "pair_variant": torch.full((R, num_rewards), -1, dtype=torch.long),
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
