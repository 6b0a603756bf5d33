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

At scale (§5):

- *Collective safety.* Every FSDP forward issues collectives, so every data-parallel rank must run the
  same number of forwards. The schedule of micro-batches is built first, then ``sync_forward_count(n_local)
  -> n_global`` is called, **before the first forward**; short ranks then run ``n_global - n_local``
  one-token padding forwards at the end.
- *Cost in proportion to the tokens that exist.* A sequence is its own prompt followed by its own
  response, up to the response's last existing token (:func:`response_lengths`): the attention covers
  every response token up to there, ``response_mask`` only decides where q is measured. Sequences are
  packed into micro-batches by a token budget (``token_budget``: micro-batch size x its longest sequence,
  i.e. the padded tokens of the forward, at most the budget; one longer sequence runs alone) or, without
  one, by ``micro_batch_size`` sequences; a forward keeps the logits of its micro-batch's longest
  response only. P_all's response logits are held as their own tensor ([T_r, V], copied out of their
  micro-batch when they outlive it) only while the row's variants still run, with the compiled JS its
  log-normaliser [T_r] too (one logsumexp per position, shared by the variants); the JS expands at most
  ``chunk_size`` positions x V to fp32 at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

from recipe.mrtpo.core.relevance import (
    logsumexp_rows,
    picked_logprobs,
    relevance_against_reference,
    sampled_logprobs_from_logits,
)

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


def sync_max_over_ranks(n: int) -> int:
    """The largest ``n`` over the ranks of the default process group (``n`` itself outside one).

    The agreement :func:`replay_relevance` needs under FSDP (§5): gloo reduces on CPU, NCCL on the
    current CUDA device.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return n
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


@dataclass(frozen=True)
class Sequence:
    """One forward sequence: variant ``variant`` of row ``row`` followed by the row's response."""

    row: int
    variant: int  # 0 = P_all
    prompt_len: int
    resp_len: int  # response positions that exist (attended), up to the last valid token
    last_of_row: bool  # P_all's logits of the row can be dropped after this sequence

    @property
    def length(self) -> int:
        return self.prompt_len + self.resp_len


def response_lengths(response_mask: torch.Tensor) -> torch.Tensor:
    """[R] number of response positions that exist: the index of the last valid token + 1 (0 if none).

    A non-contiguous mask (tool output inside a multi-turn response, rejected tokens) keeps its gaps
    attended: they are tokens the model saw; only where q counts is the mask's business.
    """
    m = (response_mask > 0).cpu()
    if m.shape[-1] == 0:
        return torch.zeros(m.shape[0], dtype=torch.long)
    return (torch.arange(1, m.shape[-1] + 1) * m).amax(dim=-1)


def plan_sequences(variant_lens: torch.Tensor, pair_variant: torch.Tensor, resp_lens: torch.Tensor) -> list[Sequence]:
    """Every sequence to forward, row by row, P_all first, each distinct used variant once."""
    seqs: list[Sequence] = []
    for r in range(pair_variant.shape[0]):
        used = sorted({int(v) for v in pair_variant[r].tolist() if v > 0})
        n_resp = int(resp_lens[r])
        if not used or n_resp == 0:
            continue
        order = [0, *used]
        for j, v in enumerate(order):
            seqs.append(Sequence(r, v, int(variant_lens[r, v]), n_resp, j == len(order) - 1))
    return seqs


def pack_micro_batches(seqs: list[Sequence], micro_batch_size: int, token_budget: Optional[int] = None) -> list[list[Sequence]]:
    """Consecutive micro-batches of the sequences, in order (§5).

    With ``token_budget``: as many sequences as keep ``n x longest`` (the padded tokens of the forward)
    within the budget; a sequence longer than the budget alone. Without: ``micro_batch_size`` sequences.
    """
    if micro_batch_size < 1:
        raise ValueError("micro_batch_size must be >= 1")
    if token_budget is not None and token_budget < 1:
        raise ValueError("token_budget must be >= 1 (or None)")
    batches: list[list[Sequence]] = []
    cur: list[Sequence] = []
    longest = 0
    for s in seqs:
        if cur:
            full = (len(cur) + 1) * max(longest, s.length) > token_budget if token_budget else len(cur) >= micro_batch_size
            if full:
                batches.append(cur)
                cur, longest = [], 0
        cur.append(s)
        longest = max(longest, s.length)
    if cur:
        batches.append(cur)
    return batches


def _micro_batch_inputs(mb: list[Sequence], variant_ids, responses, pad_id: int):
    """[pad | prompt | response] per sequence, LEFT-padded to the micro-batch's longest, so that every
    response ends at the last position; ``keep`` = longest response + 1 positions of logits suffice."""
    L = max(s.length for s in mb)
    ids = torch.full((len(mb), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(mb), L), dtype=torch.long)
    P = variant_ids.shape[-1]
    for i, s in enumerate(mb):
        ids[i, L - s.length : L - s.resp_len] = variant_ids[s.row, s.variant, P - s.prompt_len :]
        ids[i, L - s.resp_len :] = responses[s.row, : s.resp_len]
        attn[i, L - s.length :] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    keep = max(s.resp_len for s in mb) + 1
    return ids, attn, pos, keep


