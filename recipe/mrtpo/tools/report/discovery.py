"""Discovery: every training log and eval JSON under a runs folder, grouped into runs.

What is read (recursively; ``checkpoints/``, ``global_step_*/`` and the output folder are skipped):

- training logs: verl's console logger (``trainer.logger=[console,...]``): ``*.log``, ``*.out``,
  ``*.txt`` files with ``step:N - key:value - ...`` lines (Ray's ``(Actor pid=..)`` prefixes and ANSI
  colours are fine). A step line that does not parse completely (a truncated or interleaved line) is
  skipped and counted in a warning. verl's ``file`` logger (``trainer.logger=[console,file]``) writes
  JSON lines ``{"step": N, "data": {...}}`` to ``$VERL_FILE_LOGGER_PATH``, or by default
  ``$VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl`` (root: the working directory):
  copy or point it into the run's folder; ``*.jsonl`` files of that shape are read too.
- eval results: ``*.json`` files written by ``python -m recipe.mrtpo.tools.eval``
  (``{"task", "model", "n", "metrics": {...}, "config": {...}, "items": [...]}``); other JSON files
  are ignored.

Which run a file belongs to (model, training task, method, seed), first source that has the field:

1. ``run.json`` in the file's folder or any folder above it up to RUNS_DIR (the nearest wins), e.g.
   ``{"method": "mrtpo", "task": "ifbench", "seed": 0, "model": "Qwen2.5-1.5B-Instruct"}``;
2. a name ``<model>_<task>_<method>_seed<k>``: the file's own name (without suffix), then its folders
   from the nearest up (``task`` may contain underscores if it is a known task name such as
   ``instruction_following``);
3. single path components: a folder named exactly like a known method (``mrtpo``) or ``seed<k>``;
4. for eval files, ``"model"`` inside the JSON.

The eval JSON's own ``"task"`` is the evaluated benchmark (the table's column); ``run.json``'s ``task``
is the training task (it groups the plots). Method names are lower-cased. A file whose method cannot
be told is skipped with a warning. Files of the same (model, task, method, seed) are one run (e.g. a
resumed run's two logs; a later file's value wins for a step both have).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from recipe.mrtpo.tools.report.launch_meta import meta_from_command_line, meta_from_config
from recipe.mrtpo.tools.report.names import METHOD_ORDER, TASK_ORDER, UNKNOWN
from recipe.mrtpo.tools.verl_log import parse_console_log, parse_file_logger, parse_wandb_run

_TASKS = "|".join(re.escape(t) for t in sorted(TASK_ORDER, key=len, reverse=True))
RUN_NAME = re.compile(r"^(?P<model>.+?)_(?P<task>" + _TASKS + r"|[^_]+)_(?P<method>[^_]+)_seed(?P<seed>\d+)$")
#: the run scripts' name before seeds were added to it: the method must then be a known one
RUN_NAME_NO_SEED = re.compile(r"^(?P<model>.+?)_(?P<task>" + _TASKS + r"|[^_]+)_(?P<method>"
                              + "|".join(re.escape(m) for m in METHOD_ORDER) + r")$", re.IGNORECASE)
_SEED_DIR = re.compile(r"^seed[_-]?(\d+)$")
_SKIP_DIRS = re.compile(r"^(checkpoints|global_step_\d+|__pycache__|\.git|node_modules|\..*)$")
LOG_SUFFIXES = (".log", ".out", ".txt")


def parse_run_name(name: str) -> dict:
    """``<model>_<task>_<method>_seed<k>`` (any method) or ``<model>_<task>_<method>`` (a known method, no
    seed) -> ``{"model", "task", "method"[, "seed"]}``; ``{}`` otherwise. These are the run scripts'
    ``trainer.experiment_name`` (``qwen2.5-7b-instruct_ifbench_mrtpo_seed0``) and so verl's file-logger
    file name and the checkpoint folder."""
    m = RUN_NAME.match(name)
    if m:
        return {"model": m["model"], "task": m["task"], "method": m["method"], "seed": int(m["seed"])}
    m = RUN_NAME_NO_SEED.match(name)
    if m:
        return {"model": m["model"], "task": m["task"], "method": m["method"]}
    return {}


def _norm_seed(seed):
    if isinstance(seed, str) and seed.strip().isdigit():
        return int(seed)
    return seed


def resolve_meta(path: Path, root: Path, warnings: list[str]) -> dict:
    """Model / task / method / seed of a file under ``root`` (the module docstring's rules 1-3)."""
    meta: dict = {}
    folders = [path.parent, *path.parent.parents]
    folders = folders[: folders.index(root) + 1] if root in folders else [path.parent]
    for folder in folders:  # 1. run.json, nearest first
        rj = folder / "run.json"
        if rj.is_file():
            try:
                data = json.loads(rj.read_text())
                if not isinstance(data, dict):
                    raise ValueError("not an object")
            except (ValueError, OSError) as e:
                msg = f"{rj}: unreadable run.json ({e}); ignored"
                if msg not in warnings:
                    warnings.append(msg)
                continue
            for k in ("model", "task", "method", "seed"):
                if data.get(k) is not None:
                    meta.setdefault(k, _norm_seed(data[k]) if k == "seed" else str(data[k]))
    for name in [path.stem] + [f.name for f in folders]:  # 2. <model>_<task>_<method>_seed<k>
        for k, v in parse_run_name(name).items():
            meta.setdefault(k, v)
    for name in [f.name for f in folders]:  # 3. single components
        if name in METHOD_ORDER:
            meta.setdefault("method", name)
        m = _SEED_DIR.match(name)
        if m:
            meta.setdefault("seed", int(m.group(1)))
    if "method" in meta:
        meta["method"] = meta["method"].lower()
    return meta


@dataclass
class TrainRun:
    """One training run: its identity, the merged steps of its log files and how many lines were bad."""

    model: str
    task: str
    method: str
    seed: object  # int, or the run folder's relative path when no seed is known
    sources: list = field(default_factory=list)
    steps: dict = field(default_factory=dict)
    corrupt_lines: int = 0


@dataclass
class EvalResult:
    """One eval JSON, with the run it belongs to."""

    model: str
    train_task: str
    method: str
    seed: object
    eval_task: str
    metrics: dict  # flattened: "a/b" for nested dicts, numbers only
    headline: Optional[list]
    path: str
    subset: Optional[str] = None  # "k/N" (or "k") when ``tools.eval --limit`` scored only part of the file


def _flatten(d: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def _walk(root: Path, skip: Optional[Path]) -> list[Path]:
    """Files under ``root``, following folder links once each, without :data:`_SKIP_DIRS` and ``skip``."""
    files, seen = [], {root.resolve()}
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir():
                real = entry.resolve()
                if _SKIP_DIRS.match(entry.name) or real == skip or real in seen:
                    continue
                seen.add(real)
                stack.append(entry)
            elif entry.is_file():
                files.append(entry)
    return sorted(files)


def _subset(data: dict) -> Optional[str]:
    """``"k/N"`` when the eval scored k of the file's N items (``--limit``): from its ``"subset"`` record,
    or ``"k"`` from ``config.limit`` in results written before it had one; ``None`` for a whole file."""
    sub = data.get("subset")
    if isinstance(sub, dict) and isinstance(sub.get("items"), int):
        total = sub.get("of")
        return f"{sub['items']}/{total}" if isinstance(total, int) else str(sub["items"])
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    if isinstance(config.get("limit"), int) and data.get("n") == config["limit"]:  # fewer: the whole file
        return f"{data['n']}/?"
    return None


def _seed_or_path(meta: dict, path: Path, root: Path):
    if meta.get("seed") is not None:
        return meta["seed"]
    return str(path.parent.relative_to(root)) or "."


def _fill(meta: dict, extra: dict) -> dict:
    """``meta`` with the fields it lacks taken from ``extra`` (an experiment name parsed first)."""
    for k, v in parse_run_name(str(extra.get("name", ""))).items():
        meta.setdefault(k, v)
    for k in ("model", "task", "method", "seed"):
        if extra.get(k) is not None:
            meta.setdefault(k, extra[k])
    if "method" in meta:
        meta["method"] = str(meta["method"]).lower()
    return meta


def _read_training_log(path: Path, rel: str, root: Path, warnings: list[str]):
    """(steps, corrupt lines, meta) of a console / file-logger / wandb log, or a reason string why it is
    not one (``None`` for a file that is plainly something else)."""
    if path.name.startswith("run-") and path.suffix == ".wandb":
        try:
            steps, wmeta, corrupt = parse_wandb_run(path)
        except ImportError:
            return "a wandb run, but the wandb package (which decodes it) is not installed"
        except (ValueError, OSError) as e:
            return f"unreadable wandb run ({str(e)[:80]})"
        meta = resolve_meta(path, root, warnings)
        return steps, corrupt, _fill(meta, meta_from_config(wmeta.get("name"), wmeta.get("config", {})))
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"unreadable ({e})"
    if path.suffix.lower() == ".jsonl":
        steps, corrupt, is_log = parse_file_logger(text)
        if not is_log:
            return None  # some other JSON-lines file (e.g. rollout dumps)
    else:
        steps, corrupt = parse_console_log(text)
        if not steps and not corrupt:
            return None
    return steps, corrupt, _fill(resolve_meta(path, root, warnings), meta_from_command_line(text))


def _folder_of(rel: str) -> str:
    return rel.split("/", 1)[0] + "/" if "/" in rel else "."


def discover(root: Path, skip: Optional[Path], warnings: list[str]) -> tuple[list[TrainRun], list[EvalResult]]:
    """Every training log and eval JSON under ``root`` (except under ``skip``), grouped into runs; a warning
    for every file skipped and, per top-level folder that gave nothing, why."""
    runs: dict[tuple, TrainRun] = {}
    evals: dict[tuple, EvalResult] = {}
    used: set[str] = set()
    reasons: dict[str, list[str]] = {}
    files = _walk(root, skip)
    wandb_dirs = {p.parent for p in files if p.name.startswith("run-") and p.suffix == ".wandb"}
    for path in files:
        suffix = path.suffix.lower()
        rel = str(path.relative_to(root))
        if any(d in path.parents for d in wandb_dirs) and path.parent not in wandb_dirs:
            continue  # a wandb run's files/output.log, logs/debug.log: its run-<id>.wandb is read instead
        if suffix in LOG_SUFFIXES or suffix in (".jsonl", ".wandb"):
            got = _read_training_log(path, rel, root, warnings)
            if got is None:
                continue
            if isinstance(got, str):
                warnings.append(f"{rel}: {got}; skipped")
                reasons.setdefault(_folder_of(rel), []).append(got)
                continue
            steps, corrupt, meta = got
            if corrupt:
                warnings.append(f"{rel}: {corrupt} corrupt/truncated step line(s) skipped")
            if "method" not in meta:
                why = ("training log of unknown method (no run.json, no <model>_<task>_<method>[_seed<k>] name, "
                       "no launch command line in it)")
                warnings.append(f"{rel}: {why}; skipped")
                reasons.setdefault(_folder_of(rel), []).append(why)
                continue
            key = (meta.get("model", UNKNOWN), meta.get("task", UNKNOWN), meta["method"],
                   _seed_or_path(meta, path, root))
            run = runs.setdefault(key, TrainRun(*key))
            run.sources.append(rel)
            run.corrupt_lines += corrupt
            used.add(_folder_of(rel))
            for step, metrics in steps.items():
                run.steps.setdefault(step, {}).update(metrics)
        elif suffix == ".json" and path.name != "run.json":
            try:
                data = json.loads(path.read_text(errors="replace"))
            except (ValueError, OSError) as e:
                warnings.append(f"{rel}: not valid JSON ({str(e)[:80]}); skipped")
                continue
            if not (isinstance(data, dict) and isinstance(data.get("metrics"), dict)):
                continue  # not an eval result
            if not isinstance(data.get("task"), str):
                warnings.append(f"{rel}: eval JSON without a \"task\"; skipped")
                continue
            meta = resolve_meta(path, root, warnings)
            if "method" not in meta:
                why = "eval result of unknown method (no run.json, no <model>_<task>_<method>[_seed<k>] name)"
                warnings.append(f"{rel}: {why}; skipped")
                reasons.setdefault(_folder_of(rel), []).append(why)
                continue
            model = meta.get("model") or (str(data["model"]) if data.get("model") else UNKNOWN)
            headline = data.get("headline")
            result = EvalResult(
                model=model, train_task=meta.get("task", UNKNOWN), method=meta["method"],
                seed=_seed_or_path(meta, path, root), eval_task=data["task"],
                metrics=_flatten(data["metrics"]),
                headline=[str(h) for h in headline] if isinstance(headline, list) else None, path=rel,
                subset=_subset(data),
            )
            key = (result.model, result.method, result.eval_task, result.train_task, result.seed)
            if key in evals:
                warnings.append(f"{rel}: second eval of {result.eval_task} for the same run as "
                                f"{evals[key].path}; using {rel}")
            evals[key] = result
            used.add(_folder_of(rel))
    for folder in sorted({_folder_of(str(p.relative_to(root))) for p in files} - used - {"."}):
        why = "; ".join(sorted(set(reasons.get(folder, [])))) or (
            "no training log (verl console step lines, file-logger .jsonl, wandb run) and no eval JSON in it")
        warnings.append(f"skipped folder {folder}: {why}")
    return list(runs.values()), list(evals.values())
