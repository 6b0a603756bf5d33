"""Before the first step: every file a worker will read is there on every Ray node, or the run stops in one line.

What a worker reads (:func:`run_files`), each a :class:`NodeFile` saying how a worker finds it:

- ``data``: the files the training and validation rows name, resolved against ``$MRTPO_DATA_ROOT`` on each node
  (:mod:`recipe.mrtpo.cluster.node_files`): the SQL rows' databases (``reward_model.ground_truth.db_path``);
- ``module``: the Python modules the workers import from an installed package, looked up as files without
  importing them: for BFCL multi-turn rows (``agent_name: bfcl_multi_turn``) the pinned ``bfcl-eval``'s backends
  of the rows' ``involved_classes`` (the agent loop builds them) and its multi-turn checker (the verifier runs
  it); a ``pkg://`` module a reward setting names;
- ``as_given``: the files the run's settings name, opened by verl's workers as written (a relative path from the
  worker's directory): the model, its config and tokenizer folders when local, verl's tool config, function
  tool file and agent-loop config, a custom reward function or reward manager module file, a local reward model;
- ``nltk``: the NLTK resources the IF checkers load (``node_files.NLTK_RESOURCES``) where rows of an IF data source
  (:data:`IF_DATA_SOURCES`) are in the data, looked up as NLTK looks them up under the asset root's
  ``nltk_data`` (``node_files.nltk_data_dir``: ``$MRTPO_NLTK_DATA``, else ``$MRTPO_ASSETS/nltk_data``).

One task pinned to each alive node (Ray's ``NodeAffinitySchedulingStrategy``) looks them up there; the first
missing one stops the run with :func:`recipe.mrtpo.cluster.node_files.missing_line` (the file, the node, and the row or
setting that names it). Where the run saves or resumes checkpoints, :func:`check_run` first writes a marker under
``trainer.default_local_dir`` on the task runner's node (``checkpoint_shards.write_marker``) and every node must read
it there, else the run stops in one line saying the folder is not shared. A node whose task does not answer within
``$MRTPO_NODE_CHECK_TIMEOUT_S`` seconds (default :data:`TIMEOUT_S`: a hung file system, a worker that cannot start)
is named in one line and the run stops. The driver prints the line alone (``launch_errors``) and exits non-zero.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from recipe.mrtpo.cluster import checkpoint_shards, node_files
from recipe.mrtpo.rollout.rollout_render import BFCL_AGENT  # the agent name of BFCL multi-turn rows

#: how each kind of :class:`NodeFile` is found on a node
KINDS = ("data", "module", "as_given", "nltk")
#: the data sources the IF verifier scores (``tasks.instruction_following``'s ``register_task``; a test pins them)
IF_DATA_SOURCES = ("instruction_following", "ifeval", "ifbench")
NLTK_HINT = "python run_scripts/fetch_assets.py --dest <asset root> on every node"
#: seconds the check waits for every node's answer (``$MRTPO_NODE_CHECK_TIMEOUT_S`` overrides)
TIMEOUT_S = 300.0
TIMEOUT_ENV = "MRTPO_NODE_CHECK_TIMEOUT_S"
#: what the multi-turn verifier imports of bfcl-eval (``recipe.mrtpo.tasks.multi_turn.official``)
BFCL_CHECKER_MODULES = ("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
                        "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
BFCL_HINT = "pip install --no-deps bfcl-eval==2026.3.23 on every node"
#: settings that name a file a worker opens as written (absent keys are skipped: verl 0.9.1 has them all)
FILE_KEYS = ("actor_rollout_ref.rollout.multi_turn.tool_config_path",
             "actor_rollout_ref.rollout.multi_turn.function_tool_path",
             "actor_rollout_ref.rollout.agent.agent_loop_config_path",
             "reward.custom_reward_function.path",
             "reward.reward_manager.module.path")
#: settings that name a model folder: checked when local (absolute, ``~``, ``./``), else a hub id
MODEL_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.hf_config_path",
              "actor_rollout_ref.model.tokenizer_path", "reward.reward_model.model_path")


@dataclass(frozen=True)
class NodeFile:
    """One file a worker reads: ``path`` as the run names it, ``kind`` (:data:`KINDS`: how a worker finds it),
    ``source`` (which row or setting names it: the one line says so; empty for a row's file, shown as row)."""

    path: str
    kind: str = "data"
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"NodeFile kind must be one of {KINDS}, got {self.kind!r}")


def _ground_truth(rm):
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    if isinstance(gt, str) and gt.startswith("{"):
        try:
            return json.loads(gt)
        except ValueError:
            return None
    return gt


