"""The per-(model, task) run scripts (run_scripts/qwen*_{ifbench,text2sql,toolcall,toolcall_multiturn}.sh + common.sh).

Two kinds of checks, neither of which can start Ray or a training run:

- dry runs (``DRY_RUN=1``): every script composes its config through ``run_scripts/dry_run.py`` (Hydra's
  compose API, then the launch's own checks). The smoke, seed, data-set and refusal dry runs run it end to end;
  the others (:func:`_dry_run`) run the script itself with a stand-in ``bin/python`` that records the command
  (it must be ``python run_scripts/dry_run.py ...``) and compose it here with the same ``dry_run.main``, since
  each subprocess would import verl again (~10 s of CPU). The YAML it prints is parsed, passed through
  ``main_mrtpo.check_config`` once more and checked (estimator, reward manager, replay switches,
  model and data paths, nodes/GPUs from the environment, hyper-parameters, seeds and the checkpoint folder,
  the extra override winning). ``SMOKE=1 DRY_RUN=1`` composes for every script too; a config the launch
  refuses (``mrtpo.beta=1.5``, a mistyped key) exits non-zero with one line.
  The ALGO values are spread over the twelve scripts so that each value runs at least once (the ALGO
  switch lives in common.sh, shared by all scripts). On the
  multi-turn task every ALGO value runs (its three scripts, then the other values on one of them): the
  methods compose on the agent loop's settings.
- launches with a stand-in interpreter (``MRTPO_VENV`` pointing at a fake ``bin/python`` that only
  records its arguments): the real (non-dry) command line, and the errors raised before anything runs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "run_scripts"
SIZES = {"1.5b": "1.5B", "3b": "3B", "7b": "7B"}
TASKS = ("ifbench", "text2sql", "toolcall", "toolcall_multiturn")
ROLLOUT_TP = {"1.5b": 1, "3b": 1, "7b": 1}  # a 7B engine fits one 80 GB GPU
DEFAULT_DATA = {
    "ifbench": (["data/instruction_following/train.parquet"], ["data/ifeval/test.parquet", "data/ifbench/test.parquet"]),
    "text2sql": (["data/chinook/train.parquet"], ["data/chinook/test.parquet"]),  # DATA_SET=offline
    "toolcall": (["data/bfcl/train.parquet"], ["data/bfcl/test.parquet"]),
    "toolcall_multiturn": (["data/bfcl_multi_turn/train.parquet"], ["data/bfcl_multi_turn/test.parquet"]),
}
# (max_prompt_length, max_response_length) per task: GDPO's 2048 / 1024; SQL schemas; multi-turn trajectories
LENGTHS = {"ifbench": (2048, 1024), "text2sql": (4096, 1024), "toolcall": (2048, 1024), "toolcall_multiturn": (8192, 8192)}
# (estimator, mrtpo.mode, mrtpo.shuffle) each ALGO must give; gdpo/grpo leave the replay knobs untouched
# (the recipe's trainer replays only for adv_estimator=mrtpo).
ALGO_EXPECT = {
    "mrtpo": ("mrtpo", "mrtpo", False),
    "gdpo": ("gdpo", "mrtpo", False),
    "grpo": ("grpo", "mrtpo", False),
    "cort": ("mrtpo", "cort", False),
    "shuffle": ("mrtpo", "mrtpo", True),
    "opsd": ("gdpo", "opsd", False),
    "gdpo-distill": ("gdpo", "gdpo-distill", False),
    "rlsd": ("gdpo", "rlsd", False),
    "sdpo": ("gdpo", "sdpo", False),
}
# script -> ALGO of its dry run (None: ALGO unset, the default mrtpo). Every ALGO value occurs.
DRY_RUNS = {
    "qwen1.5b_ifbench": None,
    "qwen1.5b_text2sql": "gdpo",
    "qwen1.5b_toolcall": "grpo",
    "qwen3b_ifbench": "cort",
    "qwen3b_text2sql": "shuffle",
    "qwen3b_toolcall": "sdpo",
    "qwen7b_ifbench": "gdpo-distill",
    "qwen7b_text2sql": "opsd",
    "qwen7b_toolcall": "rlsd",
    "qwen1.5b_toolcall_multiturn": "opsd",
    "qwen3b_toolcall_multiturn": None,
    "qwen7b_toolcall_multiturn": "cort",
}
MULTI_TURN_OTHER_ALGOS = ("grpo", "gdpo", "shuffle", "gdpo-distill", "sdpo")  # with the three above and rlsd (every script): all nine
# scripts whose dry run also sets MODEL_PATH / TRAIN_FILES / VAL_FILES (relative paths, from tmp cwd)
CUSTOM_PATHS = {"qwen3b_toolcall", "qwen1.5b_text2sql"}
EXTRA = ["trainer.test_freq=7", "data.train_batch_size=64"]  # the script sets 10 and 512: the extras must win
DRY_TIMEOUT_S = 600  # ~10 s on a quiet machine; minutes when the machine is shared
PPO_TOKENS = {"1.5b": 24576, "3b": 24576, "7b": 24576}
LOGPROB_TOKENS = {"1.5b": 32768, "3b": 32768, "7b": 24576}
# every seed verl 0.9.1 and the recipe read for a run of these scripts (SEED sets them all)
# the seeds SEED sets for every method (mrtpo.seed only where the method reads it: the seed-per-method test below)
SEED_KEYS = ("data.seed", "actor_rollout_ref.actor.data_loader_seed", "actor_rollout_ref.rollout.seed",
             "actor_rollout_ref.actor.fsdp_config.seed", "actor_rollout_ref.ref.fsdp_config.seed")


def _at(cfg: dict, dotted: str):
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


def _seeds(cfg: dict) -> dict:
    return {k: _at(cfg, k) for k in SEED_KEYS}


def _base_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ALGO", "DRY_RUN", "MODEL_PATH", "TRAIN_FILES", "VAL_FILES",
                                                             "NNODES", "N_GPUS_PER_NODE", "EXPERIMENT_NAME", "PROJECT_NAME",
                                                             "MRTPO_VENV", "SEED", "SMOKE", "DATA_SET", "MRTPO_DEBUG",
                                                             "CHECKPOINT_ROOT", "MRTPO_PREFLIGHT", "MRTPO_NLTK_DATA")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def _missing_values(node, prefix: str = "") -> list[str]:
    """Dotted paths of the values Hydra printed as ``???`` (mandatory, unset)."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _missing_values(v, f"{prefix}{k}.")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _missing_values(v, f"{prefix}{i}.")]
    return [prefix[:-1]] if node == "???" else []


