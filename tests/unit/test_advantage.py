"""The MRTPO advantage against verl 0.9.1's own GDPO/GRPO and the invariants of docs/design.md §1."""

import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_gdpo_outcome_advantage, compute_grpo_outcome_advantage

from recipe.mrtpo.core.advantage import (
    cap_token_weight,
    compute_mrtpo_advantage_with_stats,
    group_has_variance,
    group_normalized_scores,
    relevance_weights,
    response_level_weights,
    rlsd_lambda,
    rlsd_reweight,
    shuffle_within_mask,
    smoothstep_beta,
)


def mrtpo_adv(*args, **kwargs):
    """The core advantage alone (the statistics left out)."""
    return compute_mrtpo_advantage_with_stats(*args, **kwargs)[0]


def make_batch(n_groups=4, n=4, K=3, T=12, seed=0, binary=True):
    g = torch.Generator().manual_seed(seed)
    B = n_groups * n
    if binary:
        scores = torch.randint(0, 2, (B, K), generator=g).float()
    else:
        scores = torch.rand(B, K, generator=g)
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    index = np.array([f"uid{i // n}" for i in range(B)], dtype=object)
    q = torch.rand(B, K, T, generator=g) * mask[:, None]
    return scores, index, mask, q


def verl_gdpo(scores, index, mask, weights=None):
    """verl 0.9.1's GDPO on the same inputs, through its real entry (non_tensor_batch + batch)."""
    B, T = mask.shape
    prompt_len = 5
    attn = torch.cat([torch.ones(B, prompt_len), mask], dim=1).long()
    keys = [f"r{k}" for k in range(scores.shape[1])]
    ntb = {k: scores[:, j].numpy() for j, k in enumerate(keys)}
    cfg = {"gdpo_reward_keys": keys}
    if weights is not None:
        cfg["gdpo_reward_weights"] = weights
    adv, _ = compute_gdpo_outcome_advantage(
        token_level_rewards=torch.zeros(B, T), response_mask=mask, index=index, config=cfg,
        non_tensor_batch=ntb, batch={"prompts": torch.zeros(B, prompt_len), "attention_mask": attn},
    )
    return adv


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beta_zero_is_verl_gdpo(seed, binary):
    scores, index, mask, q = make_batch(seed=seed, binary=binary)
    ours = mrtpo_adv(scores, index, mask, q, beta=0.0, max_realloc_rms=1.0)
    assert torch.allclose(ours, verl_gdpo(scores, index, mask), atol=1e-5)
    # no replay at all (relevance None) is GDPO too, and so are fixed reward weights
    assert torch.allclose(mrtpo_adv(scores, index, mask, None, beta=0.5, max_realloc_rms=1.0), verl_gdpo(scores, index, mask), atol=1e-5)
    w = [1.0, 0.5, 2.0]
    assert torch.allclose(
        mrtpo_adv(scores, index, mask, None, beta=0.0, reward_weights=w, max_realloc_rms=1.0), verl_gdpo(scores, index, mask, w), atol=1e-5
    )


def test_uniform_relevance_is_gdpo():
    scores, index, mask, q = make_batch(seed=5)
    uniform = torch.full_like(q, 0.37) * mask[:, None]
    ours = mrtpo_adv(scores, index, mask, uniform, beta=0.8, max_realloc_rms=1.0)
    assert torch.allclose(ours, verl_gdpo(scores, index, mask), atol=1e-5)


def test_nonuniform_relevance_moves_advantage():
    scores, index, mask, q = make_batch(seed=6)
    ours = mrtpo_adv(scores, index, mask, q, beta=0.5, max_realloc_rms=1.0)
    assert not torch.allclose(ours, verl_gdpo(scores, index, mask), atol=1e-3)
    assert torch.isfinite(ours).all() and (ours[mask == 0] == 0).all()


def test_k1_beta0_is_grpo_up_to_whitening():
    scores, index, mask, q = make_batch(K=1, seed=3, binary=False)
    ours = mrtpo_adv(scores, index, mask, q, beta=0.0, max_realloc_rms=1.0)
    B, T = mask.shape
    tlr = torch.zeros(B, T)
    tlr[torch.arange(B), mask.sum(1).long() - 1] = scores[:, 0]
    grpo, _ = compute_grpo_outcome_advantage(tlr, mask, index)
    m = mask.bool()
    whitened = (grpo - grpo[m].mean()) / grpo[m].std()
    assert torch.allclose(ours[m], whitened[m], atol=1e-4)


