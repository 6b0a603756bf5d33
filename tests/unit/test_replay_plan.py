"""Driver-side replay planning: the replay rule, fallbacks, packing, and the errored-sample fill."""

import numpy as np
import torch

from recipe.mrtpo.core.replay_plan import build_replay_plan, pad_rows, q_mass_top_share
from recipe.mrtpo.rewards.reward_extras import fill_errored_samples, reward_extras

NAN = float("nan")


def render(msgs):
    return [ord(c) for c in "".join(m["content"] for m in msgs)]


def test_rule_fallbacks_and_packing():
    msgs = [{"role": "user", "content": "Say hi. No commas. All lowercase."}]
    ctx = {"a": {"text": "No commas.", "placement": "prompt"}, "b": {"text": "All lowercase.", "placement": "prompt"},
           "c": {"text": "Not there.", "placement": "prompt"}}
    # group g1 (samples 0, 1): a varies, b constant, c varies (but its context is missing from the prompt)
    # group g2 (samples 2, 3): nothing varies; sample 3 lacks reward c (ragged)
    scores = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 0.0, NAN]])
    index = np.array(["g1", "g1", "g2", "g2"], dtype=object)
    T = 5
    responses = torch.arange(20).view(4, T)
    mask = torch.ones(4, T, dtype=torch.long)
    plan = build_replay_plan(scores, index, ["a", "b", "c"], [ctx] * 4, [msgs] * 4, responses, mask, render)
    assert plan.rows == [0, 1]
    assert plan.pairs_replayed == 2 and plan.pairs_fallback == 2 and plan.fallback_reasons == {"not_found": 2}
    assert plan.pairs_skipped == 2 + 5  # (b in g1) x 2 + all present pairs of g2
    assert plan.replayed_mask.tolist() == [[True, False, False], [True, False, False], [False] * 3, [False] * 3]
    pv = plan.inputs["pair_variant"]
    assert pv.tolist() == [[1, -1, -1], [1, -1, -1]]
    ids, lens = plan.inputs["variant_ids"], plan.inputs["variant_lens"]
    full = render(msgs)
    assert ids[0, 0, -lens[0, 0]:].tolist() == full
    minus = "".join(chr(i) for i in ids[0, 1, -lens[0, 1]:].tolist())
    assert "No commas." not in minus and "All lowercase." in minus
    assert torch.equal(plan.inputs["responses"], responses[:2])
    m = plan.metrics()
    assert m["mrtpo/pairs_replayed"] == 2 and m["mrtpo/fallback/not_found"] == 2 and m["mrtpo/variants_replayed"] == 4


def test_packing_pads_every_slot_once_whatever_the_render_returns():
    """Each slot of the packed ids [R, NV, P] is its variant left-padded with ``pad_id``, a row's unused slots all
    padding; a render returning a list, an int64 array or the cache's read-only int32 arrays packs the same."""
    from recipe.mrtpo.core.render_cache import CachedRender

    msgs = [{"role": "user", "content": "Say hi. No commas."}]
    two = {"a": {"text": "No commas.", "placement": "prompt"}, "b": {"text": "Say hi.", "placement": "prompt"}}
    one = {"a": two["a"]}
    scores = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, NAN], [0.0, NAN]])
    index = np.array(["g1", "g1", "g2", "g2"], dtype=object)
    responses, mask = torch.ones(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long)
    args = (scores, index, ["a", "b"], [two, two, one, one], [msgs] * 4, responses, mask)
    renders = [render, lambda m: np.asarray(render(m), dtype=np.int64), CachedRender(render)]
    plans = [build_replay_plan(*args, r, pad_id=7) for r in renders]
    ids, lens = plans[0].inputs["variant_ids"], plans[0].inputs["variant_lens"]
    assert ids.dtype == torch.int32 and ids.shape[:2] == (4, 3) and lens[2:, 2].tolist() == [0, 0]
    for r in range(4):
        for j in range(3):
            n = int(lens[r, j])
            assert (ids[r, j, : ids.shape[2] - n] == 7).all()
    assert ids[0, 0, -lens[0, 0]:].tolist() == render(msgs)
    for p in plans[1:]:
        assert all(torch.equal(p.inputs[k], plans[0].inputs[k]) for k in plans[0].inputs)


