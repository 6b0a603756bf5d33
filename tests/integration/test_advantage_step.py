"""The trainer's advantage step without Ray or vLLM: a fake TransferQueue, a tiny Qwen2 as the "actor".

``MRTPOTrainer._compute_advantage`` runs as in the real loop (verl's batch layout: nested tensors and
non-tensor stacks in a TensorDict), with the worker group replaced by a function that runs the core replay
on a tiny model. A change in the advantage step fails here in seconds, not only in the minutes-long e2e runs.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from tensordict import NonTensorStack, TensorDict

from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats, smoothstep_beta
from recipe.mrtpo.core.replay import hf_forward
from recipe.mrtpo.rewards.reward_extras import CONTEXTS_KEY, ERROR_KEY, SCORES_KEY
from recipe.mrtpo.seams import verl_seam


def mrtpo_adv(*args, **kwargs):
    """The core advantage alone (the statistics left out)."""
    return compute_mrtpo_advantage_with_stats(*args, **kwargs)[0]


MSGS = [{"role": "user", "content": "Write a haiku about rain. Do not use any commas. Use only lowercase letters."}]
CTX = {"no_comma": {"text": "Do not use any commas.", "placement": "prompt"},
       "lower": {"text": "Use only lowercase letters.", "placement": "prompt"}}
# two groups of two responses; "no_comma" varies in group a, "lower" in both
SCORES = [{"no_comma": 1.0, "lower": 0.0}, {"no_comma": 0.0, "lower": 1.0}, {"no_comma": 1.0, "lower": 1.0}, {"no_comma": 1.0, "lower": 0.0}]
UIDS = ["a", "a", "b", "b"]
LENS = [7, 9, 5, 8]


class FakeTQ:
    """kv_batch_get / kv_batch_put over one in-memory TensorDict, as TransferQueue answers them."""

    def __init__(self, td: TensorDict):
        self.td = td
        self.put: dict = {}

    def kv_batch_get(self, keys, partition_id, select_fields):
        td = self.td.select(*[f for f in select_fields if f in self.td.keys()])
        rows = [int(str(k).rsplit("_", 1)[1]) for k in keys] if all("_" in str(k) for k in keys) else None
        if rows is None or sorted(rows) != list(range(len(rows))) or rows == list(range(len(rows))):
            return td  # keys in the batch's own order (or not "<uid>_<j>_<row>" keys at all)
        # keys "<uid>_<j>_<row>" asked in another order (the standing check's second call): rows in that order
        def pick(v):
            if isinstance(v, torch.Tensor) and v.is_nested:
                return torch.nested.as_nested_tensor([v.unbind()[i] for i in rows], layout=torch.jagged)
            if isinstance(v, torch.Tensor):
                return v[rows]
            return NonTensorStack(*[v[i] for i in rows])

        return TensorDict({k: pick(v) for k, v in td.items()}, batch_size=[len(rows)])

    def kv_batch_put(self, keys, partition_id, fields):
        self.put.update(dict(fields.items()))
        return SimpleNamespace(keys=keys, partition_id=partition_id)


def render(tok, msgs):
    return list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))


def old_log_probs(model, prompt: list[int], response: torch.Tensor) -> torch.Tensor:
    ids = torch.tensor([prompt + response.tolist()])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, response.view(-1, 1)).squeeze(-1)


def make_trainer(tok, model, step: int, *overrides: str):
    from recipe.mrtpo.step.trainer import MRTPOTrainer

    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        cfg = compose(config_name="mrtpo_trainer", overrides=["actor_rollout_ref.rollout.temperature=1.0", *overrides])
    trainer = MRTPOTrainer.__new__(MRTPOTrainer)
    trainer.config, trainer.tokenizer, trainer.global_steps = cfg, tok, step
    calls = []

    def compute_replay_relevance(td):
        from recipe.mrtpo.step.worker import REPLAY_SETTINGS, replay_rows

        assert all(td.get_non_tensor(k) is not None for k in REPLAY_SETTINGS)  # what the worker requires
        calls.append(int(td["pair_variant"].shape[0]))
        with torch.no_grad():  # as the worker's eval mode
            return replay_rows(hf_forward(model), td, "cpu", sync=None)  # the worker's own code, one rank

    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0]}, compute_replay_relevance=compute_replay_relevance)
    return trainer, calls


def make_batch(tok, model, scores=SCORES, errors=None, ctx=CTX):
    prompt = render(tok, MSGS)
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(0, 150_000, (n,), generator=g) for n in LENS]
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    extras = [{"reward_extra_info": {SCORES_KEY: json.dumps(s), CONTEXTS_KEY: json.dumps(ctx), ERROR_KEY: (errors or [""] * 4)[i]}}
              for i, s in enumerate(scores)]
    td = TensorDict(
        {
            "responses": nested(responses),
            "response_mask": nested([torch.ones(n, dtype=torch.long) for n in LENS]),
            "rm_scores": nested([torch.zeros(n) for n in LENS]),
            "old_log_probs": nested([old_log_probs(model, prompt, r) for r in responses]),
            "prompts": nested([torch.tensor(prompt)] * 4),
        },
        batch_size=[4],
    )
    td["uid"] = NonTensorStack(*UIDS)
    td["extra_fields"] = NonTensorStack(*extras)
    td["raw_prompt"] = NonTensorStack(*[MSGS] * 4)
    keys = [f"{u}_0_{i}" for i, u in enumerate(UIDS)]
    return td, SimpleNamespace(keys=keys, partition_id="train", __len__=lambda: 4), responses


class Meta(SimpleNamespace):
    def __len__(self):
        return len(self.keys)


def run_step(monkeypatch, tiny, step, *overrides, scores=SCORES, errors=None, ctx=CTX):
    tok, model = tiny
    td, _, responses = make_batch(tok, model, scores, errors, ctx)
    fake = FakeTQ(td)
    monkeypatch.setattr(verl_seam, "tq", fake)
    trainer, calls = make_trainer(tok, model, step, *overrides)
    metrics: dict = {}
    trainer._compute_advantage(Meta(keys=[f"{u}_0_{i}" for i, u in enumerate(UIDS)], partition_id="train"), metrics)
    return fake, metrics, calls, responses


def padded(x):
    return x.to_padded_tensor(padding=0.0) if getattr(x, "is_nested", False) else x


def test_mrtpo_step_equals_the_core_on_a_direct_replay(monkeypatch, tiny):
    fake, metrics, calls, _ = run_step(monkeypatch, tiny, 6, "mrtpo.beta=0.5", "mrtpo.warmup_steps=2")
    adv = padded(fake.put["advantages"])
    assert set(fake.put) == {"advantages", "returns"} and adv.shape == (4, max(LENS))
    assert calls == [4]  # all four rows have a varying reward
    mask = torch.zeros(4, max(LENS))
    for i, n in enumerate(LENS):
        mask[i, :n] = 1
    # the same relevance, recomputed here, through the core function
    scores = torch.tensor([[s["lower"], s["no_comma"]] for s in SCORES])
    assert metrics["mrtpo/beta"] == pytest.approx(smoothstep_beta(5, 0.5, 2))
    assert metrics["mrtpo/pairs_replayed"] == 6 and metrics["mrtpo/pairs_skipped_no_variance"] == 2
    # P_all is the rollout prompt for prompt-placed Z: the replay reproduces old_log_probs (fp32)
    assert metrics["mrtpo/consistency/rows"] == 4 and metrics["mrtpo/consistency/max_abs_logprob_diff"] < 1e-4
    assert metrics["mrtpo/reward/lower/mean"] == pytest.approx(0.5) and metrics["mrtpo/verifier_errors"] == 0
    assert metrics["mrtpo/adv_max_abs_diff_vs_gdpo"] > 1e-3  # the replay moved credit
    gdpo = mrtpo_adv(scores, np.array(UIDS, dtype=object), mask, None, 0.0, max_realloc_rms=1.0)
    assert not torch.allclose(adv, gdpo, atol=1e-4)
    assert torch.isfinite(adv).all() and float((adv * (1 - mask)).abs().max()) == 0
    # the concentration metrics, re-stated: the largest |A_t|, and per response max_t A^2 / sum_t A^2
    assert metrics["mrtpo/adv_max_abs"] == pytest.approx(float((adv.abs() * mask).max()))
    shares = [float((adv[i, :n] ** 2).max() / (adv[i, :n] ** 2).sum()) for i, n in enumerate(LENS)]
    assert metrics["mrtpo/adv_top_share_max"] == pytest.approx(max(shares), rel=1e-5)
    assert metrics["mrtpo/adv_top_share_mean"] == pytest.approx(sum(shares) / len(shares), rel=1e-5)


def test_first_step_and_gdpo_are_verl_gdpo(monkeypatch, tiny):
    from verl.trainer.ppo.core_algos import compute_gdpo_outcome_advantage

    mask = torch.zeros(4, max(LENS))
    for i, n in enumerate(LENS):
        mask[i, :n] = 1
    names = ["lower", "no_comma"]
    scores = torch.tensor([[s[n] for n in names] for s in SCORES])
    last = mask.sum(-1).long() - 1
    ntb = {}
    for k, n in enumerate(names):
        ntb[n] = scores[:, k].numpy()
    batch = {"prompts": torch.zeros(4, 1), "attention_mask": torch.cat([torch.ones(4, 1), mask], 1).long()}
    cfg = {"gdpo_reward_keys": names}
    ref, _ = compute_gdpo_outcome_advantage(torch.zeros(4, max(LENS)), mask, np.array(UIDS, dtype=object), config=cfg,
                                            non_tensor_batch=ntb, batch=batch)
    assert int(last.max()) < mask.shape[1]
    for est, step in (("mrtpo", 1), ("gdpo", 7)):
        fake, metrics, calls, _ = run_step(monkeypatch, tiny, step, f"algorithm.adv_estimator={est}")
        assert calls == [] and torch.allclose(padded(fake.put["advantages"]), ref, atol=1e-5), est


def test_errored_verifier_counts_and_scores_zero(monkeypatch, tiny):
    scores = [dict(s) for s in SCORES]
    scores[3] = {}
    fake, metrics, _, _ = run_step(monkeypatch, tiny, 6, scores=scores, errors=["", "", "", "ValueError: boom"])
    assert metrics["mrtpo/verifier_errors"] == 1 and torch.isfinite(padded(fake.put["advantages"])).all()


def test_a_batch_whose_verifiers_all_raised_trains_with_zero_advantage(monkeypatch, tiny):
    """Every verifier raised (a task never imported): counted and logged, zero advantage, no crash, no replay."""
    errors = ["KeyError: no task 'custom'"] * 4
    fake, metrics, calls, _ = run_step(monkeypatch, tiny, 6, scores=[{}] * 4, errors=errors)
    assert metrics["mrtpo/verifier_errors"] == 4 and metrics["mrtpo/batches_without_scores"] == 1
    assert metrics["mrtpo/num_rewards"] == 0 and calls == []
    assert (padded(fake.put["advantages"]) == 0).all()


def test_checker_errors_are_counted_apart_from_raising_verifiers(monkeypatch, tiny):
    """A checker that failed on one reward keeps the sample's scores; only a verifier without scores raised."""
    errors = ["lower: ValueError: bad", "", "", "ValueError: boom"]
    scores = [*SCORES[:3], {}]
    fake, metrics, _, _ = run_step(monkeypatch, tiny, 6, scores=scores, errors=errors)
    assert metrics["mrtpo/verifier_errors"] == 1 and metrics["mrtpo/checker_errors"] == 1


