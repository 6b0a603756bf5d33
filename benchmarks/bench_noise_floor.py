"""The numerical noise floor of q: P_all replayed against itself, placed differently in a batch, per dtype.

    python benchmarks/bench_noise_floor.py                  # fp32 and bf16, a random Qwen2 (hidden 256, 4 layers)
    python benchmarks/bench_noise_floor.py --dtypes bf16 --hidden 64 --layers 2 --vocab 500   # a smoke run

The replay's q is the JS distance between the next-token distributions under P_all and under P_minus_k.
P_all and its variants run in different batch shapes (another batch position, other left padding, other
neighbours), and in bf16 the same sequence gives slightly different logits in each shape. That difference
is a floor under q: a token that does not depend on Z_k at all still gets q ~ floor. This benchmark
measures it with the project's own forward and JS (:func:`recipe.mrtpo.core.replay.hf_forward`,
:func:`recipe.mrtpo.core.relevance.js_distance_from_logits`) on ``--rows`` random [prompt | response]
sequences, each in three placements:

- ``alone``: batch of one, no padding;
- ``beside``: batch index 1 beside a sequence of ``--neighbour-len`` tokens, left-padded to its length;
- ``replay``: the replay's own layout, through :func:`recipe.mrtpo.core.replay.replay_relevance` with a
  real variant (``--cut`` prompt tokens removed) in the micro-batch of P_all.

and prints, per dtype: the floor (JS distance of ``alone`` against ``beside``, the same tokens), the q of
the real variant (its tokens do depend on the removed Z_k: every token of a random model does), the floor
as a share of that q, and what the floor does to the weights: the same variant's q computed against the
two placements of P_all, and the mean |w - w'| of the token weights (``relevance_weights``, ``--beta``)
built from each. The last line is ``noise floor: bf16 floor / q = X`` (the dtype last in ``--dtypes``).
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

from recipe.mrtpo.core.advantage import relevance_weights  # noqa: E402  (torch-only core)
from recipe.mrtpo.core.relevance import js_distance_from_logits  # noqa: E402
from recipe.mrtpo.core.replay import hf_forward, replay_relevance  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build_model(args, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      intermediate_size=args.intermediate, max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(cfg).to(dtype).eval()  # the same weights, rounded, for every dtype
    model.set_attn_implementation(args.attn)
    return model


def forward_response_logits(fwd, seqs: list[torch.Tensor], n_resp: int, index: int, device: str = "cpu") -> torch.Tensor:
    """Logits [n_resp, V] predicting the last ``n_resp`` tokens of ``seqs[index]``, all ``seqs`` left-padded in one forward."""
    L = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, s in enumerate(seqs):
        ids[b, L - len(s):] = s
        attn[b, L - len(s):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = fwd(ids.to(device), attn.to(device), pos.to(device), n_resp + 1)
    return logits[index, :n_resp]


def noise_floor(fwd, vocab: int, rows: int, prompt_len: int, response_len: int, neighbour_len: int, cut: int,
                beta: float, seed: int = 0, device: str = "cpu") -> dict:
    """The floor and the real variant's q, |dq| and |dw| on ``rows`` random sequences (module docstring)."""
    g = torch.Generator().manual_seed(seed + 1)
    R, P, T = rows, prompt_len, response_len
    prompts = torch.randint(0, vocab, (R, P), generator=g)
    responses = torch.randint(0, vocab, (R, T), generator=g)
    neighbour = torch.randint(0, vocab, (neighbour_len,), generator=g)
    mask = torch.ones(1, T, device=device)
    lo = (P - cut) // 2
    variants = torch.zeros(R, 2, P, dtype=torch.long)  # left-padded: P_all, P_all without tokens lo..lo+cut
    variants[:, 0] = prompts
    variants[:, 1, cut:] = torch.cat([prompts[:, :lo], prompts[:, lo + cut:]], 1)
    lens = torch.tensor([[P, P - cut]] * R)
    with torch.no_grad():
        rep = replay_relevance(fwd, variants, lens, responses, torch.ones(R, T), torch.ones(R, 1, dtype=torch.long),
                               micro_batch_size=2, device=device)
    floor, q_alone, q_beside, dw = [], [], [], []
    for r in range(R):
        seq = torch.cat([prompts[r], responses[r]])
        var = torch.cat([variants[r, 1, cut:], responses[r]])
        alone = forward_response_logits(fwd, [seq], T, 0, device)[None]
        beside = forward_response_logits(fwd, [neighbour, seq], T, 1, device)[None]
        minus = forward_response_logits(fwd, [seq, var], T, 1, device)[None]  # the variant as the replay places it
        floor.append(js_distance_from_logits(alone, beside, mask)[0].cpu())
        qa, qb = js_distance_from_logits(alone, minus, mask), js_distance_from_logits(beside, minus, mask)
        q_alone.append(qa[0].cpu())
        q_beside.append(qb[0].cpu())
        wa = relevance_weights(qa, mask, beta, 1.0)
        wb = relevance_weights(qb, mask, beta, 1.0)
        dw.append((wa - wb).abs()[0].cpu())
        del alone, beside, minus
    floor_t, q_rep = torch.cat(floor), rep["variant_relevance"][:, 0].flatten()
    return {
        "floor_mean": floor_t.mean().item(), "floor_p99": torch.quantile(floor_t, 0.99).item(), "floor_max": floor_t.max().item(),
        "q_mean": q_rep.mean().item(), "dq_mean": (torch.cat(q_alone) - torch.cat(q_beside)).abs().mean().item(),
        "dw_mean": torch.cat(dw).mean().item(), "dw_max": torch.cat(dw).max().item(), "positions": floor_t.numel(),
    }


