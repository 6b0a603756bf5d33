"""OPSD, on-policy self-distillation with privileged context (docs/design.md §6, docs/opsd.md): the maths.

The teacher is the behaviour policy itself under ``P_all`` (the prompt with every verifier context Z_k,
built by :func:`recipe.mrtpo.core.prompt_variants.build_sample_variants` exactly as the replay builds it);
the student is the policy under the rollout prompt. Both read the same sampled response y. Per response
position t the teacher's next-token distribution is kept as its top-k only:

    p_T(v | t)  = softmax(z_T[t] / tau)_v                 z_T: logits after P_all, y_<t; tau: rollout temperature
    K_T[t]      = top-k_v p_T(v | t)                       (ids and log-probs; k = mrtpo.opsd_topk)

and the student is pulled towards it with verl's top-k forward KL (``forward_kl_topk``)

    D[t]        = sum_{v in K_T[t]} p_T(v|t) (log p_T(v|t) - log p_S(v|t))

or one of verl's single-sample estimators on the sampled token (``k3``...). Everything here is pure torch
over any causal-LM forward callable (the worker binds it to the FSDP module), forwarded by the pass engine
the replay uses (:mod:`recipe.mrtpo.core.passes`); memory is bounded by top-k: a forward keeps the
response logits of its sequences only, the log-softmax expands ``chunk_size`` positions
x V to fp32 at a time, and only [rows, T, k] leaves this module. Never rows x T x V.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from recipe.mrtpo.core.passes import ForwardFn, PassSequence, PassSettings, response_lengths, row_sequences, run_pass

#: positions whose fp32 [chunk, V] log-softmax is formed at once when no chunk size is given (~64 MiB at V = 152k)
DEFAULT_CHUNK_POSITIONS = 110


def teacher_topk_from_logits(
    logits: torch.Tensor,
    response_ids: torch.Tensor,
    k: int,
    temperature: float = 1.0,
    chunk_size: Optional[int] = None,
    ids: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher top-k and the sampled token's log-prob at every position.

        logp[t, v] = log_softmax(z[t] / tau)_v
        (topk_logprobs[t], topk_ids[t]) = top-k_v logp[t, v]        (descending)
        token_logprob[t] = logp[t, y_t]

    With ``ids`` ([..., T, k] int) the log-probs are taken at those ids instead of the top-k
    (``topk_logprobs[t] = logp[t, ids[t]]``, ``topk_ids = ids``): SDPO's teacher, evaluated at the
    student's top-k (``methods.sdpo``).

    Args:
        logits: [..., T, V] (any float dtype); response_ids: [..., T] the sampled tokens.
        chunk_size: positions expanded to fp32 [chunk, V] at a time (None: :data:`DEFAULT_CHUNK_POSITIONS`).

    Returns ``topk_logprobs`` [..., T, k] fp32, ``topk_ids`` [..., T, k] int64, ``token_logprob`` [..., T] fp32.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    *lead, T, V = logits.shape
    k = min(k, V) if ids is None else ids.shape[-1]
    flat = logits.reshape(-1, V)
    at = ids.reshape(-1, k).to(flat.device).long() if ids is not None else None
    ids = response_ids.reshape(-1).to(flat.device).long()
    N = flat.shape[0]
    out_lp = torch.empty(N, k, dtype=torch.float32, device=flat.device)
    out_ids = torch.empty(N, k, dtype=torch.long, device=flat.device)
    out_tok = torch.empty(N, dtype=torch.float32, device=flat.device)
    step = int(chunk_size or DEFAULT_CHUNK_POSITIONS)
    for s in range(0, N, step):
        e = min(s + step, N)
        lp = torch.log_softmax(flat[s:e].float() / float(temperature), dim=-1)
        if at is None:
            v, i = torch.topk(lp, k, dim=-1)
        else:
            i = at[s:e].clamp(0, V - 1)
            v = lp.gather(-1, i)
        out_lp[s:e], out_ids[s:e] = v, i
        out_tok[s:e] = lp.gather(-1, ids[s:e].clamp(0, V - 1).unsqueeze(-1)).squeeze(-1)
        del lp
    return out_lp.reshape(*lead, T, k), out_ids.reshape(*lead, T, k), out_tok.reshape(*lead, T)


def forward_kl_topk(teacher_topk_logprobs: torch.Tensor, teacher_topk_ids: torch.Tensor, student_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token top-k forward KL (verl's ``forward_kl_topk`` before its clamp at 0):

        D[t] = sum_{v in K_T[t]} p_T(v|t) (log p_T(v|t) - log p_S(v|t))

    ``student_logprobs`` [..., T, V] (full log-softmax of the student); teacher tensors [..., T, k]. Returns [..., T].
    """
    lp_t = teacher_topk_logprobs.float()
    lp_s = student_logprobs.float().gather(-1, teacher_topk_ids.long())
    return (lp_t.exp() * (lp_t - lp_s)).sum(-1)


def topk_mass(topk_logprobs: torch.Tensor) -> torch.Tensor:
    """Probability mass in the top-k: ``m[t] = sum_{v in K[t]} p(v|t)`` ([..., T, k] -> [..., T], in [0, 1])."""
    return topk_logprobs.float().exp().sum(-1)


