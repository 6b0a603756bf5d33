"""The trainer's old_log_prob step fused with the replay, without Ray or vLLM (the advantage step's harness).

On a replay step ``MRTPOTrainer._compute_old_log_prob`` plans and runs the replay, writes verl's
``old_log_probs`` and ``entropy`` from the same forwards (as verl's own step writes them: nested responses),
and the advantage step then uses that replay instead of dispatching another one.
"""

from __future__ import annotations

import pytest
import torch
from verl.utils.torch_functional import entropy_from_logits

from integration.test_advantage_step import LENS, MSGS, UIDS, FakeTQ, Meta, make_batch, make_trainer, padded, render
from recipe.mrtpo.seams import verl_seam


def test_fused_old_log_prob_step_writes_verls_fields_and_feeds_the_advantage_step(monkeypatch, tiny):
    tok, model = tiny
    td, _, responses = make_batch(tok, model)
    want = td["old_log_probs"]  # the harness's own forward of [rollout prompt | response] (fp32)
    del td["old_log_probs"]
    td["rollout_log_probs"] = want  # as if the rollout engine's log-probs were exact: verl's debug metrics then read ~0
    fake = FakeTQ(td)
    monkeypatch.setattr(verl_seam, "tq", fake)
    trainer, calls = make_trainer(tok, model, 6, "mrtpo.beta=0.5", "mrtpo.warmup_steps=2", "mrtpo.fused_check_every=0")
    trainer.actor_rollout_wg.compute_log_prob = lambda *_: pytest.fail("verl's compute_log_prob ran on a fused step")
    meta = Meta(keys=[f"{u}_0_{i}" for i, u in enumerate(UIDS)], partition_id="train")
    metrics: dict = {}
    assert trainer.plan.fuse_old_log_prob
    trainer._compute_old_log_prob(meta, metrics)
    assert set(fake.put) == {"old_log_probs", "entropy"} and calls == [4]
    prompt = render(tok, MSGS)
    for i, r in enumerate(responses):
        assert torch.allclose(fake.put["old_log_probs"][i], want[i], atol=1e-5), i
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + r.tolist()])).logits[0, len(prompt) - 1 : -1].float()
        assert torch.allclose(fake.put["entropy"][i], entropy_from_logits(logits), atol=1e-5), i
    assert metrics["actor/entropy"] > 0
    if trainer.config.actor_rollout_ref.rollout.calculate_log_probs:  # verl's rollout-vs-actor metrics, re-stated
        assert metrics["training/rollout_probs_diff_max"] < 1e-5
    # the advantage step reads them back and reuses the replay: no second dispatch
    td["old_log_probs"], td["entropy"] = fake.put["old_log_probs"], fake.put["entropy"]
    adv_metrics: dict = {}
    trainer._compute_advantage(meta, adv_metrics)
    assert calls == [4] and "advantages" in fake.put
    assert adv_metrics["mrtpo/replay_fused_old_log_prob"] == 1 and adv_metrics["mrtpo/consistency/fused_rows"] == 4
    assert adv_metrics["mrtpo/pairs_replayed"] == 6 and adv_metrics["mrtpo/adv_max_abs_diff_vs_gdpo"] > 1e-3
    assert max(LENS) == fake.put["advantages"].to_padded_tensor(0.0).shape[1]


def test_no_fusion_where_the_advantage_step_does_not_replay(tiny):
    tok, model = tiny
    assert not make_trainer(tok, model, 1, "mrtpo.beta=0.5", "mrtpo.warmup_steps=2")[0].plan.fuse_old_log_prob  # beta_0 = 0
    assert not make_trainer(tok, model, 6, "mrtpo.replay=False")[0].plan.fuse_old_log_prob
    assert not make_trainer(tok, model, 6, "algorithm.adv_estimator=gdpo")[0].plan.fuse_old_log_prob
    bypass = "+algorithm.rollout_correction={bypass_mode:true}"
    assert not make_trainer(tok, model, 6, bypass)[0].plan.fuse_old_log_prob
    # RLSD's initial teacher runs on verl's reference policy: never the actor's old_log_prob pass
    rlsd = ("algorithm.adv_estimator=gdpo", "mrtpo.mode=rlsd", "actor_rollout_ref.actor.use_kl_loss=True")
    assert make_trainer(tok, model, 6, *rlsd)[0].plan.fuse_old_log_prob
    assert not make_trainer(tok, model, 6, *rlsd, "mrtpo.rlsd_teacher=initial")[0].plan.fuse_old_log_prob