RLSD = ("algorithm.adv_estimator=gdpo", "mrtpo.mode=rlsd")
# "lower"'s Z is appended (a verifier block, as text-to-SQL's gold SQL): P_all differs from the rollout prompt
CTX_APPENDED = {"no_comma": CTX["no_comma"], "lower": {"text": "rain falls on the roof", "placement": "appended"}}
# RLSD's teacher prompt of MSGS with CTX_APPENDED, written out (the default template, not built by the code under
# test): the appended Z framed as a reference solution after the user turn; the prompt-placed one stays in place
TEACHER_MSGS = [{"role": "user", "content": (
    "Write a haiku about rain. Do not use any commas. Use only lowercase letters.\n\n"
    "Here is a reference solution:\nrain falls on the roof\n\n"
    "After understanding the reference solution, please try to solve this problem using your own approach below.")}]
# 2 optimizer updates per training step (train_batch_size 4 prompts, mini-batches of 2)
TWO_UPDATES = ("data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2")


def verl_gdpo_of_the_batch(scores=SCORES):
    """verl 0.9.1's own GDPO advantage of :func:`make_batch`'s batch (the reference every method starts from)."""
    from verl.trainer.ppo.core_algos import compute_gdpo_outcome_advantage

    mask = torch.zeros(4, max(LENS))
    for i, n in enumerate(LENS):
        mask[i, :n] = 1
    names = ["lower", "no_comma"]
    ntb = {n: np.array([s[n] for s in scores], dtype=np.float32) for n in names}
    batch = {"prompts": torch.zeros(4, 1), "attention_mask": torch.cat([torch.ones(4, 1), mask], 1).long()}
    adv, _ = compute_gdpo_outcome_advantage(torch.zeros(4, max(LENS)), mask, np.array(UIDS, dtype=object),
                                            config={"gdpo_reward_keys": names}, non_tensor_batch=ntb, batch=batch)
    return adv, mask


