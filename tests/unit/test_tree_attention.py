"""The shared forwards' attention as transformers takes it (``recipe/mrtpo/passes/tree_attention.py``)."""

import pytest
import torch

from recipe.mrtpo.core.tree_mask import TREE_ATTENTION, TreeMask, tree_flex_attention
from recipe.mrtpo.passes.tree_attention import check_transformers_sources, register_tree_attention


def test_transformers_functions_the_shared_forwards_rely_on_are_as_pinned():
    assert check_transformers_sources() == []


def test_registration_is_idempotent_and_names_the_tree_attention():
    from transformers import AttentionInterface

    assert register_tree_attention() == register_tree_attention() == TREE_ATTENTION
    assert AttentionInterface().get_interface(TREE_ATTENTION, None) is tree_flex_attention


def test_the_tree_attention_refuses_what_its_mask_cannot_express():
    q = torch.zeros(1, 2, 8, 4)
    mask = TreeMask.sequences([3, 5], block=8).block_mask()
    with pytest.raises(TypeError, match="BlockMask"):
        tree_flex_attention(None, q, q, q, torch.ones(1, 1, 8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="sliding window of 4"):
        tree_flex_attention(None, q, q, q, mask, sliding_window=4)
    with pytest.raises(NotImplementedError, match="softcapping"):
        tree_flex_attention(None, q, q, q, mask, softcap=30.0)
    out, weights = tree_flex_attention(None, q, q, q, mask, sliding_window=4096)  # a window the row fits: no effect
    assert out.shape == (1, 8, 2, 4) and weights is None


@pytest.mark.gpu
def test_the_compiled_tree_attention_on_cuda_is_exact_and_never_holds_the_scores():
    """On a GPU the tree attention is compiled flex_attention (a fused kernel): at a 16k-token shared row it equals
    SDPA under the dense rule in fp32 and its peak memory stays far below one [L, L] fp32 score matrix per head."""
    from recipe.mrtpo.core.shared_prompts import plan_shared_forwards, shared_forward_inputs
    from unit.test_tree_mask import tree_batch

    prompts, responses, seqs = tree_batch(4, 4, 1500, 512, NV=2, seed=0)
    mb = plan_shared_forwards(seqs, prompts, None, 64)[0]
    tree = shared_forward_inputs(mb, prompts, responses)[1]
    L, dev = tree.length, torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, h, L, 64, device=dev, generator=g) for h in (4, 2, 2))
    mask = tree.block_mask(dev)
    tree_flex_attention(None, q, k, v, mask)  # compiles
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out, _ = tree_flex_attention(None, q, k, v, mask)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < L * L  # bytes: a quarter of one fp32 score matrix
    r = torch.arange(L, device=dev)
    seg, depth, anc = (torch.from_numpy(x).to(dev) for x in (tree.segment_of_rows(), tree.depth, tree.anc))
    dense = tree.allowed(r[:, None], r[None, :], seg, depth, anc)
    want = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=dense)
    assert L >= 16_000 and (out.transpose(1, 2) - want).abs().max() < 1e-4
