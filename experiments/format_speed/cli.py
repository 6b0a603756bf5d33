"""Command line of the format-speed experiment (``python -m experiments.format_speed --help``); the package
docstring says what it runs and measures."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import experiments.format_speed as package
from data_prep import format_speed as builder
from experiments.format_speed.common import LOG_PREFIX, METHODS, REPO, REWARDS, Condition, ExperimentError
from experiments.format_speed.preflight import run_preflight
from experiments.format_speed.results import analyse
from experiments.format_speed.runs import heavy_lock, prepare_seed, run_method

# the warm start of the measured runs: 1500 gold steps (400 left the copied argument right in 21% of
# samples); the demonstrations' probabilities are the data builder's defaults (data_prep.format_speed)
DEFAULT_SFT = {"gold": 1500, "demo": 200, "full": 40}


def run_timeout_s(steps: int, prompts_per_step: int) -> float:
    """The default hard limit of one training run: 600 s of start-up and first step, then per step 5 s a
    prompt (at least 60 s). Measured on the 2-core machine: start-up ~2 min and ~15 s a step at 4 prompts;
    ~97 s + a first step of 114 s and ~77 s a step at 32 prompts (docs/format_speed/README_section.md), so
    the limit is 2x a 30-step run at 32 prompts (5,400 s against ~2,440 s), and 1,320 s at the control's
    12 steps of 4 prompts (~300 s)."""
    return 600.0 + steps * max(60.0, 5.0 * prompts_per_step)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.format_speed", description=package.__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "format_speed")
    ap.add_argument("--docs", type=Path, default=None, help="also copy results.md and the plots here")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--steps", type=int, default=12, help="RL steps per run (default 12)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--reward", choices=list(REWARDS), default="tool_calling",
                    help="tool_calling: the recipe's verifier on one frame broken after the object (the first grid, the "
                         "control); toolrl: ToolRL's rewards (format {0,1}, correctness [-3,3]) on the layout the "
                         "instruction names (default tool_calling)")
    ap.add_argument("--prompts-per-step", type=int, default=4, help="prompts a step, 4 responses each (default 4)")
    ap.add_argument("--threshold", type=float, default=0.8, help="format level for steps-to-threshold (default 0.8)")
    ap.add_argument("--window", type=int, default=3, help="batches in the running mean (default 3)")
    ap.add_argument("--after", type=int, default=10, help="report the format rate after this many updates (default 10)")
    ap.add_argument("--lr", type=float, default=3e-4,
                    help="RL learning rate (default 3e-4; 1e-3 broke every response's JSON within 2 updates in the pilot)")
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--warmup", type=int, default=1, help="mrtpo.warmup_steps (default 1: step 1 is GDPO)")
    ap.add_argument("--p-format", type=float, default=builder.P_FORMAT,
                    help=f"chance that a demonstration's frame is right (default {builder.P_FORMAT})")
    ap.add_argument("--p-arg", type=float, default=builder.P_ARG,
                    help=f"chance that a demonstration's argument is right (default {builder.P_ARG})")
    ap.add_argument("--p-follow-call", type=float, default=builder.P_FOLLOW_CALL,
                    help=f"toolrl: chance that a demonstration follows an instruction naming the call alone "
                         f"(default {builder.P_FOLLOW_CALL})")
    ap.add_argument("--p-follow-response", type=float, default=builder.P_FOLLOW_RESPONSE,
                    help=f"toolrl: chance that a demonstration follows an instruction naming the response block "
                         f"(default {builder.P_FOLLOW_RESPONSE})")
    ap.add_argument("--n-sft", type=int, default=4000)
    ap.add_argument("--sft-gold-steps", type=int, default=DEFAULT_SFT["gold"], help="SFT phase 1 (gold calls)")
    ap.add_argument("--sft-demo-steps", type=int, default=DEFAULT_SFT["demo"], help="SFT phase 2 (demonstrations)")
    ap.add_argument("--sft-full-steps", type=int, default=DEFAULT_SFT["full"], help="SFT phase 3 (full softmax)")
    ap.add_argument("--warm-start-seed", type=int, default=0,
                    help="seed of the data and of the one warm start that every run starts from (default 0)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the warm start (default 1: the machine is shared)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=None,
                    help="hard limit per training run, seconds (default: run_timeout_s(steps, prompts a step), about "
                         "twice the measured time)")
    ap.add_argument("--no-lock", action="store_true", help="do not take the machine-wide lock around each run")
    ap.add_argument("--preflight-prompts", type=int, default=64,
                    help="RL prompts (x 4 responses) the preflight samples from the warm start and replays (default 64)")
    ap.add_argument("--ignore-gate", action="store_true",
                    help="run the grid even when the preflight's gate is not passed (e.g. to re-run the control "
                         "condition, whose grid ran before the preflight existed)")
    ap.add_argument("--prepare-only", action="store_true", help="only build the data and the SFT models (no verl run)")
    ap.add_argument("--preflight-only", action="store_true", help="only the data, the warm start and the preflight")
    ap.add_argument("--analyse-only", action="store_true", help="only rebuild results.md and the plots")
    args = ap.parse_args(argv)
    if args.timeout is None:
        args.timeout = run_timeout_s(args.steps, args.prompts_per_step)
    out = args.out.resolve()
    t0 = time.monotonic()
    try:
        cond = Condition(args.reward, args.prompts_per_step)
    except ExperimentError as e:
        print(f"{LOG_PREFIX} ERROR: {e}", file=sys.stderr)
        return 2
    frames = {"tool_calling": ("--p-format", args.p_format != builder.P_FORMAT),
              "toolrl": ("--p-follow-call/--p-follow-response", args.p_follow_call != builder.P_FOLLOW_CALL
                         or args.p_follow_response != builder.P_FOLLOW_RESPONSE)}
    for reward, (flag, set_) in frames.items():
        if set_ and reward != cond.reward:
            print(f"{LOG_PREFIX} ERROR: {flag} sets the demonstrations of --reward {reward}, not of {cond.reward}",
                  file=sys.stderr)
            return 2
    root, wdir = cond.root(out), cond.warm_start_dir(out)
    docs = None if args.docs is None else args.docs if cond.control else args.docs / cond.tag
    # a stop (SIGTERM, or SIGINT in a background job, which ignores it by default) unwinds through
    # run_cpu, whose cleanup kills the verl run's whole process tree
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def log(msg: str) -> None:
        print(msg, flush=True)

    try:
        if not args.analyse_only:
            import torch

            torch.set_num_threads(max(1, min(args.threads, os.cpu_count() or 1)))
            model_name = f"tiny-qwen2-h{args.hidden}-l{args.layers}"
            grid = not (args.prepare_only or args.preflight_only)
            if grid:
                from recipe.mrtpo.cpu.quickstart import QuickstartError, preflight

                try:
                    preflight(out)
                except QuickstartError as e:
                    if "memory" not in str(e):
                        raise ExperimentError(str(e)) from None
                    # other jobs may hold memory now; each run waits for the machine-wide lock anyway
                    log(f"{LOG_PREFIX} warning: {e}")
            # the warm start (~5-16 min of SFT unless cached) and the preflight hold the machine-wide lock as
            # the verl runs do
            lock = (lambda: heavy_lock(log=log)) if not args.no_lock else contextlib.nullcontext
            with lock():
                prepare_seed(wdir, args.warm_start_seed, args, log, cond)
            if args.prepare_only:
                log(f"{LOG_PREFIX} prepared the data and the warm start under {wdir}")
                return 0
            # the preflight: does the replay put q_format where the frame is decided? (minutes)
            with lock():
                pre = run_preflight(wdir / "sft_model", wdir / "data" / "train.parquet", root, cond,
                                    prompts=args.preflight_prompts, seed=args.warm_start_seed, beta=args.beta, docs=docs,
                                    log=log)
            print()
            print((root / "preflight.md").read_text())
            if args.preflight_only:
                return 0 if pre["gate"]["passed"] else 3
            if not pre["gate"]["passed"]:
                if not args.ignore_gate:
                    print(f"{LOG_PREFIX} STOP: the preflight's gate is not passed ({pre['gate']['reason']}); the grid "
                          f"does not start ({root / 'preflight.md'})", file=sys.stderr)
                    return 3
                log(f"{LOG_PREFIX} warning: the gate is not passed; --ignore-gate: running the grid anyway")
            for seed in args.seeds:  # seed-major: an interrupted experiment has whole seeds
                for method in args.methods:
                    run_method(method, seed, wdir / "sft_model", wdir / "data" / "train.parquet", root / "runs",
                               args.steps, args.lr, args.beta, args.warmup, args.timeout, model_name, log=log,
                               lock=not args.no_lock, condition=cond)
        results = analyse(root, args.methods, args.seeds, args.threshold, args.window, args.after, args.steps,
                          args.beta, docs=docs, log=log, condition=cond, warm_start=wdir)
        print()
        print((root / "results.md").read_text())
        failed = [k for k, e in results["runs"].items() if not e["ok"]]
        log(f"{LOG_PREFIX} done in {time.monotonic() - t0:.0f} s: {root / 'results.md'}")
        if failed:
            print(f"{LOG_PREFIX} ERROR: failed runs, left out of the table (re-run to retry them): {failed}", file=sys.stderr)
            return 1
        return 0
    except ExperimentError as e:
        print(f"{LOG_PREFIX} ERROR: {e}", file=sys.stderr)
        return 1