def test_single_sample_group_follows_verl_convention():
    scores = torch.tensor([[0.3], [1.0], [0.0]])
    index = np.array(["a", "b", "b"], dtype=object)
    A = group_normalized_scores(scores, index)
    assert math.isclose(A[0, 0].item(), 0.3 / (1 + 1e-6), rel_tol=1e-6)
    assert A[1, 0] > 0 > A[2, 0]


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("rho", [None, 1.0, 0.3])
def test_weights_mean_one_positive_rms_bounded(beta, rho):
    _, _, mask, q = make_batch(seed=7, T=20)
    q = q[:, 0] ** 4  # peaky
    w = relevance_weights(q, mask, beta, max_realloc_rms=rho)
    m = mask.bool()
    per_row_mean = (w * mask).sum(1) / mask.sum(1)
    assert torch.allclose(per_row_mean, torch.ones_like(per_row_mean), atol=1e-5)
    assert (w[m] >= 1 - beta - 1e-6).all()
    if beta < 1:
        assert (w[m] > 0).all()
    assert (w[~m] == 0).all()
    if rho is not None:
        rms = ((((w - 1) ** 2) * mask).sum(1) / mask.sum(1)).sqrt()
        assert (rms <= rho + 1e-5).all()


def test_rms_constraint_scales_not_clips():
    mask = torch.ones(1, 10)
    q = torch.zeros(1, 10)
    q[0, 0] = 1.0  # all mass on one token: w = [1 + 9b, 1 - b, ...]
    w_free = relevance_weights(q, mask, 1.0, max_realloc_rms=None)
    w = relevance_weights(q, mask, 1.0, max_realloc_rms=1.0)
    d_free, d = w_free - 1, w - 1
    assert (((d_free**2).mean()).sqrt() > 1.0)
    assert torch.allclose(((d**2).mean()).sqrt(), torch.tensor(1.0), atol=1e-5)
    ratio = d / d_free
    assert torch.allclose(ratio, ratio[0, 0].expand_as(ratio))  # one common scale: shape and signs kept


@pytest.mark.parametrize("cap", [1.0, 1.5, 3.0])
@pytest.mark.parametrize("rho", [None, 1.0, 0.5])
def test_token_weight_cap_bounds_one_token_and_keeps_the_invariants(cap, rho):
    """Step 5b: w <= c, mean_t w = 1, w >= 1 - beta, RMS(w - 1) no larger than without the cap, the order kept."""
    _, _, mask, q = make_batch(seed=3, T=30)
    q = q[:, 0] ** 6
    q[:, 0] += 20.0  # nearly one-hot rows (mass on the first token): the case the cap is for
    beta = 0.5
    free = relevance_weights(q, mask, beta, max_realloc_rms=rho)
    w = relevance_weights(q, mask, beta, max_realloc_rms=rho, max_token_weight=cap)
    m = mask.bool()
    assert free[m].max() > cap  # the cap acts in this batch
    assert (w[m] <= cap + 1e-5).all() and (w[m] >= 1 - beta - 1e-6).all() and (w[~m] == 0).all()
    assert torch.allclose((w * mask).sum(1) / mask.sum(1), torch.ones(w.shape[0]), atol=1e-5)
    rms = lambda x: ((((x - 1) ** 2) * mask).sum(1) / mask.sum(1)).sqrt()  # noqa: E731
    assert (rms(w) <= rms(free) + 1e-6).all()
    for i in range(w.shape[0]):  # never reorders two tokens (ties may appear where the cap clips)
        a, b = free[i][m[i]], w[i][m[i]]
        order = torch.argsort(a)
        assert (b[order].diff() >= -1e-6).all()
    if cap == 1.0:
        assert torch.allclose(w[m], torch.ones_like(w[m]), atol=1e-6)