def replay_relevance(
    forward: ForwardFn,
    variant_ids: torch.Tensor,
    variant_lens: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    pair_variant: torch.Tensor,
    *,
    micro_batch_size: int,
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
) -> dict[str, torch.Tensor]:
    """Replay every row's variants with its sampled response and measure their relevance (module docstring).

    Args:
        micro_batch_size: sequences per forward when ``token_budget`` is None.
        token_budget: padded tokens per forward (verl's ``log_prob_max_token_len_per_gpu`` when
            ``log_prob_use_dynamic_bsz``); takes precedence over ``micro_batch_size``.
        sync_forward_count: ``n_local -> n_global`` (e.g. :func:`sync_max_over_ranks`), called once,
            before any forward; None for a single process.
        compiled_js: the ``torch.compile``d JSD kernel (``mrtpo.compile_js``).
        resp_lens: [R] response positions that exist (default :func:`response_lengths` of the mask).
        logprob_variant: [R] which variant's log-probs of the sampled tokens ``replay_logprobs`` holds
            (default 0, P_all): the variant that is the rollout prompt, so that they can be checked against
            verl's ``old_log_probs``. A variant that is not forwarded leaves the row's log-probs at 0.

    Returns:
        ``variant_relevance`` [R, max(NV - 1, 1), T] fp32, ``replay_logprobs`` [R, T] fp32, and the
        counts ``n_forwards`` (this process's own) and ``n_forwards_global`` (after the agreement).
    """
    R, K = pair_variant.shape
    NV, T = variant_ids.shape[1], responses.shape[1]
    if resp_lens is None:
        resp_lens = response_lengths(response_mask)
    batches = pack_micro_batches(plan_sequences(variant_lens, pair_variant, resp_lens), micro_batch_size, token_budget)
    n_local = len(batches)
    n_global = int(sync_forward_count(n_local)) if sync_forward_count is not None else n_local  # before any forward
    if n_global < n_local:
        raise RuntimeError(f"forward-count agreement returned {n_global} < this rank's {n_local}")
    variant_relevance = torch.zeros(R, max(NV - 1, 1), T, dtype=torch.float32)
    logprobs = torch.zeros(R, T, dtype=torch.float32)
    lp_variant = [0] * R if logprob_variant is None else [int(v) for v in logprob_variant.tolist()]
    refs: dict[int, torch.Tensor] = {}  # row -> P_all's response logits [T_r, V] (own storage)
    lses: dict[int, torch.Tensor] = {}  # row -> P_all's log-normaliser [T_r] (compiled JS only)
    for mb in batches:
        ids, attn, pos, keep = _micro_batch_inputs(mb, variant_ids, responses, pad_id)
        logits = forward(ids.to(device), attn.to(device), pos.to(device), keep)
        i = 0
        while i < len(mb):  # consecutive sequences of one row share P_all's log-softmax
            j = i
            while j < len(mb) and mb[j].row == mb[i].row:
                j += 1
            r, n_resp = mb[i].row, mb[i].resp_len
            resp = logits[i:j, keep - n_resp - 1 : keep - 1]  # position L-1-n+t predicts response token t
            first = i
            if mb[i].variant == 0:
                # its own tensor: a copy, unless nothing else of the micro-batch outlives this row (the
                # forward is this one sequence, or the row's last sequence is in it too)
                alone = len(mb) == 1 or mb[j - 1].last_of_row
                refs[r] = resp[0] if alone else resp[0].clone()
                resp, first = resp[1:], i + 1
                if compiled_js:  # P_all's log-normaliser, once per row, shared by every variant's JSD
                    lses[r] = logsumexp_rows(refs[r], temperature, chunk_size, compiled=True)
            ids_r = responses[r, :n_resp].to(device)
            mask_r = response_mask[r, :n_resp].to(device)
            want_lp = mb[i].variant == 0 and lp_variant[r] == 0
            if first == j:  # P_all alone in this forward: its variants come in the next ones
                if want_lp:  # z_y - logsumexp(z), the normaliser computed once (compiled JS) or here
                    logprobs[r, :n_resp] = (picked_logprobs(refs[r], ids_r, temperature, lses.get(r)) * (mask_r > 0)).cpu()
                q = lp = None
            else:
                q, lp = relevance_against_reference(
                    refs[r], resp, ids_r, mask_r, temperature, measure, chunk_size, compiled=compiled_js,
                    need_logp=want_lp, ref_lse=lses.get(r),
                )
                if want_lp:
                    logprobs[r, :n_resp] = lp.cpu()
            for jl, s in enumerate(mb[first:j]):
                variant_relevance[r, s.variant - 1, :n_resp] = q[jl].cpu()
                if s.variant == lp_variant[r]:
                    lpv = sampled_logprobs_from_logits(resp[jl : jl + 1], ids_r.unsqueeze(0), mask_r.unsqueeze(0), temperature, chunk_size)
                    logprobs[r, :n_resp] = lpv[0].cpu()
            if mb[j - 1].last_of_row:
                del refs[r]
                lses.pop(r, None)
            del resp, q, lp
            i = j
        del logits
    if n_global > n_local:
        dummy = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
        one = torch.ones((1, 1), dtype=torch.long, device=device)
        for _ in range(n_global - n_local):
            forward(dummy, one, torch.zeros_like(one), 1)
    return {
        "variant_relevance": variant_relevance,
        "replay_logprobs": logprobs,
        "n_forwards": torch.tensor(n_local),
        "n_forwards_global": torch.tensor(n_global),
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
