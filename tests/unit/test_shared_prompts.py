"""Shared prompts (``core/shared_prompts.py``): each distinct prompt forwarded once per forward, exact in fp32."""

import pytest
import torch

from recipe.mrtpo.core.passes import PassSettings, hf_forward, row_sequences
from recipe.mrtpo.core.replay import replay_relevance
from recipe.mrtpo.core.shared_prompts import plan_shared_forwards, shared_forward_inputs
from recipe.mrtpo.methods.opsd.teacher import teacher_topk_rows
from recipe.mrtpo.passes.tree_attention import register_tree_attention

register_tree_attention()  # the worker's and the benchmarks' call: the shared forwards' attention

SHARED = dict(layout="packed", packed_attention="block_mask", share_prompts=True)


def cut_variants(base: torch.Tensor, NV: int, P: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """[NV, P] left-padded variants of ``base`` (P_all): variant 1 cuts a span out of the middle (the rest shifts),
    variant 2 drops a tail (a proper prefix of P_all), further ones cut elsewhere: P_minus_k as the tasks make them."""
    out = torch.zeros(NV, P, dtype=torch.long)
    lens = torch.zeros(NV, dtype=torch.long)
    for v in range(NV):
        if v == 0:
            seq = base
        elif v == 2:
            seq = base[: P - 3]
        else:
            a = int(torch.randint(1, P - 3, (1,), generator=g))
            seq = torch.cat([base[:a], base[a + 2 :]])
        out[v, P - len(seq) :], lens[v] = seq, len(seq)
    return out, lens


def group_batch(groups=(4, 3), NV=3, P=10, T=12, seed=0, prefixes=False):
    """Groups of rows sharing their prompt variants (uneven sizes), responses of uneven lengths with one gap.
    ``prefixes``: a row's variants cut from its P_all (:func:`cut_variants`, sharing prefixes), else random."""
    g = torch.Generator().manual_seed(seed)
    R = sum(groups)
    ids = torch.zeros(R, NV, P, dtype=torch.long)
    lens = torch.zeros(R, NV, dtype=torch.long)
    r = 0
    for n in groups:
        if prefixes:
            gi, gl = cut_variants(torch.randint(0, 150_000, (P,), generator=g), NV, P, g)
        else:
            gi = torch.randint(0, 150_000, (NV, P), generator=g)
            gl = torch.randint(3, P + 1, (NV,), generator=g)
            gl[0] = P
        ids[r : r + n], lens[r : r + n] = gi, gl
        r += n
    resp = torch.randint(0, 150_000, (R, T), generator=g)
    mask = torch.zeros(R, T, dtype=torch.long)
    for i in range(R):
        mask[i, : int(torch.randint(2, T + 1, (1,), generator=g))] = 1
    mask[1, 2:4] = 0
    pair = torch.tensor([[1, 2], [2, -1], [1, 1], [2, 1], [1, 2], [-1, -1], [2, 2]])[:R]
    return ids, lens, resp, mask, pair


def dense(tree) -> torch.Tensor:
    """[L, L] the tree mask's rule at every pair (a test's view: the package never builds it)."""
    q = torch.arange(tree.length)
    return tree.allowed(q[:, None], q[None, :])


def test_shared_inputs_hold_the_prompt_once_and_each_response_sees_it_alone():
    prompts = torch.tensor([[[0, 0, 101, 102, 103]], [[0, 0, 101, 102, 103]]])
    responses = torch.tensor([[201, 202, 203], [301, 302, 0]])
    mb = row_sequences(0, [0], [3], 3) + row_sequences(1, [0], [3], 2)
    ids, tree, pos, keep, starts = shared_forward_inputs(mb, prompts, responses)
    assert ids.tolist() == [[101, 102, 103, 201, 202, 203, 301, 302]]
    assert pos.tolist() == [[0, 1, 2, 3, 4, 5, 3, 4]]  # each response positioned right after the prompt
    assert keep.tolist() == [2, 3, 4, 2, 6] and starts == [0, 3]  # the prompt's last position, once per response
    assert tree.shape == (1, 1, 8, 8) and tree.parent.tolist() == [-1, 0, 0]  # the prompt, a response after it each
    blocked = ~dense(tree)
    assert not blocked[6, :3].any() and blocked[6, 3:6].all() and not blocked[7, 6]  # the prompt, not the other response
    assert blocked[0, 1] and blocked[3, 4]  # causal


def test_variants_share_their_common_prefix_once_each_token_at_its_own_position():
    # P_all = 101 102 103 104; P_minus_1 = 101 102 104 (a cut: shares 101 102); P_minus_2 = 101 102 103 (a prefix)
    prompts = torch.tensor([[[101, 102, 103, 104], [0, 101, 102, 104], [0, 101, 102, 103]]])
    responses = torch.tensor([[201, 202]])
    mb = row_sequences(0, [0, 1, 2], [4, 3, 3], 2)
    ids, tree, pos, keep, starts = shared_forward_inputs(mb, prompts, responses)
    # the tree in lexicographic order: 101 102 103 | 104 (P_all's tail) | 104 (P_minus_1's own tail), responses after each
    assert ids.tolist() == [[101, 102, 103, 201, 202, 104, 201, 202, 104, 201, 202]]
    assert pos.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5, 2, 3, 4]]
    allowed = dense(tree).int()
    # segments in creation order: 101 102 (cut where P_minus_1 branches), P_minus_2's answer, P_all's 104, its answer,
    # 103 (the tail cut off: what followed it follows it still), P_minus_1's 104, its answer
    assert tree.starts.tolist() == [0, 3, 5, 6, 2, 8, 9] and tree.parent.tolist() == [-1, 4, 4, 2, 0, 0, 5]
    assert allowed[5].tolist() == [1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0]  # P_all's last token: its prefix, not P_minus_2's answer
    assert allowed[8].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0]  # P_minus_1's own 104 after the shared 101 102
    assert allowed[10].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1]  # its response: its prompt, itself
    assert keep.tolist() == [5, 6, 8, 9, 2, 3] and starts == [0, 2, 4]  # each sequence in mb's order