def _split(name: str) -> tuple[str, str]:
    size, task = name[len("qwen"):].split("_", 1)
    return size, task


#: a ``bin/python`` that records its arguments, NUL-separated, to ``$MRTPO_RECORD`` and exits 0
RECORDER = '#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$MRTPO_RECORD"\n'


def _run_recorded(script: str, workdir: Path, extra=(), env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """``DRY_RUN=1 bash <script>.sh extra...`` in ``workdir`` under ``env``, its ``bin/python`` the recorder; (the
    script's process, the record of the command it ran)."""
    import tempfile

    own = Path(tempfile.mkdtemp(prefix="recorder-", dir=workdir))  # one per call: calls run two at a time
    (own / "bin").mkdir()
    (own / "bin" / "python").write_text(RECORDER)
    (own / "bin" / "python").chmod(0o755)
    full = _base_env(DRY_RUN="1", **(env or {}), MRTPO_VENV=str(own), MRTPO_RECORD=str(own / "argv"))
    res = subprocess.run(["bash", str(SCRIPTS / f"{script}.sh"), *extra], cwd=workdir, env=full,
                         capture_output=True, text=True, timeout=DRY_TIMEOUT_S)
    return res, own / "argv"


def _compose_recorded(script: subprocess.CompletedProcess, record: Path) -> subprocess.CompletedProcess:
    """Compose the recorded command as ``python run_scripts/dry_run.py ...`` would, in this process: its exit status
    and stdout, and the script's stderr followed by the composition's."""
    import contextlib
    import io

    out, err, rc = io.StringIO(), io.StringIO(), script.returncode
    if rc == 0:
        argv = record.read_text().split("\0")[:-1]
        assert argv[:1] == [str(SCRIPTS / "dry_run.py")], argv[:3]  # the script ran the dry-run entry, nothing else
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = _load_dry_run().main(argv[1:])
    return subprocess.CompletedProcess(script.args, rc, out.getvalue(), script.stderr + err.getvalue())


def _fast_dry_run(script: str, workdir: Path, extra=(), **env: str) -> subprocess.CompletedProcess:
    """What :func:`_plain_dry_run` returns, the composition in this process (the module docstring)."""
    return _compose_recorded(*_run_recorded(script, workdir, extra, env))


def _record_dry_run(name: str, algo, workdir: Path) -> tuple[dict, subprocess.CompletedProcess, Path]:
    """The dry run of :data:`DRY_RUNS` (a cluster of 3 x 4 GPUs, :data:`EXTRA`, custom paths where the script is
    one of :data:`CUSTOM_PATHS`), recorded; (the paths expected, the script's process, the record)."""
    env = {"NNODES": "3", "N_GPUS_PER_NODE": "4"}
    if algo is not None:
        env["ALGO"] = algo
    expect_model = None
    expect_train = expect_val = None
    if name in CUSTOM_PATHS:
        (workdir / "my_model").mkdir()
        for f in ("d/train.parquet", "d/val_a.parquet", "d/val_b.parquet"):
            (workdir / f).parent.mkdir(parents=True, exist_ok=True)
            (workdir / f).touch()
        env.update(MODEL_PATH="my_model", TRAIN_FILES="d/train.parquet", VAL_FILES="d/val_a.parquet, ./d/val_b.parquet")
        expect_model = str(workdir / "my_model")
        expect_train = [str(workdir / "d/train.parquet")]
        expect_val = [str(workdir / "d/val_a.parquet"), str(workdir / "d/val_b.parquet")]
    return {"model": expect_model, "train": expect_train, "val": expect_val}, *_run_recorded(name, workdir, EXTRA, env)


def _dry_run(name: str, algo, workdir: Path) -> dict:
    """``DRY_RUN=1 ALGO=algo bash <name>.sh`` (:func:`_record_dry_run`), composed: ``{"res", "model", "train", "val"}``."""
    expect, script, record = _record_dry_run(name, algo, workdir)
    return {"res": _compose_recorded(script, record), **expect}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict:
    """All the dry runs (the scripts two at a time, the compositions one after another); {script name: result}."""
    base = tmp_path_factory.mktemp("dry")
    for name in DRY_RUNS:
        (base / name).mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {n: pool.submit(_record_dry_run, n, a, base / n) for n, a in DRY_RUNS.items()}
        recorded = {n: f.result() for n, f in futures.items()}
    return {n: {"res": _compose_recorded(script, record), **expect} for n, (expect, script, record) in recorded.items()}


def test_twelve_scripts_exist_and_are_thin():
    names = sorted(p.stem for p in SCRIPTS.glob("qwen*.sh"))
    assert names == sorted(DRY_RUNS), names
    for name in names:
        text = (SCRIPTS / f"{name}.sh").read_text()
        size, task = _split(name)
        assert f"mrtpo_launch {size} {task} \"$@\"" in text, name
        assert 'source "$(dirname "${BASH_SOURCE[0]}")/common.sh"' in text, name
        # shared logic stays in common.sh: no override written in a per-model script
        assert "actor_rollout_ref." not in text.split("set -euo pipefail", 1)[1], name


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_dry_run_config(dry_runs, name):
    run = dry_runs[name]
    res = run["res"]
    assert res.returncode == 0, f"{name} failed (rc {res.returncode}):\n{res.stderr[-4000:]}"
    cfg = yaml.safe_load(res.stdout)  # stdout is the composed config and nothing else
    assert isinstance(cfg, dict) and "actor_rollout_ref" in cfg, res.stdout[:2000]
    assert "run_scripts/dry_run.py" in res.stderr  # the echoed command line
    # every mandatory value is set, but that of verl's generative reward model, which the recipe leaves off
    assert _missing_values(cfg) == ["reward.reward_model.rollout.name"]
    assert not cfg["reward"]["reward_model"]["enable"]

    size, task = _split(name)
    algo = DRY_RUNS[name] or "mrtpo"
    est, mode, shuffle = ALGO_EXPECT[algo]
    arr = cfg["actor_rollout_ref"]

    # the frozen reference in bf16 (verl's default fp32 doubles its CPU copy and per-forward transfer)
    assert arr["ref"]["fsdp_config"]["model_dtype"] == "bf16"
    # method switches
    assert cfg["algorithm"]["adv_estimator"] == est
    assert cfg["mrtpo"]["mode"] == mode
    assert cfg["mrtpo"]["shuffle"] is shuffle
    if algo == "opsd":  # the reference's recommended run: JSD beta 0.5, top-50 renormalised; verl's teacher servers off
        assert (cfg["mrtpo"]["opsd_topk"], cfg["mrtpo"]["opsd_beta"], cfg["mrtpo"]["opsd_support"]) == (None, 0.5, "topk")
        assert cfg["distillation"]["enabled"] is False
    if algo == "gdpo-distill":  # the teacher is the actor itself: verl's teacher servers stay off
        assert (cfg["mrtpo"]["opsd_topk"], cfg["mrtpo"]["opsd_loss_mode"], cfg["mrtpo"]["opsd_loss_coef"]) == (None, "forward_kl_topk", 1.0)
        assert cfg["distillation"]["enabled"] is False
    if algo == "sdpo":  # SDPO's reference defaults; the EMA teacher needs FSDP2 (the scripts' strategy)
        m = cfg["mrtpo"]
        assert (m["sdpo_topk"], m["sdpo_add_tail"], m["sdpo_alpha"], m["sdpo_ema_rate"], m["sdpo_is_clip"]) == (100, True, 0.5, 0.05, 2.0)
        assert cfg["distillation"]["enabled"] is False and arr["actor"]["strategy"] == "fsdp2"
    assert cfg["mrtpo"]["replay"] is True  # never switched off: replay runs iff adv_estimator == mrtpo
    assert (cfg["mrtpo"]["beta"], cfg["mrtpo"]["warmup_steps"], cfg["mrtpo"]["max_realloc_rms"]) == (0.5, 10, 1.0)
    rm = cfg["reward"]["reward_manager"]
    assert (rm["name"], rm["source"], rm["module"]["path"]) == ("MRTPORewardManager", "importlib", "pkg://recipe.mrtpo.rewards.reward_manager")
    assert cfg["trainer"]["v1"]["trainer_mode"] == "mrtpo" and cfg["trainer"]["use_v1"] is True
    # the composed config passes the entry point's own check (run before Ray starts), GPU settings included
    from omegaconf import OmegaConf

    from recipe.mrtpo.main_mrtpo import check_config

    check_config(OmegaConf.create(cfg))
    assert arr["model"]["use_remove_padding"] is True and arr["model"]["use_fused_kernels"] is False

    # model and data
    family = "Qwen2.5-Coder" if task == "text2sql" else "Qwen2.5"
    default_model = f"Qwen/{family}-{SIZES[size]}-Instruct"
    assert arr["model"]["path"] == (run["model"] or default_model)
    train, val = DEFAULT_DATA[task]
    assert cfg["data"]["train_files"] == (run["train"] or [str(REPO / p) for p in train])
    assert cfg["data"]["val_files"] == (run["val"] or [str(REPO / p) for p in val])
    model_tag = Path(run["model"] or default_model).name.lower()
    assert cfg["trainer"]["experiment_name"] == f"{model_tag}_{task}_{algo}_seed0"  # SEED unset: 0
    assert cfg["trainer"]["default_local_dir"] == str(REPO / "checkpoints" / "mrtpo" / f"{model_tag}_{task}_{algo}_seed0")
    assert _seeds(cfg) == {k: 0 for k in SEED_KEYS}
    # knobs that do nothing are not set: verl offloads the FSDP2 reference anyway; dynamic bsz packs the replay
    assert arr["ref"]["fsdp_config"]["param_offload"] is False and cfg["mrtpo"]["replay_micro_batch_size"] == 8
    assert arr["rollout"]["log_prob_use_dynamic_bsz"] is True
    assert arr["rollout"]["log_prob_max_token_len_per_gpu"] == LOGPROB_TOKENS[size]
    assert arr["actor"]["ppo_max_token_len_per_gpu"] == PPO_TOKENS[size]
    assert cfg["trainer"]["val_before_train"] is True and cfg["mrtpo"]["dump"]["every_n_steps"] == 0  # not a smoke run

    # cluster shape from the environment
    assert (cfg["trainer"]["nnodes"], cfg["trainer"]["n_gpus_per_node"]) == (3, 4)
    assert arr["rollout"]["tensor_model_parallel_size"] == ROLLOUT_TP[size]
    assert cfg["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["PYTHONPATH"].split(":")[0] == str(REPO)

    # the anchor hyper-parameters (GDPO's tool-calling setup) ...
    assert arr["rollout"]["n"] == 4 and arr["rollout"]["name"] == "vllm"
    assert arr["actor"]["optim"]["lr"] == 1e-6
    assert (cfg["data"]["max_prompt_length"], cfg["data"]["max_response_length"]) == LENGTHS[task]
    _check_agent_loop(cfg, task)
    # ALGO=opsd's and ALGO=rlsd's overrides: no KL term (the reference worker stays: it holds their frozen teacher);
    # ALGO=sdpo's: no KL at all (SDPO has none), and SDPO's token-level rollout correction
    use_kl, kl_coef = {"opsd": (True, 0), "rlsd": (True, 0), "sdpo": (False, 0.001)}.get(algo, (True, 0.001))
    assert (arr["actor"]["use_kl_loss"], arr["actor"]["kl_loss_coef"], arr["actor"]["kl_loss_type"]) == (use_kl, kl_coef, "low_var_kl")
    corr = cfg["algorithm"]["rollout_correction"]
    assert (corr["rollout_is"], corr["rollout_is_threshold"]) == (("token", 2.0) if algo == "sdpo" else (None, 2.0))
    assert cfg["algorithm"]["use_kl_in_reward"] is False
    # ... and the extra overrides, passed last, won over the script's own values
    assert cfg["trainer"]["test_freq"] == 7
    assert cfg["data"]["train_batch_size"] == 64


def _check_agent_loop(cfg: dict, task: str) -> None:
    """The multi-turn scripts run verl's agent loop with the BFCL loop's file; the others leave verl's defaults."""
    rollout = cfg["actor_rollout_ref"]["rollout"]
    if task != "toolcall_multiturn":
        assert rollout["agent"]["agent_loop_config_path"] is None and rollout["multi_turn"]["max_tool_response_length"] == 256
        return
    path = Path(rollout["agent"]["agent_loop_config_path"])
    assert path == REPO / "recipe" / "mrtpo" / "config" / "bfcl_agent_loop.yaml" and path.is_file()
    assert [e["name"] for e in yaml.safe_load(path.read_text())] == [rollout["agent"]["default_agent_loop"]] == ["bfcl_multi_turn"]
    assert rollout["multi_turn"]["max_tool_response_length"] == 16384  # verl's 256 cuts BFCL's outputs
    assert (rollout["prompt_length"], rollout["response_length"]) == LENGTHS[task]  # verl derives them from data.*


@pytest.mark.parametrize("algo", MULTI_TURN_OTHER_ALGOS)
def test_every_algo_composes_on_the_multi_turn_task(tmp_path, algo):
    from omegaconf import OmegaConf

    from recipe.mrtpo.main_mrtpo import check_config

    res = _dry_run("qwen3b_toolcall_multiturn", algo, tmp_path)["res"]
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = yaml.safe_load(res.stdout)
    est, mode, shuffle = ALGO_EXPECT[algo]
    assert (cfg["algorithm"]["adv_estimator"], cfg["mrtpo"]["mode"], cfg["mrtpo"]["shuffle"]) == (est, mode, shuffle)
    assert check_config(OmegaConf.create(cfg)).name == algo
    _check_agent_loop(cfg, "toolcall_multiturn")


def test_every_multi_turn_dry_run_covers_every_algo():
    on_multi_turn = {a or "mrtpo" for n, a in DRY_RUNS.items() if n.endswith("_multiturn")}
    assert on_multi_turn | set(MULTI_TURN_OTHER_ALGOS) | {"rlsd"} == set(ALGO_EXPECT)


def test_every_algo_is_dry_run():
    assert {a or "mrtpo" for a in DRY_RUNS.values()} == set(ALGO_EXPECT)


def test_algo_list_is_the_methods_registry():
    """ALGO's values and overrides are the registry's (recipe/mrtpo/methods/), read through its command line."""
    from recipe.mrtpo import methods

    assert set(ALGO_EXPECT) == set(methods.names())
    res = subprocess.run(["bash", "-c", f'source "{SCRIPTS}/common.sh"; echo "$MRTPO_ALGOS"; _mrtpo_algo cort; printf "%s\\n" "${{ALGO_ARGS[@]}}"'],
                         capture_output=True, text=True, timeout=30)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and lines[0].split() == methods.names(), res.stderr
    assert lines[1:] == list(methods.get("cort").overrides)


#: one script of each task, every size among them (a dry run costs ~10 s of a verl import; the sizes change budgets
#: and parallelism, which DRY_RUNS composes in all twelve); qwen7b_toolcall runs RLSD in DRY_RUNS
RLSD_SCRIPTS = ("qwen7b_ifbench", "qwen1.5b_text2sql", "qwen3b_toolcall", "qwen3b_toolcall_multiturn")


@pytest.mark.parametrize("name", RLSD_SCRIPTS)
def test_rlsd_composes_in_every_task(tmp_path, name):
    """ALGO=rlsd composes in a script of every task, and the composed config resolves to RLSD before Ray."""
    from omegaconf import OmegaConf

    from recipe.mrtpo.main_mrtpo import check_config

    res = _dry_run(name, "rlsd", tmp_path)["res"]
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = yaml.safe_load(res.stdout)
    assert (cfg["algorithm"]["adv_estimator"], cfg["mrtpo"]["mode"]) == ("gdpo", "rlsd")
    assert check_config(OmegaConf.create(cfg)).name == "rlsd"


def _plain_dry_run(script: str, workdir: Path, extra=(), **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPTS / f"{script}.sh"), *extra], cwd=workdir, env=_base_env(DRY_RUN="1", **env),
                          capture_output=True, text=True, timeout=DRY_TIMEOUT_S)