def test_pad_rows_and_empty():
    inputs = {"pair_variant": torch.tensor([[1, -1]]), "variant_ids": torch.ones(1, 2, 3, dtype=torch.long)}
    out, n = pad_rows(inputs, 4)
    assert n == 3 and out["pair_variant"].shape == (4, 2) and (out["pair_variant"][1:] == -1).all()
    same, n0 = pad_rows(inputs, 1)
    assert n0 == 0 and same is inputs


def test_q_mass_top_share():
    rel = torch.zeros(1, 1, 10)
    rel[0, 0, 0] = 9.0
    rel[0, 0, 1:] = 1.0 / 9
    share = q_mass_top_share(rel, torch.tensor([[True]]), torch.ones(1, 10))
    assert abs(share - 0.9) < 1e-6
    uniform = q_mass_top_share(torch.ones(1, 1, 10), torch.tensor([[True]]), torch.ones(1, 10))
    assert abs(uniform - 0.1) < 1e-6


def test_errored_sample_scores_zero_on_its_groups_rewards():
    scores = torch.tensor([[1.0, 0.0, NAN], [NAN, NAN, NAN], [NAN, NAN, 1.0]])
    index = np.array(["g", "g", "h"], dtype=object)
    out = fill_errored_samples(scores, [False, True, False], index)
    assert out[1, :2].tolist() == [0.0, 0.0] and torch.isnan(out[1, 2])
    assert torch.equal(fill_errored_samples(scores, [False] * 3, index).isnan(), scores.isnan())


def test_reward_extras_reads_transferqueue_layout():
    class Wrapped:
        def __init__(self, d):
            self.data = d

    ef = [{"reward_extra_info": {"mrtpo_rewards": "{}"}}, Wrapped({"reward_extra_info": {"x": 1}}), None, {"other": 1}]
    assert reward_extras(ef) == [{"mrtpo_rewards": "{}"}, {"x": 1}, {}, {}]


def test_run_replay_maps_compact_rows_to_rewards_on_the_driver():
    """The workers answer one half-precision row per variant; the driver returns [B, K, T] fp32 (§5)."""
    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.passes.pass_driver import PassRequest
    from recipe.mrtpo.rewards.reward_extras import RewardTable
    from recipe.mrtpo.step.replay_driver import run_replay

    msgs = [{"role": "user", "content": "Say hi. No commas. All lowercase."}]
    ctx = {"a": {"text": "No commas.", "placement": "prompt"}, "b": {"text": "All lowercase.", "placement": "prompt"}}
    scores = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])  # group g1 varies in a and b, g2 in nothing
    index = np.array(["g1", "g1", "g2", "g2"], dtype=object)
    T = 4
    responses, mask = torch.arange(16).view(4, T), torch.ones(4, T, dtype=torch.long)
    seen = {}

    def dispatch(inputs, settings):
        seen.update(settings=settings, rows=inputs["pair_variant"].shape[0])
        R, NV = inputs["variant_lens"].shape
        # an answer that depends on the row's content, not its position (the driver orders rows for balance)
        rows = (inputs["responses"][:, :1, None].float() + torch.arange((NV - 1) * T).view(1, NV - 1, T)) / 100
        forwards = torch.tensor([[3, 3], [3, 3], [1, 3], [1, 3]])  # rank 0: 3 forwards, rank 1: 1 (+2 padding)
        return {"variant_relevance": rows.to(torch.bfloat16), "replay_logprobs": torch.zeros(R, T),
                "replay_forwards": forwards[:R]}

    table = RewardTable(names=["a", "b"], scores=scores, contexts=[ctx] * 4, errors=[""] * 4)
    res = run_replay(PassRequest(mrtpo_config({}), table, [msgs] * 4, responses, mask, [render(msgs)] * 4, render, dispatch,
                                 dp_size=2, temperature=1.0, pad_id=0, token_budget=96), index)
    assert seen["settings"]["token_budget"] == 96 and seen["rows"] == 2
    assert res.relevance.dtype == torch.float32 and res.relevance.shape == (4, 2, T) and res.rows == [0, 1]
    expect = ((responses[:2, :1, None].float() + torch.arange(2 * T).view(1, 2, T)) / 100).to(torch.bfloat16).float()
    # both rewards' variants of each row: pair a -> variant 1 (row 0), b -> variant 2 (row 1)
    assert torch.equal(res.relevance[:2], expect) and (res.relevance[2:] == 0).all()
    assert res.metrics["mrtpo/replay_forwards_max"] == 3 and res.metrics["mrtpo/replay_forwards_min"] == 3
    assert res.metrics["mrtpo/replay_padding_forwards"] == 0
    from recipe.mrtpo.passes.pass_driver import pass_metrics

    m = pass_metrics(torch.tensor([[3, 3], [3, 3], [1, 3], [1, 3]]), 2, "mrtpo/replay")
    assert m == {"mrtpo/replay_forwards_max": 3, "mrtpo/replay_forwards_min": 1, "mrtpo/replay_padding_forwards": 2}
    m = pass_metrics(torch.tensor([[3, 3, 90, 80], [3, 3, 90, 80], [1, 3, 30, 30], [1, 3, 30, 30]]), 2, "mrtpo/replay")
    assert m["mrtpo/replay_tokens_max"] == 90 and m["mrtpo/replay_tokens_min"] == 30
    assert m["mrtpo/replay_tokens_over_existing"] == 120 / 110


