"""The trainer's advantage step with ``mrtpo.mode=opsd``, without Ray or vLLM (a fake TransferQueue, a tiny Qwen2).

``MRTPOTrainer._compute_advantage`` runs as in the real loop; the worker group's ``compute_opsd_teacher`` is
the worker's own row function on the tiny model. Checked: the advantage is GDPO's, verl's
teacher fields land in TransferQueue in verl's per-sequence layout with P_all's top-k at the response rows,
and the batch meta carries the loss settings the actor update installs verl's distillation loss from.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_module
from tensordict import NonTensorStack, TensorDict

from recipe.mrtpo import verl_seam
from recipe.mrtpo.core.prompt_variants import build_sample_variants
from recipe.mrtpo.core.replay import hf_forward
from recipe.mrtpo.methods.opsd.driver import LOSS_SETTINGS_KEY
from recipe.mrtpo.reward_extras import CONTEXTS_KEY, ERROR_KEY, SCORES_KEY

MSGS = [{"role": "user", "content": "How many tracks are longer than five minutes? Reply with one SQL query in a ```sql block."}]
CTX = {"execution_match": {"text": "SELECT COUNT(*) FROM Track WHERE Milliseconds > 300000", "placement": "appended"},
       "format": {"text": "Reply with one SQL query in a ```sql block.", "placement": "prompt"}}
SCORES = [{"execution_match": 1.0, "format": 0.0}, {"execution_match": 0.0, "format": 1.0},
          {"execution_match": 1.0, "format": 1.0}, {"execution_match": 0.0, "format": 1.0}]
UIDS = ["a", "a", "b", "b"]
LENS = [7, 9, 5, 8]
K = 4


class FakeTQ:
    def __init__(self, td: TensorDict):
        self.td, self.put = td, {}

    def kv_batch_get(self, keys, partition_id, select_fields):
        return self.td.select(*[f for f in select_fields if f in self.td.keys()])

    def kv_batch_put(self, keys, partition_id, fields):
        self.put.update(dict(fields.items()))
        return SimpleNamespace(keys=keys, partition_id=partition_id)


class Meta(SimpleNamespace):
    def __len__(self):
        return len(self.keys)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    path = build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64, seed=11)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)
    return tok, model.eval()


def render(tok, msgs):
    return list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))


def logprobs_after(model, prompt, response):
    seq = torch.tensor([list(prompt) + response.tolist()])
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=seq).logits[0, len(prompt) - 1 : -1].float(), -1)


def run_step(monkeypatch, tiny, *overrides, ctx=None):
    import verl.trainer.ppo.v1.trainer_base as tb

    from recipe.mrtpo.trainer import MRTPOTrainer
    from recipe.mrtpo.worker import opsd_teacher_rows

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

    def compute_opsd_teacher(data):
        calls.append(int(data["prompt_lens"].shape[0]))
        with torch.no_grad():
            return opsd_teacher_rows(hf_forward(model), data, "cpu", sync=None)  # the worker's own code, one rank

    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0]}, compute_opsd_teacher=compute_opsd_teacher)
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
    with caplog.at_level("WARNING", logger="recipe.mrtpo.trainer"):
        _, metrics, calls, _, _, _ = run_step(monkeypatch, tiny, "algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd",
                                              f"mrtpo.opsd_topk={K}", ctx=placed)
    assert calls == [4] and metrics["mrtpo/rows_privileged"] == 0 and metrics["mrtpo/opsd/rows_same_prompt"] == 4
    lines = [r.getMessage() for r in caplog.records if "privileged information" in r.getMessage()]
    assert len(lines) == 1 and "method opsd" in lines[0] and "GDPO here" in lines[0]


def test_gdpo_opsd_writes_gdpos_advantage_and_p_alls_topk(monkeypatch, tiny):
    tok, model = tiny
    ref, ref_metrics, ref_calls, _, _, _ = run_step(monkeypatch, tiny, "algorithm.adv_estimator=gdpo")
    fake, metrics, calls, meta, responses, prompt = run_step(monkeypatch, tiny, "algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd",
                                                             f"mrtpo.opsd_topk={K}", "mrtpo.opsd_loss_coef=0.25")
    assert ref_calls == [] and calls == [4]
    assert set(fake.put) == {"advantages", "returns", "teacher_logprobs", "teacher_ids"}
    assert torch.equal(fake.put["advantages"].to_padded_tensor(0.0), ref.put["advantages"].to_padded_tensor(0.0))  # GDPO's
    assert metrics["mrtpo/opsd/rows_privileged"] == 4 and metrics["mrtpo/rows_privileged"] == 4 and metrics["mrtpo/beta"] == 0.0
    assert metrics["mrtpo/opsd/teacher_prompt_extra_tokens"] > 5  # the gold SQL block
    teacher = p_all(tok)
    for i, (lp, ids) in enumerate(zip(fake.put["teacher_logprobs"].unbind(), fake.put["teacher_ids"].unbind())):
        n = LENS[i]
        assert lp.shape == (len(prompt) + n, K) and ids.dtype == torch.int32
        v, j = logprobs_after(model, teacher, responses[i]).topk(K, -1)
        rows = slice(len(prompt) - 1, len(prompt) - 1 + n)  # verl's row of response token t is prompt_len - 1 + t
        assert torch.allclose(lp[rows], v, atol=1e-4) and torch.equal(ids[rows].long(), j)
        assert (lp[: len(prompt) - 1] == 0).all() and (lp[-1] == 0).all()
    settings = meta.extra_info[LOSS_SETTINGS_KEY]
    assert (settings["loss_mode"], settings["topk"], settings["distillation_loss_coef"], settings["use_task_rewards"]) == \
        ("forward_kl_topk", K, 0.25, True)


def test_opsd_with_the_single_token_estimator(monkeypatch, tiny):
    tok, model = tiny
    fake, metrics, calls, meta, responses, prompt = run_step(monkeypatch, tiny, "algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd",
                                                             "mrtpo.opsd_loss_mode=k3")
    assert calls == [4] and "advantages" in fake.put and "mrtpo/reward/format/mean" in metrics
    teacher = p_all(tok)
    for i, lp in enumerate(fake.put["teacher_logprobs"].unbind()):
        n = LENS[i]
        assert lp.shape == (len(prompt) + n, 1)
        want = logprobs_after(model, teacher, responses[i]).gather(-1, responses[i].view(-1, 1))
        assert torch.allclose(lp[len(prompt) - 1 : len(prompt) - 1 + n], want, atol=1e-4)
    assert meta.extra_info[LOSS_SETTINGS_KEY]["loss_mode"] == "k3"
    assert metrics["mrtpo/opsd/teacher_logprob_gain"] != 0.0


def test_opsd_is_attached_through_its_registry_entry():
    """The trainer knows no OPSD: the method's entry carries the hook, which reads its step context only."""
    import inspect

    from recipe.mrtpo import methods, trainer
    from recipe.mrtpo.methods.opsd import step as opsd_step

    assert methods.get("opsd").after_step is not None and methods.get("gdpo").after_step is None
    assert "opsd" not in inspect.getsource(trainer.MRTPOTrainer._compute_advantage)
    assert "trainer" not in inspect.getsource(opsd_step.write_opsd_teacher)


@pytest.mark.parametrize("override, message", [("actor_rollout_ref.model.use_fused_kernels=True", "use_fused_kernels=False"),
                                               ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "ulysses"),
                                               ("actor_rollout_ref.actor.strategy=megatron", "strategy=fsdp2"),
                                               ("distillation.enabled=True", "teacher servers")])
def test_settings_opsd_cannot_run_with_are_refused(override, message):
    from recipe.mrtpo.main_mrtpo import check_config

    base = ["algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd"]
    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        assert check_config(compose(config_name="mrtpo_trainer", overrides=base)).name == "opsd"
        with pytest.raises(ValueError, match=message):
            check_config(compose(config_name="mrtpo_trainer", overrides=[*base, override]))
