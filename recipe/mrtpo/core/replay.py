"""The replay forward passes: per-token relevance of each prompt variant (docs/design.md §1.2, §5).

Pure torch over any causal LM callable; the verl worker method (``worker.py``) calls
:func:`replay_relevance` inside the FSDP engine's eval mode, so this file holds the whole
algorithm and is tested on a tiny Hugging Face model without Ray (and under real FSDP2 on two
processes, ``tests/unit/test_replay_distributed.py``).

Input (one row per replayed sample, built by the driver from :mod:`prompt_variants`)::

    variant_ids   [R, NV, P]  prompt token ids of each variant, LEFT-padded; variant 0 is P_all
    variant_lens  [R, NV]     true lengths (0: no such variant for this row)
    responses     [R, T]      the sampled response ids (never re-tokenised)
    response_mask [R, T]      where q counts (may be non-contiguous: multi-turn, token-level rejection)
    pair_variant  [R, K]      index of P_minus_k among the row's variants, -1 if (r, k) is not replayed

Output (compact, §5): ``variant_relevance`` [R, max(NV - 1, 1), T] fp32, row ``j - 1`` holding the
q of variant j against P_all (0 where masked or not replayed); :func:`expand_relevance` maps it to
rewards [R, K, T] through ``pair_variant`` (the driver does, never the worker). ``replay_logprobs``
[R, T]: log p(y_t | P_all) of the sampled tokens (equals old_log_probs when P_all is the rollout prompt).

At scale (§5): the forwards are :mod:`recipe.mrtpo.core.passes`' (the one packer, layout and forward-count
agreement of every no-grad pass over the actor); this module is the replay's reduction over them. P_all's
response logits are held as their own tensor ([T_r, V], copied out of their forward when they outlive it)
only while the row's variants still run (the packer keeps a row's sequences together, P_all first), with
the compiled JS its log-normaliser [T_r] too (one logsumexp per position, shared by the variants); the JS
expands at most ``chunk_size`` positions x V to fp32 at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from recipe.mrtpo.core.passes import (  # noqa: F401  (hf_forward, sync_max_over_ranks: the replay's public names)
    ForwardFn,
    PassSequence,
    PassSettings,
    hf_forward,
    response_lengths,
    row_sequences,
    run_pass,
    sync_max_over_ranks,
)
from recipe.mrtpo.core.relevance import (
    logsumexp_rows,
    picked_logprobs,
    relevance_against_reference,
    sampled_logprobs_from_logits,
)


def plan_sequences(variant_lens: torch.Tensor, pair_variant: torch.Tensor, resp_lens: torch.Tensor) -> list[PassSequence]:
    """Every sequence to forward, row by row, P_all first, each distinct used variant once."""
    seqs: list[PassSequence] = []
    for r in range(pair_variant.shape[0]):
        used = sorted({int(v) for v in pair_variant[r].tolist() if v > 0})
        n_resp = int(resp_lens[r])
        if not used or n_resp == 0:
            continue
        order = [0, *used]
        seqs += row_sequences(r, order, [int(variant_lens[r, v]) for v in order], n_resp)
    return seqs


def replay_relevance(
    forward: ForwardFn,
    variant_ids: torch.Tensor,
    variant_lens: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    pair_variant: torch.Tensor,
    *,
    micro_batch_size: int = 8,
    token_budget: Optional[int] = None,
    temperature: float = 1.0,
    measure: str = "js_distance",
    chunk_size: Optional[int] = None,
    pad_id: int = 0,
    device: torch.device | str = "cpu",
    sync_forward_count: Optional[Callable[[int], int]] = None,
    compiled_js: bool = False,
    resp_lens: Optional[torch.Tensor] = None,
    logprob_variant: Optional[torch.Tensor] = None,
    layout: str = "sorted",
    packed_attention: str = "block_mask",
    settings: Optional[PassSettings] = None,
) -> dict[str, torch.Tensor]:
    """Replay every row's variants with its sampled response and measure their relevance (module docstring).

    Args:
        micro_batch_size: sequences per forward when ``token_budget`` is None.
        token_budget: tokens per forward (verl's ``log_prob_max_token_len_per_gpu`` when
            ``log_prob_use_dynamic_bsz``); takes precedence over ``micro_batch_size``.
        layout, packed_attention: how sequences share a forward (:mod:`recipe.mrtpo.core.passes`).
        settings: all of the above and ``temperature``, ``chunk_size``, ``pad_id`` at once (then those
            keyword arguments are not read).
        sync_forward_count: ``n_local -> n_global`` (e.g. :func:`sync_max_over_ranks`), called once,
            before any forward; None for a single process.
        compiled_js: the ``torch.compile``d JSD kernel (``mrtpo.compile_js``).
        resp_lens: [R] response positions that exist (default :func:`response_lengths` of the mask).
        logprob_variant: [R] which variant's log-probs of the sampled tokens ``replay_logprobs`` holds
            (default 0, P_all): the variant that is the rollout prompt, so that they can be checked against
            verl's ``old_log_probs``. A variant that is not forwarded leaves the row's log-probs at 0.

    Returns:
        ``variant_relevance`` [R, max(NV - 1, 1), T] fp32, ``replay_logprobs`` [R, T] fp32, and the counts
        ``n_forwards`` (this process's own), ``n_forwards_global`` (after the agreement),
        ``tokens_forwarded`` and ``tokens_existing`` (:class:`recipe.mrtpo.core.passes.PassCounts`).
    """
    if settings is None:
        settings = PassSettings(temperature=float(temperature), micro_batch_size=int(micro_batch_size), token_budget=token_budget,
                                chunk_size=chunk_size, pad_id=int(pad_id), layout=layout, packed_attention=packed_attention)
    temperature, chunk_size = settings.temperature, settings.chunk_size
    R, K = pair_variant.shape
    NV, T = variant_ids.shape[1], responses.shape[1]
    if resp_lens is None:
        resp_lens = response_lengths(response_mask)
    variant_relevance = torch.zeros(R, max(NV - 1, 1), T, dtype=torch.float32)
    logprobs = torch.zeros(R, T, dtype=torch.float32)
    lp_variant = [0] * R if logprob_variant is None else [int(v) for v in logprob_variant.tolist()]
    refs: dict[int, torch.Tensor] = {}  # row -> P_all's response logits [T_r, V] (own storage)
    lses: dict[int, torch.Tensor] = {}  # row -> P_all's log-normaliser [T_r] (compiled JS only)

    def consume(seqs: list[PassSequence], resp: torch.Tensor, single: bool) -> None:
        r, n_resp = seqs[0].row, seqs[0].resp_len
        first = 0
        if seqs[0].variant == 0:
            # its own tensor: a copy, unless nothing else of the forward outlives this row (the forward is
            # this one sequence, or the row's last sequence is in it too)
            refs[r] = resp[0] if (single and len(seqs) == 1) or seqs[-1].last_of_row else resp[0].clone()
            first = 1
            if compiled_js:  # P_all's log-normaliser, once per row, shared by every variant's JSD
                lses[r] = logsumexp_rows(refs[r], temperature, chunk_size, compiled=True)
        rest = resp[first:]
        ids_r = responses[r, :n_resp].to(resp.device)
        mask_r = response_mask[r, :n_resp].to(resp.device)
        want_lp = seqs[0].variant == 0 and lp_variant[r] == 0
        if first == len(seqs):  # P_all alone in this forward: its variants come in the next ones
            if want_lp:  # z_y - logsumexp(z), the normaliser computed once (compiled JS) or here
                logprobs[r, :n_resp] = (picked_logprobs(refs[r], ids_r, temperature, lses.get(r)) * (mask_r > 0)).cpu()
        else:
            q, lp = relevance_against_reference(
                refs[r], rest, ids_r, mask_r, temperature, measure, chunk_size, compiled=compiled_js,
                need_logp=want_lp, ref_lse=lses.get(r),
            )
            if want_lp:
                logprobs[r, :n_resp] = lp.cpu()
            for jl, s in enumerate(seqs[first:]):
                variant_relevance[r, s.variant - 1, :n_resp] = q[jl].cpu()
                if s.variant == lp_variant[r]:
                    lpv = sampled_logprobs_from_logits(rest[jl : jl + 1], ids_r.unsqueeze(0), mask_r.unsqueeze(0), temperature, chunk_size)
                    logprobs[r, :n_resp] = lpv[0].cpu()
        if seqs[-1].last_of_row:
            del refs[r]
            lses.pop(r, None)

    seqs = plan_sequences(variant_lens, pair_variant, resp_lens)
    counts = run_pass(forward, variant_ids, responses, seqs, settings, consume, device=device, sync_forward_count=sync_forward_count)
    return {
        "variant_relevance": variant_relevance,
        "replay_logprobs": logprobs,
        "n_forwards": torch.tensor(counts.n_forwards),
        "n_forwards_global": torch.tensor(counts.n_forwards_global),
        "tokens_forwarded": torch.tensor(counts.tokens_forwarded),
        "tokens_existing": torch.tensor(counts.tokens_existing),
    }


def expand_relevance(variant_relevance: torch.Tensor, pair_variant: torch.Tensor) -> torch.Tensor:
    """Map the compact rows [R, NV', T] (row j - 1 = variant j) to rewards: [R, K, T] fp32, 0 where
    ``pair_variant`` <= 0 (not replayed)."""
    R, K = pair_variant.shape
    T = variant_relevance.shape[-1]
    idx = (pair_variant.long().clamp(min=1) - 1).clamp(max=variant_relevance.shape[1] - 1)
    out = variant_relevance.float().gather(1, idx.unsqueeze(-1).expand(R, K, T))
    out[pair_variant <= 0] = 0.0
    return out
