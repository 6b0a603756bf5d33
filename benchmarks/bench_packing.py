"""Benchmark: the tokens the actor-side no-grad passes forward, over the tokens that exist (no model, counts only).

    python benchmarks/bench_packing.py [--responses 512] [--budget 24576] [--seed 0]

For the length mixes of the run scripts (7B: ``log_prob_max_token_len_per_gpu`` 24,576, responses capped
at 1,024 tokens) this plans the replay (``core.replay.plan_sequences``) and the OPSD teacher pass (one P_all
sequence per row) with the pass engine's packer (``core.passes.plan_forwards``) and counts, per layout:

- ``forwarded / existing``: the tokens the forwards hold (padding included) over the tokens of the
  sequences themselves (prompt + response up to its last valid token);
- ``kept / needed``: logit rows kept over the response positions the reductions read;
- ``repeat``: the share of the replay's existing tokens that repeat verl's ``old_log_prob`` forward (the
  row's variant that is the rollout prompt: P_all in instruction following, P_minus_correctness in tool
  calling); with the fused step (``trainer._compute_old_log_prob``, both new layouts) that forward IS
  old_log_prob's, so none of the replay's tokens repeat it (the samples no replayed variant covers get one
  forward of their rollout prompt in the same pass, in place of verl's, not counted here);
- ``forwards / row``: forwards per replayed row.

Layouts: ``padded`` (today's: micro-batches in arrival order, each padded to its longest), ``sorted``
(rows sorted by length, what ``auto`` picks without flash-attention) and ``packed`` (one row per forward,
restarting position ids, logits only at response positions: ``auto`` under flash-attention's varlen path).

Mixes (synthetic, seeded; a group of 4 responses shares its prompt; half the pairs replayed):

- ``if``: prompts 150-400 tokens, responses log-normal around 330 tokens, 3 prompt-placed rewards;
- ``sql``: schema prompts 800-3,000 tokens, responses around 150, 3 prompt-placed and 2 appended rewards
  (P_all carries the appended block, ~120 tokens);
- ``tool``: tool-doc prompts 500-1,500 tokens, responses around 120, format (prompt) + correctness
  (appended, ~60 tokens): P_minus_correctness is the rollout prompt.

Ends with ``packing: forwarded / existing tokens = X (was Y); forwards per replayed row = Z`` for the IF mix.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from recipe.mrtpo.core.passes import PassSettings, forward_tokens, plan_forwards, row_sequences
from recipe.mrtpo.core.replay import plan_sequences

LAYOUTS = ("padded", "sorted", "packed")


@dataclass
class Mix:
    name: str
    prompt: tuple[int, int]  # rollout prompt length range
    response_median: int
    prompt_rewards: int  # each removes a sentence of ~12-25 tokens from P_all
    appended: tuple[int, ...]  # appended contexts' token lengths (in P_all's verifier block)
    rollout_is: str  # "p_all" | "p_minus_appended" (the only Z that differs is appended)


MIXES = {
    "if": Mix("if", (150, 400), 330, 3, (), "p_all"),
    "sql": Mix("sql", (800, 3000), 150, 3, (60, 60), "none"),
    "tool": Mix("tool", (500, 1500), 120, 1, (60,), "p_minus_appended"),
}


def make_rows(mix: Mix, n_resp: int, seed: int, cap: int = 1024):
    """Packed replay inputs (lengths only): variant_lens [R, NV], pair_variant [R, K], resp_lens [R], the
    rollout-prompt variant of each row (-1: none)."""
    rng = np.random.default_rng(seed)
    K = mix.prompt_rewards + len(mix.appended)
    groups = n_resp // 4
    block = 8 + sum(mix.appended) if mix.appended else 0  # the verifier block's header + contexts
    lens, pairs, resp, rollout = [], [], [], []
    for _ in range(groups):
        base = int(rng.integers(*mix.prompt))
        cuts = [int(rng.integers(12, 26)) for _ in range(mix.prompt_rewards)]
        p_all = base + block
        # variant j = 1..K: P_all without Z_j (prompt-placed: its sentence; appended: its context, or the whole
        # block when it is the only one)
        minus = [p_all - c for c in cuts] + [p_all - (a if len(mix.appended) > 1 else block) for a in mix.appended]
        for _ in range(4):
            n = int(min(cap, max(8, rng.lognormal(np.log(mix.response_median), 0.6))))
            want = rng.random(K) < 0.5
            if not want.any():
                want[int(rng.integers(K))] = True
            lens.append([p_all, *minus])
            pairs.append([k + 1 if want[k] else -1 for k in range(K)])
            resp.append(n)
            if mix.rollout_is == "p_all":
                rollout.append(0)
            elif mix.rollout_is == "p_minus_appended":
                v = K  # the appended one is the last variant
                rollout.append(v if want[K - 1] else -1)
            else:
                rollout.append(-1)
    return torch.tensor(lens), torch.tensor(pairs), torch.tensor(resp), torch.tensor(rollout)


def count(seqs, settings: PassSettings) -> dict:
    batches = plan_forwards(seqs, settings)
    packed = settings.layout == "packed"
    return {
        "forwarded": sum(forward_tokens(b, settings.layout) for b in batches),
        "existing": sum(s.length for s in seqs),
        "kept": sum(sum(s.resp_len for s in b) if packed else len(b) * (max(s.resp_len for s in b) + 1) for b in batches),
        "needed": sum(s.resp_len for s in seqs),
        "forwards": len(batches),
    }


def bench_mix(mix: Mix, args) -> dict:
    lens, pairs, resp, rollout = make_rows(mix, args.responses, args.seed)
    seqs = plan_sequences(lens, pairs, resp)
    rows = len({s.row for s in seqs})
    repeat = sum(s.length for s in seqs if int(rollout[s.row]) == s.variant)
    teacher = [s for r in range(lens.shape[0]) for s in row_sequences(r, [0], [int(lens[r, 0])], int(resp[r]))]
    out = {}
    for layout in LAYOUTS:
        st = PassSettings(token_budget=args.budget, layout=layout)
        rc, tc = count(seqs, st), count(teacher, st)
        out[layout] = rc
        fused = layout != "padded"  # the new step (sorted or packed) runs fused with old_log_prob
        print(f"{mix.name:>5} | {layout:>7} | {rc['forwarded'] / rc['existing']:>9.2f} | {rc['kept'] / rc['needed']:>6.2f} | "
              f"{(0.0 if fused else repeat / rc['existing']):>6.0%} | {rc['forwards'] / max(1, rows):>7.3f} | "
              f"{tc['forwarded'] / tc['existing']:>9.2f} | {tc['kept'] / tc['needed']:>6.2f} | {rc['forwarded']:>10,} | {rc['existing']:>10,}")
    return out


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--responses", type=int, default=512)
    ap.add_argument("--budget", type=int, default=24_576, help="tokens per forward (log_prob_max_token_len_per_gpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    args = ap.parse_args(argv)
    print(f"{args.responses} responses, token budget {args.budget:,} per forward, half the pairs replayed")
    print(f"{'mix':>5} | {'layout':>7} | {'replay f/e':>9} | {'kept':>6} | {'repeat':>6} | {'fwd/row':>7} | "
          f"{'teach f/e':>9} | {'kept':>6} | {'forwarded':>10} | {'existing':>10}")
    results = {name: bench_mix(MIXES[name], args) for name in args.mixes}
    print("(f/e: tokens forwarded / existing; kept: logit rows kept / needed; repeat: replay tokens that repeat "
          "old_log_prob's forward; padded = today's step, sorted / packed = the new one, fused with old_log_prob)")
    if "if" in results:
        new, old = results["if"]["packed"], results["if"]["padded"]
        rows = len({s.row for s in plan_sequences(*make_rows(MIXES["if"], args.responses, args.seed)[:3])})
        print(f"packing: forwarded / existing tokens = {new['forwarded'] / new['existing']:.2f} "
              f"(was {old['forwarded'] / old['existing']:.2f}); forwards per replayed row = {new['forwards'] / max(1, rows):.3f}")


if __name__ == "__main__":
    main()