def test_token_weight_cap_is_off_by_default_and_inert_above_the_largest_weight():
    _, _, mask, q = make_batch(seed=4, T=16)
    free = relevance_weights(q[:, 1], mask, 0.5, 1.0)
    assert torch.equal(relevance_weights(q[:, 1], mask, 0.5, 1.0, max_token_weight=None), free)
    assert torch.allclose(relevance_weights(q[:, 1], mask, 0.5, 1.0, max_token_weight=float(free.max()) + 1), free, atol=1e-6)
    # one-hot q under rho = 1, T = 10: w_max = 1 + 3 = 4; c = 2 moves the token's surplus 3 to 1 and scales the
    # other nine weights' deficit by 1/3
    q1, m1 = torch.zeros(1, 10), torch.ones(1, 10)
    q1[0, 0] = 1.0
    d = cap_token_weight(relevance_weights(q1, m1, 1.0, 1.0) - 1.0, m1, 2.0)
    assert torch.allclose(d, torch.tensor([[1.0] + [-1.0 / 9] * 9]), atol=1e-6)
    with pytest.raises(ValueError, match="max_token_weight"):
        cap_token_weight(d, m1, 0.9)


def test_token_weight_cap_reaches_the_advantage():
    scores, index, mask, q = make_batch(seed=5, T=24)
    q = q ** 6
    free, st_free = compute_mrtpo_advantage_with_stats(scores, index, mask, q, 0.5, max_realloc_rms=1.0, whiten=False)
    capped, st = compute_mrtpo_advantage_with_stats(scores, index, mask, q, 0.5, max_realloc_rms=1.0, whiten=False,
                                                   max_token_weight=1.5)
    assert st_free.weight_max > 1.5 >= st.weight_max - 1e-5 and not torch.allclose(free, capped)


def test_qbar_zero_falls_back_to_uniform():
    mask = torch.ones(2, 6)
    q = torch.zeros(2, 6)
    q[1] = torch.rand(6)
    w = relevance_weights(q, mask, 0.7, max_realloc_rms=1.0)
    assert torch.equal(w[0], torch.ones(6))
    assert not torch.allclose(w[1], torch.ones(6))
    # an all-masked row never divides by zero
    w2 = relevance_weights(torch.rand(1, 4), torch.zeros(1, 4), 0.5, max_realloc_rms=1.0)
    assert torch.equal(w2, torch.zeros(1, 4))


def test_no_variance_group_gets_zero_advantage_and_no_replay():
    scores = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    A = group_normalized_scores(scores, index)
    assert A[0, 0] != 0 and A[2, 0] == 0 and A[3, 0] == 0 and A[2, 1] == 0 and A[3, 1] == 0
    var = group_has_variance(scores, index)
    assert var.tolist() == [[True, True], [True, True], [False, False], [False, False]]


def test_absent_rewards_contribute_nothing_and_never_leak_nan():
    nan = float("nan")
    # group a has rewards 0 and 1; group b has rewards 1 and 2 (ragged, as in instruction following)
    scores = torch.tensor([[1.0, 0.0, nan], [0.0, 1.0, nan], [nan, 1.0, 0.0], [nan, 0.0, 1.0]])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    mask = torch.ones(4, 5)
    q = torch.rand(4, 3, 5)
    adv = mrtpo_adv(scores, index, mask, q, beta=0.5, max_realloc_rms=1.0)
    assert torch.isfinite(adv).all()
    A = group_normalized_scores(scores, index)
    assert A[0, 2] == 0 and A[2, 0] == 0
    # the absent column changes nothing: group a's signal (before batch whitening) is the same as
    # with reward 2 dropped, whatever the replay left in the absent reward's relevance row
    q2 = q.clone()
    q2[:2, 2] = torch.rand(2, 5) * 100
    raw_full, _ = compute_mrtpo_advantage_with_stats(scores, index, mask, q2, beta=0.5, whiten=False, max_realloc_rms=1.0)
    raw_sub, _ = compute_mrtpo_advantage_with_stats(scores[:2, :2], index[:2], mask[:2], q[:2, :2], beta=0.5, whiten=False, max_realloc_rms=1.0)
    assert torch.allclose(raw_full[:2], raw_sub, atol=1e-6)