# script -> the SEED of its smoke dry run: one script of each task, every size among them (SMOKE's preset is the
# same for all twelve; the size's rollout TP is checked); seeds differ so the names are checked too
SMOKE_SEEDS = {name: i for i, name in enumerate(("qwen1.5b_ifbench", "qwen3b_text2sql", "qwen7b_toolcall",
                                                  "qwen1.5b_toolcall_multiturn"))}


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> dict:
    """``SMOKE=1 DRY_RUN=1`` of the :data:`SMOKE_SEEDS` scripts (two at a time, composed here one after another);
    {script name: CompletedProcess}."""
    base = tmp_path_factory.mktemp("smoke")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {n: pool.submit(_run_recorded, n, base, (), {"SMOKE": "1", "SEED": str(k)}) for n, k in SMOKE_SEEDS.items()}
        recorded = {n: f.result() for n, f in futures.items()}
    return {n: _compose_recorded(*r) for n, r in recorded.items()}


@pytest.mark.parametrize("name", sorted(SMOKE_SEEDS))
def test_smoke_dry_run_composes_the_preset(smoke_runs, name):
    res = smoke_runs[name]
    assert res.returncode == 0, f"{name} failed (rc {res.returncode}):\n{res.stderr[-4000:]}"
    cfg = yaml.safe_load(res.stdout)
    seed = SMOKE_SEEDS[name]
    size, task = _split(name)
    # the overrides are shown, and the preset is in the composed config
    shown = next(line for line in res.stderr.splitlines() if line.startswith("[mrtpo] SMOKE=1: "))
    assert "mrtpo.warmup_steps=0" in shown and "trainer.total_training_steps=2" in shown
    assert cfg["mrtpo"]["warmup_steps"] == 0 and cfg["mrtpo"]["beta"] == 0.5  # step 1 replays with the full beta
    assert cfg["trainer"]["val_before_train"] is False and cfg["trainer"]["test_freq"] == -1
    assert cfg["trainer"]["total_training_steps"] == 2
    assert cfg["data"]["train_batch_size"] == 16 and cfg["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == 16  # 8 GPUs
    assert cfg["trainer"]["save_freq"] == -1 and cfg["trainer"]["resume_mode"] == "disable"
    assert cfg["mrtpo"]["dump"]["every_n_steps"] == 1
    assert cfg["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == ROLLOUT_TP[size]
    assert cfg["trainer"]["experiment_name"].endswith(f"_{task}_mrtpo_smoke_seed{seed}")
    assert cfg["trainer"]["default_local_dir"].endswith(f"/{cfg['trainer']['experiment_name']}")
    assert cfg["mrtpo"]["dump"]["dir"] is None  # the trainer writes them under default_local_dir/relevance_dumps
    assert _seeds(cfg) == {k: seed for k in SEED_KEYS}


def test_two_seeds_never_share_a_checkpoint_folder(tmp_path, dry_runs, smoke_runs):
    """Seeds 1 and 2 of one method under a hand-given EXPERIMENT_NAME, beside the default-named runs (seed 0 of
    the plain dry runs, seeds 0-3 of the smoke runs): every run has its own checkpoint folder, named by its seed."""
    dirs = []
    for seed in ("1", "2"):
        res = _fast_dry_run("qwen1.5b_ifbench", tmp_path, SEED=seed, EXPERIMENT_NAME="my_run")
        assert res.returncode == 0, res.stderr[-3000:]
        cfg = yaml.safe_load(res.stdout)
        tr = cfg["trainer"]
        assert tr["experiment_name"] == f"my_run_seed{seed}"
        assert tr["default_local_dir"] == str(REPO / "checkpoints" / "mrtpo" / f"my_run_seed{seed}")
        assert _seeds(cfg) == {k: int(seed) for k in SEED_KEYS}
        dirs.append(tr["default_local_dir"])
    for runs in (dry_runs, smoke_runs):
        for run in runs.values():
            res = run["res"] if isinstance(run, dict) else run
            dirs.append(yaml.safe_load(res.stdout)["trainer"]["default_local_dir"])
    assert len(set(dirs)) == len(dirs) == 2 + len(DRY_RUNS) + len(SMOKE_SEEDS)


def test_dry_run_refuses_what_a_launch_refuses_in_one_line(tmp_path):
    res = _plain_dry_run("qwen3b_toolcall", tmp_path, ["mrtpo.beta=1.5"])
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stdout == ""
    refused = [line for line in res.stderr.splitlines() if line.startswith("DRY_RUN: error: ")]
    assert len(refused) == 1 and "mrtpo.beta must be in [0, 1)" in refused[0], res.stderr[-3000:]
    assert "Traceback" not in res.stderr


def _load_dry_run():
    spec = importlib.util.spec_from_file_location("mrtpo_dry_run", SCRIPTS / "dry_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["mrtpo.bta=0.3"], "unknown config key 'mrtpo.bta' (did you mean 'mrtpo.beta'?)"),  # a mistyped key
        (["actor_rollout_ref.rollout.val_kwargs.do_sample=True", "actor_rollout_ref.rollout.temperature=0"],
         "temperature should be greater than 0"),  # verl's own validate_config
        (["algorithm.use_kl_in_reward=True"], "use_kl_in_reward=True has no effect"),  # the recipe's check_config
    ],
)
def test_dry_run_entry_says_one_line_per_refusal(capsys, monkeypatch, overrides, message):
    monkeypatch.delenv("MRTPO_DEBUG", raising=False)
    dry_run = _load_dry_run()
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "data.train_files=[x.parquet]", "data.val_files=[y.parquet]",
            "actor_rollout_ref.actor.use_dynamic_bsz=True"]
    assert dry_run.main(base) == 0
    assert "adv_estimator: mrtpo" in capsys.readouterr().out
    assert dry_run.main(base + overrides) == dry_run.REFUSED
    out, err = capsys.readouterr()
    refused = [line for line in err.splitlines() if line.startswith("DRY_RUN: error: ")]
    assert out == "" and len(refused) == 1 and message in refused[0], err  # the line a launch prints (launch_errors)


