"""Per-token relevance of a reward: how far the policy's next-token distribution moves when the
reward's verifier information Z_k is removed from the prompt (docs/design.md §1.2).

Pure torch. The replay produces two logits tensors over the same sampled response, one under P_all
and one under P_minus_k; the functions here turn them into a per-position measure q[B, T]:

- :func:`js_distance_from_logits` (MRTPO's measure)::

      p = softmax(logits_p / temperature),  q = softmax(logits_q / temperature),  m = (p + q) / 2
      JSD(p, q) = 0.5 KL(p || m) + 0.5 KL(q || m)            (natural log, in [0, ln 2])
      js_distance   = sqrt(JSD / ln 2)                        (in [0, 1], the default)
      js_divergence = JSD                                     (in nats)

- :func:`logprob_contrast_from_logits` (the CoRT-style baseline)::

      c_t = | log p(y_t | a) - log p(y_t | b) |

Memory is bounded: logits may be [B, T, V] with V = 151,936 and T = 8k, in bf16; only
``chunk_size`` valid positions at a time are ever expanded to fp32 (never B x T x V in fp32), and
masked positions are never computed at all.

Numerics. Each KL term uses ``log(p / m) = ln 2 - log1p(exp(-|d|)) - relu(d)`` with
``d = log q - log p`` (and symmetrically for q), which does not cancel when p ~ q: identical
distributions give exactly 0 and nearby ones lose no precision to the difference of two large
entropies. Log-probabilities are floored at ``-1e4`` (``exp`` of that is 0 in fp32), which
makes ``-inf`` logits (masked vocabulary) and huge logits finite without changing any result.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

LN2 = math.log(2.0)
MEASURES = ("js_distance", "js_divergence")
_LOGP_FLOOR = -1.0e4
_TINY = torch.finfo(torch.float32).tiny
# Default chunk: about 2^24 fp32 elements per expanded [chunk, V] tensor (64 MiB); ~110 positions at
# V = 151,936. The peak is a small multiple of that (a handful of [chunk, V] temporaries).
_DEFAULT_CHUNK_ELEMS = 1 << 24


def default_chunk_size(vocab_size: int) -> int:
    """Positions per chunk so that one [chunk, V] fp32 tensor is about 64 MiB."""
    return max(1, _DEFAULT_CHUNK_ELEMS // max(1, int(vocab_size)))


def _log_softmax_fp32(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) in fp32, floored at -1e4 (finite for -inf logits).

    Rows holding NaN or +inf logits (never produced by a model; hostile input) are repaired afterwards
    (their log-softmax is NaN): only those rows pay for ``nan_to_num``.
    """
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    out = torch.log_softmax(x, dim=-1)
    bad = torch.isnan(out[:, 0]) if out.dim() == 2 else None
    if bad is not None and bool(bad.any()):
        rows = bad.nonzero(as_tuple=False).squeeze(-1)
        fixed = torch.nan_to_num(x.index_select(0, rows), nan=_LOGP_FLOOR, posinf=3.0e38, neginf=-3.0e38)
        out[rows] = torch.log_softmax(fixed, dim=-1)
    return out.clamp_(min=_LOGP_FLOOR)