def row_files(frame) -> list[str]:
    """The distinct files (as stored) that the rows of a verl parquet frame name: SQL rows' ``db_path``."""
    out: dict[str, None] = {}
    if "reward_model" not in getattr(frame, "columns", ()):
        return []
    for rm in frame["reward_model"]:
        gt = _ground_truth(rm)
        path = gt.get("db_path") if isinstance(gt, dict) else None
        if isinstance(path, str) and path:
            out[path] = None
    return list(out)


def asset_files(frame) -> list[NodeFile]:
    """The assets the rows' verifiers load: NLTK's resources where a row's ``data_source`` (before any ``/``) is one
    of :data:`IF_DATA_SOURCES`; [] otherwise."""
    if "data_source" not in getattr(frame, "columns", ()):
        return []
    sources = {str(d).split("/", 1)[0] for d in frame["data_source"]} & set(IF_DATA_SOURCES)
    if not sources:
        return []
    named_by = f"rows with data_source {sorted(sources)[0]} ({NLTK_HINT})"
    return [NodeFile(r, "nltk", named_by) for r in node_files.NLTK_RESOURCES]


def _classes(extra) -> list[str]:
    value = extra.get("involved_classes") if isinstance(extra, dict) else None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [str(c) for c in value] if value is not None and not isinstance(value, (str, bytes, dict)) else []


def bfcl_modules(frame) -> list[str]:
    """The bfcl-eval modules BFCL multi-turn rows (``agent_name`` :data:`BFCL_AGENT`) make a worker import: its
    checker and the backend of each involved class (bfcl-eval's ``CLASS_FILE_PATH_MAPPING``); [] without such rows."""
    cols = getattr(frame, "columns", ())
    if "agent_name" not in cols:
        return []
    extras = frame["extra_info"] if "extra_info" in cols else [None] * len(frame)
    classes: dict[str, None] = {}
    seen = False
    for agent, extra in zip(frame["agent_name"], extras):
        if agent == BFCL_AGENT:
            seen = True
            classes.update(dict.fromkeys(_classes(extra)))
    if not seen:
        return []
    try:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
    except ImportError:  # not installed here: the package itself is what every node (this one too) lacks
        return ["bfcl_eval"]
    return [*BFCL_CHECKER_MODULES, *(CLASS_FILE_PATH_MAPPING[c] for c in classes if c in CLASS_FILE_PATH_MAPPING)]


def _data_files(config) -> list[str]:
    out: list[str] = []
    for key in ("train_files", "val_files"):
        value = config.data.get(key, None)
        out += [str(f) for f in ([value] if isinstance(value, str) else list(value or []))]
    return list(dict.fromkeys(out))


def _select(config, key: str):
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key, default=None)


def _is_local(path: str) -> bool:
    return os.path.isabs(path) or path.startswith(("~", "./", "../"))


def setting_files(config) -> list[NodeFile]:
    """The files the run's settings name (:data:`FILE_KEYS`; :data:`MODEL_KEYS` when local; ``pkg://`` modules)."""
    out: list[NodeFile] = []
    for key in FILE_KEYS:
        value = _select(config, key)
        if value is None or not str(value).strip():
            continue
        value = str(value)
        if value.startswith("pkg://"):
            out.append(NodeFile(value[len("pkg://"):], "module", key))
        elif "://" not in value:
            out.append(NodeFile(value, "as_given", key))
    for key in MODEL_KEYS:
        value = _select(config, key)
        if value is not None and _is_local(str(value)):
            out.append(NodeFile(str(value), "as_given", key))
    return out


def run_files(config) -> list[NodeFile]:
    """Every file of the run a worker reads (module docstring), each once."""
    import pandas as pd

    files: dict[NodeFile, None] = {}
    for f in _data_files(config):
        if not os.path.isfile(f):
            continue
        present = set(_parquet_columns(f))
        frame = pd.read_parquet(f, columns=[c for c in ("data_source", "reward_model", "agent_name", "extra_info")
                                            if c in present])
        files.update(dict.fromkeys(NodeFile(p) for p in row_files(frame)))
        files.update(dict.fromkeys(asset_files(frame)))
        files.update(dict.fromkeys(NodeFile(m, "module", f"rows with agent_name {BFCL_AGENT} ({BFCL_HINT})")
                                   for m in bfcl_modules(frame)))
    files.update(dict.fromkeys(setting_files(config)))
    return list(files)


def _parquet_columns(path: str) -> list[str]:
    import pyarrow.parquet as pq

    return list(pq.read_schema(path).names)


def module_file(name: str) -> str | None:
    """Where module ``name`` would be imported from on this node (``a/b/c.py`` or ``a/b/c/__init__.py`` under
    the top package's folder), without importing it or its packages; None when it is not there."""
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return spec.origin if spec.origin and os.path.isfile(spec.origin) else None
    for base in spec.submodule_search_locations or []:
        stem = Path(base, *rest)
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
            if candidate.is_file():
                return str(candidate)
    return None


