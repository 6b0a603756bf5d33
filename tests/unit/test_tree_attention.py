"""The shared forwards' attention as transformers takes it (``recipe/mrtpo/tree_attention.py``)."""

import pytest
import torch

from recipe.mrtpo.core.tree_mask import TREE_ATTENTION, TreeMask, tree_flex_attention
from recipe.mrtpo.tree_attention import check_transformers_sources, register_tree_attention


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
