"""A few MRTPO steps of TRL's own trainer on CPU: SmolLM2-135M-Instruct on the recipe's instruction-following rows.

    python -m recipe.mrtpo.trl_adapter.demo [--out outputs/trl_demo] [--steps 3] [--prompts 4] [--generations 4]
                                            [--max-completion-length 64] [--beta 0.5] [--model PATH]

It builds ``--prompts`` instruction-following prompts with 2-3 real IFEval constraints each (``data_prep``, the
constraints the verl quickstart gives SmolLM2: a span-reading end phrase, title and postscript beside the
whole-response no-comma rule), makes one TRL reward function per constraint with the verifier's Z_k
(:func:`~recipe.mrtpo.trl_adapter.rewards.task_rewards`; a prompt without that constraint leaves its reward absent)
and runs ``MRTPOTrainer`` (replay from the first step: no warm-up) for ``--steps`` steps, printing per step the
per-reward scores (TRL's ``rewards/{name}/mean``) and the relevance statistics (per reward: the share of q's mass on
the top 10% of tokens, the largest token weight, the pairs replayed; the replay's time). The model is the one
``bash run_scripts/setup.sh`` provisions (``.assets/smollm2-135m-instruct``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONSTRAINTS = "startend:end_checker,detectable_format:title,detectable_content:postscript,punctuation:no_comma"


def build_rows(out: Path, prompts: int) -> Path:
    """The instruction-following rows (the verl quickstart's builder, the same seed), as a parquet file."""
    cmd = [sys.executable, "-m", "data_prep.instruction_following", "train", "--out-dir", str(out / "data"),
           "--constraints", CONSTRAINTS, "--min-constraints", "2", "--max-constraints", "3", "--limit", str(prompts),
           "--samples-per-prompt", "1", "--test-fraction", "0", "--seed", "0"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"trl demo: building the rows failed:\n{r.stderr[-2000:]}")
    return out / "data" / "train.parquet"


def reward_names(dataset) -> list[str]:
    """Every constraint id of the rows, in first-seen order: one TRL reward function each."""
    names: list[str] = []
    for row in dataset:
        for iid in row["reward_model"]["ground_truth"]["instruction_id_list"]:
            if iid not in names:
                names.append(iid)
    return names


def printer(names: list[str], t0: float):
    """A TRL callback printing one line per logged step: per-reward scores and relevance statistics."""
    from transformers import TrainerCallback

    class Print(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            print(f"[trl demo] step {state.global_step}  ({time.perf_counter() - t0:.0f} s)  beta_s {logs.get('mrtpo/beta', 0):.2f}  "
                  f"replay {logs.get('mrtpo/replay_time_s', 0):.1f} s  loss {logs['loss']:.4f}", flush=True)
            for n in names:
                score = logs.get(f"rewards/{n}/mean")
                top = logs.get(f"mrtpo/{n}/q_top10_share")
                print(f"    {n:36s} score {score if score is not None else float('nan'):.2f}  "
                      f"pairs replayed {logs.get(f'mrtpo/{n}/pairs_replayed', 0):.0f}  "
                      f"q top-10% share {top if top is not None else float('nan'):.2f}  "
                      f"w max {logs.get(f'mrtpo/{n}/weight_max', 1.0):.2f}", flush=True)

    return Print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "trl_demo")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--generations", type=int, default=4, help="completions per prompt (TRL's num_generations)")
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument("--beta", type=float, default=0.5, help="mrtpo_beta")
    ap.add_argument("--model", type=Path, default=None, help="default: the provisioned SmolLM2-135M-Instruct")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.mrtpo.cpu import smollm2
    from recipe.mrtpo.trl_adapter import MRTPOGRPOConfig, MRTPOTrainer, task_rewards

    try:
        path = a.model or smollm2.require()
    except FileNotFoundError as e:
        raise SystemExit(f"trl demo: {e}") from None
    torch.manual_seed(0)
    data = Dataset.from_parquet(str(build_rows(a.out, a.prompts)))
    names = reward_names(data)
    print(f"[trl demo] model {path}; {len(data)} prompts x {a.generations} completions a step; rewards: {', '.join(names)}", flush=True)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    args = MRTPOGRPOConfig(
        output_dir=str(a.out / "run"), max_steps=a.steps, per_device_train_batch_size=a.prompts * a.generations,
        num_generations=a.generations, max_completion_length=a.max_completion_length, learning_rate=1e-5,
        temperature=1.0, use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no", seed=0,
        gradient_checkpointing=False,  # TRL's default True recomputes every forward: a 135M model needs no memory saving
        mrtpo_beta=a.beta, mrtpo_warmup_steps=0,
    )
    trainer = MRTPOTrainer(model=model, reward_funcs=task_rewards(names), args=args, train_dataset=data,
                           processing_class=tok, callbacks=[printer(names, t0)])
    trainer.train()
    print(f"[trl demo] done: {a.steps} steps in {time.perf_counter() - t0:.0f} s (wall, set-up included)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