def missing_here(files: list) -> str | None:
    """:func:`recipe.mrtpo.cluster.node_files.missing_line` for the first of ``files`` (:class:`NodeFile`, or a row's
    path as a string) this node lacks, or None."""
    for f in files:
        f = f if isinstance(f, NodeFile) else NodeFile(str(f))
        if f.kind == "data":
            if not os.path.exists(node_files.resolve(f.path)):
                return node_files.missing_line(node_files.resolve(f.path), f.path)
        elif f.kind == "module":
            if module_file(f.path) is None:
                return node_files.missing_line(f"python module {f.path}", named_by=f.source)
        elif f.kind == "nltk":
            gone = node_files.missing_nltk([f.path])
            if gone is not None:
                root = node_files.nltk_data_dir()
                what = ("python module nltk" if gone == "nltk" else
                        f"NLTK's {gone} under {root} ({node_files.NLTK_DATA_ENV} or {node_files.ASSETS_ENV}/nltk_data; "
                        f"NLTK also refuses a folder another account can write)")
                return node_files.missing_line(what, named_by=f.source)
        elif not os.path.exists(os.path.expanduser(f.path)):
            return node_files.missing_line(os.path.abspath(os.path.expanduser(f.path)), named_by=f.source)
    return None


def _probe(files: list, marker: tuple[str, str] | None = None) -> str | None:
    import ray

    line = missing_here(files)
    if line is None and marker is not None:
        seen = checkpoint_shards.marker_line(*marker)
        if seen:
            line = (f"{node_files.NODE_CHECK_MARK}trainer.default_local_dir={os.path.dirname(marker[0])} is not shared: "
                    f"node {node_files.node_name()} {seen}; {checkpoint_shards.SHARED_HINT}")
    return None if line is None else line + f" [ray node {ray.get_runtime_context().get_node_id()[:12]}]"


def _timeout_s(timeout_s: float | None) -> float:
    if timeout_s is not None:
        return float(timeout_s)
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        return float(raw) if raw else TIMEOUT_S
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None


def check_every_node(files: list, marker: tuple[str, str] | None = None, timeout_s: float | None = None) -> None:
    """Raise ``FileNotFoundError`` (one line: the file, or the checkpoint folder, and the node) when an alive Ray node
    lacks a file or does not read ``marker`` (``(path, token)``, :func:`check_run`), ``TimeoutError`` (one line
    naming them) when nodes do not answer within ``timeout_s`` (default: ``$MRTPO_NODE_CHECK_TIMEOUT_S`` or
    :data:`TIMEOUT_S`).

    ``files``: :class:`NodeFile` entries, or rows' paths as strings (``data``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not files and marker is None:
        return
    wait_s = _timeout_s(timeout_s)
    probe = ray.remote(num_cpus=0)(_probe)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
            .remote(files, marker) for n in nodes]
    if not refs:
        return
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    answered = set(done)
    for line in ray.get(done):
        if line:
            raise FileNotFoundError(line)
    silent = [n for n, r in zip(nodes, refs) if r not in answered]
    if silent:
        for r in refs:
            if r not in answered:
                try:
                    ray.cancel(r, force=True)
                except Exception:  # noqa: BLE001 - the line below is the finding; a failed cancel must not hide it
                    pass
        named = ", ".join(f"ray node {n['NodeID'][:12]} ({n.get('NodeManagerHostname', '?')}, "
                          f"{n.get('NodeManagerAddress', '?')})" for n in silent)
        raise TimeoutError(f"{node_files.NODE_CHECK_MARK}{named} did not answer the node check within {wait_s:g} s "
                           f"(a hung file system, a Ray worker that cannot start there?); the run stops before its "
                           f"first step ({TIMEOUT_ENV} sets the wait)")


def check_run(config) -> None:
    """The check the task runner makes before the trainer starts: every file of :func:`run_files` on every node,
    and, where the run saves or resumes checkpoints, the marker under ``trainer.default_local_dir`` read on every
    node (``checkpoint_shards.needs_shared_folder``)."""
    marker = None
    if checkpoint_shards.needs_shared_folder(config.trainer):
        folder = str(config.trainer.default_local_dir)
        try:
            marker = checkpoint_shards.write_marker(folder)
        except OSError as e:  # verl's first save would fail there too, steps later
            raise FileNotFoundError(f"{node_files.NODE_CHECK_MARK}trainer.default_local_dir={folder}: the node check "
                                    f"cannot write its marker there ({type(e).__name__}: {e})") from None
    check_every_node(run_files(config), marker)