def test_shuffle_permutes_within_valid_positions_only():
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(3, 8)
    mask[1, 5:] = 0
    q = torch.rand(3, 2, 8) * mask[:, None]
    s = shuffle_within_mask(q, mask, torch.Generator().manual_seed(1))
    assert not torch.equal(s, q)
    for i in range(3):
        for k in range(2):
            m = mask[i].bool()
            assert torch.equal(torch.sort(s[i, k, m]).values, torch.sort(q[i, k, m]).values)
            assert torch.equal(s[i, k, ~m], q[i, k, ~m])
    # deterministic for a seeded generator
    assert torch.equal(s, shuffle_within_mask(q, mask, torch.Generator().manual_seed(1)))
    scores, index, mask2, q2 = make_batch(seed=8)
    a = mrtpo_adv(scores, index, mask2, q2, 0.5, shuffle=True, generator=torch.Generator().manual_seed(2), max_realloc_rms=1.0)
    b = mrtpo_adv(scores, index, mask2, q2, 0.5, max_realloc_rms=1.0)
    assert not torch.allclose(a, b) and torch.isfinite(a).all()
    del g


def test_smoothstep_beta():
    assert smoothstep_beta(0, 0.5, 10) == 0.0
    assert smoothstep_beta(5, 0.5, 10) == pytest.approx(0.5 * 0.25 * 2.0)
    assert smoothstep_beta(10, 0.5, 10) == 0.5
    assert smoothstep_beta(100, 0.5, 10) == 0.5
    assert smoothstep_beta(0, 0.5, 0) == 0.5
    vals = [smoothstep_beta(s, 1.0, 10) for s in range(12)]
    assert all(b >= a for a, b in zip(vals, vals[1:]))
    with pytest.raises(ValueError):
        smoothstep_beta(-1, 0.5, 10)


def test_response_level_weights():
    nan = float("nan")
    index = np.array(["a", "a", "b", "b"], dtype=object)
    scores = torch.tensor([[1.0, 0.0, 0.5], [0.0, 0.0, 0.5], [1.0, 1.0, 0.5], [0.0, 1.0, 0.5]])
    none = response_level_weights(scores, index, "none")
    assert none.tolist() == [1.0, 1.0, 1.0]
    dvao = response_level_weights(scores, index, "dvao")
    # reward 0 varies inside both groups (var .25 each), reward 1 and 2 never vary inside a group
    assert dvao.tolist() == pytest.approx([3.0, 0.0, 0.0])
    saw = response_level_weights(scores, index, "saw")
    # CV: reward 0: std .5 / mean .5 = 1; reward 1: same; reward 2: 0
    assert saw.tolist() == pytest.approx([1.5, 1.5, 0.0])
    assert float(saw.mean()) == pytest.approx(1.0)
    ragged = torch.tensor([[1.0, nan], [0.0, nan], [nan, nan], [nan, nan]])
    assert response_level_weights(ragged, index, "dvao").tolist() == [1.0, 0.0]
    # composes: SAW-weighted MRTPO differs from plain and stays finite
    s2, idx2, m2, q2 = make_batch(seed=9, binary=False)
    a = mrtpo_adv(s2, idx2, m2, q2, 0.5, reward_weighting="saw", max_realloc_rms=1.0)
    assert torch.isfinite(a).all() and not torch.allclose(a, mrtpo_adv(s2, idx2, m2, q2, 0.5, max_realloc_rms=1.0))
    with pytest.raises(ValueError):
        response_level_weights(scores, index, "bogus")


@pytest.mark.parametrize("method", ["saw", "dvao"])
def test_padding_rows_are_left_out_of_the_reward_weighting(method):
    """verl pads the batch to a multiple of the DP size with copies of sample 0 under one pad uid (their
    response_mask is 0): with ``valid`` they change neither lambda_k nor any real row's advantage."""
    from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats

    index = np.array(["a", "a", "b", "b"], dtype=object)
    nan = float("nan")
    scores = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, nan], [0.0, nan]])  # ragged: group b has no reward 1
    pad_uid = "pad" + "0" * 32
    padded_scores = torch.cat([scores, scores[:1].expand(3, -1)])
    padded_index = np.concatenate([index, np.array([pad_uid] * 3, dtype=object)])
    valid = torch.tensor([True] * 4 + [False] * 3)
    real = response_level_weights(scores, index, method)
    assert response_level_weights(padded_scores, padded_index, method, valid=valid).tolist() == pytest.approx(real.tolist())
    assert response_level_weights(padded_scores, padded_index, method).tolist() != pytest.approx(real.tolist())  # they would count

    mask = torch.ones(4, 6)
    padded_mask = torch.cat([mask, torch.zeros(3, 6)])
    q = torch.rand(4, 2, 6, generator=torch.Generator().manual_seed(0))
    padded_q = torch.cat([q, torch.zeros(3, 2, 6)])
    ref, ref_stats = compute_mrtpo_advantage_with_stats(scores, index, mask, q, 0.5, 1.0, reward_weighting=method)
    adv, stats = compute_mrtpo_advantage_with_stats(padded_scores, padded_index, padded_mask, padded_q, 0.5, 1.0,
                                                    reward_weighting=method, valid=valid)
    assert torch.allclose(adv[:4], ref, atol=1e-6) and float(adv[4:].abs().max()) == 0
    assert stats.reward_weights == pytest.approx(ref_stats.reward_weights)
    with pytest.raises(ValueError, match="valid"):
        response_level_weights(padded_scores, padded_index, method, valid=valid[:4])


