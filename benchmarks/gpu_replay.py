"""GPU benchmark of the replay at a 7B shape: replay / old_log_prob per variant, compiled JS, peak memory.

    python benchmarks/gpu_replay.py                      # Qwen2.5-7B's shape, bf16, one GPU (< 8 min on an H200)
    python benchmarks/gpu_replay.py --device cpu --dtype fp32 --hidden 64 --layers 2 --heads 4 --kv-heads 2 \\
        --intermediate 128 --vocab 1000 --lengths 8 16 --rows 2 --prompt-len 16 --no-compile-js   # a smoke run

Needs torch and transformers only (no verl, Ray or vLLM): the model is a random-weight Qwen2 of
Qwen2.5-7B's shape (hidden 3584, 28 layers, 28 query / 4 KV heads, intermediate 18944, vocabulary 152064)
built on the device in ``--dtype``, and the replay is the project's own
:func:`recipe.mrtpo.core.replay.replay_relevance` (imported from the repository tree beside this file).

For each response length T of ``--lengths`` (``--rows`` responses of exactly T tokens) and for the mixed
batch (one response per length of ``--mix-lengths``, 64 to 4096 tokens), it times in one process:

- ``old_log_prob``: verl's compute_log_prob on those rows: [prompt | response] forwards packed by the token
  budget (``--token-budget``, verl's ``log_prob_max_token_len_per_gpu``), log-probs of the response tokens
  from fp32 log-softmax rows;
- ``replay``: ``replay_relevance`` with NV = ``--variants`` prompt variants per row (P_all + NV - 1 with one
  32-token sentence removed), the same token budget, the JS compiled (``torch.compile``: Triton on GPU)
  unless ``--no-compile-js``;

and prints ``replay / (NV x old_log_prob)`` (1.0: each variant costs one log-prob pass) and the peak memory
of each (``torch.cuda.max_memory_allocated``, weights included). The last line is
``gpu mix: replay / (variants x old_log_prob) = X``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the repository tree, installed or not
    sys.path.insert(0, str(REPO))

from recipe.mrtpo.core.replay import hf_forward, replay_relevance  # noqa: E402  (torch-only core)

QWEN25_7B = dict(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MIX_LENGTHS = (64, 128, 256, 512, 1024, 2048, 3072, 4096)


def build_model(args):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      intermediate_size=args.intermediate, max_position_embeddings=32768, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[args.dtype])  # parameters created in the run's dtype (no fp32 copy of 7B)
    try:
        with torch.device(args.device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def make_rows(lengths, prompt_len: int, nv: int, vocab: int, g: torch.Generator, device: str):
    """Rows sorted by response length: variants [R, NV, P] (left-padded; variant j > 0 lacks tokens
    32(j-1)..32j of P_all), responses [R, T], mask, pair_variant [R, NV - 1]."""
    lengths = sorted(lengths)
    R, T, P = len(lengths), max(lengths), prompt_len
    prompts = torch.randint(0, vocab, (R, P), generator=g)
    responses = torch.randint(0, vocab, (R, T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    cut = min(32, P // 2)
    var = torch.zeros(R, nv, P, dtype=torch.long)
    lens = torch.zeros(R, nv, dtype=torch.long)
    for j in range(nv):
        keep = prompts if j == 0 else torch.cat([prompts[:, : cut * (j - 1)], prompts[:, cut * j :]], 1)
        var[:, j, P - keep.shape[1] :] = keep
        lens[:, j] = keep.shape[1]
    pair = torch.arange(1, nv).expand(R, nv - 1).clone()
    return var, lens, responses, mask, pair


def old_log_prob(fwd, prompts, responses, mask, budget: int, device: str) -> torch.Tensor:
    """[prompt | response] per row, rows packed into forwards of at most ``budget`` padded tokens."""
    R, P = prompts.shape
    n = mask.sum(-1).tolist()
    out = torch.zeros(mask.shape, dtype=torch.float32)
    r = 0
    while r < R:
        rows = [r]
        while r + len(rows) < R and (len(rows) + 1) * (P + n[r + len(rows)]) <= budget:
            rows.append(r + len(rows))
        T = max(n[i] for i in rows)
        ids = torch.zeros(len(rows), P + T, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for b, i in enumerate(rows):
            ids[b, T - n[i] :] = torch.cat([prompts[i], responses[i, : n[i]]])
            attn[b, T - n[i] :] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = fwd(ids.to(device), attn.to(device), pos.to(device), T + 1)[:, :T]
        for b, i in enumerate(rows):  # one fp32 [T, V] at a time, as verl's per-row log-softmax
            y = responses[i, : n[i]].to(device)
            lp = torch.log_softmax(logits[b, T - n[i] :].float(), -1).gather(-1, y[:, None]).squeeze(-1)
            out[i, : n[i]] = lp.cpu()
        del logits
        r += len(rows)
    return out


def best_time(fn, repeats: int, device: str) -> tuple[float, float]:
    """(best seconds over ``repeats`` after one warm-up call, peak GiB of the timed calls)."""
    fn()
    sync(device)
    peak_reset(device)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, peak_gib(device)


def bench_rows(label: str, model, lengths, args, g: torch.Generator) -> float:
    fwd = hf_forward(model)
    nv = args.variants
    var, lens, responses, mask, pair = make_rows(lengths, args.prompt_len, nv, args.vocab, g, args.device)

    def olp():
        with torch.no_grad():
            return old_log_prob(fwd, var[:, 0], responses, mask, args.token_budget, args.device)

    def replay():
        with torch.no_grad():
            return replay_relevance(fwd, var, lens, responses, mask, pair, micro_batch_size=nv, token_budget=args.token_budget,
                                    device=args.device, compiled_js=args.compile_js)

    t_olp, m_olp = best_time(olp, args.repeats, args.device)
    t_rep, m_rep = best_time(replay, args.repeats, args.device)
    x = t_rep / (nv * t_olp)
    print(f"{label:>6} | {len(lengths):>4} | {sum(lengths):>7} | {nv:>2} | {t_olp * 1e3:10.1f}ms | {t_rep * 1e3:8.1f}ms | "
          f"{x:13.2f} | {m_olp:9.2f} | {m_rep:9.2f}", flush=True)
    return x


def main(argv: Optional[list[str]] = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    for key, value in QWEN25_7B.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    ap.add_argument("--lengths", nargs="+", type=int, default=[512, 1024, 2048, 4096], help="response lengths, one row each")
    ap.add_argument("--rows", type=int, default=4, help="responses per length")
    ap.add_argument("--mix-lengths", nargs="+", type=int, default=list(MIX_LENGTHS))
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--variants", type=int, default=3, help="NV: P_all + NV - 1 variants per response")
    ap.add_argument("--token-budget", type=int, default=16384, help="padded tokens per forward (both passes)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-compile-js", dest="compile_js", action="store_false")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    model = build_model(args)
    sync(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"device={args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}) dtype={args.dtype} "
          f"Qwen2 random weights: hidden {args.hidden}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, "
          f"intermediate {args.intermediate}, vocab {args.vocab}, {n_params / 1e9:.2f}B params (built in {time.perf_counter() - t0:.1f}s)")
    g = torch.Generator().manual_seed(0)
    if args.compile_js:  # the first replay compiles the fused JS kernel (Inductor: Triton on GPU)
        var, lens, responses, mask, pair = make_rows([16, 32], min(args.prompt_len, 64), 2, args.vocab, g, args.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            replay_relevance(hf_forward(model), var, lens, responses, mask, pair, micro_batch_size=2, device=args.device,
                             compiled_js=True)
        sync(args.device)
        print(f"JS kernel compiled in {time.perf_counter() - t0:.1f}s (first replay)")
    print(f"prompt={args.prompt_len} token_budget={args.token_budget} compile_js={args.compile_js} best of {args.repeats}")
    print(f"{'T':>6} | {'rows':>4} | {'tokens':>7} | {'NV':>2} | {'old_log_prob':>12} | {'replay':>10} | "
          f"{'rep/(NV x olp)':>13} | {'olp GiB':>9} | {'rep GiB':>9}")
    for T in args.lengths:
        bench_rows(str(T), model, [T] * args.rows, args, g)
    x = bench_rows("mix", model, args.mix_lengths, args, g)
    print("(peak GiB: torch.cuda.max_memory_allocated during the timed calls, weights included)")
    print(f"gpu mix: replay / (variants x old_log_prob) = {x:.2f}")
    return x


if __name__ == "__main__":
    main()
