"""``mrtpo.share_prompts`` in the trainer's steps through the worker's own methods, without Ray or vLLM.

The knob travels as in the real loop: the composed config -> ``pass_driver.pass_settings`` -> the wire ->
``MRTPOActorRolloutRefWorker.compute_replay_relevance`` / ``compute_ref_opsd_teacher`` (the worker class itself
around ``unit.test_worker.Engine``, verl's engine as the worker reads it) -> the pass engine. The batch has two
groups of uneven size (3 and 2 responses) behind two different prompts, prompt-placed and appended Z (so some
rows' P_all is their rollout prompt and others need a rollout-prompt row in the fused pass). Each step runs with
sharing on and off; checked, in fp32:

- the fused old_log_prob step: verl's ``old_log_probs`` and ``entropy`` written to TransferQueue, and the
  replay's q as the worker computed it (fp32, before the bf16 hand-back), equal (log-probs and entropy to 1e-4, q
  to 2e-4: FlexAttention's eager kernel rounds 6e-7 relative on the sharpened model's logits of ~50, which q's
  divergences amplify; a wrong mask moves them by O(0.1)); the advantages from the bf16 q handed back to 1e-3; with sharing the pass forwards fewer tokens, and no fallback is counted;
- OPSD's teacher pass on the reference worker: the teacher's top-k ids equal, its log-probs to 1e-4.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from hydra import compose, initialize_config_module
from tensordict import NonTensorStack, TensorDict

from integration.test_advantage_step import FakeTQ, Meta, old_log_probs, render
from recipe.mrtpo.rewards.reward_extras import CONTEXTS_KEY, ERROR_KEY, SCORES_KEY
from recipe.mrtpo.seams import verl_seam

IF_MSGS = [{"role": "user", "content": "Write a haiku about rain. Do not use any commas. Use only lowercase letters."}]
SQL_MSGS = [{"role": "user", "content": "How many tracks are longer than five minutes? Do not use any commas. "
                                         "Use only lowercase letters. Reply with one SQL query."}]
IF_CTX = {"no_comma": {"text": "Do not use any commas.", "placement": "prompt"},
          "lower": {"text": "Use only lowercase letters.", "placement": "prompt"}}
SQL_CTX = {"no_comma": {"text": "Do not use any commas.", "placement": "prompt"},
           "lower": {"text": "SELECT COUNT(*) FROM Track WHERE Milliseconds > 300000", "placement": "appended"}}
# group a: 3 responses of the IF prompt; group b: 2 of the SQL one; every reward varies in both groups
UIDS = ["a", "a", "a", "b", "b"]
MSGS = [IF_MSGS] * 3 + [SQL_MSGS] * 2
CTXS = [IF_CTX] * 3 + [SQL_CTX] * 2
SCORES = [{"no_comma": 1.0, "lower": 0.0}, {"no_comma": 0.0, "lower": 1.0}, {"no_comma": 1.0, "lower": 1.0},
          {"no_comma": 1.0, "lower": 0.0}, {"no_comma": 0.0, "lower": 1.0}]
LENS = [7, 9, 5, 8, 6]
OPSD = ("algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0", "mrtpo.opsd_topk=4")


def make_batch(tok, model):
    g = torch.Generator().manual_seed(3)
    responses = [torch.randint(0, 150_000, (n,), generator=g) for n in LENS]
    prompts = [render(tok, m) for m in MSGS]
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    td = TensorDict({
        "responses": nested(responses),
        "response_mask": nested([torch.ones(n, dtype=torch.long) for n in LENS]),
        "rm_scores": nested([torch.zeros(n) for n in LENS]),
        "old_log_probs": nested([old_log_probs(model, p, r) for p, r in zip(prompts, responses)]),
        "prompts": nested([torch.tensor(p) for p in prompts]),
    }, batch_size=[len(LENS)])
    td["uid"] = NonTensorStack(*UIDS)
    td["extra_fields"] = NonTensorStack(*[{"reward_extra_info": {SCORES_KEY: json.dumps(s), CONTEXTS_KEY: json.dumps(c), ERROR_KEY: ""}}
                                          for s, c in zip(SCORES, CTXS)])
    td["raw_prompt"] = NonTensorStack(*MSGS)
    return td


def run_steps(monkeypatch, tiny, share: bool, *overrides: str, opsd: bool = False):  # noqa: F811
    """The fused old_log_prob step and the advantage step (or OPSD's advantage step with its teacher pass) with
    ``mrtpo.share_prompts={share}``; -> (what the trainer wrote, its metrics, the worker's fp32 replay outputs)."""
    from unit.test_worker import Engine

    import recipe.mrtpo.step.worker as worker_mod
    from recipe.mrtpo.step.trainer import MRTPOTrainer

    tok, model = tiny
    td = make_batch(tok, model)
    if not opsd:  # the fused step writes them (the rollout's own, as if exact, for verl's rollout-vs-actor metrics)
        td["rollout_log_probs"] = td["old_log_probs"]
        del td["old_log_probs"]
    fake = FakeTQ(td)
    monkeypatch.setattr(verl_seam, "tq", fake)
    import verl.trainer.ppo.v1.trainer_base as tb

    monkeypatch.setattr(tb, "tq", fake)
    seen = []  # the worker's fp32 replay outputs, before its bf16 hand-back of q
    from recipe.mrtpo.core.replay import replay_relevance as inner  # the worker's own function, unwrapped

    monkeypatch.setattr(worker_mod, "replay_relevance", lambda *a, **k: seen.append(inner(*a, **k)) or seen[-1])
    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        cfg = compose(config_name="mrtpo_trainer", overrides=["actor_rollout_ref.rollout.temperature=0.8",
                                                             f"mrtpo.share_prompts={share}", *overrides])
    trainer = MRTPOTrainer.__new__(MRTPOTrainer)
    trainer.config, trainer.tokenizer, trainer.global_steps = cfg, tok, 6
    worker = worker_mod.MRTPOActorRolloutRefWorker.__new__(worker_mod.MRTPOActorRolloutRefWorker)  # no Ray, no FSDP
    worker.actor, worker.ref = SimpleNamespace(engine=Engine(model)), SimpleNamespace(engine=Engine(model))
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0]}, compute_replay_relevance=worker.compute_replay_relevance)
    trainer.ref_policy_wg = SimpleNamespace(_dispatch_info={"ref": [0]}, compute_ref_opsd_teacher=worker.compute_ref_opsd_teacher)
    meta = Meta(keys=[f"{u}_0_{i}" for i, u in enumerate(UIDS)], partition_id="train", extra_info={})
    metrics: dict = {}
    if not opsd:
        assert trainer.plan.fuse_old_log_prob
        trainer._compute_old_log_prob(meta, metrics)
        td["old_log_probs"], td["entropy"] = fake.put["old_log_probs"], fake.put["entropy"]
    trainer._compute_advantage(meta, metrics)
    model.eval()  # the stand-in engine leaves the module in train mode (dropout 0: no effect on the forward)
    return fake.put, metrics, seen


