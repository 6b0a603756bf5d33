"""A file that vanishes mid-run (a SQL database gone from a worker's node): the verifier cannot judge the response,
so the row leaves the advantage instead of scoring 0 (``recipe/mrtpo/rewards/reward_extras.py``): no score (out of its
group's statistics), an advantage of exactly 0, counted as ``mrtpo/missing_files`` and logged with the line naming
the file and the node. From the reward manager's output through the trainer's advantage step (a fake TransferQueue,
as ``test_advantage_step.py``)."""

from __future__ import annotations

import json
import logging
import sqlite3

import numpy as np
import pytest
import torch

from integration.test_advantage_step import LENS, SCORES, UIDS, padded, run_step
from recipe.mrtpo.cluster import node_files
from recipe.mrtpo.cluster.verdict import NO_VERDICT_MARK
from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats
from recipe.mrtpo.rewards.reward_extras import ERROR_KEY, SCORES_KEY, advantage_mask, read_reward_table
from recipe.mrtpo.rewards.reward_manager import score_sample

GOLD = "SELECT name FROM t ORDER BY name"


def _gone_error(tmp_path, monkeypatch) -> str:
    """The ``mrtpo_error`` the reward manager leaves for a SQL row whose database is not on this node."""
    root = tmp_path / "root"
    (root / "db").mkdir(parents=True)
    con = sqlite3.connect(root / "db" / "x.sqlite")
    con.execute("CREATE TABLE t (name TEXT)")
    con.commit()
    con.close()
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(tmp_path / "elsewhere"))  # the database is gone from this node
    out = score_sample("chinook", f"```sql\n{GOLD}\n```", {"db_path": "db/x.sqlite", "gold_sql": GOLD}, {})
    assert out["reward_score"] == 0.0 and json.loads(out["reward_extra_info"][SCORES_KEY]) == {}
    return out["reward_extra_info"][ERROR_KEY]


def _mask():
    mask = torch.zeros(4, max(LENS))
    for i, n in enumerate(LENS):
        mask[i, :n] = 1
    return mask


def test_the_reward_table_leaves_a_missing_file_unscored_not_zero(tmp_path, monkeypatch):
    error = _gone_error(tmp_path, monkeypatch)
    assert node_files.is_missing_file(error) and str(tmp_path / "elsewhere" / "db" / "x.sqlite") in error
    extras = [{SCORES_KEY: json.dumps({"match": 1.0}), ERROR_KEY: ""}, {SCORES_KEY: "{}", ERROR_KEY: error},
              {SCORES_KEY: "{}", ERROR_KEY: "ValueError: boom"}, {SCORES_KEY: json.dumps({"match": 0.0}), ERROR_KEY: ""}]
    table = read_reward_table(extras, ["g"] * 4)
    assert table.missing_files == [False, True, False, False] and table.raised == [False, True, True, False]
    assert torch.isnan(table.scores[1]).all()  # no verdict: absent, not 0
    assert table.scores[2].tolist() == [0.0]  # any other verifier error still scores 0 (counted apart)
    mask = torch.ones(4, 3)
    assert advantage_mask(mask, table.missing_files).sum(-1).tolist() == [3.0, 0.0, 3.0, 3.0]
    with pytest.raises(ValueError):
        advantage_mask(mask, [True])


