"""Benchmark: tokens the replay forwards per response token, each prompt per sequence vs each distinct prompt once.

    python benchmarks/bench_shared_prompts.py [--responses 1024] [--budget 24576] [--seed 0]

On the length mixes of ``bench_packing`` (synthetic, seeded: a group of 4 responses shares its prompt
variants; ``if``, ``sql``, ``tool``) and a ``multi_turn`` mix (prompts 3,000-7,300 tokens, the BFCL range,
responses around 250), this plans the replay with the packed layout (``core.passes.plan_forwards``, every
sequence ``prompt | response`` whole: before) and with shared prompts (``core.shared_prompts``: after) and
prints, per mix, tokens forwarded per response token before and after, the limit (the batch's distinct
prompt-variant tokens plus the response tokens, per response token), after / limit,
the counts beside them, and the planning time of the shared pass per 1,024 responses (one run, no model).

Ends with ``shared prompts: after / limit <= X on every mix; planning <= Y s per 1,024 responses``.
"""

from __future__ import annotations

import argparse
import time
from typing import Optional

import numpy as np
import torch

from benchmarks.bench_packing import MIXES as PACKING_MIXES
from benchmarks.bench_packing import Mix, make_rows
from recipe.mrtpo.core.passes import PassSettings, forward_tokens, plan_forwards
from recipe.mrtpo.core.replay import plan_sequences
from recipe.mrtpo.core.shared_prompts import plan_shared_forwards, prompt_key, shared_tokens

MIXES = {**PACKING_MIXES, "multi_turn": Mix("multi_turn", (3000, 7300), 250, 2, (), "p_all")}


def prompt_ids(lens: torch.Tensor, group: int = 4, seed: int = 0) -> torch.Tensor:
    """[R, NV, P] left-padded int32 ids: each group's variant j the same random tokens (rows r // group)."""
    rng = np.random.default_rng(seed)
    R, NV = lens.shape
    P = int(lens.max())
    ids = np.zeros((R, NV, P), dtype=np.int32)
    for g in range(0, R, group):
        for v in range(NV):
            n = int(lens[g, v])
            ids[g : g + group, v, P - n :] = rng.integers(1, 150_000, n, dtype=np.int32)
    return torch.from_numpy(ids)


def bench_mix(mix: Mix, args) -> dict:
    lens, pairs, resp, _ = make_rows(mix, args.responses, args.seed)
    ids = prompt_ids(lens, seed=args.seed)
    seqs = plan_sequences(lens, pairs, resp)
    response = sum(s.resp_len for s in seqs)
    before = sum(forward_tokens(b, "packed") for b in plan_forwards(seqs, PassSettings(token_budget=args.budget, layout="packed")))
    t0 = time.perf_counter()
    batches = plan_shared_forwards(seqs, ids, args.budget, 8)
    plan_s = time.perf_counter() - t0
    after = sum(shared_tokens(b, [prompt_key(ids, s) for s in b]) for b in batches)
    distinct = {prompt_key(ids, s): s.prompt_len for s in seqs}
    limit = sum(distinct.values()) + response
    out = {"before": before / response, "after": after / response, "limit": limit / response, "ratio": after / limit,
           "plan_s_per_1024": plan_s * 1024 / args.responses}
    print(f"{mix.name:>10} | {out['before']:>6.2f} | {out['after']:>6.2f} | {out['limit']:>6.2f} | {out['ratio']:>7.3f} | "
          f"{before:>11,} | {after:>10,} | {limit:>10,} | {response:>9,} | {len(batches):>5} | {out['plan_s_per_1024']:>6.3f}")
    return out


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--responses", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=24_576, help="tokens per forward (log_prob_max_token_len_per_gpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    args = ap.parse_args(argv)
    print(f"replay of {args.responses} responses (groups of 4), token budget {args.budget:,} per forward; per response token:")
    print(f"{'mix':>10} | {'before':>6} | {'after':>6} | {'limit':>6} | {'after/l':>7} | {'before tok':>11} | "
          f"{'after tok':>10} | {'limit tok':>10} | {'resp tok':>9} | {'fwds':>5} | {'plan s':>6}")
    results = {name: bench_mix(MIXES[name], args) for name in args.mixes}
    print("(before: every sequence prompt | response, packed; after: each distinct prompt once per forward; limit: every "
          "distinct prompt variant of the batch once + the response tokens; plan s: per 1,024 responses)")
    print(f"shared prompts: after / limit <= {max(r['ratio'] for r in results.values()):.3f} on every mix; "
          f"planning <= {max(r['plan_s_per_1024'] for r in results.values()):.3f} s per 1,024 responses")
    return results


if __name__ == "__main__":
    main()
