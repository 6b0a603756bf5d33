"""The replay forwards on a real (tiny, random) Qwen2 with the real Qwen2 tokenizer, no Ray (docs/design.md §1.2, §5)."""

import weakref

import pytest
import torch

from recipe.mrtpo.core.passes import PassSettings, plan_forwards
from recipe.mrtpo.core.prompt_variants import build_sample_variants
from recipe.mrtpo.core.relevance import js_distance_from_logits
from recipe.mrtpo.core.replay import (
    expand_relevance,
    hf_forward,
    plan_sequences,
    replay_relevance,
    response_lengths,
)


def pack_micro_batches(seqs, micro_batch_size, token_budget=None):  # the arrival-order (padded) layout
    return plan_forwards(seqs, PassSettings(micro_batch_size=micro_batch_size, token_budget=token_budget, layout="padded"))


TINY_SEED = 3  # the suite's test model (tests/conftest.py: tiny, tiny_lm), this module's seed


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
        outc1 = replay_relevance(hf_forward(model), ids, lens, responses, mask, pair, temperature=0.9, micro_batch_size=1,
                                 compiled_js=True)  # P_all alone in its forward: log-probs from its log-normaliser
    assert torch.allclose(out["variant_relevance"], out1["variant_relevance"], atol=1e-5)
    assert torch.allclose(out["replay_logprobs"], out1["replay_logprobs"], atol=1e-5)
    for o in (outc, outc1):
        assert torch.allclose(out["variant_relevance"], o["variant_relevance"], atol=1e-5)
        assert torch.allclose(out["replay_logprobs"], o["replay_logprobs"], atol=1e-5)
        assert (o["replay_logprobs"][mask == 0] == 0).all()
    # one compact row per variant (P_all has none), mapped to rewards through pair_variant
    assert out["variant_relevance"].shape == (2, max(len(plan_a.variants), len(plan_b.variants)) - 1, T)
    rel = expand_relevance(out["variant_relevance"], pair)
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

    # row 1's P_minus_gold is the rollout prompt (its only Z is appended): its log-probs can be asked for
    # instead of P_all's (the consistency check against old_log_probs on tool-calling-like rows)
    v = plan_b.pair_variant["gold"]
    assert plan_b.variants[v].tolist() == list(render(msgs))
    with torch.no_grad():
        outv = replay_relevance(hf_forward(model), ids, lens, responses, mask, pair, temperature=0.9, micro_batch_size=2,
                                logprob_variant=torch.tensor([0, v]))
    ref_lp_v = torch.log_softmax(logits_for(plan_b.variants[v], 1) / 0.9, -1).gather(-1, responses[1:].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(outv["replay_logprobs"][1][mask[1] > 0], ref_lp_v[0][mask[1] > 0], atol=1e-4)
    assert torch.equal(outv["replay_logprobs"][0], out["replay_logprobs"][0])
    assert torch.equal(outv["variant_relevance"], out["variant_relevance"])


def test_forward_count_is_agreed_before_the_first_forward(tiny):
    _, model = tiny
    calls = []
    fwd = hf_forward(model)

    def counting(*a):
        calls.append(a[0].shape)
        return fwd(*a)

    seen = []

    def agree(n):  # what a data-parallel caller does: all ranks must issue the same number of forwards
        seen.append((n, len(calls)))
        return n + 3

    ids = torch.tensor([[[0, 0, 5, 6], [0, 7, 8, 9]]])
    lens = torch.tensor([[2, 3]])
    resp = torch.tensor([[11, 12, 13]])
    mask = torch.ones(1, 3, dtype=torch.long)
    pair = torch.tensor([[1, -1]])
    with torch.no_grad():
        out = replay_relevance(counting, ids, lens, resp, mask, pair, micro_batch_size=1, sync_forward_count=agree)
    assert seen == [(2, 0)], "the agreement must come before any forward"
    assert int(out["n_forwards"]) == 2 and int(out["n_forwards_global"]) == 5
    assert len(calls) == 5 and calls[-1] == (1, 1)  # three one-token padding forwards at the end
    # a row with nothing to replay costs no forward, but still joins the agreement
    seen.clear()
    with torch.no_grad():
        empty = replay_relevance(counting, ids, lens, resp, mask, torch.tensor([[-1, -1]]), micro_batch_size=1,
                                 sync_forward_count=agree)
    assert seen == [(0, 5)] and int(empty["n_forwards"]) == 0 and (empty["variant_relevance"] == 0).all()
    with pytest.raises(RuntimeError, match="agreement"):
        replay_relevance(counting, ids, lens, resp, mask, pair, micro_batch_size=1, sync_forward_count=lambda n: n - 1)


def test_non_contiguous_mask_attends_the_whole_response(tiny):
    """Tool output inside a response (mask 0 between valid tokens): the model attends it, q skips it."""
    _, model = tiny
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 150_000, (n,), generator=g).tolist() for n in (7, 5)]  # P_all, P_minus
    T = 10
    resp = torch.randint(0, 150_000, (1, T), generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 0, 0]])  # last valid token at 6: 7 positions exist
    assert response_lengths(mask).tolist() == [7]
    ids = torch.zeros(1, 2, 7, dtype=torch.long)
    ids[0, 0] = torch.tensor(prompts[0])
    ids[0, 1, 2:] = torch.tensor(prompts[1])
    lens = torch.tensor([[7, 5]])
    pair = torch.tensor([[1]])
    with torch.no_grad():
        out = replay_relevance(hf_forward(model), ids, lens, resp, mask, pair, micro_batch_size=2)

        def ref_logits(prompt):  # the plain forward of [prompt | response up to its last valid token]
            seq = torch.tensor([prompt + resp[0, :7].tolist()])
            return model(input_ids=seq).logits[:, len(prompt) - 1 : len(prompt) - 1 + 7]

        la, lm = ref_logits(prompts[0]), ref_logits(prompts[1])
    q = out["variant_relevance"][0, 0]
    ref_q = js_distance_from_logits(la, lm, mask[:, :7])[0]
    assert torch.allclose(q[:7], ref_q, atol=1e-4) and (q[mask[0] == 0] == 0).all()
    assert (q[mask[0] > 0] > 0).all()
    lp = torch.log_softmax(la[0], -1).gather(-1, resp[0, :7, None]).squeeze(-1)
    assert torch.allclose(out["replay_logprobs"][0, :7][mask[0, :7] > 0], lp[mask[0, :7] > 0], atol=1e-4)


