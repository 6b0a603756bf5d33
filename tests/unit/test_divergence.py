"""core.divergence against the references' formulas, re-stated here in numpy (OPSD's generalized_jsd_loss,
SDPO's add_tail / renorm_topk_log_probs) and at the limits beta = 0 (forward KL) and 1 (reverse KL)."""

import numpy as np
import pytest
import torch

from recipe.mrtpo.core.divergence import generalized_jsd, kl_from_logps, renormalise, with_tail_bucket


def _probs(rng, shape):
    z = rng.normal(size=shape) * 2.0
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _kl(a, b):
    return (a * (np.log(a) - np.log(b))).sum(-1)


def _jsd(pt, ps, beta):
    if beta == 0.0:
        return _kl(pt, ps)
    if beta == 1.0:
        return _kl(ps, pt)
    m = beta * pt + (1 - beta) * ps
    return beta * _kl(pt, m) + (1 - beta) * _kl(ps, m)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_matches_the_definition(beta):
    rng = np.random.default_rng(0)
    pt, ps = _probs(rng, (5, 7, 11)), _probs(rng, (5, 7, 11))
    got = generalized_jsd(torch.tensor(np.log(pt)), torch.tensor(np.log(ps)), beta).numpy()
    np.testing.assert_allclose(got, _jsd(pt, ps, beta), rtol=1e-5, atol=1e-6)
    assert got.shape == (5, 7)


def test_the_limits_are_the_two_kls_and_the_mixture_tends_to_them():
    rng = np.random.default_rng(1)
    pt, ps = _probs(rng, (4, 9)), _probs(rng, (4, 9))
    lt, ls = torch.tensor(np.log(pt)), torch.tensor(np.log(ps))
    np.testing.assert_allclose(generalized_jsd(lt, ls, 0.0), _kl(pt, ps), rtol=1e-5)
    np.testing.assert_allclose(generalized_jsd(lt, ls, 1.0), _kl(ps, pt), rtol=1e-5)
    # JSD_beta / beta -> KL(T || S) as beta -> 0, JSD_beta / (1 - beta) -> KL(S || T) as beta -> 1
    np.testing.assert_allclose(generalized_jsd(lt.double(), ls.double(), 1e-4) / 1e-4, _kl(pt, ps), rtol=2e-3)
    np.testing.assert_allclose(generalized_jsd(lt.double(), ls.double(), 1 - 1e-4) / 1e-4, _kl(ps, pt), rtol=2e-3)
    # symmetric at 0.5, and bounded by ln 2
    half = generalized_jsd(lt, ls, 0.5)
    torch.testing.assert_close(half, generalized_jsd(ls, lt, 0.5))
    assert float(half.max()) <= np.log(2) + 1e-6


def test_identical_distributions_give_zero_and_minus_inf_entries_are_finite():
    logp = torch.log_softmax(torch.tensor([[0.0, 1.0, float("-inf"), 2.0]]), -1)
    for beta in (0.0, 0.5, 1.0):
        out = generalized_jsd(logp, logp, beta)
        assert torch.isfinite(out).all() and float(out.abs().max()) < 1e-6


def test_gradient_reaches_the_student_only_where_asked():
    rng = np.random.default_rng(2)
    lt = torch.tensor(np.log(_probs(rng, (3, 6))))
    z = torch.randn(3, 6, requires_grad=True)
    generalized_jsd(lt, torch.log_softmax(z, -1), 0.5).sum().backward()
    assert z.grad is not None and float(z.grad.abs().sum()) > 0


def test_renormalised_topk_is_the_opsd_reference_restriction():
    # OPSD's top_k: gather the teacher's top-k ids from both, log_softmax over them
    rng = np.random.default_rng(3)
    zt, zs = rng.normal(size=(4, 20)), rng.normal(size=(4, 20))
    k = 5
    idx = np.argsort(-zt, -1)[:, :k]
    gt, gs = np.take_along_axis(zt, idx, -1), np.take_along_axis(zs, idx, -1)
    ref_t = np.exp(gt) / np.exp(gt).sum(-1, keepdims=True)
    ref_s = np.exp(gs) / np.exp(gs).sum(-1, keepdims=True)
    lt_full = torch.log_softmax(torch.tensor(zt), -1)
    ls_full = torch.log_softmax(torch.tensor(zs), -1)
    ti = torch.tensor(idx)
    lt, ls = renormalise(lt_full.gather(-1, ti)), renormalise(ls_full.gather(-1, ti))
    np.testing.assert_allclose(lt.exp().numpy(), ref_t, rtol=1e-5)
    np.testing.assert_allclose(generalized_jsd(lt, ls, 0.5).numpy(), _jsd(ref_t, ref_s, 0.5), rtol=1e-5)


def test_tail_bucket_holds_the_rest_of_the_mass():
    rng = np.random.default_rng(4)
    p = _probs(rng, (3, 30))
    idx = np.argsort(-p, -1)[:, :8]
    top = np.take_along_axis(p, idx, -1)
    out = with_tail_bucket(torch.tensor(np.log(top))).exp().numpy()
    assert out.shape == (3, 9)
    np.testing.assert_allclose(out[:, :8], top, rtol=1e-6)
    np.testing.assert_allclose(out[:, 8], 1 - top.sum(-1), rtol=1e-5)
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-6)
    # a top-k that already holds all the mass: a tail of ~0, still finite
    full = with_tail_bucket(torch.log_softmax(torch.tensor([[1.0, 2.0]]), -1))
    assert torch.isfinite(full).all() and float(full.exp()[0, 2]) < 1e-6


def test_kl_matches_numpy():
    rng = np.random.default_rng(5)
    a, b = _probs(rng, (2, 8)), _probs(rng, (2, 8))
    np.testing.assert_allclose(kl_from_logps(torch.tensor(np.log(a)), torch.tensor(np.log(b))).numpy(), _kl(a, b), rtol=1e-5)


def test_beta_out_of_range_is_refused():
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(torch.zeros(1, 2), torch.zeros(1, 2), 1.5)
