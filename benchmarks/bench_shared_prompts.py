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
from recipe.mrtpo.core.attention_cost import (
    ZERO,
    ModelShape,
    attention_flops,
    dense_counts,
    forward_flops,
    layout_counts,
    segmented_counts,
    shared_pays,
    tree_counts,
)
from recipe.mrtpo.core.passes import PassSettings, forward_tokens, plan_forwards, response_lengths
from recipe.mrtpo.core.replay import plan_sequences
from recipe.mrtpo.core.shared_prompts import PromptTree, plan_shared_forwards, prompt_key, shared_forward_inputs, shared_tokens
from recipe.mrtpo.core.tree_mask import TreeMask

#: the scripts' models (their configs' shapes): the cost model's FLOPs
SHAPES = {"1.5B": ModelShape(1536, 28, 8960, 151936, 12, 2, 128), "7B": ModelShape(3584, 28, 18944, 152064, 28, 4, 128)}


def group_split(seqs: list, ids, uid: list, budget: int) -> tuple[int, int]:
    """(groups, groups over the budget): a group's shared length (distinct prompts once + its responses)."""
    by: dict = {}
    for s in seqs:
        by.setdefault(uid[s.row], []).append(s)
    over = sum(1 for g in by.values() if shared_tokens(g, [prompt_key(ids, s) for s in g]) > budget)
    return len(by), over


def attention_cost(batches: list, ids, responses) -> dict:
    """Per shared forward: linear tokens, attention pairs computed (128 x 128 tiles) and exact for unshared varlen (the
    forward's sequences packed under flash-attention), the old dense [L, L] mask (SDPA: every pair) and the
    block-sparse tree, and the tree computed segment by segment (the reference for a tiled kernel's rounding); per
    shape of :data:`SHAPES` their FLOPs, the cost model's choice and the attention's share of the chosen FLOPs; the
    pass's totals."""
    tot = {"varlen": ZERO, "dense": ZERO, "tree": ZERO, "segmented": ZERO}
    small = {64: 0, 32: 0}  # the tree's tile pairs at smaller tiles (a kernel's other tile sizes)
    flops = {k: {"varlen": 0.0, "dense": 0.0, "chosen": 0.0, "attention": 0.0, "unshared": 0, "worst": 0.0} for k in SHAPES}
    forwards = []
    for mb in batches:
        tree = shared_forward_inputs(mb, ids, responses)[1]
        c = {"varlen": layout_counts(mb, "packed"), "tree": tree_counts(tree)}
        c["dense"] = dense_counts(tree.length, c["tree"].exact_pairs)
        c["segmented"] = segmented_counts(tree)
        for b in small:
            small[b] += TreeMask(tree.starts, tree.ends, tree.parent, tree.length, b).block_counts().tile_pairs
        for k in tot:
            tot[k] += c[k]
        for name, shape in SHAPES.items():
            f = {k: forward_flops(shape, c[k]) for k in c}
            pays = shared_pays(shape, c["tree"], c["varlen"])
            flops[name]["varlen"] += f["varlen"]
            flops[name]["dense"] += f["dense"]
            flops[name]["chosen"] += f["tree"] if pays else f["varlen"]
            flops[name]["attention"] += attention_flops(shape, c["tree"] if pays else c["varlen"])
            flops[name]["unshared"] += not pays
            flops[name]["worst"] = max(flops[name]["worst"], f["tree"] / f["varlen"])
        forwards.append(c)
    return {"totals": tot, "flops": flops, "forwards": forwards, "small": small}


