"""Benchmark: the replay's JS kernel vs a naive all-at-once JS vs verl's log-prob extraction, side by side.

    python benchmarks/bench_relevance.py [--vocab 151936] [--lengths 128 512 2048] [--dtype bf16] [--compiled]

For each response length T (batch 1, Qwen2's vocabulary by default) and the same pair of logits
tensors, it times and measures the peak extra memory (RSS sampled every millisecond above the level
before the call) of:

- ``replay_js``: :func:`recipe.mrtpo.core.relevance.relevance_against_reference` with one variant, the
  call the replay makes per row (``core.replay``): the relevance q of ``docs/design.md`` §1.2 and the
  sampled ids' log-probs under P_all, chunked, eager;
- ``compiled_js`` (with ``--compiled``): the same call as the replay makes it with ``mrtpo.compile_js``
  (P_all's log-normaliser from :func:`~recipe.mrtpo.core.relevance.logsumexp_rows` once, then the
  compiled kernel), timed after one compiling call;
- ``naive_js``: the textbook JSD with every [T, V] temporary in fp32 at once (skipped above --naive-max);
- ``verl_logprob``: ``verl.utils.torch_functional.logprobs_from_logits`` on one logits tensor, the
  log-softmax + gather verl already runs for old_log_probs (on CPU: its torch path);
- ``verl_logprob_x2``: the same on both tensors (the replay has two forwards' logits).

It prints the ratios replay_js / verl_logprob and replay_js / verl_logprob_x2 (and compiled_js /
verl_logprob). Goals (docs/performance.md): JS time <= 3x the log-prob extraction; the JS's peak extra
memory flat in T (one chunk). Run from the repository root with the recipe installed (``pip install -e .``).
"""

from __future__ import annotations

import argparse
import math
import os
import threading
import time
from typing import Optional

import psutil
import torch

from recipe.mrtpo.core.relevance import default_chunk_size, logsumexp_rows, relevance_against_reference


class PeakRSS:
    """Peak resident memory above the level at entry, sampled every millisecond in a thread."""

    def __enter__(self):
        self.proc = psutil.Process(os.getpid())
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def extra_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def naive_js(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(a.float(), -1)
    lq = torch.log_softmax(b.float(), -1)
    p, q = lp.exp(), lq.exp()
    lm = torch.log(0.5 * (p + q))
    jsd = 0.5 * (p * (lp - lm)).sum(-1) + 0.5 * (q * (lq - lm)).sum(-1)
    return (jsd / math.log(2)).clamp(0, 1).sqrt()


def measure(fn, repeats: int):
    fn()  # warm-up (allocator, thread pool)
    best = float("inf")
    peak = 0.0
    for _ in range(repeats):
        with PeakRSS() as m:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
        best = min(best, dt)
        peak = max(peak, m.extra_mib)
    return best, peak


def bench_length(T: int, V: int, dtype: torch.dtype, chunk: int, g: torch.Generator, args, logprobs_from_logits) -> str:
    """One row of the table: every kernel timed on the same pair of [1, T, V] logits drawn from ``g``."""
    a = (torch.randn(1, T, V, generator=g) * 2).to(dtype)
    b = (a.float() + torch.randn(1, T, V, generator=g) * 0.5).to(dtype)
    mask = torch.ones(1, T)
    ids = torch.randint(0, V, (1, T), generator=g)
    def replay_js(compiled: bool):  # as core.replay calls it for a row with one variant
        lse = logsumexp_rows(a[0], 1.0, chunk, compiled=True) if compiled else None
        return relevance_against_reference(a[0], b, ids[0], mask[0], chunk_size=chunk, compiled=compiled, ref_lse=lse)

    js = measure(lambda: replay_js(False), args.repeats)
    cjs = measure(lambda: replay_js(True), args.repeats) if args.compiled else None
    naive = measure(lambda: naive_js(a, b), args.repeats) if T <= args.naive_max else None
    lp = measure(lambda: logprobs_from_logits(a.float(), ids), args.repeats)
    lp2 = measure(lambda: (logprobs_from_logits(a.float(), ids), logprobs_from_logits(b.float(), ids)), args.repeats)

    def fmt(r):
        return f"{'skipped':>17}" if r is None else f"{r[0] * 1e3:8.1f}ms {r[1]:6.0f}MiB"

    line = f"{T:>6} | {fmt(js)} | {fmt(naive)} | {fmt(lp)} | {fmt(lp2)} | {js[0] / lp[0]:6.2f} | {js[0] / lp2[0]:8.2f}"
    if cjs is not None:
        line += f" | {fmt(cjs)} | {cjs[0] / lp[0]:6.2f} | {js[0] / cjs[0]:6.2f}"
    return line


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--naive-max", type=int, default=1024, help="skip the naive JS above this T (memory)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compiled", action="store_true", help="also time the torch.compile'd kernel (mrtpo.compile_js)")
    args = ap.parse_args(argv)

    from verl.utils.torch_functional import logprobs_from_logits

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    V = args.vocab
    chunk = args.chunk_size or default_chunk_size(V)
    print(f"V={V} dtype={args.dtype} chunk={chunk} positions threads={torch.get_num_threads()}")
    header = f"{'T':>6} | {'replay_js':>17} | {'naive_js':>17} | {'verl_logprob':>17} | {'logprob_x2':>17} | {'js/lp':>6} | {'js/lp_x2':>8}"
    if args.compiled:
        header += f" | {'compiled_js':>17} | {'cjs/lp':>6} | {'js/cjs':>6}"
    print(header)
    print("-" * len(header))
    g = torch.Generator().manual_seed(0)
    for T in args.lengths:
        print(bench_length(T, V, dtype, chunk, g, args, logprobs_from_logits))  # its tensors freed before the next T
    print("(time: best of --repeats; memory: peak RSS above the level before the call)")


if __name__ == "__main__":
    main()