def test_reward_table_from_extras_gives_verl_gdpo():
    """The reward manager's per-sample JSON, parsed once into a RewardTable, gives verl's GDPO (beta = 0)
    and the recipe's MRTPO (beta > 0) through the core function; the recipe does not register an estimator
    in verl's registry (the trainer calls the core itself)."""
    import json

    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    from recipe.mrtpo.rewards.reward_extras import SCORES_KEY, read_reward_table

    scores, index, mask, q = make_batch(seed=11)
    names = ["r0", "r1", "r2"]
    extras = [{SCORES_KEY: json.dumps({n: float(s[j]) for j, n in enumerate(names)})} for s in scores]
    table = read_reward_table(extras, index)
    assert table.names == names and torch.equal(table.scores, scores.float())
    adv = mrtpo_adv(table.scores, index, mask, q, 0.0, max_realloc_rms=1.0)
    assert torch.allclose(adv, verl_gdpo(scores, index, mask), atol=1e-5)
    adv2 = mrtpo_adv(table.scores, index, mask, q, 0.5, max_realloc_rms=1.0)
    assert not torch.allclose(adv2, adv, atol=1e-4)
    assert "mrtpo" not in ADV_ESTIMATOR_REGISTRY


def test_pairs_uniform_leaves_rows_without_valid_tokens_out():
    """A row with a non-zero advantage but no valid token has no weights: neither a uniform nor a weighted pair."""
    scores = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    mask = torch.ones(4, 6)
    mask[3] = 0  # e.g. one of verl's one-token padding rows: response_mask 0
    q = torch.zeros(4, 1, 6)
    q[0, 0, 2] = 1.0  # row 0 weighted; rows 1 and 2 uniform (qbar 0)
    _, stats = compute_mrtpo_advantage_with_stats(scores, index, mask, q, beta=0.5, max_realloc_rms=None)
    assert stats.weighted_pairs == 1 and stats.uniform_pairs == 2


def _ms_swift_rlsd(base, mask, teacher, student, lam, clip_range, negative_only=False):
    """ms-swift's apply_rlsd_reweight (PR 9758), as its docstring states it: one advantage per sequence."""
    base_bt = base.unsqueeze(1).expand_as(mask)
    delta = (teacher - student) * mask
    w = torch.exp(torch.sign(base_bt) * delta) * mask
    reweight = (1.0 - lam) + lam * torch.clamp(w, 1.0 - clip_range, 1.0 + clip_range)
    if negative_only:
        neg = (base < 0).float().unsqueeze(1)
        reweight = neg * reweight + (1.0 - neg)
    return base_bt * reweight * mask


@pytest.mark.parametrize("lam, clip, neg", [(1.0, 0.2, False), (0.5, 0.2, False), (0.5, 0.05, True), (0.0, 0.2, False)])
def test_rlsd_reweight_is_ms_swifts(lam, clip, neg):
    g = torch.Generator().manual_seed(3)
    B, T = 6, 9
    base = torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    teacher, student = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    adv = base.unsqueeze(1) * mask
    out, r = rlsd_reweight(adv, mask, teacher, student, lam, clip, neg)
    assert torch.allclose(out, _ms_swift_rlsd(base, mask, teacher, student, lam, clip, neg), atol=1e-6)
    assert (torch.sign(out) == torch.sign(adv)).all()  # r > 0: the reward's direction is never flipped
    assert float((r - 1).abs().max()) <= lam * clip + 1e-6
    if lam == 0.0:
        assert torch.equal(out, adv)