@pytest.mark.parametrize("prefixes", [False, True])
def test_plan_keeps_rows_whole_groups_together_and_bounds_the_shared_length(prefixes):
    ids, lens, resp, mask, pair = group_batch(prefixes=prefixes)
    from recipe.mrtpo.core.replay import plan_sequences

    seqs = plan_sequences(lens, pair, mask.sum(-1))
    batches = plan_shared_forwards(seqs, ids, token_budget=50, micro_batch_size=8)
    for b in batches:
        rows = {s.row for s in b}
        assert all(sum(1 for s in b if s.row == r) == sum(1 for s in seqs if s.row == r) for r in rows)  # rows whole
        distinct = {tuple(ids[s.row, s.variant, -int(s.prompt_len):].tolist()) for s in b}
        trie = {p[:j] for p in distinct for j in range(1, len(p) + 1)}
        assert len(rows) == 1 or len(trie) + sum(s.resp_len for s in b) <= 50
    flat = [s.row for b in batches for s in b]
    groups = [0 if r < 4 else 1 for r in dict.fromkeys(flat)]
    assert groups == sorted(groups) or groups == sorted(groups, reverse=True)  # a group's rows adjacent


@pytest.mark.parametrize("budget,prefixes", [(None, False), (60, False), (None, True), (45, True)])
def test_shared_replay_equals_the_unshared_one_at_the_limit(tiny_lm, budget, prefixes):
    ids, lens, resp, mask, pair = group_batch(prefixes=prefixes)
    fwd = hf_forward(tiny_lm)
    lpv = torch.tensor([0, 2, 0, 1, 0, 0, 0])
    with torch.no_grad():
        shared = replay_relevance(fwd, ids, lens, resp, mask, pair, settings=PassSettings(
            temperature=0.8, micro_batch_size=64, token_budget=budget, **SHARED), logprob_variant=lpv, entropy=True)
        one = replay_relevance(fwd, ids, lens, resp, mask, pair, micro_batch_size=1, temperature=0.8, logprob_variant=lpv,
                               layout="padded", entropy=True)
    # FlexAttention's eager kernel (an exp2 softmax) rounds otherwise than SDPA: 3e-5 on logits of 54 (6e-7
    # relative) in the same row under the same mask; a wrong mask moves log-probs by O(1)
    for key, tol in (("variant_relevance", 1e-5), ("replay_logprobs", 1e-4), ("replay_entropy", 1e-4)):
        assert torch.allclose(shared[key], one[key], atol=tol), key
    assert int(shared["tokens_forwarded"]) < int(one["tokens_existing"])
    if budget is None:  # one forward: every distinct prompt token once plus every response token, the limit
        from recipe.mrtpo.core.passes import response_lengths
        from recipe.mrtpo.core.replay import plan_sequences

        seqs = plan_sequences(lens, pair, response_lengths(mask), lpv)
        distinct = {tuple(ids[s.row, s.variant, -int(s.prompt_len):].tolist()) for s in seqs}
        trie = {p[:j] for p in distinct for j in range(1, len(p) + 1)}  # the prompts' prefixes: a trie's nodes
        assert int(shared["tokens_forwarded"]) == len(trie) + sum(s.resp_len for s in seqs)
        assert (len(trie) < sum(map(len, distinct))) == prefixes