def test_token_budget_bounds_every_forward_and_pall_is_not_a_view(tiny):
    """One long and many short responses: every forward stays within the token budget (padded tokens and
    logits positions), each sequence is its own prompt + response, P_all's logits outlive their
    micro-batch only as their own tensor (a copy, or the whole logits of a forward of that one sequence),
    and the result equals one sequence per forward."""
    _, model = tiny
    fwd = hf_forward(model)
    g = torch.Generator().manual_seed(2)
    R, NV, P, T = 5, 3, 6, 30
    ids = torch.randint(0, 150_000, (R, NV, P), generator=g)
    lens = torch.full((R, NV), P)
    lens[:, 1:] = P - 2
    resp = torch.randint(0, 150_000, (R, T), generator=g)
    mask = torch.zeros(R, T, dtype=torch.long)
    mask[0] = 1  # the long one: 30 tokens
    mask[1:, :3] = 1  # four short ones: 3 tokens
    pair = torch.tensor([[1, 2]] * R)
    budget = 64
    stats = {"tokens": [], "positions": [], "lengths": []}
    returned = []

    def counting(input_ids, attn, pos, keep):
        alive = [t for t in (r() for r in returned) if t is not None]
        # an earlier forward's logits outlive it only when they are one sequence's (P_all alone in its
        # forward, held as a view: one position more than its copy would be), never a micro-batch's
        assert all(t.shape[0] == 1 for t in alive), "an earlier micro-batch's logits are still alive"
        assert len(alive) <= 1
        stats["tokens"].append(input_ids.numel())
        stats["lengths"].append(attn.sum(-1).tolist())
        logits = fwd(input_ids, attn, pos, keep)
        stats["positions"].append(logits.shape[0] * logits.shape[1])
        returned.append(weakref.ref(logits))
        return logits

    with torch.no_grad():
        out = replay_relevance(counting, ids, lens, resp, mask, pair, micro_batch_size=100, token_budget=budget, layout="padded")
        one = replay_relevance(fwd, ids, lens, resp, mask, pair, micro_batch_size=1)
    longest = P + T  # the long row's sequences alone exceed nothing but themselves
    assert max(stats["tokens"]) <= max(budget, longest) and max(stats["positions"]) <= max(budget, longest)
    assert max(t for t, ls in zip(stats["tokens"], stats["lengths"]) if max(ls) < longest) <= budget
    # short rows are forwarded at their own length (prompt + 3), never at the batch's longest response
    assert [len(ls) for ls in stats["lengths"][:3]] == [1, 1, 1]  # the long row's three sequences, one a forward
    assert sorted({n for ls in stats["lengths"][3:] for n in ls}) == [P - 2 + 3, P + 3]
    assert len(stats["tokens"]) == int(out["n_forwards"]) < 3 * R
    assert torch.allclose(out["variant_relevance"], one["variant_relevance"], atol=1e-5)
    assert torch.allclose(out["replay_logprobs"], one["replay_logprobs"], atol=1e-5)
    # without a budget: micro_batch_size sequences per forward, logits of the micro-batch's longest response only
    stats = {"tokens": [], "positions": [], "lengths": []}
    returned.clear()
    with torch.no_grad():
        replay_relevance(counting, ids, lens, resp, mask, pair, micro_batch_size=3, layout="padded")
    assert stats["positions"] == [3 * (T + 1)] + [3 * (3 + 1)] * (R - 1)