def test_rlsds_live_teacher_fuses_with_old_log_prob_and_gives_the_unfused_advantage(monkeypatch, tiny):
    """RLSD with the live teacher on appended contexts: one dispatch forwards each response under P_all (the
    teacher) and under its rollout prompt (verl's old_log_probs), and the advantage step reuses it."""
    from integration.test_advantage_step import CTX_APPENDED, RLSD

    tok, model = tiny
    td, _, responses = make_batch(tok, model, ctx=CTX_APPENDED)
    want = td["old_log_probs"]
    unfused = FakeTQ(td.clone())
    monkeypatch.setattr(verl_seam, "tq", unfused)
    meta = Meta(keys=[f"{u}_0_{i}" for i, u in enumerate(UIDS)], partition_id="train")
    make_trainer(tok, model, 6, *RLSD)[0]._compute_advantage(meta, {})

    del td["old_log_probs"]
    td["rollout_log_probs"] = want
    fake = FakeTQ(td)
    monkeypatch.setattr(verl_seam, "tq", fake)
    trainer, calls = make_trainer(tok, model, 6, *RLSD, "mrtpo.fused_check_every=0")  # the check: its own test below
    assert trainer.plan.fuse_old_log_prob
    trainer._compute_old_log_prob(meta, {})
    assert calls == [8]  # 4 rows under P_all, 4 under the rollout prompt, one dispatch
    for i in range(len(responses)):
        assert torch.allclose(fake.put["old_log_probs"][i], want[i], atol=1e-5), i
    td["old_log_probs"], td["entropy"] = fake.put["old_log_probs"], fake.put["entropy"]
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)
    assert calls == [8] and metrics["mrtpo/replay_fused_old_log_prob"] == 1 and metrics["mrtpo/rlsd/rows_teacher"] == 4
    got, ref = fake.put["advantages"].to_padded_tensor(0.0), unfused.put["advantages"].to_padded_tensor(0.0)
    assert torch.allclose(got, ref, atol=1e-5) and float((got - ref).abs().max()) < 1e-5


def _verl_compute_log_prob(fake, prompt_len: int, want, shift: float = 0.0, calls=None):
    """A stand-in for verl's ``compute_log_prob``: writes ``log_probs`` (and an ``entropy`` of 0.5) over
    [prompt | response] (nested), as its worker does, holding ``want`` (+ ``shift``) at the positions that predict
    the response. ``calls`` gets each call's token budget (None: verl's own)."""
    def compute_log_prob(meta):
        info = dict(meta.extra_info)
        budget = info.pop("max_token_len_per_gpu", None)  # the floor's call under a dynamic batch size
        assert info == {"calculate_entropy": True, "compute_loss": False, "temperature": 1.0}  # verl's step 1
        if calls is not None:
            calls.append(budget)
        rows = [torch.cat([torch.zeros(prompt_len - 1), w + shift, torch.zeros(1)]) for w in want.unbind()]
        fake.td["log_probs"] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        fake.td["entropy"] = torch.nested.as_nested_tensor([torch.full_like(r, 0.5) for r in rows], layout=torch.jagged)
        return meta
    return compute_log_prob


