"""The replay forwards on a real (tiny, random) Qwen2 with the real Qwen2 tokenizer, no Ray."""

import pytest
import torch

from recipe.mrtpo.core.prompt_variants import build_sample_variants
from recipe.mrtpo.core.relevance import js_distance_from_logits
from recipe.mrtpo.core.replay import hf_forward, replay_relevance


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    path = build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64, seed=3)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    # random init at std 0.02 barely reacts to the prompt: sharpen so that prompts matter measurably
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)
    return tok, model.eval()


def pack(plans, responses, pad_id):
    R = len(plans)
    NV = max(len(p.variants) for p in plans)
    P = max(len(v) for p in plans for v in p.variants)
    ids = torch.full((R, NV, P), pad_id, dtype=torch.long)
    lens = torch.zeros(R, NV, dtype=torch.long)
    for r, p in enumerate(plans):
        for j, v in enumerate(p.variants):
            ids[r, j, P - len(v) :] = torch.tensor(v)
            lens[r, j] = len(v)
    return ids, lens


def test_replay_matches_plain_forward_and_js(tiny):
    tok, model = tiny
    render = lambda m: tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)  # noqa: E731
    msgs = [{"role": "user", "content": "Write a haiku about rain. Do not use any commas. Use only lowercase letters."}]
    ctx = {
        "no_comma": {"text": "Do not use any commas.", "placement": "prompt"},
        "lower": {"text": "Use only lowercase letters.", "placement": "prompt"},
        "gold": {"text": "the reference answer", "placement": "appended"},
    }
    names = sorted(ctx)
    plan_a = build_sample_variants(msgs, ctx, ["no_comma", "lower"], render)
    plan_b = build_sample_variants(msgs, ctx, ["gold"], render)
    T = 9
    g = torch.Generator().manual_seed(0)
    responses = torch.randint(0, 151_000, (2, T), generator=g)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 6:] = 0
    ids, lens = pack([plan_a, plan_b], responses, tok.pad_token_id or 0)
    pair = torch.full((2, len(names)), -1, dtype=torch.long)
    for r, plan in enumerate([plan_a, plan_b]):
        for k, n in enumerate(names):
            pair[r, k] = plan.pair_variant.get(n, -1)
    with torch.no_grad():
        out = replay_relevance(hf_forward(model), ids, lens, responses, mask, pair, temperature=0.9, micro_batch_size=2)
        out1 = replay_relevance(hf_forward(model), ids, lens, responses, mask, pair, temperature=0.9, micro_batch_size=1)
        outc = replay_relevance(hf_forward(model), ids, lens, responses, mask, pair, temperature=0.9, micro_batch_size=2,
                                compiled_js=True)  # mrtpo.compile_js
    assert torch.allclose(out["relevance"], out1["relevance"], atol=1e-5)
    assert torch.allclose(out["relevance"], outc["relevance"], atol=1e-5)
    assert torch.equal(out["replay_logprobs"], outc["replay_logprobs"])
    rel = out["relevance"]
    assert rel.shape == (2, 3, T) and (rel >= 0).all() and (rel <= 1).all()
    assert (rel[1, :, 6:] == 0).all()  # masked positions
    assert (rel[0, names.index("gold")] == 0).all() and (rel[1, names.index("lower")] == 0).all()  # not replayed
    assert (rel[0, names.index("no_comma")][mask[0] > 0] > 0).all()

    # reference: plain unpadded forwards of [prompt | response] for P_all and P_minus_no_comma
    def logits_for(prompt_ids, r):
        seq = torch.tensor([list(prompt_ids) + responses[r].tolist()])
        with torch.no_grad():
            lg = model(input_ids=seq).logits[:, len(prompt_ids) - 1 : len(prompt_ids) - 1 + T]
        return lg

    la = logits_for(plan_a.variants[0], 0)
    lm = logits_for(plan_a.variants[plan_a.pair_variant["no_comma"]], 0)
    ref_q = js_distance_from_logits(la, lm, mask[:1], temperature=0.9)
    assert torch.allclose(rel[0, names.index("no_comma")], ref_q[0], atol=1e-4)
    ref_lp = torch.log_softmax(la / 0.9, -1).gather(-1, responses[:1].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(out["replay_logprobs"][0], ref_lp[0], atol=1e-4)
    # the appended block is really in P_all of row 1 and not in P_minus_gold
    assert "the reference answer" in tok.decode(plan_b.variants[0])
    assert "the reference answer" not in tok.decode(plan_b.variants[plan_b.pair_variant["gold"]])


def test_forward_count_sync_pads_with_dummy_forwards(tiny):
    _, model = tiny
    calls = []
    fwd = hf_forward(model)

    def counting(*a):
        calls.append(a[0].shape)
        return fwd(*a)

    ids = torch.tensor([[[0, 0, 5, 6], [0, 7, 8, 9]]])
    lens = torch.tensor([[2, 3]])
    resp = torch.tensor([[11, 12, 13]])
    mask = torch.ones(1, 3, dtype=torch.long)
    pair = torch.tensor([[1, -1]])
    with torch.no_grad():
        out = replay_relevance(counting, ids, lens, resp, mask, pair, micro_batch_size=1, sync_forward_count=lambda n: n + 3)
    assert int(out["n_forwards"]) == 2 and len(calls) == 5 and calls[-1] == (1, 1)
    # a row with nothing to replay costs no forward
    with torch.no_grad():
        empty = replay_relevance(counting, ids, lens, resp, mask, torch.tensor([[-1, -1]]), micro_batch_size=1)
    assert int(empty["n_forwards"]) == 0 and (empty["relevance"] == 0).all()