def measure(args, dtype_name: str) -> dict:
    fwd = hf_forward(build_model(args, DTYPES[dtype_name]))
    return noise_floor(fwd, args.vocab, args.rows, args.prompt_len, args.response_len, args.neighbour_len, args.cut,
                       args.beta, args.seed)


def main(argv: Optional[list[str]] = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--rows", type=int, default=4, help="[prompt | response] sequences")
    ap.add_argument("--prompt-len", type=int, default=120)
    ap.add_argument("--response-len", type=int, default=200)
    ap.add_argument("--neighbour-len", type=int, default=500, help="the longer sequence beside P_all in the other placement")
    ap.add_argument("--cut", type=int, default=10, help="prompt tokens the real variant lacks (its Z_k)")
    ap.add_argument("--beta", type=float, default=0.5, help="mrtpo.beta of the weights compared")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not 0 < args.cut < args.prompt_len or args.neighbour_len <= args.prompt_len + args.response_len:
        ap.error("need 0 < --cut < --prompt-len and --neighbour-len > --prompt-len + --response-len")

    print(f"random Qwen2: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, attn {args.attn}; {args.rows} rows of "
          f"prompt {args.prompt_len} + response {args.response_len}; other placement: beside {args.neighbour_len} tokens; "
          f"real variant: {args.cut} prompt tokens removed; beta {args.beta}")
    print(f"{'dtype':>5} | {'positions':>9} | {'floor mean':>10} | {'floor p99':>9} | {'floor max':>9} | {'q mean':>8} | "
          f"{'floor/q':>7} | {'|dq| mean':>9} | {'|dw| mean':>9} | {'|dw| max':>8} | {'time':>6}")
    ratio = float("nan")
    for name in args.dtypes:
        t0 = time.perf_counter()
        m = measure(args, name)
        ratio = m["floor_mean"] / m["q_mean"]
        print(f"{name:>5} | {m['positions']:>9} | {m['floor_mean']:10.2e} | {m['floor_p99']:9.2e} | {m['floor_max']:9.2e} | "
              f"{m['q_mean']:8.4f} | {ratio:7.4f} | {m['dq_mean']:9.2e} | {m['dw_mean']:9.2e} | {m['dw_max']:8.2e} | "
              f"{time.perf_counter() - t0:5.1f}s", flush=True)
    print("(floor: JS distance of P_all against itself in two placements; q: the replay's q of the real variant; |dq|, |dw|: "
          "that variant's q and weights against the two placements of P_all)")
    print(f"noise floor: {args.dtypes[-1]} floor / q = {ratio:.4f}")
    return ratio


if __name__ == "__main__":
    main()
