"""The trainer's advantage step with ``mrtpo.mode=opsd`` and ``gdpo-distill``, without Ray or vLLM (a fake
TransferQueue, a tiny Qwen2).

``MRTPOTrainer._compute_advantage`` runs as in the real loop; the actor worker group's ``compute_opsd_teacher``
(gdpo-distill's live teacher) is the worker's own row function on the tiny model, the reference worker group's
``compute_ref_opsd_teacher`` (OPSD's frozen teacher) the same function on a different model standing for the
initial policy. Checked: the advantage is GDPO's, verl's teacher fields land in TransferQueue in verl's
per-sequence layout with the teacher's top-k of P_all at the response rows, from the right model, and the batch
meta carries the loss settings the actor update installs its loss from.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_module
from tensordict import NonTensorStack, TensorDict

from integration.test_advantage_step import FakeTQ, Meta, render
from recipe.mrtpo.core.prompt_variants import build_sample_variants
from recipe.mrtpo.core.replay import hf_forward
from recipe.mrtpo.methods.opsd.driver import LOSS_SETTINGS_KEY
from recipe.mrtpo.rewards.reward_extras import CONTEXTS_KEY, ERROR_KEY, SCORES_KEY
from recipe.mrtpo.seams import verl_seam

MSGS = [{"role": "user", "content": "How many tracks are longer than five minutes? Reply with one SQL query in a ```sql block."}]
CTX = {"execution_match": {"text": "SELECT COUNT(*) FROM Track WHERE Milliseconds > 300000", "placement": "appended"},
       "format": {"text": "Reply with one SQL query in a ```sql block.", "placement": "prompt"}}
SCORES = [{"execution_match": 1.0, "format": 0.0}, {"execution_match": 0.0, "format": 1.0},
          {"execution_match": 1.0, "format": 1.0}, {"execution_match": 0.0, "format": 1.0}]
UIDS = ["a", "a", "b", "b"]
LENS = [7, 9, 5, 8]
K = 4


TINY_SEED = 11  # the suite's test model (tests/conftest.py: tiny, tiny_lm), this module's seed


def logprobs_after(model, prompt, response):
    seq = torch.tensor([list(prompt) + response.tolist()])
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=seq).logits[0, len(prompt) - 1 : -1].float(), -1)


OPSD = ("algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd", "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
assert OPSD == __import__("recipe.mrtpo.methods", fromlist=["get"]).get("opsd").overrides  # ALGO=opsd's, written out
GDPO_DISTILL = ("algorithm.adv_estimator=gdpo", "mrtpo.mode=gdpo-distill")


def reference_model(model):
    """A model standing for verl's reference worker (the initial policy): the tiny model with other weights."""
    import copy

    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
    return ref.eval()


def run_step(monkeypatch, tiny, *overrides, ctx=None, reference=None, actor_fn=None, ref_fn=None):
    """One advantage step; ``calls``: (worker group, rows) of each teacher pass. ``actor_fn`` / ``ref_fn``: the
    worker's own registered methods to call instead of its row function on ``model`` / ``reference``."""
    import verl.trainer.ppo.v1.trainer_base as tb

    from recipe.mrtpo.step.trainer import MRTPOTrainer
    from recipe.mrtpo.step.worker import opsd_teacher_rows

    tok, model = tiny
    prompt = render(tok, MSGS)
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(0, 150_000, (n,), generator=g) for n in LENS]
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    old = [logprobs_after(model, prompt, r).gather(-1, r.view(-1, 1)).squeeze(-1) for r in responses]
    td = TensorDict({"responses": nested(responses), "response_mask": nested([torch.ones(n, dtype=torch.long) for n in LENS]),
                     "rm_scores": nested([torch.zeros(n) for n in LENS]), "old_log_probs": nested(old),
                     "prompts": nested([torch.tensor(prompt)] * 4)}, batch_size=[4])
    td["uid"] = NonTensorStack(*UIDS)
    td["extra_fields"] = NonTensorStack(*[{"reward_extra_info": {SCORES_KEY: json.dumps(s), CONTEXTS_KEY: json.dumps(ctx or CTX), ERROR_KEY: ""}}
                                          for s in SCORES])
    td["raw_prompt"] = NonTensorStack(*[MSGS] * 4)
    fake = FakeTQ(td)
    monkeypatch.setattr(verl_seam, "tq", fake)
    monkeypatch.setattr(tb, "tq", fake)
    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        cfg = compose(config_name="mrtpo_trainer", overrides=["actor_rollout_ref.rollout.temperature=1.0", *overrides])
    trainer = MRTPOTrainer.__new__(MRTPOTrainer)
    trainer.config, trainer.tokenizer, trainer.global_steps = cfg, tok, 6
    calls = []

    def teacher_rows(where, module, fn=None):
        def call(data):
            calls.append((where, int(data["prompt_lens"].shape[0])))
            if fn is not None:
                return fn(data)
            with torch.no_grad():
                return opsd_teacher_rows(hf_forward(module), data, "cpu", sync=None)  # the worker's own code, one rank
        return call

    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0]}, compute_opsd_teacher=teacher_rows("actor", model, actor_fn))
    trainer.ref_policy_wg = SimpleNamespace(_dispatch_info={"ref": [0]}, compute_ref_opsd_teacher=teacher_rows(
        "ref", reference if reference is not None else model, ref_fn))
    metrics: dict = {}
    meta = trainer._compute_advantage(Meta(keys=[f"{u}_0_{i}" for i, u in enumerate(UIDS)], partition_id="train"), metrics)
    return fake, metrics, calls, meta, responses, prompt