def topk_overlap(ids_a: torch.Tensor, ids_b: torch.Tensor) -> torch.Tensor:
    """Share of one top-k set found in the other: ``o[t] = |K_a[t] & K_b[t]| / k`` ([..., T, k] x2 -> [..., T])."""
    hit = (ids_a.unsqueeze(-1) == ids_b.unsqueeze(-2)).any(-1)
    return hit.float().mean(-1)


def teacher_topk_rows(
    forward: ForwardFn,
    prompt_ids: torch.Tensor,
    prompt_lens: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    k: int,
    temperature: float = 1.0,
    micro_batch_size: int = 8,
    token_budget: Optional[int] = None,
    chunk_size: Optional[int] = None,
    pad_id: int = 0,
    device: torch.device | str = "cpu",
    sync_forward_count: Optional[Callable[[int], int]] = None,
    layout: str = "sorted",
    packed_attention: str = "block_mask",
    settings: Optional[PassSettings] = None,
    ids: Optional[torch.Tensor] = None,
) -> dict[str, torch.Tensor]:
    """The teacher pass over packed rows: each row's teacher prompt followed by its sampled response.

    Input: ``prompt_ids`` [R, P] LEFT-padded teacher prompts (P_all), ``prompt_lens`` [R] (0: a padding row,
    no forward), ``responses`` / ``response_mask`` [R, T]. The forwards are the pass engine's
    (:func:`recipe.mrtpo.core.passes.run_pass`: its packer, layouts and forward-count agreement, the same as
    the replay's; ``settings`` or the keyword arguments it is made of). A row is forwarded up to its last
    valid response token (:func:`recipe.mrtpo.core.passes.response_lengths`: a mask with gaps keeps them
    attended). ``ids`` ([R, T, k]): take each row's log-probs at these ids instead of its top-k (SDPO's teacher
    at the student's top-k; :func:`teacher_topk_from_logits`).

    Returns ``topk_logprobs`` [R, T, k] fp32, ``topk_ids`` [R, T, k] int64, ``token_logprobs`` [R, T] fp32
    (all 0 at masked positions and on padding rows) and the counts ``n_forwards``, ``n_forwards_global``,
    ``tokens_forwarded``, ``tokens_existing``, ``unshared_by_cost``, ``attention_pairs`` (``PassCounts``).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if settings is None:
        settings = PassSettings(temperature=float(temperature), micro_batch_size=int(micro_batch_size), token_budget=token_budget,
                                chunk_size=chunk_size, pad_id=int(pad_id), layout=layout, packed_attention=packed_attention)
    R, T = responses.shape
    if ids is not None:
        k = ids.shape[-1]
    resp_lens = response_lengths(response_mask)
    out_lp = torch.zeros(R, T, int(k), dtype=torch.float32)
    out_ids = torch.zeros(R, T, int(k), dtype=torch.long)
    out_tok = torch.zeros(R, T, dtype=torch.float32)

    def consume(seqs: list[PassSequence], logits: torch.Tensor, single: bool) -> None:
        r, n = seqs[0].row, seqs[0].resp_len
        at = ids[r, :n] if ids is not None else None
        lp, tid, tok = teacher_topk_from_logits(logits[0], responses[r, :n].to(logits.device), int(k), 1.0, settings.chunk_size, at)
        kk = lp.shape[-1]
        out_lp[r, :n, :kk] = lp.cpu()
        out_ids[r, :n, :kk] = tid.cpu()
        out_tok[r, :n] = tok.cpu()

    seqs = [s for r in range(R) if int(prompt_lens[r]) > 0 and int(resp_lens[r]) > 0
            for s in row_sequences(r, [0], [int(prompt_lens[r])], int(resp_lens[r]))]
    counts = run_pass(forward, prompt_ids.unsqueeze(1), responses, seqs, settings, consume, device=device,
                      sync_forward_count=sync_forward_count)
    valid = response_mask > 0
    out_tok = out_tok * valid
    out_lp = out_lp * valid.unsqueeze(-1)
    out_ids = out_ids * valid.unsqueeze(-1)
    return {
        "topk_logprobs": out_lp,
        "topk_ids": out_ids,
        "token_logprobs": out_tok,
        **counts.as_tensors(),
    }


def sequence_teacher_fields(
    topk_logprobs: torch.Tensor,
    topk_ids: torch.Tensor,
    prompt_len: int,
    response_len: int,
    pad_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sample's teacher tensors in verl's sequence layout (what the actor's distillation loss reads).

    verl aligns the teacher with the student's logits over the whole sequence x = prompt + response
    (L = prompt_len + response_len rows): row j is the distribution of token j + 1. The response token t
    sits at j = prompt_len + t, so its teacher row is j = prompt_len - 1 + t; every other row (prompt
    positions, the last token) is verl's padding: log-prob 0, id ``pad_id``, which the response mask drops.

    Args: ``topk_logprobs`` / ``topk_ids`` [T, k] of the sample's response positions ([T, 1] for the
    single-sample estimators). Returns ``(logprobs [L, k] fp32, ids [L, k] int32)``.
    """
    L = int(prompt_len) + int(response_len)
    kk = topk_logprobs.shape[-1]
    lp = torch.zeros(L, kk, dtype=torch.float32)
    ids = torch.full((L, kk), int(pad_id), dtype=torch.int32)
    start = int(prompt_len) - 1
    n = int(response_len)
    lp[start : start + n] = topk_logprobs[:n].float()
    ids[start : start + n] = topk_ids[:n].to(torch.int32)
    return lp, ids
