"""The node check before the first step: what it looks up (the rows' databases, BFCL's bfcl-eval modules, the files
the settings name), and on two Ray nodes on one machine (``ray.cluster_utils.Cluster``) the second node's data root
lacks the database, and the check stops in one line naming the file and that node."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from recipe.mrtpo.cluster import node_files
from recipe.mrtpo.launch.node_check import (
    BFCL_AGENT,
    BFCL_CHECKER_MODULES,
    BFCL_HINT,
    FILE_KEYS,
    MODEL_KEYS,
    NodeFile,
    bfcl_modules,
    check_every_node,
    missing_here,
    module_file,
    row_files,
    run_files,
    setting_files,
)


def test_row_files_reads_the_sql_rows_databases():
    frame = pd.DataFrame({"reward_model": [
        {"ground_truth": {"db_path": "db/a.sqlite", "gold_sql": "SELECT 1"}},
        {"ground_truth": '{"db_path": "db/a.sqlite", "gold_sql": "SELECT 2"}'},
        {"ground_truth": {"db_path": "/abs/b.sqlite", "gold_sql": "SELECT 1"}},
        {"ground_truth": "an IF row's ground truth"},
    ]})
    assert row_files(frame) == ["db/a.sqlite", "/abs/b.sqlite"]


def test_a_node_whose_data_root_lacks_the_database_or_the_nltk_data_stops_the_run_in_one_line(tmp_path, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    good, bad = tmp_path / "good", tmp_path / "bad"
    (good / "db").mkdir(parents=True)
    sqlite3.connect(good / "db" / "a.sqlite").close()
    bad.mkdir(mode=0o700)
    nltk = [NodeFile(r, "nltk", "rows with data_source ifeval") for r in node_files.NLTK_RESOURCES]
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(good))  # each raylet's workers inherit the env it started with
    monkeypatch.setenv(node_files.NLTK_DATA_ENV, str(ASSETS / "nltk_data"))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        ray.init(address=cluster.address)
        check_every_node(["db/a.sqlite"])  # one node, the database there: quiet
        check_every_node([NodeFile("db/a.sqlite"), NodeFile("recipe.mrtpo.cluster.node_files", "module", "k"), *nltk])  # through Ray
        monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(bad))
        monkeypatch.setenv(node_files.NLTK_DATA_ENV, str(bad))
        second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        with pytest.raises(FileNotFoundError) as err:
            check_every_node(["db/a.sqlite"])
        line = str(err.value)
        assert "\n" not in line and str(bad / "db" / "a.sqlite") in line
        assert f"ray node {second.node_id[:12]}" in line
        with pytest.raises(FileNotFoundError) as err:  # the IF checkers' NLTK data: the same one line
            check_every_node(nltk)
        line = str(err.value)
        assert "\n" not in line and f"NLTK's {node_files.NLTK_RESOURCES[0]} under {bad}" in line, line
        assert f"ray node {second.node_id[:12]}" in line and "named by rows with data_source ifeval" in line
    finally:
        ray.shutdown()
        cluster.shutdown()


# ---------------------------------------------------------------- every file a worker reads, not only databases
CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipe" / "mrtpo" / "config"


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    import recipe.mrtpo.config  # noqa: F401  (registers the mrtpo group's schema, as the entry point does)

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=list(overrides))


def test_every_setting_the_check_reads_is_a_key_of_verls_config():
    """verl 0.9.1's names, pinned: a renamed key would make the check skip a file silently."""
    from omegaconf import OmegaConf

    cfg = _compose()
    for key in (*FILE_KEYS, *MODEL_KEYS):
        parent, leaf = key.rsplit(".", 1)
        assert leaf in OmegaConf.select(cfg, parent), key


def _bfcl_frame():
    return pd.DataFrame({
        "reward_model": [{"ground_truth": {"turns": "[]"}}, {"ground_truth": {"db_path": "db/a.sqlite"}}],
        "agent_name": [BFCL_AGENT, "single_turn_agent"],
        "extra_info": [{"involved_classes": '["GorillaFileSystem", "MathAPI"]'}, {"involved_classes": None}],
    })


def test_bfcl_rows_need_bfcl_evals_checker_and_their_backends():
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    mods = bfcl_modules(_bfcl_frame())
    assert mods == [*BFCL_CHECKER_MODULES, CLASS_FILE_PATH_MAPPING["GorillaFileSystem"], CLASS_FILE_PATH_MAPPING["MathAPI"]]
    assert all(module_file(m) for m in mods)  # installed here (requirements pin bfcl-eval)
    assert bfcl_modules(pd.DataFrame({"agent_name": ["single_turn_agent"], "extra_info": [{}]})) == []
    assert bfcl_modules(pd.DataFrame({"reward_model": [{}]})) == []