#: OPSD's teacher prompt of MSGS with CTX, written out (the default template, not built by the code under test):
#: the gold SQL framed as a reference solution after the user turn (MRTPO's replay P_all keeps a bare block)
TEACHER_MSGS = [{"role": "user", "content": (
    MSGS[0]["content"] + "\n\nHere is a reference solution:\n" + CTX["execution_match"]["text"] + "\n\n"
    "After understanding the reference solution, please try to solve this problem using your own approach below.")}]


def p_all(tok):
    """The teacher prompt's ids (framed; not the replay's P_all)."""
    ids = render(tok, TEACHER_MSGS)
    assert list(ids) != list(build_sample_variants(MSGS, CTX, ["format"], lambda m: render(tok, m)).variants[0])
    return ids


def test_opsd_without_privileged_information_says_so_once(monkeypatch, tiny, caplog):
    """Every Z in the prompt (instruction following): the teacher prompt is the rollout prompt on every row,
    the step counts 0 privileged rows and the trainer logs one line saying what OPSD then is."""
    placed = {"format": CTX["format"]}
    with caplog.at_level("WARNING", logger="recipe.mrtpo.step.trainer"):
        _, metrics, calls, _, _, _ = run_step(monkeypatch, tiny, *OPSD, f"mrtpo.opsd_topk={K}", ctx=placed)
    assert calls == [("ref", 4)] and metrics["mrtpo/rows_privileged"] == 0 and metrics["mrtpo/opsd/rows_same_prompt"] == 4
    lines = [r.getMessage() for r in caplog.records if "privileged information" in r.getMessage()]
    assert len(lines) == 1 and "method opsd" in lines[0] and "initial policy" in lines[0] and "GDPO" not in lines[0]


def check_teacher_fields(fake, teacher_model, teacher_prompt, responses, prompt, k):
    """verl's per-sequence layout: the teacher's top-k of ``teacher_prompt`` + the response at the response rows
    (row prompt_len - 1 + t), verl's padding elsewhere."""
    for i, (lp, ids) in enumerate(zip(fake.put["teacher_logprobs"].unbind(), fake.put["teacher_ids"].unbind())):
        n = LENS[i]
        assert lp.shape == (len(prompt) + n, k) and ids.dtype == torch.int32
        v, j = logprobs_after(teacher_model, teacher_prompt, responses[i]).topk(k, -1)
        rows = slice(len(prompt) - 1, len(prompt) - 1 + n)
        assert torch.allclose(lp[rows], v, atol=1e-4) and torch.equal(ids[rows].long(), j)
        assert (lp[: len(prompt) - 1] == 0).all() and (lp[-1] == 0).all()


def test_opsd_teaches_from_the_initial_policy_with_the_jsd_alone(monkeypatch, tiny):
    """OPSD: the teacher pass runs on the reference worker group (the initial policy), its top-k is that model's
    (not the actor's) under the framed P_all, k defaults to the reference's 50, and the loss settings are the
    renormalised top-k JSD at beta with no policy loss and use_policy_gradient pinned False."""
    from recipe.mrtpo.methods.opsd.driver import BETA_KEY, JSD_TOPK_LOSS_MODE

    tok, model = tiny
    ref_model = reference_model(model)
    gdpo, _, _, _, _, _ = run_step(monkeypatch, tiny, "algorithm.adv_estimator=gdpo")
    fake, metrics, calls, meta, responses, prompt = run_step(monkeypatch, tiny, *OPSD, "mrtpo.opsd_beta=0.3", reference=ref_model)
    assert calls == [("ref", 4)] and metrics["mrtpo/opsd/teacher_initial"] == 1.0
    assert torch.equal(fake.put["advantages"].to_padded_tensor(0.0), gdpo.put["advantages"].to_padded_tensor(0.0))
    check_teacher_fields(fake, ref_model, p_all(tok), responses, prompt, 50)
    with pytest.raises(AssertionError):  # the actor's own top-k is not what was written
        check_teacher_fields(fake, model, p_all(tok), responses, prompt, 50)
    settings = meta.extra_info[LOSS_SETTINGS_KEY]
    assert settings["loss_mode"] == JSD_TOPK_LOSS_MODE and settings[BETA_KEY] == 0.3 and settings["topk"] == 50
    assert settings["use_task_rewards"] is False and settings["use_policy_gradient"] is False
    assert settings["loss_max_clamp"] is None and "log_prob_min_clamp" not in settings


