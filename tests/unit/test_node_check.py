"""The node check before the first step, on two Ray nodes on one machine (``ray.cluster_utils.Cluster``): the
second node's data root lacks the database, and the check stops in one line naming the file and that node."""
from __future__ import annotations

import sqlite3

import pandas as pd
import pytest

from recipe.mrtpo import node_files
from recipe.mrtpo.node_check import check_every_node, row_files


def test_row_files_reads_the_sql_rows_databases():
    frame = pd.DataFrame({"reward_model": [
        {"ground_truth": {"db_path": "db/a.sqlite", "gold_sql": "SELECT 1"}},
        {"ground_truth": '{"db_path": "db/a.sqlite", "gold_sql": "SELECT 2"}'},
        {"ground_truth": {"db_path": "/abs/b.sqlite", "gold_sql": "SELECT 1"}},
        {"ground_truth": "an IF row's ground truth"},
    ]})
    assert row_files(frame) == ["db/a.sqlite", "/abs/b.sqlite"]


def test_a_node_whose_data_root_lacks_the_database_stops_the_run_in_one_line(tmp_path, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    good, bad = tmp_path / "good", tmp_path / "bad"
    (good / "db").mkdir(parents=True)
    sqlite3.connect(good / "db" / "a.sqlite").close()
    bad.mkdir()
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(good))  # each raylet's workers inherit the env it started with
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        ray.init(address=cluster.address)
        check_every_node(["db/a.sqlite"])  # one node, the database there: quiet
        monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(bad))
        second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        with pytest.raises(FileNotFoundError) as err:
            check_every_node(["db/a.sqlite"])
        line = str(err.value)
        assert "\n" not in line and str(bad / "db" / "a.sqlite") in line
        assert f"ray node {second.node_id[:12]}" in line
    finally:
        ray.shutdown()
        cluster.shutdown()