def _jsd_rows(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """JSD in nats for each row of two log-probability tensors [N, V] (fp32). Consumes ``lq``.

    With a = |log q - log p| and t = ln2 - log1p(exp(-a)) (so that log m = max(lp, lq) - t):
        log(p / m) = t - relu(log q - log p),   log(q / m) = t - relu(log p - log q)
        JSD = 0.5 * sum_v [ (p + q) t - p relu(lq - lp) - q relu(lp - lq) ]
            = 0.5 * sum_v [ (p + q) t - min(p, q) a ]
    No term subtracts two large numbers: identical rows give exactly 0, and a token that one
    distribution gives ~0 probability contributes the other's mass times ln2 without rounding loss.
    """
    a = (lq - lp).abs_()
    p = lp.exp()
    q = lq.exp_()
    t = F.softplus(a.neg()).neg_().add_(LN2)
    s = (p + q).mul_(t)
    s.sub_(torch.minimum(p, q).mul_(a))
    return s.sum(dim=-1).mul_(0.5).clamp_(min=0.0, max=LN2)


def _jsd_rows_functional(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """:func:`_jsd_rows` without in-place ops, the form ``torch.compile`` fuses into one pass over [N, V]
    with no [N, V] temporaries. Three transcendentals per entry instead of four: ``exp(-a)``, inside the
    softplus, equals ``min(p, q) / max(p, q)``, which costs a division (both 0: the entry adds 0)."""
    a = (lq - lp).abs()
    p, q = lp.exp(), lq.exp()
    lo, hi = torch.minimum(p, q), torch.maximum(p, q)
    t = LN2 - torch.log1p(lo / hi.clamp(min=_TINY))
    return (0.5 * ((p + q) * t - lo * a).sum(dim=-1)).clamp(0.0, LN2)


def _jsd_lse_from_logits_functional(xp: torch.Tensor, lse_p: torch.Tensor, xq: torch.Tensor, lse_q: torch.Tensor,
                                    temperature: float) -> torch.Tensor:
    """The JSD from raw logits and their log-normalisers [N] (:func:`logsumexp_rows`; P_all's computed
    once per position and shared by its variants), for ``torch.compile``: each log-softmax is
    ``x / temperature - lse``, computed alike for both sides, so identical rows give exactly 0; the
    [N, V] fp32 log-softmaxes are never written out. Rows with NaN / +inf logits come out NaN (repaired
    by the caller)."""
    lp = (xp.float() / temperature - lse_p.unsqueeze(-1)).clamp(min=_LOGP_FLOOR)
    lq = (xq.float() / temperature - lse_q.unsqueeze(-1)).clamp(min=_LOGP_FLOOR)
    return _jsd_rows_functional(lp, lq)


def _logsumexp_functional(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """[N] logsumexp(x / temperature) in fp32, for ``torch.compile`` (no [N, V] temporaries)."""
    return torch.logsumexp(x.float() / temperature, dim=-1)


_COMPILED: dict[str, object] = {}
_FUNCTIONAL = {"lse": _jsd_lse_from_logits_functional, "logsumexp": _logsumexp_functional}


def _compiled(name: str):
    """``torch.compile`` (dynamic row counts) of a fused kernel, built once per process on first use.
    The first call compiles (seconds to a minute; Inductor needs a C++ or Triton toolchain)."""
    fn = _COMPILED.get(name)
    if fn is None:
        fn = _COMPILED[name] = torch.compile(_FUNCTIONAL[name], dynamic=True)
    return fn


def _fused_jsd(a: torch.Tensor, lse: torch.Tensor, xq: torch.Tensor, temperature: float) -> torch.Tensor:
    """The compiled fused JSD of raw logits ``a`` (log-normaliser ``lse``) and ``xq``; rows it returns as
    NaN (NaN / +inf logits: hostile input) are recomputed by the eager path, which repairs them."""
    out = _compiled("lse")(a, lse, xq, logsumexp_rows(xq, temperature, compiled=True), temperature)
    bad = torch.isnan(out)
    if bool(bad.any()):
        rows = bad.nonzero(as_tuple=False).squeeze(-1)
        lp = _log_softmax_fp32(a.index_select(0, rows), temperature)
        out[rows] = _jsd_rows(lp, _log_softmax_fp32(xq.index_select(0, rows), temperature))
    return out


def logsumexp_rows(logits: torch.Tensor, temperature: float = 1.0, chunk_size: Optional[int] = None,
                   compiled: bool = False) -> torch.Tensor:
    """[N] ``logsumexp(logits / temperature)`` of [N, V] logits in fp32, ``chunk_size`` rows at a time:
    P_all's log-normaliser, computed once per position and shared by all its variants' JSDs.
    ``compiled``: the ``torch.compile``d reduction (one pass, no [chunk, V] temporaries; the compiled JS
    uses it for both sides, so that identical rows give bitwise identical log-probabilities)."""
    N, V = logits.shape
    out = torch.empty(N, dtype=torch.float32, device=logits.device)
    chunk = int(chunk_size) if chunk_size else default_chunk_size(V)
    fn = _compiled("logsumexp") if compiled else _logsumexp_functional
    for s in range(0, N, chunk):
        out[s : s + chunk] = fn(logits[s : s + chunk], temperature)
    return out


def _rows(flat: torch.Tensor, rows: torch.Tensor, contiguous: bool) -> torch.Tensor:
    """The given rows of [N, V]: a view when they are one contiguous range (no copy), else a gather."""
    if contiguous:
        return flat[int(rows[0]) : int(rows[0]) + rows.numel()]
    return flat.index_select(0, rows)


def _chunks(mask: torch.Tensor, shape, chunk_size: Optional[int], V: int):
    """Yield (rows, is_contiguous) over the valid flat positions, at most ``chunk_size`` at a time."""
    idx = _valid_positions(mask, shape)
    chunk = int(chunk_size) if chunk_size else default_chunk_size(V)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    for start in range(0, idx.numel(), chunk):
        rows = idx[start : start + chunk]
        yield rows, int(rows[-1] - rows[0]) + 1 == rows.numel()


def _valid_positions(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if mask.shape != shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match logits' [B, T] {tuple(shape)}")
    return mask.reshape(-1).nonzero(as_tuple=False).squeeze(-1)


def js_distance_from_logits(
    logits_p: torch.Tensor,
    logits_q: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    measure: str = "js_distance",
    chunk_size: Optional[int] = None,
) -> torch.Tensor:
    """Jensen-Shannon between the next-token distributions of two replays, per position.

    The measure on its own (eager), the reference the tests and ``benchmarks/bench_noise_floor.py`` use;
    the replay runs :func:`relevance_against_reference`, which shares P_all's log-softmax among its
    variants (and fuses it with ``compiled=True``).

    Args:
        logits_p: [B, T, V] logits under P_all (fp32 or bf16/fp16; computed in fp32).
        logits_q: [B, T, V] logits under P_minus_k, same positions (the sampled response).
        mask: [B, T] valid response positions (bool or 0/1).
        temperature: the rollout temperature; both distributions are softmax(logits / temperature).
        measure: ``"js_distance"`` = sqrt(JSD / ln 2) in [0, 1], or ``"js_divergence"`` = JSD in nats.
        chunk_size: at most this many valid positions are expanded to fp32 [chunk, V] at a time
            (default: about 64 MiB per expanded tensor).

    Returns:
        [B, T] fp32, 0 where ``mask`` is 0.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    if logits_p.shape != logits_q.shape or logits_p.dim() != 3:
        raise ValueError(f"logits must both be [B, T, V], got {tuple(logits_p.shape)} and {tuple(logits_q.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T, V = logits_p.shape
    out = torch.zeros(B * T, dtype=torch.float32, device=logits_p.device)
    flat_p = logits_p.reshape(B * T, V)
    flat_q = logits_q.reshape(B * T, V)
    for rows, contiguous in _chunks(mask, logits_p.shape[:2], chunk_size, V):
        lp = _log_softmax_fp32(_rows(flat_p, rows, contiguous), temperature)
        lq = _log_softmax_fp32(_rows(flat_q, rows, contiguous), temperature)
        out[rows] = _jsd_rows(lp, lq)
        del lp, lq
    if measure == "js_distance":
        out = out.div_(LN2).clamp_(0.0, 1.0).sqrt_()
    return out.view(B, T)


def relevance_against_reference(
    logits_ref: torch.Tensor,
    logits_variants: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    measure: str = "js_distance",
    chunk_size: Optional[int] = None,
    compiled: bool = False,
    need_logp: bool = True,
    ref_lse: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Relevance of J prompt variants against one reference (P_all) over the same response, in one pass.

    The replay's inner loop: P_all's log-softmax is computed once per chunk of positions and shared by
    every variant (instead of once per variant), and the sampled ids' log-probs under P_all come out
    of the same pass.

    Args:
        logits_ref: [T, V] logits under P_all; logits_variants: [J, T, V] under each P_minus.
        ids: [T] sampled response ids; mask: [T] valid positions.
        measure: ``js_distance`` | ``js_divergence`` | ``logprob_contrast``.
        compiled: the ``torch.compile``d kernel: each variant's log-softmax fused with the JSD, P_all's
            taken from its log-normaliser (one logsumexp per position, shared by the variants).
        need_logp: False when the caller does not use the log-probs (then they may come back as 0).
        ref_lse: [T] P_all's log-normaliser (:func:`logsumexp_rows`) when the caller already has it
            (the replay computes it once per row); only the compiled path reads it.

    Returns:
        (q [J, T] fp32, log p(y_t | P_all) [T] fp32), 0 where masked.
    """
    if measure not in MEASURES + ("logprob_contrast",):
        raise ValueError(f"measure must be one of {MEASURES + ('logprob_contrast',)}, got {measure!r}")
    T, V = logits_ref.shape
    J = logits_variants.shape[0]
    if logits_variants.shape[1:] != (T, V) or ids.shape != (T,) or mask.shape != (T,):
        raise ValueError("shapes must be ref [T, V], variants [J, T, V], ids [T], mask [T]")
    q = torch.zeros(J, T, dtype=torch.float32, device=logits_ref.device)
    logp = torch.zeros(T, dtype=torch.float32, device=logits_ref.device)
    fused = compiled and measure != "logprob_contrast"
    for rows, contiguous in _chunks(mask.unsqueeze(0), (1, T), chunk_size, V):
        if fused:  # P_all's log-softmax is never written out as [chunk, V] fp32: its log-normaliser suffices
            ref = _rows(logits_ref, rows, contiguous)
            lse = ref_lse.index_select(0, rows) if ref_lse is not None else logsumexp_rows(ref, temperature, compiled=True)
            for j in range(J):
                q[j, rows] = _fused_jsd(ref, lse, _rows(logits_variants[j], rows, contiguous), temperature)
            if need_logp:
                logp[rows] = picked_logprobs(ref, ids.index_select(0, rows), temperature, lse)
            continue
        lp = _log_softmax_fp32(_rows(logits_ref, rows, contiguous), temperature)
        picked = ids.index_select(0, rows).unsqueeze(-1)
        logp[rows] = lp.gather(-1, picked).squeeze(-1)
        for j in range(J):
            lq = _log_softmax_fp32(_rows(logits_variants[j], rows, contiguous), temperature)
            if measure == "logprob_contrast":
                q[j, rows] = (logp[rows] - lq.gather(-1, picked).squeeze(-1)).abs_()
            else:
                q[j, rows] = _jsd_rows(lp, lq)
            del lq
        del lp
    if measure == "js_distance":
        q = q.div_(LN2).clamp_(0.0, 1.0).sqrt_()
    return q, logp


def picked_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float,
                    lse: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[N] log softmax(logits / temperature)[ids] of [N, V] logits in fp32, without writing the [N, V]
    log-softmax: ``z_y - logsumexp(z)`` (``lse``: that logsumexp, when known), floored as
    :func:`_log_softmax_fp32` floors."""
    if lse is None:
        lse = logsumexp_rows(logits, temperature)
    out = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1).float() / temperature - lse
    bad = torch.isnan(out)
    if bool(bad.any()):  # NaN / +inf logits (hostile input): the repaired log-softmax, as the eager path
        rows = bad.nonzero(as_tuple=False).squeeze(-1)
        lp = _log_softmax_fp32(logits.index_select(0, rows), temperature)
        out[rows] = lp.gather(-1, ids.index_select(0, rows).unsqueeze(-1)).squeeze(-1)
    return out.clamp_(min=_LOGP_FLOOR)


def sampled_logprobs_from_logits(
    logits: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: Optional[int] = None,
) -> torch.Tensor:
    """log p(y_t) of the sampled ids under softmax(logits / temperature), chunked; 0 where masked.

    ``log p(y) = z_y - logsumexp(z)`` with ``z = logits / temperature`` in fp32: the same quantity verl's
    ``logprobs_from_logits`` gives for old_log_probs.
    """
    if logits.dim() != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(f"logits [B, T, V] and ids [B, T] expected, got {tuple(logits.shape)}, {tuple(ids.shape)}")
    B, T, V = logits.shape
    out = torch.zeros(B * T, dtype=torch.float32, device=logits.device)
    flat = logits.reshape(B * T, V)
    flat_ids = ids.reshape(-1)
    for rows, contiguous in _chunks(mask, logits.shape[:2], chunk_size, V):
        z = _rows(flat, rows, contiguous).float()
        if temperature != 1.0:
            z = z / temperature
        picked = z.gather(-1, flat_ids.index_select(0, rows).unsqueeze(-1)).squeeze(-1)
        out[rows] = picked - torch.logsumexp(z, dim=-1)
    return out.view(B, T)


def logprob_contrast_from_logits(
    logits_a: torch.Tensor,
    logits_b: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: Optional[int] = None,
) -> torch.Tensor:
    """CoRT-style measure ``|log p(y_t | a) - log p(y_t | b)|`` of the sampled ids, [B, T]; 0 where masked.

    Unbounded above (nats). -inf log-probs are floored at -1e4 so the contrast stays finite.
    """
    la = sampled_logprobs_from_logits(logits_a, ids, mask, temperature, chunk_size).clamp_(min=_LOGP_FLOOR)
    lb = sampled_logprobs_from_logits(logits_b, ids, mask, temperature, chunk_size).clamp_(min=_LOGP_FLOOR)
    return (la - lb).abs_() * mask.to(la.dtype)

