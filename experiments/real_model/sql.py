"""Text-to-SQL on Chinook with SmolLM2-135M-Instruct (``docs/real_model/analysis_plan.md``, "Text-to-SQL"): does
the model write SQL at all? Descriptive, one try: the first 20 shipped Chinook questions in the recipe's own prompt
(schema, question, format instruction), greedy, 128 new tokens, scored by the task's own verifier
(:func:`recipe.mrtpo.tasks.text_to_sql.score`: format, executable, execution_match). If few answers execute, no q
is measured on SQL (the plan), and the report says so.

    python -m experiments.real_model.sql [--n 20] [--out docs/real_model/sql.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "real_model" / "sql.json")
    a = ap.parse_args(argv)
    from data_prep.text_to_sql.build import build_chinook_rows
    from experiments.real_model.run import load
    from recipe.mrtpo.cpu import smollm2
    from recipe.mrtpo.tasks.text_to_sql import score

    torch.manual_seed(0)
    tok, model = load(smollm2.require())
    rows, _ = build_chinook_rows(limit=a.n)
    t0 = time.monotonic()
    tok.padding_side = "left"
    if tok.pad_token is None:  # the GGUF tokenizer has none; padding is masked anyway
        tok.pad_token = tok.eos_token
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    out, totals = [], {}
    for i in range(0, len(texts), 4):
        enc = tok(texts[i:i + 4], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=a.max_new, do_sample=False, pad_token_id=tok.pad_token_id)
        for j, seq in enumerate(gen[:, enc["input_ids"].shape[1]:]):
            row = rows[i + j]
            resp = tok.decode(seq, skip_special_tokens=True)
            res = score(resp, row["reward_model"]["ground_truth"], row.get("extra_info"))
            for k, v in res.scores.items():
                totals[k] = totals.get(k, 0.0) + v
            out.append({"id": row["extra_info"].get("id"), "response": resp, "scores": res.scores})
        print(f"[real-model sql] {len(out)}/{len(rows)} ({time.monotonic() - t0:.0f} s)", flush=True)
    summary = {"n": len(out), "mean": {k: v / max(len(out), 1) for k, v in totals.items()}, "greedy": True,
               "max_new_tokens": a.max_new, "items": out}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=1))
    print("[real-model sql] mean scores over", len(out), "questions:", json.dumps(summary["mean"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
