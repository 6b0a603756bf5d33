"""The `mrtpo` reward manager on multi-turn rows: the verifier judges the agent loop's record, never the text.

A BFCL multi-turn row's response holds tool output and injected user turns; the reward manager hands the
verifier the trajectory record from the loop's ``extra_fields`` (verl's reward loop passes them as
``tool_extra_fields``). The tokenizer here refuses to decode: a multi-turn row that reached the text path fails.
A missing or malformed record scores 0 on every reward, logged, behind ``record:`` and counted by the trainer.
"""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest
import torch
from verl import DataProto

from data_prep.multi_turn import gold_record, multi_turn_row
from recipe.mrtpo.rewards.reward_extras import ERROR_KEY, RECORD_ERROR_PREFIX, SCORES_KEY, read_reward_table
from recipe.mrtpo.rewards.reward_manager import MRTPORewardManager
from recipe.mrtpo.step.step_metrics import reward_metrics
from recipe.mrtpo.tasks import record_field_of
from recipe.mrtpo.tasks.multi_turn.official import load_category
from recipe.mrtpo.tasks.multi_turn.trajectory import RECORD_FIELD


class NoDecode:
    """A tokenizer whose decode fails the test: a record-judged row must never be decoded."""

    pad_token_id = 0

    def decode(self, *a, **k):
        raise AssertionError("a multi-turn row's response was decoded for its verifier")


@pytest.fixture(scope="module")
def row():
    entry, gold = next(iter(load_category("base")))
    return multi_turn_row(entry, gold, "base"), gold


def batch(row: dict, extra_fields=None, column=None) -> DataProto:
    """One sample as verl's reward loop builds it (``AgentLoopWorker._compute_score``); the response is noise."""
    T = 6
    ntb = {
        "data_source": np.array([row["data_source"]], dtype=object),
        "reward_model": np.array([row["reward_model"]], dtype=object),
        "extra_info": np.array([row["extra_info"]], dtype=object),
    }
    if extra_fields is not None:
        ntb["tool_extra_fields"] = np.array([extra_fields], dtype=object)
    if column is not None:
        ntb[RECORD_FIELD] = np.array([column], dtype=object)
    return DataProto.from_dict(
        tensors={"responses": torch.arange(1, T + 1)[None], "prompts": torch.zeros(1, 4, dtype=torch.long),
                 "attention_mask": torch.ones(1, 4 + T, dtype=torch.long)},
        non_tensors=ntb,
    )


def run(data: DataProto) -> dict:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # the manager runs its work on the loop current at its construction
    try:
        mgr = MRTPORewardManager(config=None, tokenizer=NoDecode())
        return loop.run_until_complete(mgr.run_single(data))
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def scores_of(out: dict) -> dict:
    return json.loads(out["reward_extra_info"][SCORES_KEY])


def test_the_task_declares_its_record_field():
    assert record_field_of("bfcl_multi_turn") == RECORD_FIELD == "bfcl_trajectory"
    assert record_field_of("bfcl_multi_turn/base") == RECORD_FIELD
    assert record_field_of("ifeval") is None and record_field_of("no_such_task") is None


def test_the_gold_record_from_the_loops_extra_fields_scores_full_marks(row):
    r, gold = row
    out = run(batch(r, extra_fields={RECORD_FIELD: gold_record(gold), "bfcl_spans": []}))
    assert scores_of(out) and set(scores_of(out).values()) == {1.0}, out
    assert out["reward_score"] == 1.0 and out["reward_extra_info"][ERROR_KEY] == ""
    # as a column of its own (a batch-level reward reads the extra fields so), and as JSON text
    col = run(batch(r, column=json.dumps(gold_record(gold))))
    assert scores_of(col) == scores_of(out)


def test_the_record_decides_not_what_the_response_text_says(row):
    """The same row with a record that made no call: state and response fail, whatever the text held."""
    r, gold = row
    idle = {"turns": [{"steps": [{"text": "ok", "calls": [], "error": None}]} for _ in gold]}
    s = scores_of(run(batch(r, extra_fields={RECORD_FIELD: idle})))
    assert s["state"] == 0.0 and s["response"] == 0.0 and s["format"] == 1.0


@pytest.mark.parametrize("case", ["missing", "none", "malformed", "not_json"])
def test_a_missing_or_malformed_record_scores_zero_logged_and_counted(row, case, caplog):
    r, gold = row
    extra = {"missing": {"bfcl_spans": []}, "none": {RECORD_FIELD: None},
             "malformed": {RECORD_FIELD: {"turns": "x"}}, "not_json": {RECORD_FIELD: "{not json"}}[case]
    with caplog.at_level(logging.WARNING, logger="recipe.mrtpo.rewards.reward_manager"):
        out = run(batch(r, extra_fields=extra))
    s, err = scores_of(out), out["reward_extra_info"][ERROR_KEY]
    assert s and set(s.values()) == {0.0} and out["reward_score"] == 0.0  # every reward of the task, at 0
    assert err.startswith(RECORD_ERROR_PREFIX + ("missing" if case in ("missing", "none") else "malformed")), err
    assert any(RECORD_ERROR_PREFIX in m for m in caplog.messages), caplog.messages
    # the trainer's count: the bad row and a good one
    good = run(batch(r, extra_fields={RECORD_FIELD: gold_record(gold)}))
    table = read_reward_table([out["reward_extra_info"], good["reward_extra_info"]], np.array(["g", "g"], dtype=object))
    assert table.record_errors == [True, False]
    m = reward_metrics(table)
    assert m["mrtpo/record_errors"] == 1.0 and m["mrtpo/checker_errors"] == 1.0 and m["mrtpo/verifier_errors"] == 0.0
