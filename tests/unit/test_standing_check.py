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
from omegaconf import OmegaConf

from recipe.mrtpo.core.passes import PassSettings
from recipe.mrtpo.core.replay import hf_forward, replay_relevance
from recipe.mrtpo.core.standing_check import FUSED_CHECK_THRESHOLDS, floor_token_budget, row_means, standing_check

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

    from recipe.mrtpo.seams import verl_seam

    assert {"keys", "tags", "partition_id", "extra_info"} <= {f.name for f in dataclasses.fields(KVBatchMeta)}
    b = KVBatchMeta(keys=["a", "b", "c"], tags=[{"i": 0}, {"i": 1}, {"i": 2}], partition_id="train", extra_info={"x": 1})
    r = verl_seam.reordered(b, [2, 1, 0])
    assert r.keys == ["c", "b", "a"] and [t["i"] for t in r.tags] == [2, 1, 0] and r.partition_id == "train"
    assert b.keys == ["a", "b", "c"] and r.extra_info == b.extra_info == {"x": 1} and r.extra_info is not b.extra_info
    floor = verl_seam.reordered(b, [2, 1, 0], {"max_token_len_per_gpu": 96})  # the floor's settings: its call's alone
    assert floor.extra_info == {"x": 1, "max_token_len_per_gpu": 96} and b.extra_info == {"x": 1}
    KVBatchMeta(keys=r.keys, tags=r.tags, partition_id=r.partition_id)  # a valid batch by TransferQueue's own checks


# ------------------------------------------------------------------ decided per row
def _noisy(B: int, T: int, seed: int, scale: float = 0.04):
    """verl's log-probs and two packings' rounding of them at the 7B bf16 scale (a row's mean |d| ~ ``scale``,
    long-tailed per token), rows of 16..T tokens."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(16, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lens[:, None]).long()
    verl = -torch.rand(B, T, generator=g) * 5
    noise = lambda: torch.distributions.Laplace(0.0, scale).sample((B, T)) * mask  # noqa: E731
    torch.manual_seed(seed)
    return verl, verl + noise(), verl + noise(), mask


@pytest.mark.parametrize("seed", range(20))
def test_a_1_nat_fault_on_2_percent_of_rows_is_caught_where_the_mean_passes_it(seed):
    B, T = 250, 400
    verl, fused, floor, mask = _noisy(B, T, seed)
    quiet, warn = standing_check(fused, verl, floor, mask, None, FUSED_CHECK_THRESHOLDS["bf16"])
    assert not warn, quiet  # repacking noise alone: each row within twice the largest floor row
    faulty = fused.clone()
    rows = torch.randperm(B, generator=torch.Generator().manual_seed(100 + seed))[: B // 50]  # 2% of the rows
    faulty[rows] += 1.0 * mask[rows]
    m, warn = standing_check(faulty, verl, floor, mask, None, FUSED_CHECK_THRESHOLDS["bf16"])
    assert warn and m["mrtpo/consistency/fused_check_rows_above"] == len(rows), m
    # the batch mean moved by ~0.02 and stays under 2 x the floor's mean + the tolerance: the old rule passed it
    assert m["mrtpo/consistency/fused_vs_verl_mean"] < 2 * m["mrtpo/consistency/verl_vs_verl_mean"] + FUSED_CHECK_THRESHOLDS["bf16"]
    assert m["mrtpo/consistency/fused_vs_verl_row_max"] > 0.9 and m["mrtpo/consistency/verl_vs_verl_row_max"] < 0.1


def test_a_one_row_fault_on_real_bf16_repacking_noise(bf16_model):
    """The pass engine's bf16 log-probs of 50 rows under three packings: verl's (padded micro-batches), the floor's
    (each sequence alone) and the fused pass's (packed rows): quiet, and one row (2%) 1 nat off is caught."""
    n = 50
    g = torch.Generator().manual_seed(3)
    plen, rlen = torch.randint(8, 40, (n,), generator=g).tolist(), torch.randint(6, 48, (n,), generator=g).tolist()
    P, T = max(plen), max(rlen)
    var = torch.zeros(n, 1, P, dtype=torch.long)
    for r in range(n):
        var[r, 0, P - plen[r]:] = torch.randint(1, VOCAB, (plen[r],), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(rlen)[:, None]).long()
    resp = torch.randint(1, VOCAB, (n, T), generator=g) * mask

    def lp(layout, budget=None):
        settings = PassSettings(temperature=1.0, micro_batch_size=4, token_budget=budget, layout=layout,
                                packed_attention="block_mask")
        return replay_relevance(hf_forward(bf16_model), var, torch.tensor(plen).view(n, 1), resp, mask,
                                torch.full((n, 1), -1), settings=settings,
                                logprob_variant=torch.zeros(n, dtype=torch.long))["replay_logprobs"]

    verl, floor, fused = lp("padded"), lp("single"), lp("packed", budget=256)
    m, warn = standing_check(fused, verl, floor, mask, None, FUSED_CHECK_THRESHOLDS["bf16"])
    assert not warn and m["mrtpo/consistency/verl_vs_verl_row_max"] > 0, m
    fused[7] += 1.0 * mask[7]
    m, warn = standing_check(fused, verl, floor, mask, None, FUSED_CHECK_THRESHOLDS["bf16"])
    assert warn and m["mrtpo/consistency/fused_check_rows_above"] == 1, m


