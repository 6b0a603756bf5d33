"""The TRL adapter (``recipe.mrtpo.trl_adapter``) against TRL's own GDPO and the verl recipe's MRTPO step.

One fixed batch, the one of ``test_advantage_step.py`` (a prompt with two instruction-following constraints, two
groups of two responses, per-reward scores and the constraints' sentences as Z_k), goes through TRL's real
``_generate_and_score_completions`` (generation stubbed to hand back those responses; the reward functions are a
user's own, with ``mrtpo_context``) on the suite's tiny Qwen2, and through the verl recipe's advantage step.
"""

from __future__ import annotations

import logging

import pytest
import torch

from integration.test_advantage_step import CTX, LENS, MSGS, SCORES, make_batch, padded, render, run_step
from recipe.mrtpo.core.advantage import smoothstep_beta
from recipe.mrtpo.trl_adapter import MRTPOGRPOConfig, MRTPOTrainer, task_rewards, with_context

NAMES = ["no_comma", "lower"]  # TRL's column order; verl's table sorts them (the sum over rewards does not care)


def user_rewards(scores=SCORES, contexts=True):
    """A user's own reward functions: fixed scores by completion, Z_k the constraint's sentence (``with_context``)."""
    out = []
    for name in NAMES:
        def reward(prompts, completions, _name=name, **kwargs):
            return [scores[i].get(_name) for i in range(len(completions))]

        reward.__name__ = name
        sentence = CTX[name]["text"]
        out.append(with_context(reward, lambda prompts, _s=sentence, **kw: [_s] * len(prompts)) if contexts else reward)
    return out


def make_trainer(tiny, tmp_path, cls, *, rewards=None, **knobs):
    from datasets import Dataset
    from trl import GRPOConfig

    tok, model = tiny
    config_cls = MRTPOGRPOConfig if cls is MRTPOTrainer else GRPOConfig
    extra = {} if cls is MRTPOTrainer else {"multi_objective_aggregation": "normalize_then_sum"}
    args = config_cls(output_dir=str(tmp_path / cls.__name__), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=max(LENS), report_to="none", use_cpu=True, logging_steps=1, temperature=1.0,
                      **extra, **knobs)
    data = Dataset.from_list([{"prompt": MSGS}] * 2)
    return cls(model=model, reward_funcs=rewards or user_rewards(), args=args, train_dataset=data, processing_class=tok)


def score_batch(trainer, tiny, step: int = 0):
    """TRL's ``_generate_and_score_completions`` on the fixed batch (its generation stubbed), at ``step``."""
    import trl

    tok, model = tiny
    _, _, responses = make_batch(tok, model)
    prompt = render(tok, MSGS)
    completions = [[{"role": "assistant", "content": tok.decode(r)}] for r in responses]
    ids = [r.tolist() for r in responses]

    def generate(prompts):
        if int(trl.__version__.split(".")[0]) >= 1:
            return [prompt] * 4, ids, None, completions, None, {}, None, None
        return [prompt] * 4, ids, None, completions, torch.tensor(sum(LENS)), None, {}

    trainer._generate = generate
    trainer.state.global_step = step
    trainer.model.train()
    return trainer._generate_and_score_completions([{"prompt": MSGS}] * 4)


def mask():
    m = torch.zeros(4, max(LENS))
    for i, n in enumerate(LENS):
        m[i, :n] = 1
    return m


def test_beta_zero_is_trls_own_gdpo_bit_for_bit(tiny, tmp_path):
    """beta_s = 0 (the first step of the warm-up; and mrtpo_beta = 0) hands TRL exactly its own normalize_then_sum."""
    # "lower" absent (None) on row 2: TRL leaves it out of its group's statistics (one value left: no advantage)
    scores = [{"no_comma": 1.0, "lower": 1.0}, {"no_comma": 0.0, "lower": 1.0}, {"no_comma": 1.0, "lower": None},
              {"no_comma": 0.5, "lower": 0.0}]
    gdpo = score_batch(make_trainer(tiny, tmp_path, __import__("trl").GRPOTrainer, rewards=user_rewards(scores)), tiny)
    assert gdpo["advantages"].shape == (4,) and gdpo["advantages"].abs().min() > 0.1
    for knobs, step in (({}, 0), ({"mrtpo_beta": 0.0}, 7)):
        out = score_batch(make_trainer(tiny, tmp_path, MRTPOTrainer, rewards=user_rewards(scores), **knobs), tiny, step)
        adv = out["advantages"]
        assert adv.shape == (4, max(LENS))
        assert torch.equal(adv, gdpo["advantages"].unsqueeze(1) * mask()), knobs  # bit for bit on every valid token