def values(x: torch.Tensor) -> torch.Tensor:
    return x.values() if getattr(x, "is_nested", False) else x


def test_fused_step_and_replay_with_shared_prompts_equal_the_unshared_ones(monkeypatch, tiny):  # noqa: F811
    overrides = ("mrtpo.beta=0.5", "mrtpo.warmup_steps=2", "mrtpo.fused_check_every=0")
    on, m_on, w_on = run_steps(monkeypatch, tiny, True, *overrides)
    off, m_off, w_off = run_steps(monkeypatch, tiny, False, *overrides)
    for key in ("old_log_probs", "entropy"):  # verl's fields as the fused step writes them (fp32)
        a, b = values(on[key]), values(off[key])
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4), (key, float((a - b).abs().max()))
    assert len(w_on) == len(w_off) == 1
    for key, tol in (("variant_relevance", 2e-4), ("replay_logprobs", 1e-4), ("replay_entropy", 1e-4)):  # the worker's fp32
        assert torch.allclose(w_on[0][key], w_off[0][key], atol=tol), (key, float((w_on[0][key] - w_off[0][key]).abs().max()))
    assert float(w_on[0]["variant_relevance"].max()) > 1e-2  # q is not trivially 0
    # a q moved by 1e-4 may round to the neighbouring bf16 value when handed back: the advantages move by ~1e-4
    assert torch.allclose(values(on["advantages"]), values(off["advantages"]), atol=1e-3)
    assert m_on["mrtpo/pairs_replayed"] == m_off["mrtpo/pairs_replayed"] == 10
    # the same rows, fewer tokens: group a's 3 responses share P_all (= the rollout prompt) and each P_minus_k
    assert m_on["mrtpo/replay_tokens_over_existing"] < 0.8 * m_off["mrtpo/replay_tokens_over_existing"]
    assert m_on["mrtpo/replay_tokens_max"] < m_off["mrtpo/replay_tokens_max"]
    assert m_on["mrtpo/replay_unshared_fallback"] == 0 == m_off["mrtpo/replay_unshared_fallback"]
    # the worker's cost model over the tiny model's shape (hidden 64: attention weighs more than at 7B) may run a
    # forward unshared; with sharing off nothing is
    assert 0 <= m_on["mrtpo/replay_unshared_by_cost"] <= m_on["mrtpo/replay_forwards_max"]
    assert m_off["mrtpo/replay_unshared_by_cost"] == 0
    assert 0 < m_on["mrtpo/replay_attention_pairs_max"]


