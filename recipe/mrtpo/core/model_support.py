"""Which models the no-grad passes (replay, OPSD teacher, fused old_log_prob) run on, and how: ONE table.

The passes forward ``prompt | response`` sequences through the actor's plain causal-LM forward
(:mod:`recipe.mrtpo.core.passes`). Whether several sequences may share one packed row depends on the model
type and the attention implementation, and some models cannot be run that way at all:

- ``packed``: dense attention-only decoders whose transformers 5.9 forward isolates packed sequences under
  flash-attention's varlen path (the boundaries read from restarting ``position_ids``, what verl's
  ``use_remove_padding`` forward relies on). They pack under ``flash_attention_2`` / ``flash_attention_3``
  and take the ``sorted`` layout under any other attention.
- ``single``: hybrid, linear-attention and state-space models (Qwen3-Next, Qwen3.5 text, Mamba and its
  hybrids, ...). Their recurrent layers carry state from one packed sequence into the next unless the
  forward is given ``cu_seqlens`` (which verl passes to its patched forwards; the plain forward is not), and
  they do not ignore left padding either (a tiny Qwen3-Next / Mamba2 gives other logits for a left-padded
  row than for the sequence alone: ``tests/unit/test_model_support.py``), so each sequence is a forward of
  its own, unpadded: exact, at the cost of more, smaller forwards.
- refused: vision-language models (the type in verl 0.9.1's patched-VLM list, or any config with a
  ``vision_config``): verl's patched forwards ignore ``logits_to_keep`` and need the images and 3-D mrope
  position ids, which the passes do not carry. :func:`refusal` says so before Ray starts.

The other types take ``sorted`` (micro-batches of LEFT-padded rows of similar length, attention masked) unless
they pack. Any model type not in the table takes the safe path, ``sorted``: never packed; but one whose config looks
recurrent (:func:`looks_recurrent`: a ``layer_types`` entry other than attention, or a state-space / linear
attention size) is refused, because whether its layers ignore left padding is not known.
"""

from __future__ import annotations

from typing import Optional

#: dense decoders whose flash-attention varlen forward keeps packed sequences apart (module docstring)
PACKED_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "deepseek_v3", "glm4",
    "olmo2", "granite",
)
#: hybrid / linear-attention / SSM types: recurrent state would cross packed sequences (module docstring)
RECURRENT_TYPES = (
    "qwen3_next", "qwen3_5_text", "mamba", "mamba2", "falcon_mamba", "jamba", "falcon_h1", "bamba",
    "granitemoehybrid", "nemotron_h", "zamba", "zamba2", "lfm2", "lfm2_moe", "minimax", "recurrent_gemma",
    "rwkv", "olmo_hybrid",
)
#: verl 0.9.1's patched vision-language forwards (``verl/models/transformers/monkey_patch.py``
#: ``apply_monkey_patch``): they ignore ``logits_to_keep`` and need images and mrope position ids
VISION_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "kimi_vl", "qwen3_5", "qwen3_5_moe")

#: the one table: model type -> "packed" | "single" | "refused"
MODEL_TABLE: dict[str, str] = {
    **{t: "packed" for t in PACKED_TYPES},
    **{t: "single" for t in RECURRENT_TYPES},
    **{t: "refused" for t in VISION_TYPES},
}
#: attention implementations whose varlen path isolates packed sequences given restarting position ids
VARLEN_ATTENTIONS = ("flash_attention_2", "flash_attention_3")


def table_entry(model_type: Optional[str]) -> str:
    """The table's entry for ``model_type``; ``sorted`` (the safe path) for a type it does not name."""
    return MODEL_TABLE.get(str(model_type or ""), "sorted")


def may_pack(model_type: Optional[str], attn_implementation: Optional[str]) -> bool:
    """Whether sequences of this model may share a packed row under flash-attention's varlen path."""
    return table_entry(model_type) == "packed" and str(attn_implementation or "") in VARLEN_ATTENTIONS


#: ``layer_types`` entries of attention layers (anything else is a recurrent layer: linear attention, mamba, ...)
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "attention", "global", "local")
#: config keys only recurrent (state-space / linear-attention / hybrid) models carry
RECURRENT_CONFIG_KEYS = (
    "ssm_state_size", "state_size", "mamba_d_state", "mamba_n_heads", "mamba_d_conv", "linear_num_key_heads",
    "linear_num_value_heads", "linear_conv_kernel_dim", "conv_kernel", "attn_layer_indices", "layers_block_type",
    "hybrid_override_pattern", "block_types", "full_attn_idxs", "layer_block_types", "conv_L_cache", "rescale_every",
)


def looks_recurrent(get) -> bool:
    """Whether a config (``get(key, default)``) has recurrent layers: a non-attention ``layer_types`` entry or a
    :data:`RECURRENT_CONFIG_KEYS` key."""
    layer_types = get("layer_types", None) or ()
    if any(str(t) not in ATTENTION_LAYER_TYPES for t in layer_types):
        return True
    return any(get(k, None) is not None for k in RECURRENT_CONFIG_KEYS)


def refusal(model_type: Optional[str], has_vision: bool = False, recurrent: bool = False,
            what: str = "the recipe's replay and teacher passes",
            otherwise: str = "choose a method without a replay or teacher pass (grpo, gdpo)") -> Optional[str]:
    """One line saying why ``what`` cannot run on this model, else None: a vision-language model, or a model
    type the table does not name whose config looks recurrent (module docstring)."""
    if has_vision or table_entry(model_type) == "refused":
        return (f"{what} do not support vision-language models (model type {model_type!r}): verl's patched forwards "
                "ignore logits_to_keep and need the images and mrope position ids, which the passes do not carry; "
                f"use a text-only model, or {otherwise}")
    if recurrent and str(model_type or "") not in MODEL_TABLE:
        return (f"{what} do not know model type {model_type!r}, whose config has recurrent (linear-attention / "
                "state-space) layers: packed rows would carry their state across sequences and left padding is not "
                f"known to be ignored; add the type to recipe/mrtpo/core/model_support.py with a test, or {otherwise}")
    return None


def config_facts(hf_config) -> dict:
    """``refusal``'s keywords (``model_type``, ``has_vision``, ``recurrent``) of a Hugging Face config object or a
    config.json dict (a multimodal config's ``text_config`` is read for the layers)."""
    def getter(c):
        return c.get if isinstance(c, dict) else (lambda k, d=None: getattr(c, k, d))

    get = getter(hf_config)
    text = get("text_config", None)
    recurrent = looks_recurrent(get) or (text is not None and looks_recurrent(getter(text)))
    return {"model_type": str(get("model_type", "") or ""), "has_vision": get("vision_config", None) is not None,
            "recurrent": recurrent}


def module_config(module):
    """The Hugging Face config of a module (FSDP2's in-place wrapper, an FSDP1 / DDP wrapper's inner module), or None."""
    for m in (module, getattr(module, "_fsdp_wrapped_module", None), getattr(module, "module", None)):
        cfg = getattr(m, "config", None)
        if cfg is not None:
            return cfg
    return None