def test_rlsd_with_prompt_placed_contexts_is_gdpo(monkeypatch, tiny, caplog):
    """P_all equal to the rollout prompt (every Z in the prompt): the live teacher is the behaviour policy on the
    same prompt, delta = 0 on every token, nothing is forwarded and RLSD is GDPO exactly; the step says so in
    one line."""
    ref, _, _, _ = run_step(monkeypatch, tiny, 6, "algorithm.adv_estimator=gdpo")
    with caplog.at_level("WARNING", logger="recipe.mrtpo.step.trainer"):
        fake, metrics, calls, _ = run_step(monkeypatch, tiny, 6, *RLSD, "mrtpo.rlsd_lambda=1.0")
    lines = [r.getMessage() for r in caplog.records if "privileged information" in r.getMessage()]
    assert len(lines) == 1 and "method rlsd" in lines[0] and "= GDPO here" in lines[0]
    assert calls == [] and metrics["mrtpo/rlsd/rows_privileged"] == 0 and metrics["mrtpo/rlsd/lambda"] == 1.0
    assert metrics["mrtpo/rows_privileged"] == 0  # the self-teachers' common count: no privileged information
    assert metrics["mrtpo/rlsd/rows_teacher"] == 0
    assert torch.equal(padded(fake.put["advantages"]), padded(ref.put["advantages"]))


