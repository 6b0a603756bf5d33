"""The self-teachers' divergences between a teacher's and a student's next-token distributions (docs/opsd.md).

Pure torch, over log-probabilities on the last dimension (any leading shape, e.g. [N, V] or [N, K]); the
callers choose the support (full vocabulary, a renormalised top-k, a top-k plus a tail bucket) with
:func:`renormalise` and :func:`with_tail_bucket`, then take :func:`generalized_jsd`. One convention for
both references (OPSD's ``beta``, SDPO's ``alpha``: the same coefficient), with T the teacher, S the student:

    M_beta         = beta * p_T + (1 - beta) * p_S
    JSD_beta(T, S) = beta * KL(p_T || M_beta) + (1 - beta) * KL(p_S || M_beta)
    JSD_0          = KL(p_T || p_S)       (forward KL; the limit of JSD_beta / beta as beta -> 0)
    JSD_1          = KL(p_S || p_T)       (reverse KL)

At 0 and 1 the references (OPSD's ``generalized_jsd_loss``, SDPO's ``compute_self_distillation_loss``) take
the KL itself, not the (vanishing) limit of the mixture formula, and so does :func:`generalized_jsd`.
"""

from __future__ import annotations

import math

import torch

#: log-probabilities are floored here before use (exp of it is 0 in fp32): -inf entries stay finite
LOGP_FLOOR = -1.0e4


def _floor(logp: torch.Tensor) -> torch.Tensor:
    return logp.float().clamp(min=LOGP_FLOOR)


def kl_from_logps(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """``KL(a || b) = sum_v a_v (log a_v - log b_v)`` over the last dimension, [...]; 0 where a_v = 0."""
    la, lb = _floor(logp_a), _floor(logp_b)
    pa = la.exp()
    return (pa * (la - lb)).sum(-1)


def mixture_logp(logp_t: torch.Tensor, logp_s: torch.Tensor, beta: float) -> torch.Tensor:
    """``log M_beta = log(beta p_T + (1 - beta) p_S)``, [..., V], for 0 < beta < 1."""
    lt, ls = _floor(logp_t), _floor(logp_s)
    return torch.logaddexp(lt + math.log(beta), ls + math.log1p(-beta))


def generalized_jsd(logp_t: torch.Tensor, logp_s: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Per position ``JSD_beta(T, S)`` over the last dimension, [...] (module docstring for the formula).

    ``logp_t`` / ``logp_s``: log-probabilities of the teacher / student over the same support, [..., V].
    ``beta`` in [0, 1]: 0 is the forward KL ``KL(p_T || p_S)``, 1 the reverse KL ``KL(p_S || p_T)``.
    Differentiable in both arguments (the callers detach the teacher).
    """
    if not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return kl_from_logps(logp_t, logp_s)
    if beta == 1.0:
        return kl_from_logps(logp_s, logp_t)
    m = mixture_logp(logp_t, logp_s, beta)
    return beta * kl_from_logps(logp_t, m) + (1.0 - beta) * kl_from_logps(logp_s, m)


def renormalise(logp: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of a subset renormalised to sum to 1: ``log p_v - log sum_{u in K} p_u``, [..., K]."""
    logp = _floor(logp)
    return logp - torch.logsumexp(logp, dim=-1, keepdim=True)


def with_tail_bucket(logp_topk: torch.Tensor) -> torch.Tensor:
    """A top-k plus one bucket for the rest of the vocabulary, [..., K + 1]:

        log p_tail = log(1 - sum_{v in K} p_v)        (= log(-expm1(logsumexp(log p_K))), clamped below 0)

    as SDPO's ``add_tail``: the K + 1 entries form a distribution without renormalising the top-k.
    """
    logp_topk = _floor(logp_topk)
    log_s = torch.logsumexp(logp_topk, dim=-1, keepdim=True).clamp(max=-1e-7)
    tail = torch.log(-torch.expm1(log_s))
    return torch.cat([logp_topk, tail], dim=-1)
