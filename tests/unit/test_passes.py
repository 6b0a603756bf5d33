"""The pass engine (``core/passes.py``): one packer and layout for the replay and the OPSD teacher, on a tiny Qwen2."""

import pytest
import torch

from recipe.mrtpo.core.passes import (
    PassSequence,
    PassSettings,
    forward_inputs,
    hf_forward,
    plan_forwards,
    resolve_layout,
    row_sequences,
)
from recipe.mrtpo.core.replay import plan_sequences, replay_relevance
from recipe.mrtpo.methods.opsd.teacher import teacher_topk_rows

PACKED = dict(layout="packed", packed_attention="block_mask")


def batch(R=5, NV=3, P=9, T=12, seed=0):
    """Rows of uneven prompt and response lengths, one mask with gaps, one row replaying nothing."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 150_000, (R, NV, P), generator=g)
    lens = torch.randint(3, P + 1, (R, NV), generator=g)
    lens[:, 0] = P
    resp = torch.randint(0, 150_000, (R, T), generator=g)
    mask = torch.zeros(R, T, dtype=torch.long)
    for r in range(R):
        mask[r, : int(torch.randint(2, T + 1, (1,), generator=g))] = 1
    mask[1, 2:5] = 0  # a gap (tool output): attended, not measured
    pair = torch.tensor([[1, 2], [2, -1], [-1, -1], [1, 1], [2, 1]])[:R]
    return ids, lens, resp, mask, pair


def test_plan_forwards_keeps_rows_together_longest_first_and_bounds_tokens():
    seqs = plan_sequences(torch.tensor([[10, 8, 7], [10, 9, 0], [4, 0, 0]]), torch.tensor([[1, 2, -1], [-1, 1, 1], [-1, -1, -1]]),
                          torch.tensor([5, 20, 3]))
    sorted_ = plan_forwards(seqs, PassSettings(micro_batch_size=2, layout="sorted"))
    assert [[(s.row, s.variant) for s in b] for b in sorted_] == [[(1, 0), (1, 1)], [(0, 0), (0, 1)], [(0, 2)]]
    packed = plan_forwards(seqs, PassSettings(token_budget=60, layout="packed"))
    assert [[s.length for s in b] for b in packed] == [[30, 29], [15, 13, 12]]  # sums <= 60
    padded = plan_forwards(seqs, PassSettings(token_budget=60, layout="sorted"))
    assert [[s.length for s in b] for b in padded] == [[30, 29], [15, 13, 12]]  # 2 x 30, 3 x 15 <= 60
    assert [[s.length for s in b] for b in plan_forwards(seqs, PassSettings(token_budget=20, layout="packed"))] == [
        [30], [29], [15], [13], [12]]  # over the budget: alone
    with pytest.raises(ValueError, match="layout"):
        PassSettings(layout="ragged")
    with pytest.raises(ValueError, match="micro_batch_size"):
        PassSettings(micro_batch_size=0)


def test_packed_inputs_restart_positions_keep_response_rows_and_mask_blocks():
    prompts = torch.arange(2 * 1 * 4).view(2, 1, 4) + 100
    responses = torch.arange(2 * 3).view(2, 3) + 200
    mb = row_sequences(0, [0], [2], 3) + row_sequences(1, [0], [4], 2)
    ids, attn, pos, keep, starts = forward_inputs(mb, prompts, responses, PassSettings(**PACKED))
    assert ids.tolist() == [[102, 103, 200, 201, 202, 104, 105, 106, 107, 203, 204]]
    assert pos.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]]
    assert keep.tolist() == [1, 2, 3, 8, 9] and starts == [0, 3]  # the position before each response token
    blocked = attn[0, 0] < 0
    assert blocked[5, :5].all() and not blocked[4, :5].any() and blocked[0, 1]  # no look across, causal within
    _, varlen, _, _, _ = forward_inputs(mb, prompts, responses, PassSettings(layout="packed", packed_attention="varlen"))
    assert varlen is None  # flash-attention reads the boundaries from the restarting position ids
    assert resolve_layout("auto", "flash_attention_2", "qwen2") == ("packed", "varlen")
    assert resolve_layout("auto", "flash_attention_2") == ("sorted", "varlen")  # unknown type: the safe path
    assert resolve_layout("auto", "sdpa") == ("sorted", "block_mask")


def test_what_keeps_packed_sequences_apart_under_sdpa(tiny_lm):
    """The block mask does; so does no mask at all (transformers 5.9 then derives the blocks from the
    restarting position ids, as flash-attention's varlen path does); a plain 2D mask of ones does not."""
    prompts = torch.randint(0, 150_000, (2, 1, 6), generator=torch.Generator().manual_seed(3))
    responses = torch.randint(0, 150_000, (2, 5), generator=torch.Generator().manual_seed(4))
    mb = row_sequences(0, [0], [6], 5) + row_sequences(1, [0], [6], 5)
    fwd = hf_forward(tiny_lm)
    with torch.no_grad():
        ids, attn, pos, keep, _ = forward_inputs(mb, prompts, responses, PassSettings(**PACKED))
        masked = fwd(ids, attn, pos, keep)[0, 5:]
        no_mask = fwd(ids, None, pos, keep)[0, 5:]
        ones = fwd(ids, torch.ones_like(ids), pos, keep)[0, 5:]
        alone = tiny_lm(input_ids=torch.cat([prompts[1, 0], responses[1]])[None]).logits[0, 5:10]
    assert (masked - alone).abs().max() < 1e-4 and (no_mask - alone).abs().max() < 1e-4
    assert (ones - alone).abs().max() > 1e-2


@pytest.mark.parametrize("budget", [None, 40])
def test_replay_is_the_same_in_every_layout(tiny_lm, budget):
    ids, lens, resp, mask, pair = batch()
    fwd = hf_forward(tiny_lm)
    lpv = torch.tensor([0, 2, 0, 1, 0])
    outs = {}
    with torch.no_grad():
        for layout in ("padded", "sorted", "packed", "single"):
            outs[layout] = replay_relevance(fwd, ids, lens, resp, mask, pair, micro_batch_size=3, token_budget=budget,
                                            temperature=0.8, logprob_variant=lpv, layout=layout, packed_attention="block_mask")
        one = replay_relevance(fwd, ids, lens, resp, mask, pair, micro_batch_size=1, temperature=0.8, logprob_variant=lpv,
                               layout="padded")
    for layout, out in outs.items():
        for key in ("variant_relevance", "replay_logprobs"):
            assert torch.allclose(out[key], one[key], atol=1e-5), (layout, key)
    assert (outs["packed"]["variant_relevance"][1, :, 2:5] == 0).all()  # the gap is not measured
    assert (outs["packed"]["variant_relevance"][1, 1, :2] > 0).all()
    existing = int(one["tokens_existing"])
    assert int(outs["packed"]["tokens_forwarded"]) == existing  # the tokens that exist, no padding
    assert min(int(outs[k]["tokens_forwarded"]) for k in ("padded", "sorted")) >= existing
    assert int(outs["single"]["tokens_forwarded"]) == existing  # one unpadded sequence a forward


def test_teacher_is_the_same_in_every_layout_with_gaps(tiny_lm):
    ids, lens, resp, mask, _ = batch(seed=1)
    prompt_ids, prompt_lens = ids[:, 0], lens[:, 0].clone()
    prompt_lens[3] = 0  # a padding row: no forward
    fwd = hf_forward(tiny_lm)
    with torch.no_grad():
        outs = {lay: teacher_topk_rows(fwd, prompt_ids, prompt_lens, resp, mask, k=4, temperature=0.8, micro_batch_size=2,
                                       token_budget=50, layout=lay, packed_attention="block_mask")
                for lay in ("padded", "sorted", "packed")}
        # reference: each row's [prompt | response up to its last valid token] alone
        for r in (0, 1, 2, 4):
            n = int((torch.arange(1, resp.shape[1] + 1) * mask[r]).max())
            seq = torch.cat([prompt_ids[r, -int(prompt_lens[r]):], resp[r, :n]])[None]
            lp = torch.log_softmax(tiny_lm(input_ids=seq).logits[0, int(prompt_lens[r]) - 1 : -1] / 0.8, -1)
            v, i = lp.topk(4, -1)
            m = mask[r, :n] > 0
            for out in outs.values():
                assert torch.allclose(out["topk_logprobs"][r, :n][m], v[m], atol=1e-5)
                assert torch.equal(out["topk_ids"][r, :n][m], i[m])
                assert torch.allclose(out["token_logprobs"][r, :n][m], lp.gather(-1, resp[r, :n, None])[:, 0][m], atol=1e-5)
                assert (out["topk_logprobs"][r][mask[r] == 0] == 0).all()
    assert all((o["topk_logprobs"][3] == 0).all() for o in outs.values())
    assert int(outs["packed"]["tokens_forwarded"]) == int(outs["packed"]["tokens_existing"])


def test_balanced_order_splits_tokens_evenly_over_ranks():
    from recipe.mrtpo.passes.pass_driver import balanced_order

    tokens = [900, 10, 800, 20, 30, 700, 0, 0]
    order = balanced_order(tokens, 2)
    assert sorted(order) == list(range(8))
    per_rank = [sum(tokens[j] for j in order[:4]), sum(tokens[j] for j in order[4:])]
    contiguous = [sum(tokens[:4]), sum(tokens[4:])]
    assert max(per_rank) - min(per_rank) < max(contiguous) - min(contiguous)
    assert balanced_order(tokens, 1) == list(range(8))
    with pytest.raises(ValueError, match="pad them"):
        balanced_order(tokens[:7], 2)


def test_pass_settings_travel_and_missing_ones_are_named():
    s = PassSettings(temperature=0.7, micro_batch_size=4, token_budget=None, chunk_size=16, pad_id=3, layout="auto")
    wire = s.to_wire()
    assert wire["token_budget"] == 0 and wire["pad_token_id"] == 3
    back = PassSettings.from_wire(wire, "m", "sdpa")
    assert back.layout == "sorted" and back.chunk_size == 16 and back.token_budget is None
    assert PassSettings.from_wire(wire, "m", "flash_attention_2", "qwen2").layout == "packed"
    with pytest.raises(ValueError, match=r"m: settings \['chunk_size'\] missing"):
        PassSettings.from_wire({k: v for k, v in wire.items() if k != "chunk_size"}, "m")
    assert isinstance(row_sequences(0, [0, 2], [5, 4], 3)[1], PassSequence) and row_sequences(0, [0, 2], [5, 4], 3)[1].last_of_row


def test_fused_old_log_probs_and_entropy_equal_verls_on_every_sample(tiny_lm):
    """run_replay(fused=True) through the worker's row function: every sample's old_log_probs and entropy
    equal verl's own functions on a plain forward of [rollout prompt | response] (fp32, 1e-5), whether its
    row is replayed with P_all as the rollout prompt, replayed with a P_all that is not (an appended block),
    or not replayed at all; the relevance equals the unfused replay's."""
    import numpy as np
    from tensordict import TensorDict
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.core.passes import PassSettings as PS
    from recipe.mrtpo.passes.pass_driver import PassRequest
    from recipe.mrtpo.rewards.reward_extras import RewardTable
    from recipe.mrtpo.step.replay_driver import run_replay
    from recipe.mrtpo.step.worker import REPLAY_SETTINGS, replay_rows

    words = {}

    def render(messages):  # a toy chat template: one id per distinct word, stable within the test
        text = " ".join(m["content"] for m in messages)
        return [words.setdefault(w, 1000 + len(words)) for w in text.split()]

    a = {"text": "no commas", "placement": "prompt"}
    b = {"text": "lower case", "placement": "prompt"}
    gold = {"text": "gold answer here", "placement": "appended"}
    msgs = [{"role": "user", "content": "write a poem no commas lower case please"}]
    contexts = [{"a": a, "b": b}] * 2 + [{"a": a, "g": gold}] * 2 + [{"a": a, "b": b}] * 2
    names = ["a", "b", "g"]
    nan = float("nan")
    scores = torch.tensor([[1, 0, nan], [0, 1, nan], [1, nan, 0], [0, nan, 0], [1, 1, nan], [1, 1, nan]])
    index = np.array(["p", "p", "q", "q", "s", "s"], dtype=object)  # group s varies in nothing: not replayed
    g = torch.Generator().manual_seed(7)
    B, T = 6, 9
    responses = torch.randint(0, 150_000, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 6:] = 0
    mask[4, 2:4] = 0  # a gap
    rollout = [render(msgs)] * B
    fwd = hf_forward(tiny_lm)

    def dispatch(inputs, settings):
        td = TensorDict(dict(inputs), batch_size=[inputs["pair_variant"].shape[0]])
        for k in (*REPLAY_SETTINGS, "fused"):
            td.set_non_tensor(k, settings[k])
        td.set_non_tensor("layout", "packed")  # the packed layout (exact here through the block mask)
        with torch.no_grad():
            return replay_rows(fwd, td, "cpu", sync=None)

    table = RewardTable(names=names, scores=scores, contexts=contexts, errors=[""] * B)
    cfg = mrtpo_config({})
    args = (cfg, table, [msgs] * B, responses, mask, rollout, render, dispatch)
    fused = run_replay(PassRequest(*args, dp_size=2, temperature=0.8, pad_id=0), index, fused=True)
    plain = run_replay(PassRequest(*args, dp_size=1, temperature=0.8, pad_id=0), index)
    assert torch.allclose(fused.relevance, plain.relevance, atol=1e-5) and fused.rows == plain.rows == [0, 1, 2, 3]
    assert fused.logprobs_are_rollout_prompt == [True, True, False, False]  # rows 2, 3 replay only a: both their variants carry the block
    with torch.no_grad():
        for i in range(B):
            n = int((torch.arange(1, T + 1) * mask[i]).max())
            seq = torch.tensor([rollout[i] + responses[i, :n].tolist()])
            logits = tiny_lm(input_ids=seq).logits[0, len(rollout[i]) - 1 : -1] / 0.8
            m = mask[i, :n] > 0
            want_lp = logprobs_from_logits(logits, responses[i, :n])
            want_h = entropy_from_logits(logits)
            assert torch.allclose(fused.old_log_probs[i, :n][m], want_lp[m], atol=1e-5), i
            assert torch.allclose(fused.entropy[i, :n][m], want_h[m], atol=1e-5), i
            assert (fused.old_log_probs[i][mask[i] == 0] == 0).all()
    assert fused.consistency_metrics(mask, fused.old_log_probs) == {"mrtpo/consistency/rows": 0, "mrtpo/consistency/fused_rows": 2}
    assert "mrtpo/replay_tokens_max" in fused.metrics and PS.from_wire({**PS().to_wire(), "layout": "packed"}, "m").layout == "packed"


@pytest.mark.parametrize("layout", ["sorted", "packed"])
def test_a_forward_that_ignores_logits_to_keep_fails_loudly(layout):
    """verl's patched VLM forwards return full logits whatever ``logits_to_keep`` asks: the pass must not read them."""
    from recipe.mrtpo.core.passes import LogitsShapeError, run_pass

    V = 11

    def full_logits(ids, attn, pos, keep):  # ignores keep
        return torch.zeros(ids.shape[0], ids.shape[1], V)

    def honest(ids, attn, pos, keep):
        n = int(keep.numel()) if torch.is_tensor(keep) else int(keep)
        return torch.zeros(ids.shape[0], n, V)

    prompts = torch.randint(0, V, (2, 1, 6))
    responses = torch.randint(0, V, (2, 5))
    seqs = [s for r in range(2) for s in row_sequences(r, [0], [6], 5)]
    settings = PassSettings(micro_batch_size=2, layout=layout, packed_attention="block_mask")
    run_pass(honest, prompts, responses, seqs, settings, lambda *a: None)
    with pytest.raises(LogitsShapeError, match=r"does not honour logits_to_keep.*vision-language"):
        run_pass(full_logits, prompts, responses, seqs, settings, lambda *a: None)


def test_the_reductions_see_logits_divided_as_verl_divides_them():
    """run_pass hands ``consume`` verl's temperature-scaled logits (bf16: divided by 0.7 rounded to bf16)."""
    from recipe.mrtpo.core.passes import run_pass

    V, seen = 9, []
    logits = torch.randn(1, 6, V).to(torch.bfloat16)
    seqs = row_sequences(0, [0], [4], 5)
    run_pass(lambda ids, attn, pos, keep: logits, torch.randint(0, V, (1, 1, 4)), torch.randint(0, V, (1, 5)), seqs,
             PassSettings(temperature=0.7, micro_batch_size=1), lambda s, x, single: seen.append(x.clone()))
    assert torch.equal(seen[0][0], (logits / torch.tensor(0.7).to(torch.bfloat16))[0, :5])
