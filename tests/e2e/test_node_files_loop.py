"""verl's real loop on CPU: a text-to-SQL run whose data root lacks a row's database stops before its first step,
with the node check's one line naming the file and the node (``recipe/mrtpo/launch/node_check.py``) and exit status 2.

The Chinook rows are rewritten to store their database relative to the data root (``chinook/chinook.sqlite``, as
``data_prep`` writes rows under ``$MRTPO_DATA_ROOT``), and the run points ``MRTPO_DATA_ROOT`` at an empty folder:
the rows, the model and every setting are the tiny runs' own (``tiny_run_overrides``), so only the database is
missing. The check runs in verl's task runner before the trainer is built, so no step, rollout or vLLM server starts.
"""

from __future__ import annotations

import socket

import pandas as pd
import pytest
from launches import LAUNCH_TIMEOUT_S  # tests/e2e/launches.py

from recipe.mrtpo.cluster.node_files import MISSING_MARK
from recipe.mrtpo.cpu.launcher import run_cpu, tiny_run_overrides

STORED = "chinook/chinook.sqlite"


@pytest.mark.e2e
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
def test_a_data_root_without_the_database_stops_the_run_in_one_line(tiny_task_qwen2_dir, chinook_train_parquet, tmp_path):
    frame = pd.read_parquet(chinook_train_parquet)
    frame["reward_model"] = [{**rm, "ground_truth": {**rm["ground_truth"], "db_path": STORED}} for rm in frame["reward_model"]]
    data = tmp_path / "train.parquet"
    frame.to_parquet(data)
    root = tmp_path / "empty_root"
    root.mkdir()
    res = run_cpu("recipe.mrtpo.main_mrtpo", tiny_run_overrides(tiny_task_qwen2_dir, data, tmp_path, "gdpo", 1),
                  tmp_path / "run", LAUNCH_TIMEOUT_S, extra_env={"MRTPO_DATA_ROOT": str(root)})
    assert not res.timed_out, f"run did not stop within {LAUNCH_TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 2, f"exit {res.returncode} (a refused launch exits 2):\n{res.tail()}"
    assert not res.steps, f"a step ran: {sorted(res.steps)}"
    # the driver's one line (launch_errors): the node check's line, behind the entry point's name
    lines = [ln for ln in res.log_text.splitlines() if ln.startswith(f"main_mrtpo: error: {MISSING_MARK}")]
    assert len(lines) == 1, f"not one line naming the missing file:\n{res.tail()}"
    line = lines[0]
    assert "Traceback" not in res.log_text, res.tail()
    assert f"{MISSING_MARK}{socket.gethostname()}: {root / STORED} (row: {STORED})" in line, line
    assert f"MRTPO_DATA_ROOT={root}" in line and "[ray node " in line, line
    print(f"\n[e2e node files] exit {res.returncode} after {res.wall_s:.0f}s: {line}")
