"""The one model table (``core/model_support.py``): how the passes lay out each model type, and what they refuse.

One test per table entry, against transformers 5.9's own config of that type: a ``packed`` type's config has
no recurrent layer and packs only under a varlen attention; a ``single`` type's config has recurrent layers
(the detector that refuses unknown recurrent types recognises it) and never packs; a ``refused`` type is a
vision-language config. Then the evidence for ``single``: on tiny Qwen3-Next and Mamba2 a left-padded row and
a packed row give other logits than the sequence alone, one unpadded sequence per forward gives the same.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from recipe.mrtpo.core.model_support import MODEL_TABLE, config_facts, refusal, table_entry
from recipe.mrtpo.core.passes import PassSettings, plan_forwards, resolve_layout, row_sequences

#: table types whose config transformers 5.9 does not ship (the model's own code, trust_remote_code): the fields of
#: their published config.json that the table reads (Kimi-VL's carries a vision_config beside its text_config)
REMOTE_CODE_CONFIGS = {"kimi_vl": {"model_type": "kimi_vl", "vision_config": {}, "text_config": {}}}


def default_config(model_type):
    if model_type in CONFIG_MAPPING:
        return CONFIG_MAPPING[model_type]()
    assert model_type in REMOTE_CODE_CONFIGS, f"{model_type}: neither a transformers config nor a stand-in here"
    return REMOTE_CODE_CONFIGS[model_type]


@pytest.mark.parametrize("model_type", sorted(MODEL_TABLE))
def test_each_table_entry(model_type):
    entry = MODEL_TABLE[model_type]
    facts = config_facts(default_config(model_type))
    assert facts["model_type"] == model_type
    if entry == "packed":
        assert not facts["recurrent"] and not facts["has_vision"]
        assert resolve_layout("auto", "flash_attention_2", model_type) == ("packed", "varlen")
        assert resolve_layout("auto", "sdpa", model_type) == ("sorted", "block_mask")
        assert refusal(**facts) is None
    elif entry == "single":
        assert facts["recurrent"] and not facts["has_vision"]
        for attn in ("flash_attention_2", "sdpa"):
            assert resolve_layout("auto", attn, model_type)[0] == "single"
            assert resolve_layout("sorted", attn, model_type)[0] == "single"
        with pytest.raises(ValueError, match="refused for model type .*recurrent"):
            resolve_layout("packed", "flash_attention_2", model_type)
        assert refusal(**facts) is None  # known: run, one sequence a forward
    else:
        assert entry == "refused" and facts["has_vision"]
        msg = refusal(**facts)
        assert msg and "\n" not in msg and "vision-language" in msg


def test_unknown_types_take_the_safe_path_and_unknown_recurrent_ones_are_refused():
    assert table_entry("some_new_llm") == "sorted"
    assert resolve_layout("auto", "flash_attention_2", "some_new_llm") == ("sorted", "varlen")
    assert resolve_layout("auto", "flash_attention_2", None) == ("sorted", "varlen")
    assert refusal(**config_facts({"model_type": "some_new_llm", "layer_types": ["full_attention"] * 2})) is None
    msg = refusal(**config_facts({"model_type": "some_new_hybrid", "layer_types": ["linear_attention", "full_attention"]}))
    assert msg and "\n" not in msg and "some_new_hybrid" in msg and "recurrent" in msg
    assert refusal(**config_facts({"model_type": "some_new_ssm", "ssm_state_size": 16})) is not None
    assert refusal(**config_facts({"model_type": "my_vlm", "vision_config": {}})) is not None  # a vision tower, any type


def test_single_plans_one_unpadded_sequence_per_forward_rows_together():
    seqs = row_sequences(0, [0, 1], [3, 5], 4) + row_sequences(1, [0], [9], 6)
    plan = plan_forwards(seqs, PassSettings(micro_batch_size=8, token_budget=10_000, layout="single"))
    assert [[(s.row, s.variant) for s in mb] for mb in plan] == [[(1, 0)], [(0, 0)], [(0, 1)]]


TINY = {
    "qwen3_next": dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, num_experts=2, num_experts_per_tok=1,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32,
                       layer_types=["linear_attention", "full_attention"]),
    "mamba2": dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32, state_size=16, n_groups=1,
                   expand=2, chunk_size=8),
}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_recurrent_models_mix_padding_and_packed_sequences_so_they_run_single(model_type):
    from transformers import AutoModelForCausalLM

    from recipe.mrtpo.core.passes import hf_forward
    from recipe.mrtpo.core.replay import replay_relevance

    torch.manual_seed(0)
    cfg = CONFIG_MAPPING[model_type](**TINY[model_type])
    cfg._attn_implementation = "eager"
    m = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(1, 128, (1, 10))
    with torch.no_grad():
        alone = m(input_ids=ids).logits[0]
        padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], 1)
        mask = (padded != 0).long()
        mask[0, 5:] = 1
        left = m(input_ids=padded, attention_mask=mask).logits[0, 5:]
        packed = m(input_ids=torch.cat([ids, ids], 1), position_ids=torch.arange(10).repeat(2)[None]).logits[0, 10:]
    assert (left - alone).abs().max() > 1e-3 and (packed - alone).abs().max() > 1e-3
    # the pass engine under the table's layout: each sequence alone, whatever shares the batch
    prompts = torch.randint(1, 128, (3, 1, 6))
    lens = torch.tensor([[6], [4], [5]])
    resp = torch.randint(1, 128, (3, 4))
    mask = torch.ones(3, 4, dtype=torch.long)
    layout, attn = resolve_layout("auto", "sdpa", model_type)
    with torch.no_grad():
        out = replay_relevance(hf_forward(m), prompts, lens, resp, mask, torch.full((3, 1), -1),
                               logprob_variant=torch.zeros(3, dtype=torch.long), layout=layout, packed_attention=attn,
                               micro_batch_size=3)
        for r in range(3):
            seq = torch.cat([prompts[r, 0, 6 - int(lens[r, 0]):], resp[r]])[None]
            lp = torch.log_softmax(m(input_ids=seq).logits[0, int(lens[r, 0]) - 1 : -1].float(), -1)
            want = lp.gather(-1, resp[r, :, None])[:, 0]
            assert torch.allclose(out["replay_logprobs"][r], want, atol=1e-5), r