def test_rlsd_step_is_verls_gdpo_times_ms_swifts_weight(monkeypatch, tiny, caplog):
    """The step's advantage on an appended context: verl's GDPO advantage times ms-swift's r, both re-stated
    here (r from a direct forward of P_all and of the rollout prompt, lambda from ms-swift's schedule at its
    optimizer-step count); no sign flip, r in its band on every valid token, no second whitening."""
    tok, model = tiny
    lam0, eps, warmup = 0.5, 0.5, 10
    fake, metrics, calls, responses = run_step(monkeypatch, tiny, 3, *RLSD, *TWO_UPDATES, f"mrtpo.rlsd_lambda_warmup_steps={warmup}",
                                               f"mrtpo.rlsd_reweight_clip_range={eps}", ctx=CTX_APPENDED)
    lam = lam0 * (2 * 2) / warmup  # ms-swift: global_step = 2 completed training steps x 2 updates each, inside the warm-up
    assert calls == [4] and metrics["mrtpo/rlsd/lambda"] == pytest.approx(lam)
    assert metrics["mrtpo/rlsd/rows_privileged"] == 4 and metrics["mrtpo/rlsd/rows_teacher"] == 4
    assert metrics["mrtpo/rows_privileged"] == 4
    assert not [r for r in caplog.records if "privileged information" in r.getMessage()]  # it has some: no line
    p_all = render(tok, TEACHER_MSGS)
    prompt = render(tok, MSGS)
    assert len(p_all) > len(prompt)
    gdpo, mask = verl_gdpo_of_the_batch()
    want = torch.zeros_like(gdpo)
    for i, r in enumerate(responses):
        n = len(r)
        a = gdpo[i, 0]  # GDPO's final advantage: one value per response
        delta = old_log_probs(model, list(p_all), r) - old_log_probs(model, prompt, r)
        w = torch.exp(torch.sign(a) * delta).clamp(1 - eps, 1 + eps)
        want[i, :n] = a * ((1 - lam) + lam * w)
    adv = padded(fake.put["advantages"])
    assert torch.allclose(adv, want, atol=1e-5)
    valid = mask > 0
    assert (torch.sign(adv)[valid] == torch.sign(gdpo)[valid]).all() and metrics["mrtpo/rlsd/sign_flips"] == 0
    ratio = adv[valid] / gdpo[valid]
    assert float(ratio.min()) >= 1 - lam * eps - 1e-5 and float(ratio.max()) <= 1 + lam * eps + 1e-5
    assert float((ratio - 1).abs().max()) > 1e-3 and metrics["mrtpo/adv_max_abs_diff_vs_gdpo"] > 1e-3