def test_run_files_names_rows_bfcl_modules_settings_and_a_local_model(tmp_path):
    data = tmp_path / "train.parquet"
    _bfcl_frame().to_parquet(data)
    tools = tmp_path / "tools.yaml"
    cfg = _compose(f"data.train_files={data}", f"data.val_files={data}", f"actor_rollout_ref.model.path={tmp_path}",
                   f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                   "actor_rollout_ref.rollout.agent.agent_loop_config_path=recipe/mrtpo/config/bfcl_agent_loop.yaml")
    files = run_files(cfg)
    assert files[0] == NodeFile("db/a.sqlite")
    kinds = {f.path: (f.kind, f.source) for f in files}
    assert kinds[BFCL_CHECKER_MODULES[0]][0] == "module" and BFCL_AGENT in kinds[BFCL_CHECKER_MODULES[0]][1]
    assert kinds[str(tools)] == ("as_given", "actor_rollout_ref.rollout.multi_turn.tool_config_path")
    assert kinds["recipe/mrtpo/config/bfcl_agent_loop.yaml"][0] == "as_given"
    assert kinds["recipe.mrtpo.rewards.reward_manager"] == ("module", "reward.reward_manager.module.path")  # pkg://
    assert kinds[str(tmp_path)] == ("as_given", "actor_rollout_ref.model.path")
    assert len(files) == len(set(files))
    hub = setting_files(_compose("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct"))
    assert not any(f.source == "actor_rollout_ref.model.path" for f in hub)  # a hub id is not a node's file


def test_missing_here_names_the_file_the_node_and_who_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv(node_files.DATA_ROOT_ENV, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "db").mkdir()
    sqlite3.connect(tmp_path / "db" / "a.sqlite").close()
    (tmp_path / "tools.yaml").write_text("tools: []\n")
    here = ["db/a.sqlite", NodeFile("tools.yaml", "as_given", "k.tool_config_path"),
            NodeFile("recipe.mrtpo.cluster.node_files", "module", "k.module")]
    assert missing_here(here) is None
    gone = missing_here([*here, NodeFile("cfg/loop.yaml", "as_given", "actor_rollout_ref.rollout.agent.agent_loop_config_path")])
    assert gone is not None and gone.startswith(node_files.MISSING_MARK + node_files.node_name())
    assert str(tmp_path / "cfg" / "loop.yaml") in gone and "named by actor_rollout_ref.rollout.agent.agent_loop_config_path" in gone
    gone = missing_here([NodeFile("bfcl_eval.eval_checker.no_such_backend", "module", f"rows ({BFCL_HINT})")])
    assert gone is not None and "python module bfcl_eval.eval_checker.no_such_backend" in gone and BFCL_HINT in gone
    assert missing_here([NodeFile("no_such_package_here", "module", "x")]) is not None
    assert "\n" not in gone and node_files.is_missing_file("FileNotFoundError: " + gone)
    with pytest.raises(ValueError):
        NodeFile("x", "somewhere")


def test_the_node_checks_line_from_ray_is_a_launch_error_in_one_line():
    """The check raises in verl's task runner: the driver gets Ray's error and prints the line alone."""
    from ray.exceptions import RayTaskError

    from recipe.mrtpo.launch.launch_errors import is_launch_error, one_line

    line = node_files.missing_line("/data/db/a.sqlite", "db/a.sqlite") + " [ray node 0123456789ab]"
    err = RayTaskError("run", "Traceback ...\n  many lines", FileNotFoundError(line)).as_instanceof_cause()
    assert is_launch_error(err) and one_line(err) == line
    other = RayTaskError("run", "Traceback ...", FileNotFoundError("/x: no such file")).as_instanceof_cause()
    assert not is_launch_error(other)  # a crash inside the job keeps its traceback


# ---------------------------------------------------------------- the verifiers' assets, the checkpoint folder, a silent node
ASSETS = Path(__file__).resolve().parents[2] / ".assets"


def test_if_data_sources_are_the_ones_the_if_verifier_registers():
    from recipe.mrtpo.launch.node_check import IF_DATA_SOURCES
    from recipe.mrtpo.tasks import base
    from recipe.mrtpo.tasks import instruction_following as IF

    assert set(IF_DATA_SOURCES) == {name for name, fn in base._TASKS.items() if fn is IF.score}