def test_shared_teacher_topk_equals_each_sequence_alone(tiny_lm):
    ids, lens, resp, mask, _ = group_batch(seed=1)
    prompt_ids, prompt_lens = ids[:, 0], lens[:, 0].clone()
    fwd = hf_forward(tiny_lm)
    with torch.no_grad():
        out = teacher_topk_rows(fwd, prompt_ids, prompt_lens, resp, mask, k=4, temperature=0.8, micro_batch_size=8,
                                token_budget=70, layout="packed", packed_attention="block_mask",
                                settings=PassSettings(temperature=0.8, micro_batch_size=8, token_budget=70, **SHARED))
        for r in range(ids.shape[0]):
            n = int((torch.arange(1, resp.shape[1] + 1) * mask[r]).max())
            seq = torch.cat([prompt_ids[r, -int(prompt_lens[r]):], resp[r, :n]])[None]
            lp = torch.log_softmax(tiny_lm(input_ids=seq).logits[0, int(prompt_lens[r]) - 1 : -1] / 0.8, -1)
            v, i = lp.topk(4, -1)
            m = mask[r, :n] > 0
            assert torch.allclose(out["topk_logprobs"][r, :n][m], v[m], atol=1e-4)  # flex's rounding (above)
            assert torch.equal(out["topk_ids"][r, :n][m], i[m])
            assert torch.allclose(out["token_logprobs"][r, :n][m], lp.gather(-1, resp[r, :n, None])[:, 0][m], atol=1e-4)
    assert int(out["tokens_forwarded"]) < int(out["tokens_existing"])


@pytest.mark.parametrize("layout,attention,shared", [("packed", "varlen", True), ("sorted", "block_mask", True),
                                                      ("single", "varlen", False)])
def test_sharing_holds_under_any_attention_and_is_off_for_single(layout, attention, shared):
    """The shared forwards take a TreeMask whatever the module's attention (its forward switches to the tree's
    FlexAttention); a recurrent type (``single``) runs every sequence alone, unshared."""
    from recipe.mrtpo.core.tree_mask import TreeMask

    ids, lens, resp, mask, pair = group_batch()
    calls = []

    def fwd(input_ids, attn, pos, keep):
        calls.append(attn)
        n = int(keep.numel()) if torch.is_tensor(keep) else int(keep)
        return torch.zeros(input_ids.shape[0], n, 8)

    resp = resp % 8
    out = replay_relevance(fwd, ids, lens, resp, mask, pair, settings=PassSettings(layout=layout, packed_attention=attention,
                                                                                    share_prompts=True))
    assert calls and all(isinstance(a, TreeMask) == shared for a in calls)
    assert int(out["tokens_forwarded"]) < int(out["tokens_existing"]) if shared else len(calls) == int(out["n_forwards"])


