"""The replay forward passes: per-token relevance q[R, K, T] of each reward from prompt variants.

Pure torch over any causal LM callable; the verl worker method (``worker.py``) calls
:func:`replay_relevance` inside the FSDP engine's eval mode, so this file holds the whole
algorithm and is tested on a tiny Hugging Face model without Ray.

Input (one row per replayed sample, built by the trainer from :mod:`prompt_variants`)::

    variant_ids   [R, NV, P]  prompt token ids of each variant, LEFT-padded; variant 0 is P_all
    variant_lens  [R, NV]     true lengths (0: no such variant for this row)
    responses     [R, T]      the sampled response ids (never re-tokenised)
    response_mask [R, T]
    pair_variant  [R, K]      index of P_minus_k among the row's variants, -1 if (r, k) is not replayed

Output: ``relevance`` [R, K, T] (0 where not replayed / masked) and ``replay_logprobs`` [R, T]
(log p(y_t | P_all) of the sampled tokens; equals old_log_probs when P_all is the rollout prompt).

Memory: a forward keeps only the response positions' logits of at most ``micro_batch_size``
sequences ([mb, T, V] in the model's dtype); the JS expands at most ``chunk_size`` positions x V
to fp32 at a time. Never R x T x V.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from recipe.mrtpo.core.relevance import relevance_against_reference

# forward(input_ids [b, L], attention_mask [b, L], position_ids [b, L], keep: int) -> logits [b, keep, V]
ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def hf_forward(module) -> ForwardFn:
    """A :data:`ForwardFn` over a Hugging Face causal LM (also an FSDP-wrapped one)."""

    def fwd(input_ids, attention_mask, position_ids, keep):
        out = module(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=keep,
        )
        return out.logits

    return fwd


def _sequences(variant_ids, variant_lens, response, resp_len, pad_id):
    """Stack variants of one row as [prompt (left-padded to the row's longest) | response (right-padded)]."""
    P = int(variant_lens.max())
    T = response.shape[0]
    n = variant_ids.shape[0]
    ids = torch.full((n, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((n, P + T), dtype=torch.long)
    for j in range(n):
        L = int(variant_lens[j])
        ids[j, P - L : P] = variant_ids[j, variant_ids.shape[1] - L :]
        attn[j, P - L : P] = 1
    ids[:, P:] = response
    attn[:, P : P + resp_len] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos, P


def replay_relevance(
    forward: ForwardFn,
    variant_ids: torch.Tensor,
    variant_lens: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    pair_variant: torch.Tensor,
    *,
    micro_batch_size: int,
    temperature: float = 1.0,
    measure: str = "js_distance",
    chunk_size: Optional[int] = None,
    pad_id: int = 0,
    device: torch.device | str = "cpu",
    sync_forward_count: Optional[Callable[[int], int]] = None,
    compiled_js: bool = False,
) -> dict[str, torch.Tensor]:
    """Replay every row's variants with its sampled response and measure each reward's relevance.

    Rows are processed one at a time; the variants of a row (P_all first) go through the model in
    micro-batches of ``micro_batch_size`` sequences, P_all's response logits are kept while the
    row's P_minus_k variants are compared with it (its log-softmax computed once per chunk of
    positions and shared by the variants of a micro-batch). ``sync_forward_count(n_local) -> n_global`` lets a
    data-parallel caller pad every rank to the same number of forwards (FSDP all-gathers per forward);
    the padding forwards run one pad token and are discarded. ``compiled_js`` selects the
    ``torch.compile``d JSD kernel (``mrtpo.compile_js``).
    """
    if micro_batch_size < 1:
        raise ValueError("micro_batch_size must be >= 1")
    R, K = pair_variant.shape
    T = responses.shape[1]
    relevance = torch.zeros(R, K, T, dtype=torch.float32)
    logprobs = torch.zeros(R, T, dtype=torch.float32)
    n_forwards = 0
    for r in range(R):
        used = sorted({int(v) for v in pair_variant[r].tolist() if v >= 0})
        if not used:
            continue
        order = [0] + [v for v in used if v != 0]  # P_all first, each distinct variant once
        mask_r = response_mask[r : r + 1].to(device)
        resp_len = int(response_mask[r].sum())
        ids, attn, pos, P = _sequences(
            variant_ids[r, order], variant_lens[r, order], responses[r], resp_len, pad_id
        )
        ids, attn, pos = ids.to(device), attn.to(device), pos.to(device)
        resp_ids = responses[r : r + 1].to(device)
        ref = None  # P_all's response logits [T, V], kept while the row's variants are compared with it
        ids_r, mask_1d = resp_ids[0], mask_r[0]
        for start in range(0, len(order), micro_batch_size):
            sl = slice(start, start + micro_batch_size)
            # keep T + 1 positions: position P - 1 + t predicts response token t
            logits = forward(ids[sl], attn[sl], pos[sl], T + 1)[:, :T]
            n_forwards += 1
            if start == 0:
                ref, variants, first = logits[0], logits[1:], 1
            else:
                variants, first = logits, start
            q, lp_ref = relevance_against_reference(
                ref, variants, ids_r, mask_1d, temperature, measure, chunk_size, compiled=compiled_js
            )
            if start == 0:
                logprobs[r] = lp_ref.cpu()
            for j_local in range(q.shape[0]):
                variant = order[first + j_local]
                for k in range(K):
                    if int(pair_variant[r, k]) == variant:
                        relevance[r, k] = q[j_local].cpu()
            del logits, variants
        del ref
    if sync_forward_count is not None:
        total = sync_forward_count(n_forwards)
        dummy = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
        one = torch.ones((1, 1), dtype=torch.long, device=device)
        for _ in range(total - n_forwards):
            forward(dummy, one, torch.zeros_like(one), 1)
    return {"relevance": relevance, "replay_logprobs": logprobs, "n_forwards": torch.tensor(n_forwards)}
