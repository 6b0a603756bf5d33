"""Which models the no-grad passes (replay, OPSD teacher, fused old_log_prob) run on, and how: ONE table.

The passes forward ``prompt | response`` sequences through the actor's plain causal-LM forward
(:mod:`recipe.mrtpo.core.passes`). Whether several sequences may share one packed row depends on the model
type and the attention implementation, and some models cannot be run that way at all:

- ``packed``: dense attention-only decoders whose transformers 5.9 forward isolates packed sequences under
  flash-attention's varlen path (the boundaries read from restarting ``position_ids``, what verl's
  ``use_remove_padding`` forward relies on). They pack under ``flash_attention_2`` / ``flash_attention_3``
  and take the ``sorted`` layout under any other attention.
- ``sorted``: hybrid, linear-attention and state-space models (Qwen3-Next, Qwen3.5 text, Mamba and its
  hybrids, ...). Their recurrent layers carry state from one packed sequence into the next unless the
  forward is given ``cu_seqlens`` (which verl passes to its patched forwards); the plain forward is not, so
  they never pack: each sequence is its own LEFT-padded row of a micro-batch, the padded positions masked
  (their layers zero padded positions' states, so a left-padded row equals the sequence alone).
- refused: vision-language models (the type in verl 0.9.1's patched-VLM list, or any config with a
  ``vision_config``): verl's patched forwards ignore ``logits_to_keep`` and need the images and 3-D mrope
  position ids, which the passes do not carry. :func:`refusal` says so before Ray starts.

Any model type not in the table takes the safe path, ``sorted``: never packed.
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

#: the one table: model type -> "packed" | "sorted" | "refused"
MODEL_TABLE: dict[str, str] = {
    **{t: "packed" for t in PACKED_TYPES},
    **{t: "sorted" for t in RECURRENT_TYPES},
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


def refusal(model_type: Optional[str], has_vision: bool = False, what: str = "the recipe's replay and teacher passes") -> Optional[str]:
    """One line saying why ``what`` cannot run on this model (a vision-language model), else None."""
    if has_vision or table_entry(model_type) == "refused":
        return (f"{what} do not support vision-language models (model type {model_type!r}): verl's patched forwards "
                "ignore logits_to_keep and need the images and mrope position ids, which the passes do not carry; "
                "use a text-only model or a method without a replay or teacher pass (grpo, gdpo)")
    return None


def config_facts(hf_config) -> tuple[str, bool]:
    """``(model_type, has_vision)`` of a Hugging Face config object or a config.json dict."""
    get = hf_config.get if isinstance(hf_config, dict) else (lambda k, d=None: getattr(hf_config, k, d))
    return str(get("model_type", "") or ""), get("vision_config", None) is not None