@pytest.mark.parametrize("est, step", [("gdpo", 7), ("mrtpo", 6)])
def test_a_missing_file_row_gets_exactly_zero_advantage_and_moves_no_other_row(tmp_path, monkeypatch, tiny, caplog, est, step):  # noqa: F811
    """Row 3's database vanished: its advantage is 0, and the other rows' is what the batch of rows 0-2 alone gives
    (row 2 is then alone in group b): the row entered no group's mean or std nor the batch whitening."""
    error = _gone_error(tmp_path, monkeypatch)
    scores = [*SCORES[:3], {}]
    with caplog.at_level(logging.WARNING, logger="recipe.mrtpo.step.trainer"):
        fake, metrics, calls, _ = run_step(monkeypatch, tiny, step, f"algorithm.adv_estimator={est}", "mrtpo.beta=0.5",
                                           scores=scores, errors=["", "", "", error])
    adv = padded(fake.put["advantages"])
    assert (adv[3] == 0).all()
    assert metrics["mrtpo/missing_files"] == 1 and metrics["mrtpo/verifier_errors"] == 0 and metrics["mrtpo/rows_out"] == 1
    assert any("1 rows taken out of the step" in r.getMessage() and node_files.MISSING_MARK in r.getMessage()
               for r in caplog.records)
    mask = _mask()
    # the row leaves the loss too: its response_mask is written back 0 (the KL term, the token-mean denominator)
    assert torch.equal(padded(fake.put["response_mask"]).float(), mask * torch.tensor([1.0, 1, 1, 0]).unsqueeze(-1))
    names = ["lower", "no_comma"]
    three = torch.tensor([[s[n] for n in names] for s in SCORES[:3]])
    if est == "gdpo":
        ref, _ = compute_mrtpo_advantage_with_stats(three, np.array(UIDS[:3], dtype=object), mask[:3], None, 0.0,
                                                    max_realloc_rms=1.0)
        assert torch.allclose(adv[:3], ref, atol=1e-6)
    else:  # the replay skips the row too: group b holds one scored row (no variance), group a is replayed
        assert metrics["mrtpo/pairs_replayed"] == 4 and calls == [2]
        assert torch.isfinite(adv).all() and float((adv[:3] * (1 - mask[:3])).abs().max()) == 0


def test_a_row_without_a_verdict_leaves_the_advantage_and_the_loss(monkeypatch, tiny):  # noqa: F811
    """A verifier's ``NoVerdict`` (NLTK data missing, an unreadable database, a failing gold) goes out as a missing
    file does: absent from its group's statistics, advantage 0, response mask 0, counted as ``mrtpo/no_verdict``."""
    error = f"NoVerdict: {NO_VERDICT_MARK}n1: instruction_following: lower: LookupError: Resource punkt_tab not found."
    fake, metrics, _, _ = run_step(monkeypatch, tiny, 7, "algorithm.adv_estimator=gdpo", scores=[*SCORES[:3], {}],
                                   errors=["", "", "", error])
    adv, mask = padded(fake.put["advantages"]), _mask()
    names = ["lower", "no_comma"]
    three = torch.tensor([[s[n] for n in names] for s in SCORES[:3]])
    ref, _ = compute_mrtpo_advantage_with_stats(three, np.array(UIDS[:3], dtype=object), mask[:3], None, 0.0,
                                                max_realloc_rms=1.0)
    assert (adv[3] == 0).all() and torch.allclose(adv[:3], ref, atol=1e-6)  # group statistics without the row
    assert padded(fake.put["response_mask"])[3].abs().sum() == 0 and torch.equal(padded(fake.put["response_mask"])[:3].float(), mask[:3])
    assert metrics["mrtpo/no_verdict"] == 1 and metrics["mrtpo/missing_files"] == 0 and metrics["mrtpo/verifier_errors"] == 0
    assert metrics["mrtpo/rows_out"] == 1


def test_a_step_with_every_row_judged_writes_no_mask(monkeypatch, tiny):  # noqa: F811
    fake, metrics, _, _ = run_step(monkeypatch, tiny, 7, "algorithm.adv_estimator=gdpo")
    assert "response_mask" not in fake.put and metrics["mrtpo/rows_out"] == 0


def test_a_batch_whose_files_all_vanished_trains_with_zero_advantage(tmp_path, monkeypatch, tiny):  # noqa: F811
    error = _gone_error(tmp_path, monkeypatch)
    fake, metrics, calls, _ = run_step(monkeypatch, tiny, 7, "algorithm.adv_estimator=gdpo", scores=[{}] * 4,
                                       errors=[error] * 4)
    assert (padded(fake.put["advantages"]) == 0).all() and calls == []
    assert metrics["mrtpo/missing_files"] == 4 and metrics["mrtpo/verifier_errors"] == 0


def test_grpo_stops_on_a_missing_file_rather_than_train_on_a_zero(tmp_path, monkeypatch, tiny):  # noqa: F811
    """verl's own estimator step sees one scalar per row (0 for this one) and cannot leave a row out: the run stops
    with the line naming the file and the node."""
    error = _gone_error(tmp_path, monkeypatch)
    with pytest.raises(RuntimeError) as err:
        run_step(monkeypatch, tiny, 6, "algorithm.adv_estimator=grpo", scores=[*SCORES[:3], {}], errors=["", "", "", error])
    assert node_files.MISSING_MARK in str(err.value) and "grpo" in str(err.value)