def test_the_adapter_equals_the_verl_recipes_mrtpo_step(monkeypatch, tiny, tmp_path):
    """mrtpo_normalization='verl': the adapter's (B, T) advantages are the verl trainer's advantage step's (fp32,
    1e-6) on the same rows, and its q is that step's replay's (the recipe's ``run_replay`` through its worker code).

    The recipe's workers hand q back to the driver in bf16 (``worker.RELEVANCE_DTYPE``, a wire compression); the
    adapter has no wire and keeps fp32, so the comparison sets the wire to fp32."""
    from recipe.mrtpo.step import trainer as verl_trainer
    from recipe.mrtpo.step import worker

    monkeypatch.setattr(worker, "RELEVANCE_DTYPE", torch.float32)

    seen = {}
    real_run_replay = verl_trainer.run_replay

    def recording(*args, **kwargs):
        seen["verl"] = real_run_replay(*args, **kwargs)
        return seen["verl"]

    monkeypatch.setattr(verl_trainer, "run_replay", recording)
    # both sides replay each sequence on its own: the adapter does not share prompts, and the shared pass's block-sparse
    # attention rounds differently in fp32 (its exactness against the unshared pass is tested in test_shared_prompts)
    fake, metrics, calls, _ = run_step(monkeypatch, tiny, 6, "mrtpo.beta=0.5", "mrtpo.warmup_steps=2", "mrtpo.share_prompts=false")
    verl_adv = padded(fake.put["advantages"])

    trainer = make_trainer(tiny, tmp_path, MRTPOTrainer, mrtpo_beta=0.5, mrtpo_warmup_steps=2, mrtpo_normalization="verl")
    real_relevance = trainer.mrtpo_relevance

    def keep(*args, **kwargs):
        seen["trl"] = real_relevance(*args, **kwargs)
        return seen["trl"]

    trainer.mrtpo_relevance = keep
    out = score_batch(trainer, tiny, step=5)  # verl's global_steps 6 is 5 completed steps
    assert torch.allclose(out["advantages"], verl_adv, atol=1e-6, rtol=0), (out["advantages"] - verl_adv).abs().max()
    # the same pairs replayed, the same q (verl's table orders the rewards by name)
    order = [NAMES.index(n) for n in sorted(NAMES)]
    assert torch.equal(seen["trl"].replayed[:, order], seen["verl"].replayed) and int(seen["trl"].replayed.sum()) == 6
    # q = sqrt(JSD / ln 2) magnifies fp32 rounding near 0: the two passes batch the sequences differently (1.8e-6
    # here), the suite's tolerance for q is 1e-5 (test_shared_prompts)
    assert torch.allclose(seen["trl"].q[:, order], seen["verl"].relevance, atol=1e-5, rtol=0)
    assert float(seen["trl"].q.max()) > 1e-3  # the tiny model reads its prompt: q is no trivial zero
    logged = trainer._metrics["train"]
    assert logged["mrtpo/beta"] == [pytest.approx(smoothstep_beta(5, 0.5, 2))]
    assert logged["mrtpo/rollout_prompt_found"] == [1.0]  # P_all rendered as TRL rendered the rollout prompt


def test_trl_normalization_keeps_trls_sequence_advantage_and_logs_per_reward(tiny, tmp_path, caplog):
    """The default ('trl'): each completion's mean advantage over its tokens is TRL's GDPO advantage, the tokens
    differ; per-reward relevance metrics land in TRL's logs; a reward without Z_k is counted and warned about once."""
    from trl import GRPOTrainer

    gdpo = score_batch(make_trainer(tiny, tmp_path, GRPOTrainer), tiny)["advantages"]
    rewards = user_rewards()
    rewards[1] = user_rewards(contexts=False)[1]  # "lower" without mrtpo_context
    trainer = make_trainer(tiny, tmp_path, MRTPOTrainer, rewards=rewards, mrtpo_beta=0.5, mrtpo_warmup_steps=0)
    with caplog.at_level(logging.WARNING, logger="recipe.mrtpo.trl_adapter.trainer"):
        adv = score_batch(trainer, tiny)["advantages"]
        score_batch(trainer, tiny)
    m = mask()
    assert torch.allclose((adv * m).sum(1) / m.sum(1), gdpo, atol=1e-5, rtol=0)
    spread = [float(adv[i, : LENS[i]].std()) for i in range(4)]
    assert spread[0] > 1e-3 and spread[1] > 1e-3  # group a: no_comma varies there, its credit moved
    logged = trainer._metrics["train"]
    assert 0.1 <= logged["mrtpo/no_comma/q_top10_share"][0] <= 1.0 and logged["mrtpo/no_comma/weight_max"][0] > 1.0
    assert logged["mrtpo/no_comma/pairs_replayed"] == [2, 2] and logged["mrtpo/lower/pairs_replayed"] == [0, 0]
    assert logged["mrtpo/lower/pairs_no_context"] == [4, 4] and logged["mrtpo/replay_time_s"][0] > 0
    assert sum("has no mrtpo_context" in r.getMessage() for r in caplog.records) == 1