def test_packing_and_expansion():
    lens = torch.tensor([[10, 8, 7], [10, 9, 0], [4, 0, 0]])
    pair = torch.tensor([[1, 2, -1], [-1, 1, 1], [-1, -1, -1]])
    seqs = plan_sequences(lens, pair, torch.tensor([5, 20, 3]))
    assert [(s.row, s.variant, s.length, s.last_of_row) for s in seqs] == [
        (0, 0, 15, False), (0, 1, 13, False), (0, 2, 12, True), (1, 0, 30, False), (1, 1, 29, True)]
    assert [[s.length for s in b] for b in pack_micro_batches(seqs, 2)] == [[15, 13], [12, 30], [29]]
    # budget 40: n x longest <= 40; a sequence over the budget alone (none here)
    assert [[s.length for s in b] for b in pack_micro_batches(seqs, 1, token_budget=40)] == [[15, 13], [12], [30], [29]]
    assert [[s.length for s in b] for b in pack_micro_batches(seqs, 1, token_budget=20)] == [[15], [13], [12], [30], [29]]
    rows = torch.arange(2 * 2 * 3, dtype=torch.float32).view(2, 2, 3)
    rel = expand_relevance(rows.to(torch.bfloat16), torch.tensor([[2, -1, 1], [0, 1, 1]]))
    assert rel.dtype == torch.float32 and rel.shape == (2, 3, 3)
    assert rel[0, 0].tolist() == rows[0, 1].tolist() and (rel[0, 1] == 0).all() and rel[0, 2].tolist() == rows[0, 0].tolist()
    assert (rel[1, 0] == 0).all() and rel[1, 1].tolist() == rel[1, 2].tolist() == rows[1, 0].tolist()
