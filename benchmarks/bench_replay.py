"""Benchmark: replay time / old_log_prob time against the number of prompt variants, side by side.

    python benchmarks/bench_replay.py [--configs tiny larger] [--variants 2 3 5] [--rows 8]
    python benchmarks/bench_replay.py --mix [--mix-lengths 64 128 ... 2048] [--no-compile-js]

For each model config (the CPU tests' tiny Qwen2, and a larger random Qwen2: hidden 512, 8 layers,
real 151,936 vocabulary) and the same batch of ``--rows`` responses, it times in one process:

- ``old_log_prob``: what verl's compute_log_prob does per batch: one forward of the padded
  [prompt | response] batch and ``logprobs_from_logits`` on the response positions;
- ``replay(NV)``: :func:`recipe.mrtpo.core.replay.replay_relevance` with NV prompt variants per response
  (P_all + NV - 1 variants P_minus_k: forwards plus the chunked JS, ``docs/design.md`` §1.2),
  micro-batch = NV.

It prints ``replay / old_log_prob`` and that ratio divided by NV (the cost per variant relative to
one log-prob pass). Goal (docs/performance.md): ratio <= 1.1 x NV, i.e. the JS costs little beyond the
forwards. Run from the repository root with the recipe installed (``pip install -e .``).

``--mix``: the batch users run, one row per response length from 64 to 2048 tokens in the same batch,
on the larger model with ``compile_js`` (as ``mrtpo.compile_js=True``). Both passes pack rows into
forwards by the same token budget (``--token-budget``, verl's ``log_prob_max_token_len_per_gpu``):
old_log_prob one [prompt | response] per row, the replay NV per row (P_all + NV - 1 P_minus_k, each its
own prompt followed by the row's own response). It prints both side by side and ends with
``mix: replay / (variants x old_log_prob) = X``; goal X <= 1.15.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Optional

import torch

CONFIGS = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128),
    "larger": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1408),
}


def build(name: str, tok_dir: str):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from recipe.mrtpo.cpu.tiny_model import QWEN2_VOCAB_SIZE, build_qwen2_tokenizer

    tok = AutoTokenizer.from_pretrained(build_qwen2_tokenizer(tok_dir))
    cfg = Qwen2Config(vocab_size=QWEN2_VOCAB_SIZE, tie_word_embeddings=True, max_position_embeddings=4096, **CONFIGS[name])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return tok, Qwen2ForCausalLM(cfg).eval()


def timed(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_replay(fwd, prompts: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor, nv: int, repeats: int) -> float:
    """Best time of :func:`replay_relevance` with NV prompt variants per response: P_all and NV - 1
    prompts with one sentence (16 tokens) removed each."""
    from recipe.mrtpo.core.replay import replay_relevance

    R, P = prompts.shape
    var = torch.zeros(R, nv, P, dtype=torch.long)
    lens = torch.zeros(R, nv, dtype=torch.long)
    for j in range(nv):
        L = P if j == 0 else P - 16
        var[:, j, P - L :] = prompts[:, :L]
        lens[:, j] = L
    K = nv - 1
    pair = torch.arange(1, nv).expand(R, K).clone()

    def replay():
        with torch.no_grad():
            return replay_relevance(fwd, var, lens, responses, mask, pair, micro_batch_size=nv)

    return timed(replay, repeats)


def bench_config(name: str, tok_dir: str, g: torch.Generator, args) -> int:
    """Print the rows of one model config (one per ``--variants``); returns its vocabulary size."""
    from verl.utils.torch_functional import logprobs_from_logits

    from recipe.mrtpo.core.replay import hf_forward

    _, model = build(name, tok_dir)
    R, P, T = args.rows, args.prompt_len, args.response_len
    V = model.config.vocab_size
    prompts = torch.randint(0, 150_000, (R, P), generator=g)
    responses = torch.randint(0, 150_000, (R, T), generator=g)
    mask = torch.ones(R, T, dtype=torch.long)
    fwd = hf_forward(model)

    def old_log_prob():
        ids = torch.cat([prompts, responses], 1)
        attn = torch.ones_like(ids)
        pos = torch.arange(P + T).expand(R, -1)
        with torch.no_grad():
            logits = fwd(ids, attn, pos, T + 1)[:, :T]
            return logprobs_from_logits(logits.float(), responses)

    t_olp = timed(old_log_prob, args.repeats)
    for nv in args.variants:
        t_rep = time_replay(fwd, prompts, responses, mask, nv, args.repeats)
        ratio = t_rep / t_olp
        print(f"{name:>7} | {t_olp * 1e3:10.0f}ms | {nv:>3} | {t_rep * 1e3:7.0f}ms | {ratio:10.2f} | {ratio / nv:6.2f}")
    return V


MIX_LENGTHS = (64, 128, 256, 512, 768, 1024, 1536, 2048)


def mix_batch(lengths, prompt_len: int, nv: int, g: torch.Generator):
    """Rows sorted by response length: P_all and NV - 1 variants (one 16-token sentence removed each,
    left-padded [R, NV, P]), responses right-padded [R, T], and their masks."""
    R, T, P = len(lengths), max(lengths), prompt_len
    prompts = torch.randint(0, 150_000, (R, P), generator=g)
    responses = torch.randint(0, 150_000, (R, T), generator=g)
    mask = torch.zeros(R, T, dtype=torch.long)
    for r, n in enumerate(sorted(lengths)):
        mask[r, :n] = 1
    var = torch.zeros(R, nv, P, dtype=torch.long)
    lens = torch.zeros(R, nv, dtype=torch.long)
    for j in range(nv):
        L = P - 16 * min(j, 1)
        keep = torch.cat([prompts[:, : 16 * (j - 1)], prompts[:, 16 * j :]], 1) if j else prompts
        var[:, j, P - L :] = keep[:, :L]
        lens[:, j] = L
    pair = torch.arange(1, nv).expand(R, nv - 1).clone()
    return var, lens, responses, mask, pair


def old_log_prob_packed(fwd, prompts: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor, budget: int) -> torch.Tensor:
    """verl's compute_log_prob on these rows: [prompt | response] per row, rows packed into forwards of at
    most ``budget`` padded tokens (dynamic batch size), log-probs of each row's response tokens."""
    from verl.utils.torch_functional import logprobs_from_logits

    R, P = prompts.shape
    n = mask.sum(-1).tolist()
    out = torch.zeros(mask.shape)
    r = 0
    while r < R:
        rows = [r]
        while r + len(rows) < R and (len(rows) + 1) * (P + n[r + len(rows)]) <= budget:
            rows.append(r + len(rows))
        T = max(n[i] for i in rows)
        ids = torch.zeros(len(rows), P + T, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for b, i in enumerate(rows):  # left-padded so that every response ends at the last position
            ids[b, T - n[i] :] = torch.cat([prompts[i], responses[i, : n[i]]])
            attn[b, T - n[i] :] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = fwd(ids, attn, pos, T + 1)[:, :T]
        for b, i in enumerate(rows):
            out[i, : n[i]] = logprobs_from_logits(logits[b, T - n[i] :].float(), responses[i, : n[i]])
        del logits
        r += len(rows)
    return out


def bench_mix(args) -> float:
    """The --mix run (module docstring); returns X = replay / (NV x old_log_prob)."""
    from recipe.mrtpo.core.replay import hf_forward, replay_relevance

    g = torch.Generator().manual_seed(0)
    nv, budget, lengths = args.mix_variants, args.token_budget, sorted(args.mix_lengths)
    with tempfile.TemporaryDirectory() as tmp:
        _, model = build(args.mix_config, tmp)
    fwd = hf_forward(model)
    var, lens, responses, mask, pair = mix_batch(lengths, args.prompt_len, nv, g)
    p_all = var[:, 0]

    def olp():
        with torch.no_grad():
            return old_log_prob_packed(fwd, p_all, responses, mask, budget)

    def replay(fused: bool = False):
        # fused: the old_log_prob step's replay (P_all is the rollout prompt: its forward yields old_log_probs and entropy)
        with torch.no_grad():
            return replay_relevance(fwd, var, lens, responses, mask, pair, micro_batch_size=nv, token_budget=budget,
                                    compiled_js=args.compile_js, entropy=fused,
                                    logprob_variant=torch.zeros(len(lengths), dtype=torch.long) if fused else None)

    t0 = time.perf_counter()
    counts = replay()  # the first replay compiles the JS kernel (once per process)
    first = time.perf_counter() - t0
    olp()
    t_olp = t_rep = t_fused = float("inf")
    for _ in range(args.repeats):  # interleaved, so that a load change on the machine hits all passes alike
        t0 = time.perf_counter()
        olp()
        t_olp = min(t_olp, time.perf_counter() - t0)
        t0 = time.perf_counter()
        replay()
        t_rep = min(t_rep, time.perf_counter() - t0)
        t0 = time.perf_counter()
        replay(fused=True)
        t_fused = min(t_fused, time.perf_counter() - t0)
    x = t_rep / (nv * t_olp)
    print(f"threads={torch.get_num_threads()} config={args.mix_config} rows={len(lengths)} prompt={args.prompt_len} "
          f"responses={lengths} tokens={sum(lengths)} NV={nv} token_budget={budget} compile_js={args.compile_js} (fp32, CPU)")
    print(f"{'old_log_prob':>12} | {'x NV':>9} | {'replay':>9} | {'first replay':>12}")
    print(f"{t_olp * 1e3:10.0f}ms | {nv * t_olp * 1e3:7.0f}ms | {t_rep * 1e3:7.0f}ms | {first * 1e3:10.0f}ms")
    print(f"(best of {args.repeats}, the passes interleaved; first replay includes compiling the JS; goal X <= 1.15)")
    print(f"replay tokens forwarded / existing = {int(counts['tokens_forwarded']) / int(counts['tokens_existing']):.2f} "
          f"({int(counts['n_forwards'])} forwards)")
    print(f"fused step (the replay yields old_log_probs and entropy): {t_fused * 1e3:.0f}ms "
          f"(was old_log_prob + replay = {(t_olp + t_rep) * 1e3:.0f}ms)")
    print(f"mix: replay / (variants x old_log_prob) = {x:.2f}")
    return x


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["tiny", "larger"], choices=sorted(CONFIGS))
    ap.add_argument("--variants", nargs="+", type=int, default=[2, 3, 5])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--response-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mix", action="store_true", help="the mixed-length batch (module docstring)")
    ap.add_argument("--mix-config", default="larger", choices=sorted(CONFIGS))
    ap.add_argument("--mix-lengths", nargs="+", type=int, default=list(MIX_LENGTHS))
    ap.add_argument("--mix-variants", type=int, default=3, help="NV: P_all + NV - 1 variants per row")
    ap.add_argument("--token-budget", type=int, default=4096, help="padded tokens per forward (both passes)")
    ap.add_argument("--no-compile-js", dest="compile_js", action="store_false")
    args = ap.parse_args(argv)
    if args.mix:
        bench_mix(args)
        return

    print(f"threads={torch.get_num_threads()} rows={args.rows} prompt={args.prompt_len} response={args.response_len} (fp32, CPU)")
    print(f"{'config':>7} | {'old_log_prob':>12} | {'NV':>3} | {'replay':>9} | {'replay/olp':>10} | {'/NV':>6}")
    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            V = bench_config(name, tmp, g, args)  # the model freed before the next config
    print(f"(best of {args.repeats}; V = {V}; goal: replay/old_log_prob <= 1.1 x NV)")


if __name__ == "__main__":
    main()