def test_bad_seed_and_smoke_values_fail_before_anything_runs(tmp_path):
    for env, message in (({"SEED": "-1"}, "SEED must be a non-negative integer"), ({"SMOKE": "on"}, "SMOKE must be 1 or 0")):
        res = _plain_dry_run("qwen3b_toolcall", tmp_path, **env)
        assert res.returncode == 1 and message in res.stderr, res.stderr


# --------------------------------------------------------------------- launches with a stand-in python
@pytest.fixture()
def fake_venv(tmp_path) -> tuple[Path, Path]:
    """A venv whose ``bin/python`` records argv, cwd and PYTHONPATH (one per line) and exits 0."""
    venv, record = tmp_path / "venv", tmp_path / "record.txt"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(f'#!/usr/bin/env bash\n{{ pwd; echo "PYTHONPATH=$PYTHONPATH"; printf "%s\\n" "$@"; }} > "{record}"\n')
    py.chmod(0o755)
    return venv, record


def _launch(tmp_path, fake_venv, script="qwen7b_toolcall", extra=(), **env):
    venv, record = fake_venv
    files = {}
    for f in ("train.parquet", "val.parquet"):
        (tmp_path / f).touch()
        files[f] = str(tmp_path / f)
    base = dict(MRTPO_VENV=str(venv), TRAIN_FILES=files["train.parquet"], VAL_FILES=files["val.parquet"])
    base.update(env)
    res = subprocess.run(["bash", str(SCRIPTS / f"{script}.sh"), *extra], cwd=tmp_path, env=_base_env(**base),
                         capture_output=True, text=True, timeout=30)
    lines = record.read_text().splitlines() if record.exists() else None
    return res, lines


