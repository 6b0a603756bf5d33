"""Benchmark: tokens the replay forwards per response token on the shipped data, each prompt per sequence vs
each forward's distinct prompts as a prefix tree, against the limit; and the planning time.

    python benchmarks/bench_shared_prompts.py [--responses 1024] [--n 4] [--budget 24576] [--seed 0] [--repeats 3] [--mixes ...]

On the shipped mixes (``benchmarks/shipped_mixes.py``: the IF, SQL (Chinook), tool-calling (BFCL) and BFCL
multi-turn rows the offline builders write, groups of ``--n`` responses, Z_k from each task's verifier, the
trainer's planner over the real Qwen2 tokenizer), this plans the replay with the packed layout
(``core.passes.plan_forwards``, every sequence ``prompt | response`` whole, the tokens that exist: before) and
with shared prompts (``core.shared_prompts.plan_shared_forwards``, a forward's distinct prompts as a prefix tree:
after), both within ``--budget`` tokens per
forward (the 7B scripts' ``log_prob_max_token_len_per_gpu``), and prints per mix: tokens forwarded per response
token before and after, the limit (the batch's distinct prompt-variant tokens plus the response tokens, per
response token), after / limit, the floor (the batch's distinct prompts as one prefix tree plus the responses:
what no layout goes below), the counts beside them, the mean P_all, what stops a group from sharing
one forward (``split``: groups whose distinct prompts and responses exceed the budget, so they are split between
rows and a prompt repeats in each part), and the planning time per 1,024 responses: the driver's plan
(``build_replay_plan``: variants built, rendered and packed, each row's rollout prompt matched to its variants;
wall and CPU seconds) and the shared forwards' plan, side by side
(one run; each the best of ``--repeats`` plans, each with fresh render caches as a training step's, the
median of the planning total beside it: on a VM the first touch of the packed ids' fresh pages, 150 MB for
multi-turn, costs from 0.01 to 0.35 s a plan).

Ends with ``shared prompts: after / limit <= X on every mix; planning <= Y s per 1,024 responses (best of R; median M)``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

from benchmarks import shipped_mixes
from recipe.mrtpo.core.passes import PassSettings, forward_tokens, plan_forwards, response_lengths
from recipe.mrtpo.core.replay import plan_sequences
from recipe.mrtpo.core.shared_prompts import PromptTree, plan_shared_forwards, prompt_key, shared_tokens


def group_split(seqs: list, ids, uid: list, budget: int) -> tuple[int, int]:
    """(groups, groups over the budget): a group's shared length (distinct prompts once + its responses)."""
    by: dict = {}
    for s in seqs:
        by.setdefault(uid[s.row], []).append(s)
    over = sum(1 for g in by.values() if shared_tokens(g, [prompt_key(ids, s) for s in g]) > budget)
    return len(by), over