def test_run_replay_asks_for_the_rollout_prompt_variants_logprobs():
    """Tool-calling-like rows: the only Z is appended, so P_minus_k (no verifier block) is the rollout prompt;
    the driver asks the workers for that variant's log-probs and marks the row for the consistency check."""
    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.passes.pass_driver import PassRequest
    from recipe.mrtpo.rewards.reward_extras import RewardTable
    from recipe.mrtpo.step.replay_driver import run_replay

    msgs = [{"role": "user", "content": "Call the tool."}]
    ctx = {"correctness": {"text": "f(x=1)", "placement": "appended"}, "format": {"text": "Call the tool.", "placement": "prompt"}}
    scores = torch.tensor([[1.0, 1.0], [0.0, 1.0]])  # correctness varies, format does not
    T = 3
    seen = {}

    def dispatch(inputs, settings):
        seen["lpv"] = inputs["logprob_variant"].tolist()
        R, NV = inputs["variant_lens"].shape
        return {"variant_relevance": torch.zeros(R, NV - 1, T), "replay_logprobs": torch.full((R, T), -1.0)}

    table = RewardTable(names=["correctness", "format"], scores=scores, contexts=[ctx] * 2, errors=[""] * 2)
    index = np.array(["g", "g"], dtype=object)
    res = run_replay(PassRequest(mrtpo_config({}), table, [msgs] * 2, torch.zeros(2, T, dtype=torch.long), torch.ones(2, T, dtype=torch.long),
                                 [render(msgs)] * 2, render, dispatch, dp_size=1, temperature=1.0, pad_id=0), index)
    assert seen["lpv"] == [1, 1] and res.logprobs_are_rollout_prompt == [True, True]
    m = res.consistency_metrics(torch.ones(2, T), torch.full((2, T), -1.0))
    assert m["mrtpo/consistency/rows"] == 2 and m["mrtpo/consistency/max_abs_logprob_diff"] == 0.0
    assert m["mrtpo/consistency/tokens"] == 2 * T and m["mrtpo/consistency/p99_abs_logprob_diff"] == 0.0
    # a long tail: one token off by 1 among many, the max sees it, the mean and p99 hardly
    from recipe.mrtpo.step.replay_driver import ReplayResult

    tail = ReplayResult(relevance=torch.zeros(1, 1, 200), replayed=torch.ones(1, 1, dtype=torch.bool), rows=[0],
                        replay_logprobs=torch.zeros(1, 200), logprobs_are_rollout_prompt=[True])
    old = torch.zeros(1, 200)
    old[0, :10] = 1e-3
    old[0, 7] = 1.0
    t = tail.consistency_metrics(torch.ones(1, 200), old)
    assert t["mrtpo/consistency/max_abs_logprob_diff"] == 1.0
    assert abs(t["mrtpo/consistency/mean_abs_logprob_diff"] - (1.0 + 9e-3) / 200) < 1e-7
    assert 1e-3 - 1e-6 < t["mrtpo/consistency/p99_abs_logprob_diff"] < 1.0
    # a rollout prompt that matches no variant: no consistency row
    res2 = run_replay(PassRequest(mrtpo_config({}), table, [msgs] * 2, torch.zeros(2, T, dtype=torch.long), torch.ones(2, T, dtype=torch.long),
                                  [[7, 7]] * 2, render, dispatch, dp_size=1, temperature=1.0, pad_id=0), index)
    assert seen["lpv"] == [0, 0] and res2.logprobs_are_rollout_prompt == [False, False]
    assert res2.consistency_metrics(torch.ones(2, T), torch.zeros(2, T)) == {"mrtpo/consistency/rows": 0}


