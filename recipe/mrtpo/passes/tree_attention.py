"""The shared forwards' attention registered with transformers: the glue of :mod:`recipe.mrtpo.core.tree_mask`.

A shared forward (``core.shared_prompts``) runs its module under
:data:`~recipe.mrtpo.core.tree_mask.TREE_ATTENTION` with the prefix tree's FlexAttention ``BlockMask`` as its
``attention_mask`` (``core.passes.hf_forward`` switches the module's attention for that forward only). This
module registers :func:`~recipe.mrtpo.core.tree_mask.tree_flex_attention` under that name in transformers'
``AttentionInterface`` (its public registry); the worker and the benchmarks call :func:`register_tree_attention`
before a pass. Imports transformers and the core only (the GPU benchmarks run without verl).

What of transformers 5.9 this relies on is pinned (:data:`TRANSFORMERS_SOURCES`, checked by
``tests/unit/test_tree_attention.py``): the mask preparation returns a 4D mask or ``BlockMask`` given as
``attention_mask`` unchanged (``_preprocess_mask_arguments``), the registry refuses an unregistered name
(``AttentionInterface.get_interface``), and a decoder's attention calls the registered function with the
mask, ``scaling``, ``dropout`` and ``sliding_window`` (Qwen2's, the scripts' model).
"""

from __future__ import annotations

from recipe.mrtpo.core.tree_mask import TREE_ATTENTION, tree_flex_attention

#: transformers 5.9's functions the shared forwards rely on (module docstring): name -> sha256 of the source
TRANSFORMERS_SOURCES = {
    "transformers.masking_utils:_preprocess_mask_arguments": "0db696103fa5cfa1a7f0bc2cb457ae2eafd83a39755762ecde9517a10ae63d87",
    "transformers.modeling_utils:AttentionInterface.get_interface": "a9d96a2a90be43b1c335d52304ae8e3efb2ab6c8dfce0251df7c840d0215fc85",
    "transformers.models.qwen2.modeling_qwen2:Qwen2Attention.forward": "4015c9477db5adb78e7e8e5cd9eba88689904234a32b77e7b8f9802ac5bef86e",
}


def register_tree_attention() -> str:
    """Register :func:`~recipe.mrtpo.core.tree_mask.tree_flex_attention` as
    :data:`~recipe.mrtpo.core.tree_mask.TREE_ATTENTION` (idempotent); its name."""
    from transformers import AttentionInterface

    if AttentionInterface._global_mapping.get(TREE_ATTENTION) is not tree_flex_attention:
        AttentionInterface.register(TREE_ATTENTION, tree_flex_attention)
    return TREE_ATTENTION


def check_transformers_sources() -> list[str]:
    """The :data:`TRANSFORMERS_SOURCES` whose installed source is not the pinned one (empty: as in 5.9)."""
    from recipe.mrtpo.seams.source_pins import changed_sources

    return changed_sources(TRANSFORMERS_SOURCES)