def test_rlsds_pass_forwards_the_teacher_prompt_alone(monkeypatch, tiny):
    """RLSD's pass plans no P_minus_k and no P_none: one variant per row, P_all, nothing replayed against it, and
    every response (a group without reward variance too: after whitening its advantage is not 0)."""
    from recipe.mrtpo.core.prompt_variants import build_sample_variants

    tok, model = tiny
    seen = []
    td, _, _ = make_batch(tok, model, ctx=CTX_APPENDED, scores=[SCORES[0]] * 2 + SCORES[2:])  # group a: no variance
    monkeypatch.setattr(verl_seam, "tq", FakeTQ(td))
    trainer, calls = make_trainer(tok, model, 6, *RLSD)
    inner = trainer.actor_rollout_wg.compute_replay_relevance
    trainer.actor_rollout_wg.compute_replay_relevance = lambda d: (seen.append(d), inner(d))[1]
    metrics: dict = {}
    trainer._compute_advantage(Meta(keys=[f"{u}_0_{i}" for i, u in enumerate(UIDS)], partition_id="train"), metrics)
    (sent,) = seen
    p_all = render(tok, TEACHER_MSGS)
    assert list(p_all) != list(build_sample_variants(MSGS, CTX_APPENDED, ["lower"], lambda m: render(tok, m)).variants[0])
    assert sent["variant_ids"].shape[:2] == (4, 1) and (sent["pair_variant"] == -1).all()
    for r in range(4):
        n = int(sent["variant_lens"][r, 0])
        assert sent["variant_ids"][r, 0, -n:].tolist() == list(p_all)
    assert metrics["mrtpo/rlsd/rows_teacher"] == 4 and metrics["mrtpo/pairs_replayed"] == 0


def test_rlsd_at_lambda_zero_replays_nothing(monkeypatch, tiny):
    """lambda_s = 0 (the warm-up's first step): no replay, GDPO."""
    fake, metrics, calls, _ = run_step(monkeypatch, tiny, 1, *RLSD, "mrtpo.rlsd_lambda_warmup_steps=3", ctx=CTX_APPENDED)
    assert calls == [] and metrics["mrtpo/replay_skipped"] == 1.0 and metrics["mrtpo/rlsd/lambda"] == 0.0