def test_the_p_all_plan_forwards_the_teacher_prompt_alone():
    """RLSD's pass: one variant per row (P_all, or the rollout prompt where P_all cannot be built), nothing
    replayed against it, every response with a valid token; the behaviour policy as teacher skips the rows
    whose teacher prompt is their rollout prompt."""
    from recipe.mrtpo.core.replay_plan import build_p_all_plan

    msgs = [{"role": "user", "content": "Write SQL."}]
    appended = {"gold": {"text": "SELECT 1", "placement": "appended"}}
    placed = {"fmt": {"text": "Write SQL.", "placement": "prompt"}}
    rollout = render(msgs)
    contexts = [appended, placed, None, appended, appended]
    mask = torch.ones(5, 3, dtype=torch.long)
    mask[4] = 0  # verl's padding row: no valid token
    responses = torch.arange(15).view(5, 3)
    prompts = [rollout] * 5
    live = build_p_all_plan(2, contexts, [msgs] * 5, responses, mask, render, prompts)
    assert live.rows == [0, 3] and live.privileged == [True, True] and live.rollout_variant == [-1, -1]
    assert live.inputs["variant_ids"].shape[:2] == (2, 1) and (live.inputs["pair_variant"] == -1).all()
    p_all = "".join(chr(i) for i in live.inputs["variant_ids"][0, 0, -live.inputs["variant_lens"][0, 0]:].tolist())
    assert p_all.startswith("Write SQL.") and "SELECT 1" in p_all
    assert dict(live.fallback_reasons) == {"no_contexts": 1}
    every = build_p_all_plan(2, contexts, [msgs] * 5, responses, mask, render, prompts, every_row=True)
    assert every.rows == [0, 1, 2, 3] and every.privileged == [True, False, False, True]
    assert every.rollout_variant == [-1, 0, 0, -1]
    assert every.inputs["variant_ids"][1, 0, -len(rollout):].tolist() == rollout
    short = build_p_all_plan(2, contexts, [msgs] * 5, responses, mask, render, prompts, max_prompt_length=len(rollout))
    assert short.rows == [] and dict(short.fallback_reasons) == {"no_contexts": 1, "too_long": 2}


def test_the_p_all_plans_teacher_prompt_is_framed_by_the_template():
    """RLSD's teacher prompt (the P_all-only plan) is the rollout prompt with the appended Z framed as a reference
    solution (written out here), or by mrtpo.teacher_template; a prompt-placed-only row is not privileged."""
    from recipe.mrtpo.core.replay_plan import build_p_all_plan

    msgs = [{"role": "user", "content": "Write SQL."}]
    contexts = [{"gold": {"text": "SELECT 1", "placement": "appended"}}, {"fmt": {"text": "Write SQL.", "placement": "prompt"}}]
    mask = torch.ones(2, 3, dtype=torch.long)
    responses = torch.arange(6).view(2, 3)

    def text(plan, r):
        n = int(plan.inputs["variant_lens"][r, 0])
        return "".join(chr(i) for i in plan.inputs["variant_ids"][r, 0, -n:].tolist())

    default = build_p_all_plan(1, contexts, [msgs] * 2, responses, mask, render, [render(msgs)] * 2, every_row=True)
    assert text(default, 0) == "".join(chr(i) for i in render([{"role": "user", "content": (
        "Write SQL.\n\nHere is a reference solution:\nSELECT 1\n\nAfter understanding the reference solution, please "
        "try to solve this problem using your own approach below.")}]))
    assert default.privileged == [True, False] and text(default, 1) == "".join(chr(i) for i in render(msgs))
    own = build_p_all_plan(1, contexts, [msgs] * 2, responses, mask, render, [render(msgs)] * 2,
                           template="{information} -> {prompt}")
    assert own.rows == [0] and text(own, 0) == "".join(chr(i) for i in render([{"role": "user", "content": "SELECT 1 -> Write SQL."}]))
