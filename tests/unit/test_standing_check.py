"""The standing check tells a fault from rounding (``core.standing_check``): calibrated on the floor measured
in the same step (verl's own pass against itself packed otherwise), it stays quiet on real bf16 repacking noise and
warns on a planted fault: stale weights, a shifted temperature, a row mapped to another sample.

The log-probs come from the recipe's pass engine on a small random Qwen2 held in bf16 on CPU, under three packings
(padded micro-batches, each sequence alone, sorted, packed rows under two budgets; on CPU the
rows' order alone leaves bf16 padded micro-batches bitwise equal, so the floor's packing here is "each sequence
alone"), as verl's and the fused
pass's forwards pack the same rows differently.
"""

from __future__ import annotations

import copy

import pytest
import torch

from recipe.mrtpo.core.passes import PassSettings
from recipe.mrtpo.core.replay import hf_forward, replay_relevance
from recipe.mrtpo.core.standing_check import FUSED_CHECK_THRESHOLDS, standing_check

R, VOCAB = 8, 512


@pytest.fixture(scope="module")
def bf16_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random init at std 0.02 is nearly uniform: sharpen it so that rounding shows
        for p in model.parameters():
            p.mul_(6.0)
    return model.to(torch.bfloat16)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    plen = torch.randint(8, 40, (R,), generator=g).tolist()
    rlen = torch.randint(6, 48, (R,), generator=g).tolist()
    P, T = max(plen), max(rlen)
    var = torch.zeros(R, 1, P, dtype=torch.long)
    lens = torch.tensor(plen).view(R, 1)
    for r in range(R):
        var[r, 0, P - plen[r]:] = torch.randint(1, VOCAB, (plen[r],), generator=g)
    resp = torch.randint(1, VOCAB, (R, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(rlen)[:, None]).long()
    return var, lens, resp * mask, mask


def log_probs(model, batch, layout: str, order=None, temperature: float = 1.0, budget=None) -> torch.Tensor:
    """[R, T] log-probs of the sampled tokens under P_all from the pass engine, the rows forwarded in ``order``."""
    var, lens, resp, mask = batch
    idx = torch.arange(R) if order is None else torch.tensor(order)
    settings = PassSettings(temperature=temperature, micro_batch_size=4, token_budget=budget, layout=layout,
                            packed_attention="block_mask")
    out = replay_relevance(hf_forward(model), var[idx], lens[idx], resp[idx], mask[idx], torch.full((R, 1), -1),
                           settings=settings, logprob_variant=torch.zeros(R, dtype=torch.long))["replay_logprobs"]
    assert (out[mask[idx] > 0] < 0).all()  # real log-probs, on every response token
    inv = torch.empty(R, dtype=torch.long)
    inv[idx] = torch.arange(R)
    return out[inv]


def check(fused, verl, verl2, mask):
    return standing_check(fused, verl, verl2, mask, torch.ones(R, dtype=torch.bool), FUSED_CHECK_THRESHOLDS["bf16"])


def test_quiet_on_bf16_repacking_noise_and_the_floor_is_real(bf16_model, batch):
    mask = batch[3]
    verl = log_probs(bf16_model, batch, "padded")
    verl2 = log_probs(bf16_model, batch, "single")  # verl's pass packed otherwise: each sequence alone
    assert torch.equal(log_probs(bf16_model, batch, "padded", order=list(range(R))[::-1]), verl)  # the rows' order alone
    for fused in (log_probs(bf16_model, batch, "sorted"), log_probs(bf16_model, batch, "packed", budget=256),
                  log_probs(bf16_model, batch, "packed", order=list(range(R))[::-1], budget=64)):
        m, warn = check(fused, verl, verl2, mask)
        assert not warn, m
        assert m["mrtpo/consistency/fused_vs_verl_mean"] > 0  # bf16 rounding differs by packing: real noise
        assert m["mrtpo/consistency/verl_vs_verl_mean"] > 0  # and so does verl's own pass: the floor is measured


@pytest.mark.parametrize("fault", ["stale_weights", "temperature", "wrong_row"])
def test_warns_on_a_planted_fault(bf16_model, batch, fault):
    mask = batch[3]
    verl = log_probs(bf16_model, batch, "padded")
    verl2 = log_probs(bf16_model, batch, "single")
    if fault == "stale_weights":  # the fused pass on the weights before an update (a small step on every weight)
        stale = copy.deepcopy(bf16_model)
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in stale.parameters():
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.01 * p.float().std().to(p.dtype))
        fused = log_probs(stale, batch, "packed", budget=256)
    elif fault == "temperature":  # the rollout's 1.0 read as 1.1
        fused = log_probs(bf16_model, batch, "packed", budget=256, temperature=1.1)
    else:  # two samples' rows exchanged
        fused = log_probs(bf16_model, batch, "packed", budget=256)[[1, 0, *range(2, R)]]
    m, warn = check(fused, verl, verl2, mask)
    assert warn, m
    assert m["mrtpo/consistency/fused_vs_verl_mean"] > m["mrtpo/consistency/fused_check_threshold"]


def test_the_threshold_is_the_floor_times_the_factor_plus_the_tolerance():
    mask = torch.ones(2, 3, dtype=torch.long)
    verl = torch.zeros(2, 3)
    m, warn = standing_check(verl + 0.045, verl, verl + 0.02, mask, None, 1e-2)
    assert m["mrtpo/consistency/verl_vs_verl_mean"] == pytest.approx(0.02)
    assert m["mrtpo/consistency/fused_check_threshold"] == pytest.approx(2 * 0.02 + 1e-2) and not warn
    m, warn = standing_check(verl + 0.06, verl, verl + 0.02, mask, None, 1e-2)
    assert warn
    m, warn = standing_check(verl + 0.05, verl, None, mask, None, 1e-2)  # no floor: the tolerance alone
    assert warn and m["mrtpo/consistency/verl_vs_verl_mean"] == 0.0


def test_reordered_keeps_transferqueues_batch_shape():
    """``verl_seam.reordered`` relies on TransferQueue 0.1.10's ``KVBatchMeta``: a dataclass with ``keys`` and one
    ``tags`` entry per key (its own validation), the rest shared."""
    import dataclasses

    from transfer_queue.metadata import KVBatchMeta

    from recipe.mrtpo import verl_seam

    assert {"keys", "tags", "partition_id", "extra_info"} <= {f.name for f in dataclasses.fields(KVBatchMeta)}
    b = KVBatchMeta(keys=["a", "b", "c"], tags=[{"i": 0}, {"i": 1}, {"i": 2}], partition_id="train", extra_info={"x": 1})
    r = verl_seam.reordered(b, [2, 1, 0])
    assert r.keys == ["c", "b", "a"] and [t["i"] for t in r.tags] == [2, 1, 0] and r.partition_id == "train"
    assert b.keys == ["a", "b", "c"] and r.extra_info is b.extra_info
    KVBatchMeta(keys=r.keys, tags=r.tags, partition_id=r.partition_id)  # a valid batch by TransferQueue's own checks