def test_rlsd_without_a_privileged_gap_is_the_advantage():
    """delta = 0 (P_all is the rollout prompt): r = 1 on every token, whatever lambda."""
    adv = torch.tensor([[0.5, 0.5, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    lp = torch.randn(2, 3)
    out, r = rlsd_reweight(adv, mask, lp, lp, 1.0, 0.2)
    assert torch.equal(out, adv * mask) and torch.equal(r, torch.ones(2, 3))


def test_rlsd_lambda_schedule_is_ms_swifts():
    assert [rlsd_lambda(s, 0.5) for s in (0, 7)] == [0.5, 0.5]
    assert [rlsd_lambda(s, 0.5, warmup_steps=4) for s in (0, 2, 4, 9)] == [0.0, 0.25, 0.5, 0.5]
    assert [rlsd_lambda(s, 0.5, warmup_steps=2, decay_steps=4) for s in (1, 2, 4, 6, 10)] == [0.25, 0.5, 0.25, 0.0, 0.0]
    assert [rlsd_lambda(s, 0.5, decay_steps=2) for s in (0, 1, 2)] == [0.5, 0.25, 0.0]
    with pytest.raises(ValueError):
        rlsd_reweight(torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1), 1.5, 0.2)


def _ms_swift_lambda(global_step, target, warmup, decay):
    """ms-swift's ``GRPOTrainer._rlsd_effective_lambda``, as written there (``state.global_step``)."""
    if warmup > 0 and global_step < warmup:
        return target * (global_step / warmup)
    if decay > 0 and global_step >= warmup:
        return target * max(1.0 - (global_step - warmup) / decay, 0.0)
    return target


def _rlsd_inputs(seed, lam, clip, neg=False, n_groups=8, n=4, K=3, T=14, teacher_rows=None):
    """A batch (binary rewards, lengths tied to the rewards, some groups without variance), its replay result and
    the RLSD step's inputs."""
    from types import SimpleNamespace

    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.methods import AdvantageInputs

    g = torch.Generator().manual_seed(seed)
    B = n_groups * n
    scores = torch.randint(0, 2, (B, K), generator=g).float()
    scores[:n] = scores[0]  # group 0: no variance in any reward (GDPO's raw advantage 0, whitened not)
    lengths = (3 + 3 * scores.sum(-1) + torch.randint(0, 3, (B,), generator=g)).clamp(max=T).long()
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    index = np.array([f"uid{i // n}" for i in range(B)], dtype=object)
    student = -torch.rand(B, T, generator=g) * 3 * mask
    teacher = (student + torch.randn(B, T, generator=g) * 0.4) * mask
    rows = list(range(B)) if teacher_rows is None else list(teacher_rows)
    replay = SimpleNamespace(rows=rows, replay_logprobs=teacher[rows], privileged=[True] * len(rows))
    cfg = mrtpo_config({"mode": "rlsd", "rlsd_reweight_clip_range": clip, "rlsd_negative_only": neg})
    table = SimpleNamespace(scores=scores, names=[f"r{k}" for k in range(K)])
    inp = AdvantageInputs(cfg, table, index, mask, torch.ones(B, dtype=torch.bool), 3, lam, replay, student)
    return inp, scores, index, mask, teacher, student


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("lam, clip, neg", [(0.5, 0.2, False), (1.0, 0.2, False), (0.3, 0.5, True)])
def test_rlsd_is_verls_gdpo_times_ms_swifts_weight(seed, lam, clip, neg):
    """RLSD's final advantage is verl's GDPO advantage (after its whitening) times ms-swift's r, re-stated here:
    no second whitening, no sign flip, r in [1 - lambda eps, 1 + lambda eps] on every valid token."""
    from recipe.mrtpo.methods.rlsd import rlsd_advantage

    inp, scores, index, mask, teacher, student = _rlsd_inputs(seed, lam, clip, neg)
    out, stats = rlsd_advantage(inp)
    gdpo = verl_gdpo(scores, index, mask)
    base = gdpo[torch.arange(mask.shape[0]), 0]  # one value per response (every response has >= 3 tokens)
    want = _ms_swift_rlsd(base, mask, teacher, student, lam, clip, neg)
    assert torch.allclose(out, want, atol=1e-5)
    valid = mask > 0
    assert (torch.sign(out)[valid] == torch.sign(gdpo)[valid]).all() and stats.extra["mrtpo/rlsd/sign_flips"] == 0
    r = out[valid & (gdpo != 0)] / gdpo[valid & (gdpo != 0)]
    assert float(r.min()) >= 1 - lam * clip - 1e-5 and float(r.max()) <= 1 + lam * clip + 1e-5
    assert float((r - 1).abs().max()) > 0.5 * lam * clip  # the weights act (not all 1)
    assert (gdpo[: 4][mask[: 4] > 0] != 0).all()  # the group without variance is reweighted too: its A is not 0
    assert stats.extra["mrtpo/rlsd/weight_min"] >= 1 - lam * clip - 1e-6 and stats.extra["mrtpo/rlsd/weight_max"] <= 1 + lam * clip + 1e-6


def test_rlsd_rows_without_a_teacher_keep_gdpos_advantage():
    """A row the pass did not forward (the live teacher where P_all is the rollout prompt) has delta = 0."""
    from recipe.mrtpo.methods.rlsd import rlsd_advantage

    inp, scores, index, mask, teacher, student = _rlsd_inputs(5, 1.0, 0.2, teacher_rows=range(0, 32, 2))
    out, stats = rlsd_advantage(inp)
    gdpo = verl_gdpo(scores, index, mask)
    assert torch.allclose(out[1::2], gdpo[1::2], atol=1e-6) and not torch.allclose(out[0::2], gdpo[0::2], atol=1e-3)
    assert stats.extra["mrtpo/rlsd/rows_teacher"] == 16


def test_rlsd_lambda_counts_optimizer_steps_as_ms_swift():
    """lambda_s at ms-swift's ``global_step``: the optimizer updates completed before the batch, ppo_epochs x
    (train_batch_size // ppo_mini_batch_size) per training step; 0 at the first step."""
    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.methods.rlsd import optimizer_steps, rlsd_strength

    config = {"data": {"train_batch_size": 512}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 128, "ppo_epochs": 2}}}
    cfg = mrtpo_config({"mode": "rlsd", "rlsd_lambda": 0.5, "rlsd_lambda_warmup_steps": 20, "rlsd_lambda_decay_steps": 40})
    for completed in (0, 1, 2, 3, 7, 30):
        global_step = completed * 2 * (512 // 128)  # 8 updates per training step
        assert optimizer_steps(config, completed) == global_step
        assert rlsd_strength(cfg, completed, config) == pytest.approx(_ms_swift_lambda(global_step, 0.5, 20, 40))
    assert rlsd_strength(cfg, 0, config) == 0.0


def test_top_token_share_is_the_largest_squared_advantage_over_the_sum():
    from recipe.mrtpo.core.advantage import top_token_share

    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, -1.0, 0.0, 9.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    s = top_token_share(adv, mask)
    assert s[0] == pytest.approx(0.25)  # uniform advantage: 1 / L
    assert s[1] == pytest.approx(9.0 / 10.0)  # the masked 9 does not count
    assert torch.isnan(s[2])  # no advantage at all


def test_the_token_weight_cap_knob_reaches_mrtpos_advantage_through_its_method():
    """``mrtpo.max_token_weight`` is read by the MRTPO method's advantage (not only by the core function)."""
    from types import SimpleNamespace

    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.methods import AdvantageInputs
    from recipe.mrtpo.methods.mrtpo import MRTPO

    scores, index, mask, q = make_batch(seed=6, T=24)
    q = q ** 6
    table = SimpleNamespace(scores=scores, names=["a", "b", "c"])
    replay = SimpleNamespace(relevance=q)

    def weight_max(**knobs):
        inp = AdvantageInputs(mrtpo_config(knobs), table, index, mask, torch.ones(len(index), dtype=torch.bool), 3, 0.5,
                              replay)
        return MRTPO.advantage(inp)[1].weight_max

    assert weight_max() > 1.5 and weight_max(max_token_weight=1.5) == pytest.approx(1.5, abs=1e-5)
    assert "max_token_weight" in MRTPO.reads