def test_gdpo_distill_writes_gdpos_advantage_and_p_alls_topk(monkeypatch, tiny):
    tok, model = tiny
    ref, ref_metrics, ref_calls, _, _, _ = run_step(monkeypatch, tiny, "algorithm.adv_estimator=gdpo")
    fake, metrics, calls, meta, responses, prompt = run_step(monkeypatch, tiny, *GDPO_DISTILL, f"mrtpo.opsd_topk={K}",
                                                             "mrtpo.opsd_loss_coef=0.25", reference=reference_model(model))
    assert ref_calls == [] and calls == [("actor", 4)] and metrics["mrtpo/opsd/teacher_initial"] == 0.0
    assert set(fake.put) == {"advantages", "returns", "teacher_logprobs", "teacher_ids"}
    assert torch.equal(fake.put["advantages"].to_padded_tensor(0.0), ref.put["advantages"].to_padded_tensor(0.0))  # GDPO's
    assert metrics["mrtpo/opsd/rows_privileged"] == 4 and metrics["mrtpo/rows_privileged"] == 4 and metrics["mrtpo/beta"] == 0.0
    assert metrics["mrtpo/opsd/teacher_prompt_extra_tokens"] > 5  # the gold SQL block
    check_teacher_fields(fake, model, p_all(tok), responses, prompt, K)  # the live policy's
    settings = meta.extra_info[LOSS_SETTINGS_KEY]
    assert (settings["loss_mode"], settings["topk"], settings["distillation_loss_coef"], settings["use_task_rewards"],
            settings["use_policy_gradient"]) == ("forward_kl_topk", K, 0.25, True, False)


def test_gdpo_distill_with_the_single_token_estimator(monkeypatch, tiny):
    tok, model = tiny
    fake, metrics, calls, meta, responses, prompt = run_step(monkeypatch, tiny, *GDPO_DISTILL, "mrtpo.opsd_loss_mode=k3")
    assert calls == [("actor", 4)] and "advantages" in fake.put and "mrtpo/reward/format/mean" in metrics
    teacher = p_all(tok)
    for i, lp in enumerate(fake.put["teacher_logprobs"].unbind()):
        n = LENS[i]
        assert lp.shape == (len(prompt) + n, 1)
        want = logprobs_after(model, teacher, responses[i]).gather(-1, responses[i].view(-1, 1))
        assert torch.allclose(lp[len(prompt) - 1 : len(prompt) - 1 + n], want, atol=1e-4)
    assert meta.extra_info[LOSS_SETTINGS_KEY]["loss_mode"] == "k3"
    assert metrics["mrtpo/opsd/teacher_logprob_gain"] != 0.0


def test_opsds_frozen_teacher_stays_put_while_gdpo_distills_live_one_moves(monkeypatch, tiny):
    """Through the worker's own registered methods (RLSD's harness: ``unit.test_worker.Engine`` for verl's engines):
    OPSD's teacher pass runs on the reference engine, gdpo-distill's on the actor's; at step 0 both are one model;
    after one optimizer update of the actor, OPSD's teacher top-k is unchanged (the initial policy) while
    gdpo-distill's follows the update."""
    import copy

    from unit.test_worker import Engine

    from recipe.mrtpo.step.worker import MRTPOActorRolloutRefWorker

    tok, base = tiny
    actor, reference = copy.deepcopy(base), copy.deepcopy(base)  # verl's ref worker loads the initial weights apart
    worker = MRTPOActorRolloutRefWorker.__new__(MRTPOActorRolloutRefWorker)  # no Ray, no FSDP: only the binding
    worker.actor, worker.ref = SimpleNamespace(engine=Engine(actor)), SimpleNamespace(engine=Engine(reference))

    def teacher(mode):
        fake, _, calls, _, responses, _ = run_step(monkeypatch, tiny, *mode, f"mrtpo.opsd_topk={K}",
                                                   actor_fn=worker.compute_opsd_teacher, ref_fn=worker.compute_ref_opsd_teacher)
        (where, _), = calls
        return where, fake.put["teacher_logprobs"].values().clone(), responses

    before = {"opsd": teacher(OPSD), "gdpo-distill": teacher(GDPO_DISTILL)}
    assert before["opsd"][0] == "ref" and before["gdpo-distill"][0] == "actor"
    assert torch.allclose(before["opsd"][1], before["gdpo-distill"][1], atol=1e-5)  # step 0: one model
    responses = before["opsd"][2]

    opt = torch.optim.SGD(actor.parameters(), lr=1e-3)  # one update of the actor; the reference is verl's own copy
    prompt = render(tok, MSGS)
    actor.train()
    loss = -sum(torch.log_softmax(actor(input_ids=torch.tensor([prompt + r.tolist()])).logits[0, len(prompt) - 1 : -1], -1)
                .gather(-1, r.view(-1, 1)).mean() for r in responses)
    loss.backward()
    opt.step()
    actor.eval()

    after = {"opsd": teacher(OPSD), "gdpo-distill": teacher(GDPO_DISTILL)}
    assert torch.equal(after["opsd"][1], before["opsd"][1])  # the frozen teacher did not move
    assert float((after["gdpo-distill"][1] - before["gdpo-distill"][1]).abs().max()) > 1e-3  # the live one did