def test_real_launch_command(tmp_path, fake_venv):
    res, lines = _launch(tmp_path, fake_venv, extra=["trainer.save_freq=3", "mrtpo.beta=0.25"], ALGO="shuffle")
    assert res.returncode == 0, res.stderr
    assert lines is not None, "the interpreter was not launched"
    cwd, pythonpath, *argv = lines
    assert cwd == str(REPO)
    assert pythonpath.split("=", 1)[1].split(":")[0] == str(REPO)
    assert argv[:2] == ["-m", "recipe.mrtpo.main_mrtpo"]
    assert "--cfg" not in argv and "--resolve" not in argv  # a real run, not a dry one
    assert argv[-2:] == ["trainer.save_freq=3", "mrtpo.beta=0.25"]  # extras last: they win in Hydra
    assert argv.index("mrtpo.beta=0.5") < argv.index("mrtpo.beta=0.25")
    assert ["algorithm.adv_estimator=mrtpo", "mrtpo.shuffle=True"] == [a for a in argv if a.startswith(("algorithm.adv", "mrtpo.shuffle"))]
    assert f"data.train_files=['{tmp_path / 'train.parquet'}']" in argv
    assert "trainer.nnodes=1" in argv and "trainer.n_gpus_per_node=8" in argv  # the defaults
    assert "actor_rollout_ref.model.path='Qwen/Qwen2.5-7B-Instruct'" in argv
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=1" in argv
    assert not [a for a in argv if "ref.fsdp_config.param_offload" in a or "replay_micro_batch_size" in a]
    assert "trainer.experiment_name=qwen2.5-7b-instruct_toolcall_shuffle_seed0" in argv and "data.seed=0" in argv


