"""The shared forward's block-sparse attention (``core/tree_mask.py``) and its cost model (``core/attention_cost.py``)."""

import tracemalloc

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from recipe.mrtpo.core.attention_cost import ModelShape, dense_counts, forward_flops, layout_counts, shared_pays, varlen_counts
from recipe.mrtpo.core.passes import PassSettings, plan_forwards, row_sequences
from recipe.mrtpo.core.shared_prompts import plan_pass, plan_shared_forwards, shared_forward_inputs
from recipe.mrtpo.core.tree_mask import TreeMask

QWEN25_7B = dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                 intermediate_size=18944, vocab_size=152064)


def tree_batch(groups: int, rows: int, P: int, T: int, NV: int = 3, seed: int = 0, alphabet: int = 150_000):
    """Groups of ``rows`` rows sharing NV prompt variants (P_all, then cuts and a proper prefix of it: prefixes shared
    and branching), each row its own response of a length in [T / 2, T]; every variant replayed. (prompts, responses,
    seqs)."""
    g = torch.Generator().manual_seed(seed)
    R = groups * rows
    prompts = torch.zeros(R, NV, P, dtype=torch.long)
    seqs, lens = [], []
    for gi in range(groups):
        base = torch.randint(0, alphabet, (P,), generator=g)
        variants = [base]
        for v in range(1, NV):
            a = int(torch.randint(1, P - 8, (1,), generator=g))
            variants.append(base[: P - 5] if v == 2 else torch.cat([base[:a], base[a + 4:]]))
        lens.append([len(x) for x in variants])
        for r in range(gi * rows, (gi + 1) * rows):
            for v, x in enumerate(variants):
                prompts[r, v, P - len(x):] = x
    responses = torch.randint(0, alphabet, (R, T), generator=g)
    for r in range(R):
        n = int(torch.randint(T // 2, T + 1, (1,), generator=g))
        seqs += row_sequences(r, list(range(NV)), lens[r // rows], n)
    return prompts, responses, seqs


def dense(tree: TreeMask) -> torch.Tensor:
    q = torch.arange(tree.length)
    return tree.allowed(q[:, None], q[None, :])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_row_sees_exactly_its_own_sequence_before_it(seed):
    """The rule, checked against the sequences themselves: the keys a row attends to, ordered by position id, are
    positions 0 .. its own, holding its sequence's tokens (a small alphabet: prompts sharing and branching)."""
    prompts, responses, seqs = tree_batch(3, 2, 12, 6, NV=4, seed=seed, alphabet=3)
    mb = plan_shared_forwards(seqs, prompts, None, 64)[0]
    ids, tree, pos, keep, starts = shared_forward_inputs(mb, prompts, responses)
    allowed, P = dense(tree), prompts.shape[-1]
    for i, s in enumerate(mb):
        seq = torch.cat([prompts[s.row, s.variant, P - s.prompt_len:], responses[s.row, : s.resp_len]])
        for j in range(s.resp_len):  # the rows whose logits predict the response: the prompt's last, the response's
            q = int(keep[starts[i] + j])
            keys = allowed[q].nonzero()[:, 0]
            keys = keys[pos[0, keys].argsort()]
            assert pos[0, keys].tolist() == list(range(int(pos[0, q]) + 1)), (i, j)
            assert ids[0, keys].tolist() == seq[: int(pos[0, q]) + 1].tolist(), (i, j)
    assert tree.length < sum(s.length for s in mb)  # shared: fewer tokens than the sequences


@pytest.mark.parametrize("block", [8, 16, 128])
def test_block_counts_and_the_block_mask_match_the_rule_tile_by_tile(block):
    prompts, responses, seqs = tree_batch(2, 3, 40, 30, seed=3)
    mb = plan_shared_forwards(seqs, prompts, None, 64)[0]
    _, tree, _, _, _ = shared_forward_inputs(mb, prompts, responses)
    tree = TreeMask(tree.starts, tree.ends, tree.parent, tree.length, block)
    d = dense(tree)
    n = -(-tree.length // block)
    padded = torch.zeros(n * block, n * block, dtype=torch.long)
    padded[: tree.length, : tree.length] = d.long()
    per_tile = padded.reshape(n, block, n, block).sum((1, 3))
    assert np.array_equal(tree.tile_pair_counts(), per_tile.numpy())
    c = tree.block_counts()
    assert c.pairs == int(d.sum()) and c.tiles == int((per_tile > 0).sum()) and c.full_tiles == int((per_tile == block ** 2).sum())
    assert torch.equal(tree.block_mask().to_dense()[0, 0].bool(), per_tile > 0)  # partial and full tiles, nothing else


def test_flex_attention_with_the_block_mask_equals_sdpa_with_the_dense_rule():
    from torch.nn.attention.flex_attention import flex_attention

    prompts, responses, seqs = tree_batch(2, 2, 150, 100, seed=4)
    mb = plan_shared_forwards(seqs, prompts, None, 64)[0]
    _, tree, _, _, _ = shared_forward_inputs(mb, prompts, responses)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, tree.length, 16, generator=g) for h in (4, 2, 2))
    got = flex_attention(q, k, v, block_mask=tree.block_mask(), enable_gqa=True)
    want = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                            attn_mask=dense(tree))
    assert tree.length > 2 * 128 and (got - want).abs().max() < 1e-5


class Allocations(TorchDispatchMode):
    """The largest tensor any torch op (factories included) creates inside the block."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_a_24k_token_shared_forward_is_built_without_anything_of_size_L_x_L():
    """The scripts' 24,576-token forward: its inputs, tree, counts and BlockMask create no tensor and no numpy array
    of more than 64 x L elements (L x L is 6e8; the old dense mask was one), and the check trips on a dense mask."""
    prompts, responses, seqs = tree_batch(6, 4, 1500, 512, NV=2, seed=5)
    mb = plan_shared_forwards(seqs, prompts, None, 64)[0]
    tracemalloc.start()
    try:
        with Allocations() as seen:
            _, tree, _, _, _ = shared_forward_inputs(mb, prompts, responses)
            tree.block_counts()
            tree.block_mask("cpu")
        _, peak = tracemalloc.get_traced_memory()  # numpy's arrays are traced
    finally:
        tracemalloc.stop()
    L = tree.length
    assert L >= 24_576, L
    assert seen.largest <= 64 * L and peak < 64 * L * 8, (seen.largest, peak)
    with Allocations() as old:
        torch.zeros(L, L, dtype=torch.bool)  # what the dense path allocated first
    assert old.largest > 64 * L


def test_the_cost_model_counts_7b_as_its_parameters_say():
    shape = ModelShape.from_config(QWEN25_7B)
    assert shape.head_dim == 128 and shape.kv_heads == 4
    assert shape.linear_weights_per_token() == pytest.approx(6.53e9, rel=0.01)  # Qwen2.5-7B without embeddings
    assert ModelShape.from_config({"text_config": QWEN25_7B}) == shape
    with pytest.raises(ValueError, match="lacks"):
        ModelShape.from_config({"hidden_size": 8})
    # per forward: 2 x N x weights + 4 x pairs x hidden x layers
    c = varlen_counts([24_576])
    assert c.tiles == 192 * 193 // 2 and c.exact_pairs == 24_576 * 24_577 // 2
    assert forward_flops(shape, c) == pytest.approx(2 * 24_576 * 6.53e9 + 4 * c.pairs * 3584 * 28, rel=0.01)
    assert dense_counts(24_576, 0).pairs == 24_576 ** 2


def counts_of(mb, prompts, responses, layout="packed"):
    _, tree, _, _, _ = shared_forward_inputs(mb, prompts, responses)
    from recipe.mrtpo.core.attention_cost import tree_counts

    alone = sum((layout_counts(b, layout) for b in plan_forwards(mb, PassSettings(layout=layout, token_budget=24_576))),
                varlen_counts([]))
    return tree_counts(tree), alone, tree


@pytest.mark.parametrize("block,bound", [(128, 1.25), (32, 1.1)])
def test_the_block_sparse_path_computes_near_the_trees_pairs_and_never_above_varlen_where_chosen(block, bound):
    """At the 7B scripts' shapes (prompts of 1,500 tokens, two variants, groups of 4, responses of 256-512 in 24,576-token
    forwards): the tiles computed hold at most 1.25x the tree's exact pairs at 128-token tiles and 1.1x at 32-token
    tiles (the unaligned ends of the segments: varlen's own tiles hold 1.12-1.15x its triangles here); where the
    forward stays shared, its FLOPs are at most unshared varlen's at 1.5B and 7B."""
    prompts, responses, seqs = tree_batch(6, 4, 1500, 512, NV=2, seed=6)
    shapes = [ModelShape.from_config(QWEN25_7B), ModelShape(1536, 28, 8960, 151936, 12, 2, 128)]
    for mb in plan_shared_forwards(seqs, prompts, 24_576, 64):
        _, tree, _, _, _ = shared_forward_inputs(mb, prompts, responses)
        c = TreeMask(tree.starts, tree.ends, tree.parent, tree.length, block).block_counts()
        assert c.tile_pairs <= bound * c.pairs, c.tile_pairs / c.pairs
        shared, alone, _ = counts_of(mb, prompts, responses)
        for shape in shapes:
            assert shared_pays(shape, shared, alone) and shared.tokens < alone.tokens  # it pays here
            assert forward_flops(shape, shared) <= forward_flops(shape, alone)


def test_plan_pass_runs_a_forward_unshared_exactly_where_the_cost_model_says_so():
    """Per forward: shared iff its FLOPs are at most its sequences' unshared layout's; a forward run unshared is
    replaced by that layout's forwards (its sequences once each) and counted. Short prompts (300 tokens, 6 variants)
    under 512-token responses cost 1.06-1.25x varlen's attention tiles shared: 7B's linear layers make sharing pay,
    an attention-heavy shape (tiny linear layers, many heads) does not."""
    prompts, responses, seqs = tree_batch(3, 4, 300, 512, NV=6, seed=6)
    for shape, expect_fallback in ((ModelShape.from_config(QWEN25_7B), False), (ModelShape(8, 1, 8, 10, 512, 512, 128), True)):
        settings = PassSettings(layout="packed", token_budget=24_576, share_prompts=True, model_shape=shape)
        plan = plan_pass(seqs, prompts, responses, settings, plan_forwards)
        fallbacks = 0
        for mb in plan_shared_forwards(seqs, prompts, 24_576, 8):
            shared, alone, _ = counts_of(mb, prompts, responses)
            fallbacks += not shared_pays(shape, shared, alone)
            assert shared_pays(shape, shared, alone) == (forward_flops(shape, shared) <= forward_flops(shape, alone))
        assert plan.unshared_by_cost == fallbacks and (fallbacks > 0) == expect_fallback
        ran = [s for mb, _ in plan.forwards for s in mb]
        assert sorted(ran, key=lambda s: (s.row, s.variant)) == sorted(seqs, key=lambda s: (s.row, s.variant))
        assert sum(inputs is None for _, inputs in plan.forwards) >= fallbacks


def test_the_segmented_reference_counts_each_segments_queries_over_its_ancestors_and_itself():
    """A 100-token prompt with responses of 200 and 50 tokens (128-token tiles): the prompt 1 tile, the first response
    2 + 3 (its query tiles reach 228 and 300 keys), the second 2 (150 keys); with no sharing it is unshared varlen."""
    from recipe.mrtpo.core.attention_cost import segmented_counts, tree_counts

    tree = TreeMask([0, 100, 300], [100, 300, 350], [-1, 0, 0], 350)
    c = segmented_counts(tree)
    assert c.tiles == 1 + 5 + 2 and c.pairs == 8 * 128 * 128
    assert c.exact_pairs == 100 * 101 // 2 + (200 * 100 + 200 * 201 // 2) + (50 * 100 + 50 * 51 // 2)
    assert c.exact_pairs == tree_counts(tree).exact_pairs == int(tree.block_counts().pairs)
    deep = TreeMask([0, 10, 30, 60], [10, 30, 60, 70], [-1, 0, 1, 2], 70, block=16)  # a chain: one causal sequence
    assert segmented_counts(deep, 16).exact_pairs == 70 * 71 // 2
    alone = TreeMask.sequences([300, 57, 129])
    assert segmented_counts(alone) == varlen_counts([300, 57, 129])
    prompts, responses, seqs = tree_batch(3, 4, 300, 512, NV=3, seed=2)
    for mb in plan_shared_forwards(seqs, prompts, 24_576, 8):  # a deeper tree (variants branching): exact pairs agree
        _, tree, _, _, _ = shared_forward_inputs(mb, prompts, responses)
        assert segmented_counts(tree).exact_pairs == tree_counts(tree).exact_pairs
