"""The runs of the format-speed experiment: per seed the data and the warm start (:func:`prepare_seed`),
then one verl run per method (:func:`run_method`) through ``python -m recipe.mrtpo.main_mrtpo`` on CPU,
with the overrides of the slots miniature (:func:`experiments.mini_credit.runs.method_overrides`: 4
prompts x 4 responses of <= 24 tokens a step, relevance dumps of every response of every step for the
replay methods) under this experiment's project name.

Each verl run holds the machine-wide lock (:data:`HEAVY_LOCK`, ``flock``) while it runs, and only then,
so that other heavy jobs on the machine interleave between runs. A run that finished with the same
overrides and weights is kept (``result.json`` holds its key): an interrupted experiment resumes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from data_prep.common import sha256_file
from experiments.format_speed.common import LOG_PREFIX, PROJECT, TASK, ExperimentError
from experiments.mini_credit.runs import method_overrides
from experiments.mini_credit.warm_start import SFTConfig
from recipe.mrtpo.tools.verl_log import STEP_LINE

HEAVY_LOCK = Path(os.environ.get("MRTPO_HEAVY_LOCK", "/tmp/mrtpo-heavy.lock"))


@contextlib.contextmanager
def heavy_lock(path: Path = HEAVY_LOCK, log: Callable[[str], None] = print):
    """Hold an exclusive ``flock`` on ``path`` (waits for it; logs how long)."""
    t0 = time.monotonic()
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{LOG_PREFIX}   waiting for {path} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
            log(f"{LOG_PREFIX}   got {path} after {time.monotonic() - t0:.0f} s")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_overrides(method: str, model: Path, data: Path, run_dir: Path, seed: int, steps: int, lr: float, beta: float,
                  warmup: int) -> list[str]:
    """The slots miniature's overrides for ``method`` with this experiment's project name."""
    ov = method_overrides(method, model, data, run_dir, seed, steps, lr, beta, warmup)
    return [f"trainer.project_name={PROJECT}" if o.startswith("trainer.project_name=") else o for o in ov]


def run_method(method: str, seed: int, model: Path, data: Path, runs_dir: Path, steps: int, lr: float, beta: float,
               warmup: int, timeout_s: float, model_name: str, log: Callable[[str], None] = print,
               lock: bool = True) -> dict:
    """Run one (method, seed) unless ``result.json`` says the same run already finished; returns it."""
    from recipe.mrtpo.cpu.launcher import run_cpu

    run_dir = Path(runs_dir) / f"{method}_seed{seed}"
    overrides = run_overrides(method, model, data, run_dir, seed, steps, lr, beta, warmup)
    key = hashlib.sha256(json.dumps([overrides, sha256_file(Path(model) / "model.safetensors")]).encode()).hexdigest()[:16]
    result_path = run_dir / "result.json"
    if result_path.is_file():
        try:
            old = json.loads(result_path.read_text())
            if old.get("key") == key and old.get("ok"):
                log(f"{LOG_PREFIX} {method} seed {seed}: done before, kept ({run_dir})")
                return old
        except ValueError:
            pass
    with heavy_lock(log=log) if lock else contextlib.nullcontext():
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({"method": method, "task": TASK, "seed": seed, "model": model_name}))
        t0 = time.monotonic()
        log(f"{LOG_PREFIX} {method} seed {seed}: starting verl ({steps} steps) ...")

        def progress(line: str) -> None:
            m = STEP_LINE.search(line)
            if m:
                log(f"{LOG_PREFIX}   {method} seed {seed}: step {m.group(1)} ({time.monotonic() - t0:.0f} s)")

        res = run_cpu("recipe.mrtpo.main_mrtpo", overrides, run_dir, timeout_s, on_line=progress)
    ok = (not res.timed_out) and res.returncode == 0 and sorted(res.steps) == list(range(1, steps + 1))
    result = {"method": method, "seed": seed, "key": key, "ok": ok, "returncode": res.returncode,
              "timed_out": res.timed_out, "wall_s": res.wall_s, "first_step_at_s": res.first_step_at_s,
              "peak_pss_gib": res.peak_pss_gib, "steps_logged": sorted(res.steps), "log": res.log_path.name}
    result_path.write_text(json.dumps(result, indent=1))
    if not ok:
        log(f"{LOG_PREFIX} {method} seed {seed}: FAILED (exit {res.returncode}, timed out {res.timed_out}, "
            f"steps {sorted(res.steps)}); log {res.log_path}\n{res.tail(25)}")
    else:
        log(f"{LOG_PREFIX} {method} seed {seed}: {res.wall_s:.0f} s, peak {res.peak_pss_gib:.1f} GiB PSS")
    return result


def prepare_seed(sdir: Path, seed: int, args, log: Callable[[str], None] = print) -> dict:
    """Data (``sdir/data``), the random init (``sdir/init``) and the warm-started model (``sdir/sft_model``)."""
    from data_prep import format_speed as builder
    from experiments.format_speed.warm_start import sft_warm_start
    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    data_dir = sdir / "data"
    rc = builder.main(["--out-dir", str(data_dir), "--seed", str(seed), "--n-sft", str(args.n_sft),
                       "--p-format", str(args.p_format), "--p-arg", str(args.p_arg)])
    if rc != 0:
        raise ExperimentError(f"building the data for seed {seed} failed")
    heads = args.hidden // 32
    base = build_tiny_qwen2(sdir / "init", hidden_size=args.hidden, num_layers=args.layers,
                            num_heads=heads, num_kv_heads=max(1, heads // 2), seed=seed)
    cfg = SFTConfig(gold_steps=args.sft_gold_steps, demo_steps=args.sft_demo_steps, full_steps=args.sft_full_steps)
    return sft_warm_start(base, data_dir / "sft.parquet", data_dir / "test.parquet", sdir / "sft_model", cfg,
                          seed=seed, log=log)
