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
over any causal-LM forward callable (the worker binds it to the FSDP module); memory is bounded by top-k:
a forward keeps the response logits of one micro-batch, the log-softmax expands ``chunk_size`` positions
x V to fp32 at a time, and only [rows, T, k] leaves this module. Never rows x T x V.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import torch

# forward(input_ids [b, L], attention_mask [b, L], position_ids [b, L], keep: int) -> logits [b, keep, V]
ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]

#: positions whose fp32 [chunk, V] log-softmax is formed at once when no chunk size is given (~64 MiB at V = 152k)
DEFAULT_CHUNK_POSITIONS = 110


def teacher_topk_from_logits(
    logits: torch.Tensor,
    response_ids: torch.Tensor,
    k: int,
    temperature: float = 1.0,
    chunk_size: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher top-k and the sampled token's log-prob at every position.

        logp[t, v] = log_softmax(z[t] / tau)_v
        (topk_logprobs[t], topk_ids[t]) = top-k_v logp[t, v]        (descending)
        token_logprob[t] = logp[t, y_t]

    Args:
        logits: [..., T, V] (any float dtype); response_ids: [..., T] the sampled tokens.
        chunk_size: positions expanded to fp32 [chunk, V] at a time (None: :data:`DEFAULT_CHUNK_POSITIONS`).

    Returns ``topk_logprobs`` [..., T, k] fp32, ``topk_ids`` [..., T, k] int64, ``token_logprob`` [..., T] fp32.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    *lead, T, V = logits.shape
    k = min(k, V)
    flat = logits.reshape(-1, V)
    ids = response_ids.reshape(-1).to(flat.device).long()
    N = flat.shape[0]
    out_lp = torch.empty(N, k, dtype=torch.float32, device=flat.device)
    out_ids = torch.empty(N, k, dtype=torch.long, device=flat.device)
    out_tok = torch.empty(N, dtype=torch.float32, device=flat.device)
    step = int(chunk_size or DEFAULT_CHUNK_POSITIONS)
    for s in range(0, N, step):
        e = min(s + step, N)
        lp = torch.log_softmax(flat[s:e].float() / float(temperature), dim=-1)
        v, i = torch.topk(lp, k, dim=-1)
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


def plan_forwards(lengths: Sequence[int], max_rows: int, token_budget: Optional[int] = None) -> list[list[int]]:
    """Group rows (in order) into forwards: at most ``max_rows`` rows and, with a budget, at most
    ``token_budget`` padded tokens (rows x longest sequence of the group) per forward. A row longer than
    the budget gets a forward of its own; rows of length 0 (padding rows) get none."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for r, n in enumerate(lengths):
        if n <= 0:
            continue
        new_longest = max(longest, int(n))
        over_budget = token_budget is not None and token_budget > 0 and new_longest * (len(cur) + 1) > token_budget
        if cur and (len(cur) >= max_rows or over_budget):
            groups.append(cur)
            cur, new_longest = [], int(n)
        cur.append(r)
        longest = new_longest
    if cur:
        groups.append(cur)
    return groups


def _pack(prompt_ids, prompt_lens, responses, resp_lens, rows, pad_id):
    """[prompt (left-padded to the group's longest) | response (right-padded to the group's longest)]."""
    P = int(max(int(prompt_lens[r]) for r in rows))
    T = int(max(int(resp_lens[r]) for r in rows))
    T = max(T, 1)
    n = len(rows)
    ids = torch.full((n, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((n, P + T), dtype=torch.long)
    width = prompt_ids.shape[1]
    for j, r in enumerate(rows):
        L, R = int(prompt_lens[r]), int(resp_lens[r])
        ids[j, P - L : P] = prompt_ids[r, width - L :]
        attn[j, P - L : P] = 1
        ids[j, P : P + R] = responses[r, :R]
        attn[j, P : P + R] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos, T


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
) -> dict[str, torch.Tensor]:
    """The teacher pass over packed rows: each row's teacher prompt followed by its sampled response.

    Input: ``prompt_ids`` [R, P] LEFT-padded teacher prompts (P_all), ``prompt_lens`` [R] (0: a padding row,
    no forward), ``responses`` / ``response_mask`` [R, T]. Rows go through ``forward`` in groups of
    :func:`plan_forwards` (``micro_batch_size`` rows, ``token_budget`` padded tokens). The number of
    forwards is agreed with ``sync_forward_count(n_local) -> n_global`` BEFORE the first one (FSDP
    all-gathers per forward); the extra forwards of a short rank run one pad token and are discarded.

    Returns ``topk_logprobs`` [R, T, k] fp32, ``topk_ids`` [R, T, k] int64, ``token_logprobs`` [R, T] fp32
    (0 at masked positions and on padding rows) and the forward counts ``n_forwards``, ``n_forwards_global``.
    """
    R, T = responses.shape
    k_eff = int(k)
    resp_lens = response_mask.long().sum(-1)
    lengths = [int(prompt_lens[r]) + int(resp_lens[r]) if int(prompt_lens[r]) > 0 else 0 for r in range(R)]
    groups = plan_forwards(lengths, micro_batch_size, token_budget)
    n_local = len(groups)
    n_global = sync_forward_count(n_local) if sync_forward_count is not None else n_local
    if n_global < n_local:
        raise RuntimeError(f"forward-count agreement returned {n_global} < this rank's {n_local} forwards")
    out_lp = torch.zeros(R, T, k_eff, dtype=torch.float32)
    out_ids = torch.zeros(R, T, k_eff, dtype=torch.long)
    out_tok = torch.zeros(R, T, dtype=torch.float32)
    for rows in groups:
        ids, attn, pos, Tg = _pack(prompt_ids, prompt_lens, responses, resp_lens, rows, pad_id)
        # keep Tg + 1 positions: position P - 1 + t predicts response token t
        logits = forward(ids.to(device), attn.to(device), pos.to(device), Tg + 1)[:, :Tg]
        lp, tid, tok = teacher_topk_from_logits(logits, ids[:, -Tg:].to(logits.device), k_eff, temperature, chunk_size)
        del logits
        for j, r in enumerate(rows):
            n = int(resp_lens[r])
            kk = lp.shape[-1]
            out_lp[r, :n, :kk] = lp[j, :n].cpu()
            out_ids[r, :n, :kk] = tid[j, :n].cpu()
            out_tok[r, :n] = tok[j, :n].cpu()
    if n_global > n_local:
        dummy = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
        one = torch.ones((1, 1), dtype=torch.long, device=device)
        for _ in range(n_global - n_local):
            forward(dummy, one, torch.zeros_like(one), 1)
    out_tok = out_tok * response_mask.float()
    return {
        "topk_logprobs": out_lp,
        "topk_ids": out_ids,
        "token_logprobs": out_tok,
        "n_forwards": torch.tensor(n_local),
        "n_forwards_global": torch.tensor(n_global),
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