def test_share_prompts_travels_on_the_wire_and_is_optional():
    wire = PassSettings(share_prompts=True).to_wire()
    assert wire["share_prompts"] is True and PassSettings.from_wire(wire, "m", "sdpa").share_prompts
    wire.pop("share_prompts")
    assert not PassSettings.from_wire(wire, "m", "sdpa").share_prompts  # an older sender: unshared


def test_prompt_tree_counts_every_distinct_prefix_once():
    from recipe.mrtpo.core.shared_prompts import PromptTree

    g = torch.Generator().manual_seed(3)
    for _ in range(20):  # a small alphabet: many shared prefixes, prefixes of each other, tokens above a byte
        seqs = {tuple((torch.randint(0, 3, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g) * 300).tolist())
                for _ in range(12)}
        tree = PromptTree()
        for s in seqs:  # added one by one, as the planner grows a forward
            tree.add([(len(s), torch.tensor(s, dtype=torch.long).numpy().tobytes())])
        assert tree.tokens == len({s[:j] for s in seqs for j in range(1, len(s) + 1)})


@pytest.mark.parametrize("attn", ["eager", "sdpa", "flash_attention_2"])
def test_the_tree_mask_is_exact_whatever_the_modules_attention(tiny_lm, attn):
    """A shared forward runs under the tree's FlexAttention whatever the module's own (switched for the forward,
    restored after; the name only: no flash-attn kernel runs on CPU): each sequence's logits equal it alone in fp32."""
    import copy

    from recipe.mrtpo.core.passes import PassSettings as S
    from recipe.mrtpo.core.passes import response_lengths
    from recipe.mrtpo.core.replay import plan_sequences

    model = copy.deepcopy(tiny_lm)
    model.config._attn_implementation = attn
    ids, lens, resp, mask, pair = group_batch(prefixes=True, seed=2)
    seqs = plan_sequences(lens, pair, response_lengths(mask))
    fwd = hf_forward(model)
    got: dict = {}

    def consume(rows, logits, single):
        for j, s in enumerate(rows):
            got[(s.row, s.variant)] = logits[j].clone()

    from recipe.mrtpo.core.passes import run_pass
    from recipe.mrtpo.core.shared_prompts import attention_switched

    with torch.no_grad():
        run_pass(fwd, ids, resp, seqs, S(micro_batch_size=64, **SHARED), consume)
        for (r, v), lg in got.items():
            p, n = int(lens[r, v]), int(response_lengths(mask)[r])
            seq = torch.cat([ids[r, v, -p:], resp[r, :n]])[None]
            with attention_switched(model, "sdpa"):  # the reference: the sequence alone
                want = torch.log_softmax(model(input_ids=seq).logits[0, p - 1 : p + n - 1], -1)
            lp = torch.log_softmax(lg, -1)
            # the whole vocabulary's log-probs reach -60 under random weights, where fp32 rounding differs by up to
            # 1.2e-5 relative (3e-4 absolute) on an AMD EPYC's kernels; a wrong mask moves them by O(1). The sampled
            # tokens' log-probs, q and the teacher's top-k are checked to 1e-5 / 1e-4 absolute above
            assert torch.allclose(lp, want, atol=1e-5, rtol=1e-4), (attn, r, v, float(((lp - want).abs() / want.abs()).max()))
    assert len(got) == len(seqs) and model.config._attn_implementation == attn


def test_attention_switched_restores_the_modules_own():
    from types import SimpleNamespace

    from recipe.mrtpo.core.shared_prompts import attention_switched

    module = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    with attention_switched(module, "mrtpo_tree_flex"):
        assert module.config._attn_implementation == "mrtpo_tree_flex"
    assert module.config._attn_implementation == "flash_attention_2"
    with pytest.raises(RuntimeError, match="boom"):
        with attention_switched(module, "mrtpo_tree_flex"):
            raise RuntimeError("boom")
    assert module.config._attn_implementation == "flash_attention_2"  # restored after an error too