def test_missing_data_fails_before_launch(tmp_path, fake_venv):
    res, lines = _launch(tmp_path, fake_venv, script="qwen1.5b_ifbench", TRAIN_FILES=str(tmp_path / "nope.parquet"))
    assert res.returncode != 0 and lines is None
    assert "missing data file" in res.stderr and "nope.parquet" in res.stderr
    assert "data_prep.build_offline" in res.stderr  # tells how to build them


@pytest.mark.parametrize(
    "env, message",
    [
        ({"ALGO": "ppo"}, "unknown ALGO 'ppo'"),
        ({"NNODES": "0"}, "NNODES must be a positive integer"),
        ({"N_GPUS_PER_NODE": "eight"}, "N_GPUS_PER_NODE must be a positive integer"),
        ({"DRY_RUN": "maybe"}, "DRY_RUN must be 1 or 0"),
    ],
)
def test_bad_settings_fail_before_launch(tmp_path, fake_venv, env, message):
    res, lines = _launch(tmp_path, fake_venv, **env)
    assert res.returncode != 0 and lines is None
    assert message in res.stderr, res.stderr


def test_nnodes_above_one_needs_a_shared_checkpoint_root(tmp_path, fake_venv):
    """The default checkpoint folder is inside the repository, each node's own disk: refused in one line with
    NNODES > 1 (a dry run warns); CHECKPOINT_ROOT given, the folder is there (the node check's marker decides)."""
    res, lines = _launch(tmp_path, fake_venv, NNODES="2")
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("[mrtpo] ERROR: ")]
    assert res.returncode != 0 and lines is None and len(errors) == 1, res.stderr
    assert "NNODES=2 needs CHECKPOINT_ROOT on storage every node shares" in errors[0]
    res, lines = _launch(tmp_path, fake_venv, NNODES="2", SMOKE="1")  # saves and resumes nothing
    assert res.returncode == 0 and lines is not None and "trainer.save_freq=-1" in lines, res.stderr
    res, lines = _launch(tmp_path, fake_venv, NNODES="2", CHECKPOINT_ROOT=str(tmp_path / "shared"))
    assert res.returncode == 0 and lines is not None, res.stderr
    assert f"trainer.default_local_dir='{tmp_path / 'shared'}/mrtpo/qwen2.5-7b-instruct_toolcall_mrtpo_seed0'" in lines