def test_row_means_leave_out_padding_rows_and_empty_rows():
    a = torch.tensor([[1.0, 2.0, 9.0], [0.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    assert row_means(a, torch.zeros(3, 3), mask).tolist() == [1.5, 5.0]
    assert row_means(a, torch.zeros(3, 3), mask, torch.tensor([True, True, False])).tolist() == [1.5]


# ------------------------------------------------------------------ the floor repacks, through verl's own dispatch
def _placements(lengths: list[int], dp: int, order: list[int], budget: int) -> dict:
    """Each row's micro-batch (the rows it is forwarded with) and token offset in it, as verl 0.9.1 places the batch
    in ``order``: TransferQueue's ``BatchMeta.chunk`` over the data-parallel ranks (what verl's dispatch calls on
    the batch), then each rank's rows split by the engine's own ``prepare_micro_batches`` under a dynamic batch
    size at ``budget`` tokens."""
    from tensordict import TensorDict
    from transfer_queue.metadata import BatchMeta
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    out = {}
    for chunk in BatchMeta(global_indexes=list(order), partition_ids=["train"] * len(order)).chunk(dp):
        rows = list(chunk.global_indexes)
        ids = torch.nested.as_nested_tensor([torch.ones(lengths[r], dtype=torch.long) for r in rows], layout=torch.jagged)
        td = TensorDict({"input_ids": ids}, batch_size=[len(rows)])
        tu.assign_non_tensor(td, use_dynamic_bsz=True, max_token_len_per_gpu=budget)
        _, parts = prepare_micro_batches(td)
        for part in parts:
            members, offset = frozenset(rows[j] for j in part), 0
            for j in part:
                out[rows[j]] = (members, offset)
                offset += lengths[rows[j]]
    return out


@pytest.mark.parametrize("B, dp, budget", [(256, 1, 16384), (256, 8, 16384), (1024, 8, 24576), (96, 2, 4096)])
def test_the_floor_moves_most_rows_to_another_micro_batch_through_verls_dispatch(B, dp, budget):
    """verl balances a rank's micro-batches by the rows' lengths alone: the batch in reverse order puts each rank's
    rows (on 8 ranks: exactly a rank's rows of before) into the same micro-batches, at other offsets only (which
    need not change a row's numbers). The floor's repacking (reverse order, ``floor_settings``' budget) gives
    nearly every row other companions, hence another micro-batch shape."""
    import numpy as np

    from recipe.mrtpo.seams import verl_seam

    g = np.random.default_rng(B + dp)
    lengths = np.clip(g.lognormal(7.2, 0.6, B).astype(int), 50, budget // 2).tolist()
    base = _placements(lengths, dp, list(range(B)), budget)
    reverse = _placements(lengths, dp, list(range(B))[::-1], budget)
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"log_prob_use_dynamic_bsz": True,
                                                                 "log_prob_max_token_len_per_gpu": budget}}})
    settings = verl_seam.floor_settings(config, lengths)
    assert settings == {"max_token_len_per_gpu": max(max(lengths), budget * 3 // 4)}
    floor = _placements(lengths, dp, list(range(B))[::-1], settings["max_token_len_per_gpu"])
    moved = lambda p: sum(p[r][0] != base[r][0] for r in range(B)) / B  # noqa: E731  - other companions
    placed = lambda p: sum(p[r] != base[r] for r in range(B)) / B  # noqa: E731  - other companions or offset
    assert placed(reverse) > 0.9 and placed(floor) > 0.9
    assert moved(floor) > 0.9, moved(floor)
    if dp == 8:
        assert moved(reverse) < 0.6  # the reverse order alone leaves many rows with the same companions


def test_the_floor_keeps_verls_settings_without_a_dynamic_batch_size():
    from recipe.mrtpo.seams import verl_seam

    fixed = OmegaConf.create({"actor_rollout_ref": {"rollout": {"log_prob_use_dynamic_bsz": False,
                                                                "log_prob_max_token_len_per_gpu": 4096}}})
    assert verl_seam.floor_settings(fixed, [100, 200]) == {}
    dynamic = OmegaConf.create({"actor_rollout_ref": {"rollout": {"log_prob_use_dynamic_bsz": True,
                                                                  "log_prob_max_token_len_per_gpu": 4096}}})
    assert verl_seam.floor_settings(dynamic, [100, 3500]) == {"max_token_len_per_gpu": 3500}  # never below the longest
    assert floor_token_budget(4096, 100) == 3072