def test_the_standing_check_runs_verls_old_log_prob_on_the_first_and_every_nth_fused_step(monkeypatch, tiny, caplog):
    tok, model = tiny
    td, _, responses = make_batch(tok, model)
    want = td["old_log_probs"]
    del td["old_log_probs"]
    td["rollout_log_probs"] = want
    fake = FakeTQ(td)
    monkeypatch.setattr(verl_seam, "tq", fake)
    trainer, _ = make_trainer(tok, model, 7, "mrtpo.beta=0.5", "mrtpo.warmup_steps=2", "mrtpo.fused_check_every=4")
    verl_calls: list = []
    trainer.actor_rollout_wg.compute_log_prob = _verl_compute_log_prob(fake, len(render(tok, MSGS)), want, calls=verl_calls)
    keys = [f"{u}_0_{i}" for i, u in enumerate(UIDS)]
    seen = {}
    for step in (7, 8, 9, 12):  # 7: the run's first fused step; 8 and 12: multiples of 4
        trainer.global_steps = step
        metrics: dict = {}
        trainer._compute_old_log_prob(Meta(keys=keys, partition_id="train", extra_info={}), metrics)
        seen[step] = {k: v for k, v in metrics.items() if "vs_verl" in k or "fused_check" in k}
        assert set(fake.put) >= {"old_log_probs", "entropy"}
    assert verl_calls == [None] * 6 and not seen[9]  # each check: verl's pass, and again on the rows reversed (the floor)
    for step in (7, 8, 12):
        m = seen[step]
        assert m["mrtpo/consistency/fused_vs_verl_tokens"] == sum(LENS)
        # the fused pass shares prompts under FlexAttention (eager on CPU), whose fp32 rounding differs from verl's packed
        # SDPA by ~2e-5; the check's own fp32 tolerance is 1e-4, and a wrong pass moves log-probs by O(1)
        assert m["mrtpo/consistency/fused_vs_verl_max"] < 1e-4 and m["mrtpo/consistency/fused_vs_verl_p99"] <= m["mrtpo/consistency/fused_vs_verl_max"]
        assert "mrtpo/consistency/fused_vs_verl_warning" not in m
        assert m["mrtpo/consistency/verl_vs_verl_mean"] == 0.0 and m["mrtpo/consistency/fused_check_threshold"] == 1e-2
        assert m["mrtpo/consistency/verl_vs_verl_row_max"] == 0.0 and m["mrtpo/consistency/fused_vs_verl_row_max"] < 1e-5
    assert "mrtpo/consistency/trained_on_verl_log_probs" not in metrics
    assert all(torch.allclose(padded(fake.put["old_log_probs"])[i, :n], padded(want)[i, :n], atol=1e-5)
               for i, n in enumerate(LENS))  # the fused pass's
    # a fused pass off verl's numbers (here verl's shifted by 0.05) is logged and warned about in one line, and the
    # step trains on verl's own log-probs and entropy
    trainer.actor_rollout_wg.compute_log_prob = _verl_compute_log_prob(fake, len(render(tok, MSGS)), want, shift=0.05)
    trainer.global_steps, metrics = 16, {}
    with caplog.at_level("WARNING", logger="recipe.mrtpo.step.standing_step"):
        trainer._compute_old_log_prob(Meta(keys=keys, partition_id="train", extra_info={}), metrics)
    assert abs(metrics["mrtpo/consistency/fused_vs_verl_mean"] - 0.05) < 1e-4 and metrics["mrtpo/consistency/fused_vs_verl_warning"] == 1
    assert metrics["mrtpo/consistency/trained_on_verl_log_probs"] == 1
    assert all(torch.allclose(padded(fake.put["old_log_probs"])[i, :n], padded(want)[i, :n] + 0.05, atol=1e-5)
               for i, n in enumerate(LENS))
    assert all(torch.all(e == 0.5) for e in fake.put["entropy"].unbind())
    lines = [r.getMessage() for r in caplog.records if "fused old_log_probs differ" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "bf16 threshold" in lines[0] and "floor" in lines[0]
    # and the check off: verl's call never runs
    trainer2, _ = make_trainer(tok, model, 7, "mrtpo.beta=0.5", "mrtpo.warmup_steps=2", "mrtpo.fused_check_every=0")
    trainer2.actor_rollout_wg.compute_log_prob = lambda *_: pytest.fail("verl's compute_log_prob ran with the check off")
    trainer2._compute_old_log_prob(Meta(keys=keys, partition_id="train", extra_info={}), {})