#: a ``bin/python`` that appends each call's argv (one per line) and a separator line to the record; a call of the
#: doctor exits with ``$DOCTOR_RC``
APPENDER = ('#!/usr/bin/env bash\n{ printf "%s\\n" "$@"; echo "--- call"; } >> "$MRTPO_RECORD"\n'
            '[ "$2" != recipe.mrtpo.doctor ] || exit "${DOCTOR_RC:-0}"\n')


def test_a_launch_runs_the_preflight_before_ray_and_passes_the_roots_to_every_worker(tmp_path):
    venv, record = tmp_path / "venv", tmp_path / "record.txt"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(APPENDER)
    (venv / "bin" / "python").chmod(0o755)
    (tmp_path / "train.parquet").touch()

    def launch(**env):
        record.unlink(missing_ok=True)
        full = _base_env(MRTPO_VENV=str(venv), MRTPO_RECORD=str(record), TRAIN_FILES=str(tmp_path / "train.parquet"),
                         VAL_FILES=str(tmp_path / "train.parquet"), MRTPO_ASSETS=str(tmp_path / "assets"), **env)
        res = subprocess.run(["bash", str(SCRIPTS / "qwen1.5b_ifbench.sh"), "trainer.save_freq=3"], cwd=tmp_path, env=full,
                             capture_output=True, text=True, timeout=60)
        calls = record.read_text().split("--- call\n")[:-1] if record.exists() else []
        return res, [c.splitlines() for c in calls]

    res, calls = launch()
    assert res.returncode == 0 and len(calls) == 2, res.stderr
    (pre, main) = calls
    assert pre[:5] == ["-m", "recipe.mrtpo.doctor", "--preflight", "--task", "ifbench"] and pre[5] == "--"
    assert main[:2] == ["-m", "recipe.mrtpo.main_mrtpo"] and pre[6:] == main[2:]  # the launch's own overrides
    assert f"++ray_kwargs.ray_init.runtime_env.env_vars.MRTPO_ASSETS='{tmp_path / 'assets'}'" in main
    assert any(a.startswith("++ray_kwargs.ray_init.runtime_env.env_vars.MRTPO_DATA_ROOT=") for a in main)
    res, calls = launch(MRTPO_NLTK_DATA=str(tmp_path / "nltk"))
    assert f"++ray_kwargs.ray_init.runtime_env.env_vars.MRTPO_NLTK_DATA='{tmp_path / 'nltk'}'" in calls[1]
    res, calls = launch(DOCTOR_RC="1")  # a failed preflight: nothing launched, one line
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("[mrtpo] ERROR: ")]
    assert res.returncode != 0 and len(calls) == 1 and len(errors) == 1 and "preflight failed" in errors[0], res.stderr
    res, calls = launch(MRTPO_PREFLIGHT="0")
    assert res.returncode == 0 and [c[:2] for c in calls] == [["-m", "recipe.mrtpo.main_mrtpo"]]


