"""Node-local files: rows store paths relative to ``$MRTPO_DATA_ROOT``; a missing database is one line naming the
file and the node, counted by the reward manager as a verifier error (never a silent reward of 0)."""
from __future__ import annotations

import json
import sqlite3

from recipe.mrtpo.cluster import node_files
from recipe.mrtpo.rewards.reward_manager import score_sample

GOLD = "SELECT name FROM t ORDER BY name"
RESPONSE = "```sql\nSELECT name FROM t ORDER BY name\n```"


def _db(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (name TEXT)")
    con.executemany("INSERT INTO t VALUES (?)", [("a",), ("b",)])
    con.commit()
    con.close()


def test_paths_resolve_against_the_data_root(tmp_path, monkeypatch):
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(tmp_path / "root"))
    assert node_files.data_root() == tmp_path / "root"
    assert node_files.resolve("chinook/c.sqlite") == str(tmp_path / "root" / "chinook" / "c.sqlite")
    assert node_files.resolve("/abs/x.sqlite") == "/abs/x.sqlite"
    assert node_files.relative_to_root(tmp_path / "root" / "db" / "x.sqlite") == "db/x.sqlite"
    assert node_files.relative_to_root(tmp_path / "elsewhere.sqlite") == str((tmp_path / "elsewhere.sqlite").resolve())
    monkeypatch.delenv(node_files.DATA_ROOT_ENV)
    assert node_files.data_root().name == "data"


def test_a_relative_database_scores_on_the_root_and_a_missing_one_is_a_counted_error(tmp_path, monkeypatch):
    root = tmp_path / "root"
    _db(root / "db" / "x.sqlite")
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(root))
    gt = {"db_path": "db/x.sqlite", "gold_sql": GOLD}
    ok = score_sample("chinook", RESPONSE, gt, {})
    assert ok["reward_score"] == 1.0 and ok["reward_extra_info"]["mrtpo_error"] == ""

    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(tmp_path / "other"))  # this node's root lacks the database
    bad = score_sample("chinook", RESPONSE, gt, {})
    error = bad["reward_extra_info"]["mrtpo_error"]
    assert json.loads(bad["reward_extra_info"]["mrtpo_rewards"]) == {}  # no scores: counted as raised, not 0s
    assert error.startswith("FileNotFoundError: mrtpo: file not found on node " + node_files.node_name())
    assert str(tmp_path / "other" / "db" / "x.sqlite") in error and "\n" not in error


def test_first_missing_names_the_file_and_the_node(tmp_path, monkeypatch):
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(tmp_path))
    (tmp_path / "here.json").write_text("{}")
    assert node_files.first_missing(["here.json"]) is None
    line = node_files.first_missing(["here.json", "gone.sqlite"])
    assert line is not None and "gone.sqlite" in line and node_files.node_name() in line and "\n" not in line
