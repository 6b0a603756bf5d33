"""The replay measure: JS distance / divergence and the CoRT log-prob contrast (docs/design.md §1.2)."""

import math

import pytest
import torch

from recipe.mrtpo.core.relevance import (
    js_distance_from_logits,
    logprob_contrast_from_logits,
    sampled_logprobs_from_logits,
)


def jsd_reference(a: torch.Tensor, b: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """float64 textbook JSD in nats: 0.5 KL(p||m) + 0.5 KL(q||m)."""
    p = torch.softmax(a.double() / temperature, -1)
    q = torch.softmax(b.double() / temperature, -1)
    m = 0.5 * (p + q)

    def kl(x, y):
        return torch.where(x > 0, x * (x.log() - y.log()), torch.zeros_like(x)).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def rand_pair(B=3, T=7, V=500, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(B, T, V, generator=g) * 3
    b = a + torch.randn(B, T, V, generator=g) * scale
    return a, b


@pytest.mark.parametrize("scale", [1e-3, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_float64_reference(scale, temperature):
    a, b = rand_pair(scale=scale)
    mask = torch.ones(a.shape[:2])
    ref = jsd_reference(a, b, temperature)
    dist = js_distance_from_logits(a, b, mask, temperature=temperature)
    div = js_distance_from_logits(a, b, mask, temperature=temperature, measure="js_divergence")
    assert (dist.double() - (ref / math.log(2)).clamp(0, 1).sqrt()).abs().max() < 2e-3
    assert (div.double() - ref).abs().max() < 1e-5
    assert dist.dtype == torch.float32


def test_identical_is_zero_and_disjoint_is_one():
    V = 64
    a = torch.randn(2, 4, V)
    mask = torch.ones(2, 4)
    assert js_distance_from_logits(a, a.clone(), mask).abs().max() == 0
    p = torch.full((1, 2, V), -float("inf"))
    q = torch.full((1, 2, V), -float("inf"))
    p[..., :10] = 0.0
    q[..., 10:20] = 0.0
    d = js_distance_from_logits(p, q, torch.ones(1, 2))
    assert torch.allclose(d, torch.ones(1, 2))
    div = js_distance_from_logits(p, q, torch.ones(1, 2), measure="js_divergence")
    assert torch.allclose(div, torch.full((1, 2), math.log(2)))


def test_huge_and_inf_logits_are_finite_and_correct():
    V = 300
    g = torch.Generator().manual_seed(1)
    a = torch.randn(1, 3, V, generator=g) * 1e30
    b = torch.randn(1, 3, V, generator=g) * 1e30
    a[0, 0, :100] = -float("inf")
    b[0, 1, 50:] = -float("inf")
    d = js_distance_from_logits(a, b, torch.ones(1, 3))
    assert torch.isfinite(d).all()
    ref = (jsd_reference(a.nan_to_num(neginf=-3e38), b.nan_to_num(neginf=-3e38)) / math.log(2)).clamp(0, 1).sqrt()
    assert (d.double() - ref).abs().max() < 2e-3
    # +inf and NaN logits are hostile input: still finite, still in [0, 1]
    c = a.clone()
    c[0, 2, 0] = float("inf")
    c[0, 2, 1] = float("nan")
    d2 = js_distance_from_logits(c, b, torch.ones(1, 3))
    assert torch.isfinite(d2).all() and (d2 >= 0).all() and (d2 <= 1).all()


def test_mask_zero_positions_are_zero():
    a, b = rand_pair(scale=5.0)
    mask = torch.zeros(a.shape[:2])
    mask[0, :3] = 1
    mask[2, 5] = 1
    d = js_distance_from_logits(a, b, mask)
    assert (d[mask == 0] == 0).all()
    assert (d[mask == 1] > 0).all()


@pytest.mark.parametrize("chunk", [1, 3, 5, 1000])
def test_chunked_equals_unchunked(chunk):
    a, b = rand_pair(B=2, T=9, scale=2.0)
    mask = torch.ones(a.shape[:2])
    mask[1, 6:] = 0
    full = js_distance_from_logits(a, b, mask, chunk_size=10_000)
    part = js_distance_from_logits(a, b, mask, chunk_size=chunk)
    assert torch.equal(full, part)


def test_chunking_bounds_fp32_expansion(monkeypatch):
    """No more than chunk_size positions are ever expanded to fp32 at once."""
    import recipe.mrtpo.core.relevance as rel

    seen = []
    orig = rel._log_softmax_fp32

    def spy(x, t):
        seen.append(x.shape[0])
        return orig(x, t)

    monkeypatch.setattr(rel, "_log_softmax_fp32", spy)
    a, b = rand_pair(B=4, T=10)
    rel.js_distance_from_logits(a, b, torch.ones(4, 10), chunk_size=7)
    assert max(seen) <= 7 and sum(seen) == 2 * 40


def test_bf16_input():
    a, b = rand_pair(scale=1.0)
    mask = torch.ones(a.shape[:2])
    d16 = js_distance_from_logits(a.bfloat16(), b.bfloat16(), mask)
    ref = (jsd_reference(a.bfloat16().float(), b.bfloat16().float()) / math.log(2)).clamp(0, 1).sqrt()
    assert d16.dtype == torch.float32
    assert (d16.double() - ref).abs().max() < 2e-3


def test_sampled_logprobs_and_contrast():
    a, b = rand_pair(B=2, T=5, V=50, scale=1.0)
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 5)
    mask[1, 4] = 0
    lp = sampled_logprobs_from_logits(a, ids, mask, temperature=0.8)
    ref = torch.log_softmax(a / 0.8, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1) * mask
    assert torch.allclose(lp, ref, atol=1e-5)
    c = logprob_contrast_from_logits(a, b, ids, mask)
    la = torch.log_softmax(a, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    lb = torch.log_softmax(b, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(c, (la - lb).abs() * mask, atol=1e-5)
    assert logprob_contrast_from_logits(a, a, ids, mask).abs().max() == 0


def test_bad_arguments_raise():
    a, b = rand_pair()
    with pytest.raises(ValueError):
        js_distance_from_logits(a, b, torch.ones(a.shape[:2]), measure="kl")
    with pytest.raises(ValueError):
        js_distance_from_logits(a, b[:, :-1], torch.ones(a.shape[:2]))
    with pytest.raises(ValueError):
        js_distance_from_logits(a, b, torch.ones(1, 1))


def _has_inductor_toolchain() -> bool:
    import shutil

    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.skipif(not _has_inductor_toolchain(), reason="torch.compile (Inductor) needs a C++ compiler on CPU")
def test_compiled_kernel_matches_eager_and_reference():
    """mrtpo.compile_js: the torch.compile'd kernel gives the eager values (fp32 rounding) for several row
    counts (dynamic shapes, the last chunk is shorter), masked rows, identical and disjoint rows."""
    from recipe.mrtpo.core.relevance import relevance_against_reference

    a, b = rand_pair(B=2, T=9, V=300, scale=1.0)
    mask = torch.ones(2, 9)
    mask[1, 6:] = 0
    b[0, 0] = a[0, 0]  # identical row -> 0
    b[0, 1] = -a[0, 1] * 50  # nearly disjoint row
    ids0 = torch.zeros(9, dtype=torch.long)

    def compiled_rows(x, y, chunk=None, **kw):  # the replay's kernel, one variant per batch row
        return torch.stack([relevance_against_reference(x[i], y[i : i + 1], ids0, mask[i], chunk_size=chunk, compiled=True,
                                                        **kw)[0][0] for i in range(x.shape[0])])

    for chunk in (None, 4, 5):
        eager = js_distance_from_logits(a, b, mask, chunk_size=chunk, measure="js_divergence")
        comp = compiled_rows(a, b, chunk, measure="js_divergence")
        assert (comp - eager).abs().max() < 1e-6, chunk
    ref = jsd_reference(a, b)
    assert (comp.double() - ref * mask).abs().max() < 1e-5
    assert comp[0, 0] == 0 and comp[1, 6:].abs().max() == 0
    q_e, lp_e = relevance_against_reference(a[0], b, ids0, mask[0], chunk_size=4)
    q_c, lp_c = relevance_against_reference(a[0], b, ids0, mask[0], chunk_size=4, compiled=True)
    assert (q_c - q_e).abs().max() < 1e-5 and (lp_c - lp_e).abs().max() < 1e-5 and q_c[0, 0] == 0
    # hostile rows (NaN / +inf / -inf logits) come out as the eager path repairs them, at temperature != 1
    a[0, 2, 5], b[0, 3, 7], b[0, 4, :50] = float("nan"), float("inf"), -float("inf")
    eager = js_distance_from_logits(a, b, mask, temperature=0.7)
    comp = compiled_rows(a, b, temperature=0.7)
    assert torch.isfinite(comp).all() and (comp - eager).abs().max() < 1e-4
    q_e, _ = relevance_against_reference(a[0], b, torch.zeros(9, dtype=torch.long), mask[0], temperature=0.7)
    q_c, _ = relevance_against_reference(a[0], b, torch.zeros(9, dtype=torch.long), mask[0], temperature=0.7, compiled=True)
    assert torch.isfinite(q_c).all() and (q_c - q_e).abs().max() < 1e-4
    # one variant: P_all's log-softmax is fused as well, its log-probs come from a logsumexp (same values,
    # hostile rows included); need_logp=False leaves them out
    ids = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(3))
    for temp in (1.0, 0.7):
        q_e, lp_e = relevance_against_reference(a[0], b[:1], ids, mask[0], temperature=temp, chunk_size=4)
        q_c, lp_c = relevance_against_reference(a[0], b[:1], ids, mask[0], temperature=temp, chunk_size=4, compiled=True)
        assert torch.isfinite(q_c).all() and (q_c - q_e).abs().max() < 1e-4, temp
        assert torch.isfinite(lp_c).all() and (lp_c - lp_e).abs().max() < 1e-4, temp
    _, lp_none = relevance_against_reference(a[0], b[:1], ids, mask[0], compiled=True, need_logp=False)
    assert lp_none.abs().max() == 0