def test_if_rows_need_the_nltk_data_under_the_asset_root(tmp_path, monkeypatch):
    from recipe.mrtpo.launch.node_check import asset_files

    frame = pd.DataFrame({"data_source": ["ifeval/test", "chinook"], "reward_model": [{"ground_truth": "{}"}] * 2})
    data = tmp_path / "train.parquet"
    frame.to_parquet(data)
    need = [NodeFile(r, "nltk", asset_files(frame)[0].source) for r in node_files.NLTK_RESOURCES]
    assert asset_files(frame) == need and "ifeval" in need[0].source
    assert asset_files(pd.DataFrame({"data_source": ["chinook"]})) == []
    assert [f for f in run_files(_compose(f"data.train_files={data}", f"data.val_files={data}")) if f.kind == "nltk"] == need
    # the asset root's rule: $MRTPO_NLTK_DATA, else $MRTPO_ASSETS/nltk_data
    monkeypatch.delenv(node_files.NLTK_DATA_ENV, raising=False)
    (tmp_path / "assets").mkdir(mode=0o700)
    (tmp_path / "assets" / "nltk_data").symlink_to(ASSETS / "nltk_data")
    monkeypatch.setenv(node_files.ASSETS_ENV, str(tmp_path / "assets"))
    assert node_files.nltk_data_dir() == tmp_path / "assets" / "nltk_data" and missing_here(need) is None
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    monkeypatch.setenv(node_files.NLTK_DATA_ENV, str(empty))
    line = missing_here(need)
    assert line is not None and "\n" not in line and line.startswith(node_files.MISSING_MARK + node_files.node_name())
    assert f"NLTK's {node_files.NLTK_RESOURCES[0]} under {empty}" in line and "fetch_assets.py" in line


def test_a_node_that_does_not_answer_is_named_and_an_unshared_checkpoint_folder_refused(tmp_path, monkeypatch):
    """A hung file system (a FIFO nobody writes: reading the marker blocks, as on a stale NFS mount): the check
    names the node after its timeout instead of waiting forever. A folder whose marker is another run's (a node's
    own disk keeps an older marker) or missing: refused in one line saying the folder is not shared."""
    import ray
    from ray.exceptions import RayTaskError

    from recipe.mrtpo.cluster import checkpoint_shards
    from recipe.mrtpo.launch.launch_errors import is_launch_error, one_line

    ray.init(num_cpus=1, include_dashboard=False)
    try:
        node = ray.nodes()[0]["NodeID"]
        fifo = tmp_path / "hung" / checkpoint_shards.MARKER_NAME
        fifo.parent.mkdir()
        os.mkfifo(fifo)
        with pytest.raises(TimeoutError) as err:
            check_every_node([], marker=(str(fifo), "token"), timeout_s=3)
        line = str(err.value)
        assert "\n" not in line and line.startswith(node_files.NODE_CHECK_MARK) and f"ray node {node[:12]}" in line
        assert "within 3 s" in line
        cause = RayTaskError("run", "Traceback ...", TimeoutError(line)).as_instanceof_cause()
        assert is_launch_error(cause) and one_line(cause) == line  # the driver prints it alone
        try:  # let the blocked reader go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

        path, token = checkpoint_shards.write_marker(str(tmp_path / "ckpt"))
        check_every_node([], marker=(path, token), timeout_s=60)  # this node reads it: quiet
        for marker, seen in (((path, "another run's token"), "sees another marker"),
                             ((str(tmp_path / "elsewhere" / checkpoint_shards.MARKER_NAME), token), "does not see the marker")):
            with pytest.raises(FileNotFoundError) as err:
                check_every_node([], marker=marker, timeout_s=60)
            line = str(err.value)
            assert "\n" not in line and line.startswith(node_files.NODE_CHECK_MARK) and " is not shared: node " in line
            assert seen in line and "CHECKPOINT_ROOT" in line and f"ray node {node[:12]}" in line
    finally:
        ray.shutdown()


def test_a_checkpoint_folder_the_task_runner_cannot_write_stops_the_run_in_one_line(tmp_path):
    from types import SimpleNamespace

    from recipe.mrtpo.launch.node_check import check_run

    (tmp_path / "a_file").write_text("")
    cfg = SimpleNamespace(trainer=SimpleNamespace(save_freq=50, resume_mode="auto",
                                                  default_local_dir=str(tmp_path / "a_file" / "ckpt")))
    with pytest.raises(FileNotFoundError) as err:
        check_run(cfg)
    line = str(err.value)
    assert line.startswith(node_files.NODE_CHECK_MARK) and "cannot write its marker" in line and "\n" not in line
