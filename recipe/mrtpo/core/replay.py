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
    entropy_in_dtype,
    hf_forward,
    picked_logprobs_in_dtype,
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


def plan_sequences(variant_lens: torch.Tensor, pair_variant: torch.Tensor, resp_lens: torch.Tensor,
                   logprob_variant: Optional[torch.Tensor] = None) -> list[PassSequence]:
    """Every sequence to forward, row by row: P_all first, each distinct used variant once, then the row's
    ``logprob_variant`` when it is not among them (the fused old_log_prob: a row that replays nothing, or
    whose rollout prompt is no variant, is still forwarded once under its rollout prompt)."""
    seqs: list[PassSequence] = []
    for r in range(pair_variant.shape[0]):
        used = sorted({int(v) for v in pair_variant[r].tolist() if v > 0})
        n_resp = int(resp_lens[r])
        if n_resp == 0:
            continue
        order = [0, *used] if used else []
        lpv = int(logprob_variant[r]) if logprob_variant is not None else -1
        if lpv >= 0 and lpv not in order and int(variant_lens[r, lpv]) > 0:
            order.append(lpv)
        if order:
            seqs += row_sequences(r, order, [int(variant_lens[r, v]) for v in order], n_resp)
    return seqs


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk_size: Optional[int] = None) -> torch.Tensor:
    """Per-position entropy of the sampling distribution, as verl's ``entropy_from_logits`` after its
    temperature division:

        z = logits / tau;   H[t] = logsumexp_v z[t, v] - sum_v softmax(z[t])_v z[t, v]

    ``logits`` [T, V] (any float dtype) -> [T] fp32, ``chunk_size`` positions expanded to fp32 at a time.
    """
    T = logits.shape[0]
    out = torch.empty(T, dtype=torch.float32, device=logits.device)
    step = int(chunk_size or 128)
    for a in range(0, T, step):
        z = logits[a : a + step].float() / float(temperature)
        lse = torch.logsumexp(z, dim=-1)
        out[a : a + step] = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
        del z
    return out


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
    entropy: bool = False,
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
            verl's ``old_log_probs``. A variant that is no replayed one is forwarded for them alone (the
            old_log_prob step fused with the replay: every row of the batch, the replayed ones included,
            gets verl's ``old_log_probs`` from this pass); -1: none.
        entropy: also ``replay_entropy`` [R, T], the entropy of that variant's distribution (verl's
            ``entropy`` beside ``old_log_probs``).

    Returns:
        ``variant_relevance`` [R, max(NV - 1, 1), T] fp32, ``replay_logprobs`` [R, T] fp32, and the counts
        ``n_forwards`` (this process's own), ``n_forwards_global`` (after the agreement),
        ``tokens_forwarded``, ``tokens_existing``, ``unshared_by_cost`` and ``attention_pairs``
        (:class:`recipe.mrtpo.core.passes.PassCounts`).
    """
    if settings is None:
        settings = PassSettings(temperature=float(temperature), micro_batch_size=int(micro_batch_size), token_budget=token_budget,
                                chunk_size=chunk_size, pad_id=int(pad_id), layout=layout, packed_attention=packed_attention)
    # run_pass hands over logits already divided by the temperature as verl divides them (passes: Numerics)
    temperature, chunk_size = 1.0, settings.chunk_size
    R, K = pair_variant.shape
    NV, T = variant_ids.shape[1], responses.shape[1]
    if resp_lens is None:
        resp_lens = response_lengths(response_mask)
    variant_relevance = torch.zeros(R, max(NV - 1, 1), T, dtype=torch.float32)
    logprobs = torch.zeros(R, T, dtype=torch.float32)
    lp_variant = [0] * R if logprob_variant is None else [int(v) for v in logprob_variant.tolist()]
    refs: dict[int, torch.Tensor] = {}  # row -> P_all's response logits [T_r, V] (own storage)
    lses: dict[int, torch.Tensor] = {}  # row -> P_all's log-normaliser [T_r] (compiled JS only)

    used_sets = [{int(v) for v in pair_variant[r].tolist() if v > 0} for r in range(R)]
    entropy_out = torch.zeros(R, T, dtype=torch.float32) if entropy else None

    def consume(seqs: list[PassSequence], resp: torch.Tensor, single: bool) -> None:
        r, n_resp = seqs[0].row, seqs[0].resp_len
        used = used_sets[r]
        ids_r = responses[r, :n_resp].to(resp.device).long()
        mask_r = response_mask[r, :n_resp].to(resp.device)
        lead = seqs[0].variant == 0 and bool(used)  # P_all, the reference of the row's variants
        if lead:
            # its own tensor: a copy, unless nothing else of the forward outlives this row (the forward is
            # this one sequence, or the row's last sequence is in it too)
            refs[r] = resp[0] if (single and len(seqs) == 1) or seqs[-1].last_of_row else resp[0].clone()
            if compiled_js:  # P_all's log-normaliser, once per row, shared by every variant's JSD
                lses[r] = logsumexp_rows(refs[r], temperature, chunk_size, compiled=True)
        js = [jl for jl, s in enumerate(seqs) if s.variant in used]  # contiguous: the planner keeps the order
        lp_done = False
        if js:
            want_lp = lead and lp_variant[r] == 0  # P_all's log-probs come out of the same pass
            q, lp = relevance_against_reference(
                refs[r], resp[js[0] : js[-1] + 1], ids_r, mask_r, temperature, measure, chunk_size, compiled=compiled_js,
                need_logp=want_lp, ref_lse=lses.get(r),
            )
            if want_lp:
                logprobs[r, :n_resp] = (lp if settings.logprob_dtype == "float32" else
                                        picked_logprobs_in_dtype(refs[r], ids_r, settings.logprob_dtype, chunk_size) * (mask_r > 0)).cpu()
                lp_done = True
            for jl, s in zip(js, seqs[js[0] : js[-1] + 1]):
                variant_relevance[r, s.variant - 1, :n_resp] = q[jl - js[0]].cpu()
            del q, lp
        for jl, s in enumerate(seqs):
            if s.variant != lp_variant[r]:
                continue
            if not lp_done:
                if jl == 0 and lead:  # z_y - logsumexp(z), the normaliser computed once (compiled JS) or here
                    lpv = picked_logprobs(refs[r], ids_r, temperature, lses.get(r)) * (mask_r > 0)
                else:
                    lpv = sampled_logprobs_from_logits(resp[jl : jl + 1], ids_r.unsqueeze(0), mask_r.unsqueeze(0), temperature, chunk_size)[0]
                if settings.logprob_dtype != "float32":  # verl's own log-prob comes out in the logits' dtype
                    lpv = picked_logprobs_in_dtype(resp[jl], ids_r, settings.logprob_dtype, chunk_size) * (mask_r > 0)
                logprobs[r, :n_resp] = lpv.cpu()
            if entropy_out is not None:
                ent = (entropy_from_logits(resp[jl], temperature, chunk_size) if settings.entropy_dtype == "float32"
                       else entropy_in_dtype(resp[jl], settings.entropy_dtype, chunk_size))
                entropy_out[r, :n_resp] = (ent * (mask_r > 0)).cpu()
        if seqs[-1].last_of_row:
            refs.pop(r, None)
            lses.pop(r, None)

    seqs = plan_sequences(variant_lens, pair_variant, resp_lens, logprob_variant)
    counts = run_pass(forward, variant_ids, responses, seqs, settings, consume, device=device, sync_forward_count=sync_forward_count)
    out = {
        "variant_relevance": variant_relevance,
        "replay_logprobs": logprobs,
        **counts.as_tensors(),
    }
    if entropy_out is not None:
        out["replay_entropy"] = entropy_out
    return out


def expand_relevance(variant_relevance: torch.Tensor, pair_variant: torch.Tensor) -> torch.Tensor:
    """Map the compact rows [R, NV', T] (row j - 1 = variant j) to rewards: [R, K, T] fp32, 0 where
    ``pair_variant`` <= 0 (not replayed)."""
    R, K = pair_variant.shape
    T = variant_relevance.shape[-1]
    idx = (pair_variant.long().clamp(min=1) - 1).clamp(max=variant_relevance.shape[1] - 1)
    out = variant_relevance.float().gather(1, idx.unsqueeze(-1).expand(R, K, T))
    out[pair_variant <= 0] = 0.0
    return out