def test_common_sh_is_not_a_script():
    """common.sh is sourced; running it alone must do nothing (no launch)."""
    res = subprocess.run(["bash", str(SCRIPTS / "common.sh")], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == ""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))



def test_offline_text2sql_trains_on_chinook_with_a_batch_that_fits(tmp_path, fake_venv):
    """DATA_SET=offline (the default) text-to-SQL: the Chinook set build_offline writes, not Spider, with a
    data.train_batch_size that fits Chinook's train split (verl drops the last partial batch, so 512 > its
    rows would leave no batch); a batch size the caller gives still wins."""
    build = subprocess.run([sys.executable, "-m", "data_prep.build_offline", "--out-dir", str(tmp_path / "data"),
                            "--only", "chinook"], cwd=REPO, env=_base_env(PYTHONPATH=str(REPO)),
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    import pyarrow.parquet as pq

    n_train = pq.read_metadata(tmp_path / "data" / "chinook" / "train.parquet").num_rows
    assert pq.read_metadata(tmp_path / "data" / "chinook" / "test.parquet").num_rows > 0
    res = _fast_dry_run("qwen7b_text2sql", tmp_path, DATA_SET="offline")
    assert res.returncode == 0, res.stderr[-4000:]
    cfg = yaml.safe_load(res.stdout)
    assert cfg["data"]["train_files"] == [str(REPO / "data/chinook/train.parquet")]
    assert cfg["data"]["val_files"] == [str(REPO / "data/chinook/test.parquet")]
    assert cfg["data"]["train_batch_size"] == 128 <= n_train < 512  # the launch's own 512 would not fit
    mine = _fast_dry_run("qwen7b_text2sql", tmp_path, ["data.train_batch_size=64"], DATA_SET="offline")
    assert mine.returncode == 0 and yaml.safe_load(mine.stdout)["data"]["train_batch_size"] == 64, mine.stderr[-3000:]
    assert "spider" not in res.stderr.lower()  # nothing asks for Spider files
    # missing offline data: the error names the command that builds it
    missing, lines = _launch(tmp_path, fake_venv, script="qwen7b_text2sql", TRAIN_FILES=str(tmp_path / "nope.parquet"),
                             DATA_SET="offline")
    assert missing.returncode != 0 and lines is None and "nope.parquet" in missing.stderr
    assert "build them first: python -m data_prep.build_offline --out-dir data --only chinook" in missing.stderr
    # DATA_SET=public keeps the paper's Spider / BIRD files
    public = _plain_dry_run("qwen7b_text2sql", tmp_path, DATA_SET="public")
    assert public.returncode == 0, public.stderr[-4000:]
    cfg = yaml.safe_load(public.stdout)
    assert cfg["data"]["train_files"] == [str(REPO / "data/spider/train.parquet")]
    assert cfg["data"]["val_files"] == [str(REPO / p) for p in ("data/spider/test.parquet", "data/bird/test.parquet")]


@pytest.mark.parametrize("algo, seed_read, dump_read", [("gdpo", False, True), ("grpo", False, False), ("shuffle", True, True)])
def test_seed_and_smoke_reach_each_method_only_through_the_knobs_it_reads(tmp_path, algo, seed_read, dump_read):
    """SEED=3 SMOKE=1 composes for every method: the recipe's own mrtpo.* settings (mrtpo.seed, the smoke
    preset's warm-up and dumps) are passed only where the registry says the method reads them (else the
    launch would refuse them as inert), while verl's seeds are set for all."""
    res = _fast_dry_run("qwen1.5b_ifbench", tmp_path, ALGO=algo, SEED="3", SMOKE="1")
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = yaml.safe_load(res.stdout)
    assert cfg["data"]["seed"] == 3 and cfg["actor_rollout_ref"]["rollout"]["seed"] == 3
    assert cfg["mrtpo"]["seed"] == (3 if seed_read else 0)
    assert cfg["mrtpo"]["dump"]["every_n_steps"] == (1 if dump_read else 0)
    assert cfg["trainer"]["experiment_name"].endswith(f"_{algo}_smoke_seed3")