def test_task_rewards_score_and_give_z_k_as_the_verifier_does():
    """The recipe's tasks through TRL's reward-function call: one function per reward name, scores and Z_k the
    verifier's (instruction following: prompt-placed; tool calling: appended); a row without that reward is absent
    (None); a verifier that raises leaves the row absent."""
    from recipe.mrtpo.tasks import get_task

    gt = {"instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"], "kwargs": [{}, {}]}
    extra = {"constraint_texts": [CTX["no_comma"]["text"], CTX["lower"]["text"]]}
    funcs = task_rewards(["punctuation:no_comma", "change_case:english_lowercase", "detectable_format:title"])
    completions = [[{"role": "assistant", "content": "rain falls soft and slow"}], "Rain, Falls"]
    kw = {"prompts": [MSGS, MSGS], "completions": completions, "data_source": ["instruction_following"] * 2,
          "reward_model": [{"ground_truth": gt}] * 2, "extra_info": [extra] * 2}
    ref = [get_task("instruction_following")(t, gt, extra) for t in ("rain falls soft and slow", "Rain, Falls")]
    assert [f.__name__ for f in funcs] == ["punctuation:no_comma", "change_case:english_lowercase", "detectable_format:title"]
    assert funcs[0](**kw) == [1.0, 0.0] and funcs[1](**kw) == [1.0, 0.0] and funcs[2](**kw) == [None, None]
    assert funcs[0].mrtpo_context(**kw) == [ref[0].contexts["punctuation:no_comma"]] * 2
    assert funcs[0].mrtpo_context(**kw)[0].text == CTX["no_comma"]["text"]
    bad = dict(kw, data_source=["no_such_task"] * 2)
    assert funcs[0](**bad) == [None, None] and funcs[0].mrtpo_context(**bad) == [None, None]
    # tool calling: Z_correctness is the reference calls, appended to P_all (absent from the rollout prompt)
    gt = {"calls": [{"name": "f", "arguments": {"n": 5}}], "tools": []}
    fmt, corr = task_rewards(["format", "correctness"])
    kw = {"prompts": [MSGS], "completions": ["no call"], "data_source": ["tool_calling"], "reward_model": [{"ground_truth": gt}],
          "extra_info": [None]}
    ref = get_task("tool_calling")("no call", gt, None)
    assert fmt(**kw) == [ref.scores["format"]] and corr(**kw) == [ref.scores["correctness"]]
    assert corr.mrtpo_context(**kw) == [ref.contexts["correctness"]] and ref.contexts["correctness"].placement == "appended"


@pytest.mark.parametrize("knobs, message", [
    ({"multi_objective_aggregation": "sum_then_normalize"}, "multi_objective_aggregation must be 'normalize_then_sum'"),
    ({"mrtpo_beta": 1.0}, "mrtpo_beta must be in [0, 1)"),
    ({"mrtpo_measure": "kl"}, "mrtpo_measure must be one of"),
    ({"mrtpo_normalization": "mine"}, "mrtpo_normalization must be one of"),
    ({"mrtpo_max_token_weight": 0.5}, "mrtpo_max_token_weight must be >= 1"),
])
def test_the_config_refuses_in_one_line(tmp_path, knobs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)").replace("(", r"\(")) as e:
        MRTPOGRPOConfig(output_dir=str(tmp_path), report_to="none", **knobs)
    assert "\n" not in str(e.value)


def test_the_trl_internals_the_adapter_relies_on():
    """What ``MRTPOTrainer`` relies on of TRL beyond its documented API (the parity tests above check their meaning):
    the two methods it extends and their arguments, and a loss that takes a (B, T) advantage as it is."""
    import inspect

    from trl import GRPOTrainer

    assert list(inspect.signature(GRPOTrainer._calculate_rewards).parameters) == [
        "self", "inputs", "prompts", "completions", "completion_ids_list"]
    assert list(inspect.signature(GRPOTrainer._generate_and_score_completions).parameters) == ["self", "inputs"]
    assert "if advantages.dim() == 1:" in inspect.getsource(GRPOTrainer._compute_loss)