def test_opsd_is_attached_through_its_registry_entry():
    """The trainer knows no OPSD: the methods' entries carry the hook, which reads its step context only."""
    import inspect

    from recipe.mrtpo import methods
    from recipe.mrtpo.methods.opsd import step as opsd_step
    from recipe.mrtpo.step import trainer

    assert methods.get("opsd").after_step is not None and methods.get("gdpo").after_step is None
    assert methods.get("gdpo-distill").after_step == methods.get("opsd").after_step
    assert "opsd" not in inspect.getsource(trainer.MRTPOTrainer._compute_advantage)
    assert "trainer" not in inspect.getsource(opsd_step.write_opsd_teacher)


@pytest.mark.parametrize("base", [OPSD, GDPO_DISTILL], ids=["opsd", "gdpo-distill"])
@pytest.mark.parametrize("override, message", [("actor_rollout_ref.model.use_fused_kernels=True", "use_fused_kernels=False"),
                                               ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "ulysses"),
                                               ("actor_rollout_ref.actor.strategy=megatron", "strategy=fsdp2"),
                                               ("distillation.enabled=True", "teacher servers"),
                                               ("distillation.distillation_loss.use_policy_gradient=True", "pinned")])
def test_settings_the_self_teachers_cannot_run_with_are_refused(base, override, message):
    from recipe.mrtpo.main_mrtpo import check_config

    name = "opsd" if base is OPSD else "gdpo-distill"
    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        assert check_config(compose(config_name="mrtpo_trainer", overrides=list(base))).name == name
        with pytest.raises(ValueError, match=message):
            check_config(compose(config_name="mrtpo_trainer", overrides=[*base, override]))


@pytest.mark.parametrize("base, override, message", [
    (OPSD[:2], None, "use_kl_loss=True"),  # the frozen teacher is verl's reference worker
    (OPSD, "actor_rollout_ref.model.lora_rank=8", "LoRA"),
    (OPSD, "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2", "ulysses"),
    (OPSD, "mrtpo.opsd_support=full", "full vocabulary"),
    (OPSD, "mrtpo.opsd_beta=1.5", r"opsd_beta must be in \[0, 1\]"),
    (OPSD, "mrtpo.opsd_loss_coef=0.5", "not read by method opsd"),  # gdpo-distill's knobs
    (OPSD, "mrtpo.opsd_loss_mode=k3", "not read by method opsd"),
    (OPSD, "distillation.distillation_loss.log_prob_min_clamp=-5", "not read by method opsd"),
    (OPSD, "+distillation.distillation_loss.use_chunked_topk=True", "not read by method opsd"),
    (OPSD, "actor_rollout_ref.actor.kl_loss_coef=0.001", "kl_loss_coef=0.001 is not read by method opsd"),
    (OPSD, "actor_rollout_ref.actor.entropy_coeff=0.01", "entropy_coeff=0.01 is not read by method opsd"),
    (GDPO_DISTILL, "mrtpo.opsd_beta=0.3", "not read by method gdpo-distill"),  # OPSD's knobs
    (GDPO_DISTILL, "mrtpo.opsd_support=topk", None),  # its default: accepted
])
def test_each_objectives_knobs_are_refused_by_the_other(base, override, message):
    from recipe.mrtpo.main_mrtpo import check_config

    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        cfg = compose(config_name="mrtpo_trainer", overrides=[*base, *([override] if override else [])])
        if message is None:
            check_config(cfg)
            return
        with pytest.raises(ValueError, match=message):
            check_config(cfg)
