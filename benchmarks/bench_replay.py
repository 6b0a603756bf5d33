"""Benchmark: replay time / old_log_prob time against the number of prompt variants, side by side.

    python benchmarks/bench_replay.py [--configs tiny larger] [--variants 2 3 5] [--rows 8]

For each model config (the CPU tests' tiny Qwen2, and a larger random Qwen2: hidden 512, 8 layers,
real 151,936 vocabulary) and the same batch of ``--rows`` responses, it times in one process:

- ``old_log_prob``: what verl's compute_log_prob does per batch: one forward of the padded
  [prompt | response] batch and ``logprobs_from_logits`` on the response positions;
- ``replay(NV)``: :func:`recipe.mrtpo.core.replay.replay_relevance` with NV prompt variants per response
  (P_all + NV - 1 variants P_minus_k: forwards plus the chunked JS, ``docs/design.md`` §1.2),
  micro-batch = NV.

It prints ``replay / old_log_prob`` and that ratio divided by NV (the cost per variant relative to
one log-prob pass). Goal (README, "Performance"): ratio <= 1.1 x NV, i.e. the JS costs little beyond the
forwards. Run from the repository root with the recipe installed (``pip install -e .``).
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


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["tiny", "larger"], choices=sorted(CONFIGS))
    ap.add_argument("--variants", nargs="+", type=int, default=[2, 3, 5])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--response-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    print(f"threads={torch.get_num_threads()} rows={args.rows} prompt={args.prompt_len} response={args.response_len} (fp32, CPU)")
    print(f"{'config':>7} | {'old_log_prob':>12} | {'NV':>3} | {'replay':>9} | {'replay/olp':>10} | {'/NV':>6}")
    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            V = bench_config(name, tmp, g, args)  # the model freed before the next config
    print(f"(best of {args.repeats}; V = {V}; goal: replay/old_log_prob <= 1.1 x NV)")


if __name__ == "__main__":
    main()
