"""The `mrtpo` reward manager: dispatch on data_source, per-reward scores + contexts, errors counted."""

import asyncio
import json

import numpy as np
import pytest
import torch

from recipe.mrtpo.rewards.reward_manager import ERROR_KEY, TASK_KEY, MRTPORewardManager, score_sample
from recipe.mrtpo.tasks import Context, RewardResult, register_task

FORMAT = "Reply with one word in lowercase."


def score_one_word(response, ground_truth, extra_info=None):
    """The example task of docs/design.md §2: a format reward (prompt context) and an answer reward (appended)."""
    words = response.split()
    fmt = float(len(words) == 1 and response.strip().islower())
    ans = float(response.strip().lower() == str(ground_truth["answer"]).lower())
    return RewardResult(
        scores={"format": fmt, "answer": ans},
        contexts={"format": Context(FORMAT, "prompt"), "answer": Context(str(ground_truth["answer"]), "appended")},
    )


def broken(response, ground_truth, extra_info=None):
    raise RuntimeError("checker exploded")


register_task("test_one_word", score_one_word)
register_task("test_broken", broken)


def test_scores_and_contexts_roundtrip():
    out = score_sample("test_one_word", "paris", {"answer": "Paris"}, None)
    info = out["reward_extra_info"]
    assert json.loads(info["mrtpo_rewards"]) == {"answer": 1.0, "format": 1.0}
    assert json.loads(info["mrtpo_contexts"])["format"] == {"text": FORMAT, "placement": "prompt"}
    assert out["reward_score"] == 1.0 and info[TASK_KEY] == "test_one_word" and info[ERROR_KEY] == ""
    half = score_sample("test_one_word", "Paris is nice", {"answer": "paris"}, None)
    assert half["reward_score"] == 0.0
    # every sample carries the same extra keys (verl's reward loop requires it)
    assert set(half["reward_extra_info"]) == set(info)


def test_numpy_ground_truth_from_parquet_is_plain():
    out = score_sample("test_one_word", "x", {"answer": np.array(["x"])[0]}, {"k": np.array([1, 2])})
    assert json.loads(out["reward_extra_info"]["mrtpo_rewards"])["answer"] == 1.0


@pytest.mark.parametrize("source", ["test_broken", "no_such_task"])
def test_verifier_errors_are_scored_zero_and_reported(source, caplog):
    out = score_sample(source, "anything", {}, None)
    info = out["reward_extra_info"]
    assert out["reward_score"] == 0.0 and json.loads(info["mrtpo_rewards"]) == {}
    assert info[ERROR_KEY].startswith("RuntimeError: checker exploded" if source == "test_broken" else "KeyError")


def test_register_task_rejects_a_second_owner():
    with pytest.raises(ValueError):
        register_task("test_one_word", broken)
    register_task("test_one_word", score_one_word)  # same function again is fine


def test_run_single_decodes_and_scores():
    import tempfile

    from transformers import AutoTokenizer
    from verl import DataProto

    from recipe.mrtpo.cpu.tiny_model import build_qwen2_tokenizer

    with tempfile.TemporaryDirectory() as d:
        tok = AutoTokenizer.from_pretrained(build_qwen2_tokenizer(d))
    resp = tok("paris", add_special_tokens=False)["input_ids"]
    T = len(resp) + 3
    responses = torch.full((1, T), tok.pad_token_id or 0)
    responses[0, : len(resp)] = torch.tensor(resp)
    prompts = torch.zeros(1, 4, dtype=torch.long)
    attn = torch.cat([torch.ones(1, 4), (torch.arange(T) < len(resp)).float()[None]], 1).long()
    data = DataProto.from_dict(
        tensors={"responses": responses, "prompts": prompts, "attention_mask": attn},
        non_tensors={
            "data_source": np.array(["test_one_word"], dtype=object),
            "reward_model": np.array([{"ground_truth": {"answer": "paris"}}], dtype=object),
            "extra_info": np.array([{}], dtype=object),
        },
    )
    mgr = MRTPORewardManager(config=None, tokenizer=tok)
    out = asyncio.get_event_loop().run_until_complete(mgr.run_single(data))
    assert out["reward_score"] == 1.0