def test_opsd_teacher_topk_with_shared_prompts_equals_the_unshared_one(monkeypatch, tiny):  # noqa: F811
    on, m_on, _ = run_steps(monkeypatch, tiny, True, *OPSD, opsd=True)
    off, m_off, _ = run_steps(monkeypatch, tiny, False, *OPSD, opsd=True)
    assert torch.equal(values(on["teacher_ids"]), values(off["teacher_ids"]))
    lp_on, lp_off = values(on["teacher_logprobs"]), values(off["teacher_logprobs"])
    assert torch.allclose(lp_on, lp_off, atol=1e-4), float((lp_on - lp_off).abs().max())
    assert float(lp_on.abs().max()) > 0
    assert m_on["mrtpo/opsd/teacher_tokens_over_existing"] < 0.8 * m_off["mrtpo/opsd/teacher_tokens_over_existing"]
    assert m_on["mrtpo/opsd/teacher_unshared_fallback"] == 0


def test_share_prompts_on_flash_attention_runs_the_shared_forwards_under_the_tree_attention(monkeypatch, tiny, caplog):  # noqa: F811
    """The same step with the module reporting flash_attention_2 (what verl loads on a GPU): the shared forwards
    switch the module's attention to the tree's FlexAttention for the forward (one warning says so), share their
    prompts (no fallback counted), equal the unshared step, and leave the module's attention as it was."""
    import recipe.mrtpo.core.shared_prompts as sp
    import recipe.mrtpo.step.worker as worker_mod

    monkeypatch.setattr(sp, "_FALLBACK_LOGGED", set())
    model = tiny[1]
    own = model.config._attn_implementation
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")  # restored after the test
    monkeypatch.setattr(worker_mod, "attn_implementation", lambda module: module.config._attn_implementation)
    seen_attn = []
    real_forward = type(model).forward

    def spy(self, *a, **k):
        seen_attn.append(self.config._attn_implementation)
        if self.config._attn_implementation == "flash_attention_2":  # verl's old_log_prob / update: run it as before
            self.config._attn_implementation = own
            try:
                return real_forward(self, *a, **k)
            finally:
                self.config._attn_implementation = "flash_attention_2"
        return real_forward(self, *a, **k)

    monkeypatch.setattr(type(model), "forward", spy)
    overrides = ("mrtpo.beta=0.5", "mrtpo.warmup_steps=2", "mrtpo.fused_check_every=0")
    with caplog.at_level("WARNING", logger="recipe.mrtpo.core.shared_prompts"):
        on, m_on, w_on = run_steps(monkeypatch, tiny, True, *overrides)
    assert model.config._attn_implementation == "flash_attention_2"  # restored after the passes
    assert "mrtpo_tree_flex" in seen_attn and "sdpa" not in seen_attn
    lines = [r.getMessage() for r in caplog.records if "share_prompts" in r.getMessage()]
    assert len(lines) == 1 and "flash_attention_2" in lines[0] and "mrtpo_tree_flex" in lines[0]
    assert m_on["mrtpo/replay_unshared_fallback"] == 0
    assert m_on["mrtpo/replay_tokens_over_existing"] < 0.8  # shared: fewer tokens than the sequences hold
    monkeypatch.setattr(type(model), "forward", real_forward)
    monkeypatch.setattr(model.config, "_attn_implementation", own)
    off, _, w_off = run_steps(monkeypatch, tiny, False, *overrides)
    for key, tol in (("variant_relevance", 2e-4), ("replay_logprobs", 1e-4), ("replay_entropy", 1e-4)):
        assert torch.allclose(w_on[0][key], w_off[0][key], atol=tol), key
    assert torch.allclose(values(on["old_log_probs"]), values(off["old_log_probs"]), atol=1e-4)