def test_the_initial_teacher_is_the_reference_policy_and_stays_put_while_the_live_one_moves(monkeypatch, tiny):
    """``mrtpo.rlsd_teacher=initial``: the teacher pass runs through verl's reference model (the worker's
    ``compute_ref_replay`` on its ``ref`` engine); after one optimizer update of the actor the initial teacher's
    log-probs are those of the step-0 weights, unchanged, while the live teacher's follow the update."""
    import copy

    from unit.test_worker import Engine

    from recipe.mrtpo.step.worker import MRTPOActorRolloutRefWorker

    tok, base = tiny
    actor, reference = copy.deepcopy(base), copy.deepcopy(base)  # verl's ref worker loads the initial weights apart
    worker = MRTPOActorRolloutRefWorker.__new__(MRTPOActorRolloutRefWorker)  # no Ray, no FSDP: only the binding
    worker.actor, worker.ref = SimpleNamespace(engine=Engine(actor)), SimpleNamespace(engine=Engine(reference))
    keys = [f"{u}_0_{i}" for i, u in enumerate(UIDS)]

    def step(teacher: str):
        td, _, responses = make_batch(tok, actor, ctx=CTX_APPENDED)  # old_log_probs: the actor as it is now
        monkeypatch.setattr(verl_seam, "tq", FakeTQ(td))
        trainer, _ = make_trainer(tok, actor, 6, *RLSD, f"mrtpo.rlsd_teacher={teacher}", "actor_rollout_ref.actor.use_kl_loss=True")
        got = {}

        def record(name, fn):
            return lambda d: got.setdefault(name, fn(d))

        trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0]},
                                                   compute_replay_relevance=record("actor", worker.compute_replay_relevance))
        trainer.ref_policy_wg = SimpleNamespace(_dispatch_info={"ref": [0]}, compute_ref_replay=record("ref", worker.compute_ref_replay))
        assert trainer.plan.fuse_old_log_prob == (teacher == "live")
        metrics: dict = {}
        trainer._compute_advantage(Meta(keys=keys, partition_id="train"), metrics)
        (where, out), = got.items()
        assert metrics["mrtpo/rlsd/teacher_initial"] == float(teacher == "initial") and metrics["mrtpo/rlsd/rows_teacher"] == 4
        return where, out["replay_logprobs"].clone(), responses

    p_all = list(render(tok, TEACHER_MSGS))  # the framed teacher prompt
    before = {t: step(t) for t in ("live", "initial")}
    assert before["live"][0] == "actor" and before["initial"][0] == "ref"
    assert torch.allclose(before["live"][1], before["initial"][1], atol=1e-5)  # step 0: one model
    responses = before["live"][2]

    # one optimizer update of the actor (the reference is verl's own copy: not updated)
    opt = torch.optim.SGD(actor.parameters(), lr=1e-3)
    prompt = render(tok, MSGS)
    actor.train()
    loss = -sum(torch.log_softmax(actor(input_ids=torch.tensor([prompt + r.tolist()])).logits[0, len(prompt) - 1 : -1], -1)
                .gather(-1, r.view(-1, 1)).mean() for r in responses)
    loss.backward()
    opt.step()
    actor.eval()

    after = {t: step(t) for t in ("live", "initial")}
    assert torch.equal(after["initial"][1], before["initial"][1])  # the initial teacher did not move
    moved = (after["live"][1] - before["live"][1]).abs().max()
    assert float(moved) > 1e-3  # the live one did
    for i, r in enumerate(responses):  # each against a direct forward of P_all through its own weights
        n = len(r)
        assert torch.allclose(after["initial"][1][i, :n], old_log_probs(base, p_all, r), atol=1e-5), i
        assert torch.allclose(after["live"][1][i, :n], old_log_probs(actor, p_all, r), atol=1e-5), i


def test_grpo_is_verls_own_step(monkeypatch, tiny):
    import verl.trainer.ppo.v1.trainer_base as tb

    tok, model = tiny
    td, _, _ = make_batch(tok, model)
    fake = FakeTQ(td)
    monkeypatch.setattr(verl_seam, "tq", fake)
    monkeypatch.setattr(tb, "tq", fake)
    trainer, calls = make_trainer(tok, model, 6, "algorithm.adv_estimator=grpo")
    metrics: dict = {}
    trainer._compute_advantage(Meta(keys=[f"{u}_0_{i}" for i, u in enumerate(UIDS)], partition_id="train"), metrics)
    assert calls == [] and "advantages" in fake.put and "mrtpo/reward/lower/mean" in metrics


PAD_UID = "pad" + "0123456789abcdef" * 2  # verl: f"pad{uuid.uuid4().hex}"


def make_padded_batch(tok, model, n_pad: int, tagged: bool):
    """The batch of :func:`make_batch` plus ``n_pad`` rows as verl's ``upsample_batch_to_divisible_size``
    makes them: sample 0's fields (its reward extras and raw prompt included) under one pad uid, a 127-token
    EOS prompt, a one-token EOS response with response_mask 0, and the tag ``is_padding=True``."""
    td, _, _ = make_batch(tok, model)
    eos = int(tok.eos_token_id)
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    unbind = lambda key: list(td[key].unbind())  # noqa: E731
    resp = torch.full((1,), eos, dtype=torch.long)
    fields = {
        "responses": unbind("responses") + [resp] * n_pad,
        "response_mask": unbind("response_mask") + [torch.zeros(1, dtype=torch.long)] * n_pad,
        "rm_scores": unbind("rm_scores") + [torch.zeros(1)] * n_pad,
        "old_log_probs": unbind("old_log_probs") + [torch.zeros(1)] * n_pad,
        "prompts": unbind("prompts") + [torch.full((127,), eos, dtype=torch.long)] * n_pad,
    }
    B = 4 + n_pad
    out = TensorDict({k: nested(v) for k, v in fields.items()}, batch_size=[B])
    out["uid"] = NonTensorStack(*UIDS, *[PAD_UID] * n_pad)
    extras = [{"reward_extra_info": {SCORES_KEY: json.dumps(s), CONTEXTS_KEY: json.dumps(CTX), ERROR_KEY: ""}} for s in SCORES]
    out["extra_fields"] = NonTensorStack(*extras, *[extras[0]] * n_pad)
    out["raw_prompt"] = NonTensorStack(*[MSGS] * B)
    keys = [f"{u}_0_{i}" for i, u in enumerate(UIDS)] + [f"{PAD_UID}_{j}_0" for j in range(n_pad)]
    tags = [{"is_padding": False}] * 4 + [{"is_padding": True}] * n_pad if tagged else None
    return out, Meta(keys=keys, partition_id="train", tags=tags)