def print_cost(results: dict, per_forward: bool) -> None:
    """The attention-cost table (:func:`attention_cost`), a row per mix and shape."""
    print("attention cost per replay (sums over its shared forwards; pairs in 128 x 128 tiles, M = 1e6; FLOPs 1e15):")
    print(f"{'mix':>10} | {'shape':>5} | {'tokens varlen / tree':>20} | {'pairs varlen / dense / tree':>27} | {'tree/exact':>10} | "
          f"{'@64 / @32':>11} | {'seg/exact':>9} | {'tree/seg':>8} | {'PFLOP varlen / dense / chosen':>29} | {'attn %':>6} | {'chosen/vl':>9} | {'dense/vl':>8} | {'worst fwd':>9} | {'unshared':>8}")
    for mix, r in results.items():
        t, c = r["cost"]["totals"], r["cost"]
        for name, f in c["flops"].items():
            print(f"{mix:>10} | {name:>5} | {t['varlen'].tokens:>9,} / {t['tree'].tokens:>8,} | {t['varlen'].pairs / 1e6:>8.0f} / "
                  f"{t['dense'].pairs / 1e6:>7.0f} / {t['tree'].pairs / 1e6:>6.0f} | {t['tree'].pairs / t['tree'].exact_pairs:>10.3f} | "
                  f"{c['small'][64] / t['tree'].exact_pairs:>5.3f} / {c['small'][32] / t['tree'].exact_pairs:>5.3f} | "
                  f"{t['segmented'].pairs / t['segmented'].exact_pairs:>9.3f} | {t['tree'].pairs / t['segmented'].pairs:>8.3f} | "
                  f"{f['varlen'] / 1e15:>9.3f} / {f['dense'] / 1e15:>7.3f} / {f['chosen'] / 1e15:>7.3f} | "
                  f"{100 * f['attention'] / f['chosen']:>5.1f}% | "
                  f"{f['chosen'] / f['varlen']:>9.3f} | {f['dense'] / f['varlen']:>8.3f} | {f['worst']:>9.3f} | "
                  f"{f['unshared']:>3}/{len(c['forwards']):<4}")
        if per_forward:
            for i, fc in enumerate(c["forwards"]):
                print(f"{mix:>10} | fwd {i:>3} | tokens {fc['varlen'].tokens:,} / {fc['tree'].tokens:,} | pairs (M) "
                      f"{fc['varlen'].pairs / 1e6:.1f} / {fc['dense'].pairs / 1e6:.1f} / {fc['tree'].pairs / 1e6:.1f} | tree exact "
                      f"{fc['tree'].exact_pairs / 1e6:.1f}")
    print("(varlen: each forward's sequences packed, every prompt whole, each sequence's causal triangle; dense: the "
          "shared row under the old [L, L] mask, all L^2 pairs; tree: the block-sparse mask's tiles; tree/exact: its "
          "tiles' pairs over the tree's allowed pairs (@64 / @32: at 64- and 32-token tiles); seg: the tree computed segment "
          "by segment (each segment's queries over its ancestors' gathered keys and its own: a cascade / PrefixGrouper "
          "kernel's tiles, the same rounding varlen pays); attn %: the attention's share of the chosen FLOPs; chosen: per forward the tree where the cost model says it pays, "
          "else varlen; worst fwd: the largest tree / varlen FLOPs of one forward; unshared: forwards the cost model "
          "runs unshared / forwards)")


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
    out["cost"] = attention_cost(batches, ids, plan.inputs["responses"])
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
    ap.add_argument("--per-forward", action="store_true", help="also print every shared forward's counts")
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
    print_cost(results, args.per_forward)
    tiles = max(r["cost"]["totals"]["tree"].pairs / r["cost"]["totals"]["tree"].exact_pairs for r in results.values())
    chosen = max(r["cost"]["flops"]["7B"]["chosen"] / r["cost"]["flops"]["7B"]["varlen"] for r in results.values())
    dense = max(r["cost"]["flops"]["7B"]["dense"] / r["cost"]["flops"]["7B"]["varlen"] for r in results.values())
    seg = max(r["cost"]["totals"]["segmented"].pairs / r["cost"]["totals"]["segmented"].exact_pairs for r in results.values())
    share = max(r["cost"]["flops"]["7B"]["attention"] / r["cost"]["flops"]["7B"]["chosen"] for r in results.values())
    print(f"attention: tree tiles / exact pairs <= {tiles:.3f} on every mix (segment by segment: <= {seg:.3f}); at 7B "
          f"chosen / varlen FLOPs <= {chosen:.3f} (the old dense mask: up to {dense:.3f}), attention <= {100 * share:.1f}% "
          "of the chosen FLOPs")
    worst = max(r["plan_s_per_1024"] + r["shared_plan_s_per_1024"] for r in results.values())
    worst_median = max(r["plan_median_s_per_1024"] for r in results.values())
    print(f"shared prompts: after / limit <= {max(r['ratio'] for r in results.values()):.3f} on every mix; "
          f"planning <= {worst:.3f} s per 1,024 responses (best of {args.repeats}; median {worst_median:.3f})")
    return results


if __name__ == "__main__":
    main()