def bench_mix(mix: str, rows: list, tok, args) -> dict:
    batch = shipped_mixes.make_batch(mix, rows, args.responses, args.n, args.seed)
    batch["rollout_prompts"] = shipped_mixes.rollout_prompts(batch, tok)  # the trainer matches each row's to its variants
    walls, cpus = [], []
    for _ in range(args.repeats):  # each a step's plan: fresh render caches in a warm process
        c0 = time.process_time()  # CPU seconds of this process, its tokenizer threads included: the work, whatever the load
        plan, wall = shipped_mixes.plan(batch, tok)
        cpus.append(time.process_time() - c0)
        walls.append(wall)
    plan_s, plan_cpu = min(walls), min(cpus)
    ids, lens, pair = plan.inputs["variant_ids"], plan.inputs["variant_lens"], plan.inputs["pair_variant"]
    seqs = plan_sequences(lens, pair, response_lengths(plan.inputs["response_mask"]))
    response = sum(s.resp_len for s in seqs)
    before = sum(forward_tokens(b, "packed") for b in plan_forwards(seqs, PassSettings(token_budget=args.budget, layout="packed")))
    shared = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        batches = plan_shared_forwards(seqs, ids, args.budget, 8)
        shared.append(time.perf_counter() - t0)
    shared_s = min(shared)
    total_median = statistics.median(w + s for w, s in zip(walls, shared))
    after = sum(shared_tokens(b, [prompt_key(ids, s) for s in b]) for b in batches)
    distinct = {prompt_key(ids, s): s.prompt_len for s in seqs}
    limit = sum(distinct.values()) + response
    tree = PromptTree()
    tree.add(list(distinct))
    floor = tree.tokens + response  # the batch's prompts as one prefix tree: no layout forwards fewer
    groups, split = group_split(seqs, ids, [batch["uid"][i] for i in plan.rows], args.budget)
    prompt = float(lens[:, 0].float().mean())  # P_all, the longest variant of a row
    per = 1024 / len(batch["uid"])
    out = {"before": before / response, "after": after / response, "limit": limit / response, "ratio": after / limit,
           "floor": floor / response,
           # rows whose rollout prompt is one of their variants (IF: P_all; tool calling: P_minus_correctness)
           "rollout_matched": sum(v >= 0 for v in plan.rollout_variant) / max(1, len(plan.rows)),
           "plan_s_per_1024": plan_s * per, "plan_cpu_s_per_1024": plan_cpu * per, "shared_plan_s_per_1024": shared_s * per,
           "plan_median_s_per_1024": total_median * per, "split": split, "groups": groups}
    print(f"{mix:>10} | {out['before']:>6.2f} | {out['after']:>6.2f} | {out['limit']:>6.2f} | {out['ratio']:>7.3f} | "
          f"{out['floor']:>6.2f} | "
          f"{before:>11,} | {after:>10,} | {limit:>10,} | {response:>9,} | {int(prompt):>6,} | {len(batches):>5} | "
          f"{split:>3}/{groups:<3} | {out['plan_s_per_1024']:>6.3f} | {out['plan_cpu_s_per_1024']:>8.3f} | "
          f"{out['shared_plan_s_per_1024']:>6.3f}")
    return out


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--responses", type=int, default=1024)
    ap.add_argument("--n", type=int, default=4, help="responses per prompt (rollout.n)")
    ap.add_argument("--budget", type=int, default=24_576, help="tokens per forward (log_prob_max_token_len_per_gpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="plans per mix, each with fresh caches: the times are the best of them")
    ap.add_argument("--mixes", nargs="+", default=list(shipped_mixes.MIXES), choices=list(shipped_mixes.MIXES))
    args = ap.parse_args(argv)
    tok = shipped_mixes.tokenizer()
    print(f"replay of {args.responses} responses (groups of {args.n}) on the shipped data, token budget {args.budget:,} "
          "per forward; per response token:")
    print(f"{'mix':>10} | {'before':>6} | {'after':>6} | {'limit':>6} | {'after/l':>7} | {'floor':>6} | "
          f"{'before tok':>11} | {'after tok':>10} | {'limit tok':>10} | {'resp tok':>9} | {'P_all':>6} | {'fwds':>5} | {'split':>7} | "
          f"{'plan s':>6} | {'plan cpu':>8} | {'share s':>6}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mix in args.mixes:
            results[mix] = bench_mix(mix, shipped_mixes.load_rows(mix, Path(tmp)), tok, args)
    print("(before: every sequence prompt | response, packed; after: each forward's distinct prompts as a prefix tree; "
          "limit: every distinct prompt variant of the batch once + the response tokens; floor: the batch's distinct "
          "prompts as one prefix tree + the response tokens; P_all: its mean length, tokens; "
          "split: groups over the budget / groups; plan s: the driver's replay plan (wall), plan cpu: its CPU seconds "
          "(the work, whatever the machine's load), share s: the shared forwards' plan, all per 1,024 responses, the best "
          f"of {args.repeats} plans)")
    worst = max(r["plan_s_per_1024"] + r["shared_plan_s_per_1024"] for r in results.values())
    worst_median = max(r["plan_median_s_per_1024"] for r in results.values())
    print(f"shared prompts: after / limit <= {max(r['ratio'] for r in results.values()):.3f} on every mix; "
          f"planning <= {worst:.3f} s per 1,024 responses (best of {args.repeats}; median {worst_median:.3f})")
    return results


if __name__ == "__main__":
    main()