@pytest.mark.parametrize("tagged", [True, False])
def test_padding_rows_change_no_reward_metric_and_no_advantage(monkeypatch, tiny, tagged):
    """verl pads the batch to a multiple of the data-parallel size with copies of sample 0: they are left
    out of the per-reward metrics and the SAW statistics, get no replay and a zero advantage, and the real
    rows' advantages are those of the batch without them (recognised by the tag, or by the pad uid)."""
    tok, model = tiny
    overrides = ("mrtpo.beta=0.5", "mrtpo.warmup_steps=2", "mrtpo.reward_weighting=saw")
    ref_fake, ref_metrics, ref_calls, _ = run_step(monkeypatch, tiny, 6, *overrides)
    td, meta = make_padded_batch(tok, model, n_pad=3, tagged=tagged)
    fake = FakeTQ(td)
    monkeypatch.setattr(verl_seam, "tq", fake)
    trainer, calls = make_trainer(tok, model, 6, *overrides)
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)
    assert metrics["mrtpo/padding_rows"] == 3 and ref_metrics["mrtpo/padding_rows"] == 0
    for key in ("mrtpo/reward/lower/mean", "mrtpo/reward/lower/count", "mrtpo/reward/no_comma/mean",
                "mrtpo/reward/no_comma/count", "mrtpo/lambda/lower", "mrtpo/lambda/no_comma", "mrtpo/pairs_replayed"):
        assert metrics[key] == pytest.approx(ref_metrics[key]), key
    assert metrics["mrtpo/reward/lower/count"] == 4
    adv, ref = padded(fake.put["advantages"]), padded(ref_fake.put["advantages"])
    assert torch.allclose(adv[:4, : ref.shape[1]], ref, atol=1e-5) and float(adv[4:].abs().max()) == 0


def test_the_sampled_batch_is_balanced_in_submission_order(monkeypatch):
    """MRTPOTrainer numbers the prompts it submits and puts the rows verl samples (in the order their requests
    finished) back in that order before verl's own balancing runs on them; rows of a prompt it never numbered go
    last, counted. Run on TransferQueue's own KVBatchMeta."""
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from recipe.mrtpo.step.trainer import MRTPOTrainer

    seen = []
    monkeypatch.setattr(PPOTrainer, "_submit_batch_to_rollout", lambda self, batch: len(batch["uid"]))
    monkeypatch.setattr(PPOTrainer, "_balance_batch", lambda self, batch, metrics, **kw: seen.append(list(batch.keys)) or batch)
    trainer = MRTPOTrainer.__new__(MRTPOTrainer)
    uids = ["c3-x", "a1-y", "b2-z"]
    assert trainer._submit_batch_to_rollout({"uid": uids[:2]}) == 2 and trainer._submit_batch_to_rollout({"uid": uids[2:]}) == 1
    want = [f"{u}_{s}_0" for u in uids for s in (0, 1)]
    arrived = [want[k] for k in (5, 2, 0, 3, 1, 4)]
    metrics = {}
    trainer._balance_batch(KVBatchMeta(keys=arrived + ["zz-stray_0_0"], tags=[{}] * 7), metrics)
    assert seen[-1] == want + ["zz-stray_0_0"]
    assert metrics["mrtpo/rows_moved_to_submission_order"] == 5  # want[3] arrived in its place and metrics["mrtpo/rows_unordered"] == 1
    assert trainer._uid_rank == {}  # the sampled prompts are forgotten
