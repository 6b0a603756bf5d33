"""Command line of the miniature experiment (``python -m experiments.mini_credit --help``): prepare every
seed, run every method, then build the table and the plots; see the package docstring for what it
measures."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Optional

import experiments.mini_credit as package
from experiments.mini_credit.common import METHODS, REPO, ExperimentError
from experiments.mini_credit.results import analyse
from experiments.mini_credit.runs import prepare_seed, run_method
from experiments.mini_credit.warm_start import SFTConfig


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.mini_credit", description=package.__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "mini_credit")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20, help="RL steps per run (default 20)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--threshold", type=float, default=0.6,
                    help="reward level for steps-to-threshold (default 0.6: the warm start is at ~0.45 per slot)")
    ap.add_argument("--final-window", type=int, default=4,
                    help="steps averaged for the final and the start reward and for steps-to-threshold (default 4)")
    ap.add_argument("--lr", type=float, default=3e-4,
                    help="RL learning rate (default 3e-4; 1e-3 collapsed the fields within 12 steps in a pilot)")
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--warmup", type=int, default=1, help="mrtpo.warmup_steps (default 1: step 1 is GDPO)")
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--p-correct", type=float, default=0.5)
    ap.add_argument("--n-sft", type=int, default=4000)
    d = SFTConfig()
    ap.add_argument("--sft-gold-steps", type=int, default=d.gold_steps, help="SFT phase 1 (correct answers)")
    ap.add_argument("--sft-demo-steps", type=int, default=d.demo_steps, help="SFT phase 2 (demonstrations)")
    ap.add_argument("--sft-full-steps", type=int, default=d.full_steps, help="SFT phase 3 (full softmax)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1200, help="hard limit per training run, seconds")
    ap.add_argument("--prepare-only", action="store_true", help="only build the data and the SFT models (no verl run)")
    ap.add_argument("--analyse-only", action="store_true", help="only rebuild results.md and the plots")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(msg, flush=True)

    try:
        if not args.analyse_only:
            import torch

            torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
            model_name = f"tiny-qwen2-h{args.hidden}-l{args.layers}"
            for seed in args.seeds:  # data and warm start of every seed first: cheap, and cached
                prepare_seed(out / f"seed{seed}", seed, args, log)
            if not args.prepare_only:
                from recipe.mrtpo.cpu.quickstart import QuickstartError, preflight

                try:
                    preflight(out)
                except QuickstartError as e:
                    raise ExperimentError(str(e)) from None
                for seed in args.seeds:  # seed-major: an interrupted experiment has whole seeds
                    sdir = out / f"seed{seed}"
                    for method in args.methods:
                        run_method(method, seed, sdir / "sft_model", sdir / "data" / "train.parquet", out / "runs",
                                   args.steps, args.lr, args.beta, args.warmup, args.timeout, model_name, log=log)
        if args.prepare_only:
            log(f"[mini] prepared {', '.join(f'seed{s}' for s in args.seeds)} under {out}")
            return 0
        results = analyse(out, args.methods, args.seeds, args.threshold, args.final_window, log=log)
        print()
        print((out / "results.md").read_text())
        failed = [k for k, e in results["runs"].items() if not e["ok"]]
        log(f"[mini] done in {time.monotonic() - t0:.0f} s: {out / 'results.md'}, {out / 'results.json'}, "
            f"{out / 'localisation.png'}, {out / 'report'}")
        if failed:  # the table is written without them; the exit status says the experiment is incomplete
            print(f"[mini] ERROR: failed runs, left out of the table (re-run to retry them): {failed}", file=sys.stderr)
            return 1
        return 0
    except ExperimentError as e:
        print(f"[mini] ERROR: {e}", file=sys.stderr)
        return 1

