"""GPU benchmark of the replay at the 7B scripts' shape: what verl does, beside what the replay does, in one run.

    python benchmarks/gpu_replay.py                      # Qwen2.5-7B's shape, bf16, flash-attention 2, one GPU
    python benchmarks/gpu_replay.py --attn sdpa          # the same with PyTorch's SDPA attention
    python benchmarks/gpu_replay.py --device cpu --dtype fp32 --hidden 64 --layers 2 --heads 4 --kv-heads 2 \\
        --intermediate 128 --vocab 1000 --lengths 8 16 --rows 2 --prompt-len 16 24 --mix-lengths 4 8 24 \\
        --floor-rows 1 --floor-response-len 16 --no-compile-js --mix if   # a smoke run
    python benchmarks/gpu_replay.py --attn sdpa --mix prompt-heavy         # only the prompt-heavy mix, shared on / off
    python benchmarks/gpu_replay.py --attn sdpa --sample-responses         # the mixes' responses sampled from the model

Needs torch and transformers only (no verl, Ray or vLLM): the model is a random-weight Qwen2 of
Qwen2.5-7B's shape (hidden 3584, 28 layers, 28 query / 4 KV heads, intermediate 18944, vocabulary 152064)
built on the device in ``--dtype`` with ``--attn`` (``flash_attention_2``, what verl's GPU runs use, when the
flash-attn package is installed; else ``sdpa``), and the replay is the project's own
:func:`recipe.mrtpo.core.replay.replay_relevance` (imported from the repository tree beside this file).
The defaults are the 7B run scripts' (``run_scripts/common.sh``): token budget 24,576 per forward
(``log_prob_max_token_len_per_gpu``), instruction-following prompts of 150-400 tokens, responses up to
``data.max_response_length`` = 1024, up to 6 prompt variants per response (P_all + 5 constraints removed).

For each response length T of ``--lengths`` (``--rows`` responses of exactly T tokens) and for the mixed
batch (one response per length of ``--mix-lengths``, in a shuffled order as the trainer hands them over, not
sorted), it times:

- ``olp pad``: a padded log-prob pass: [prompt | response] rows left-padded in forwards of at most the token
  budget (the replay's own layout);
- ``olp rmpad``: verl's ``use_remove_padding`` old_log_prob: the sequences of a micro-batch concatenated in
  one row (sum of tokens <= the budget) with restarting ``position_ids`` and no padding. flash-attention 2
  keeps the sequences apart through ``position_ids`` (varlen); SDPA and eager need a block-diagonal 4D mask,
  quadratic in the row's length (exact, for the CPU test; on a GPU use flash_attention_2);
- ``replay``: ``replay_relevance`` with each row's variants, the same budget, the JS compiled unless
  ``--no-compile-js``;

and prints ``replay / (NV x olp rmpad)`` (1.0: each variant costs one of verl's log-prob passes) and peak
memory. Then, on the mix: the compiled against the eager JS (max |dq|), the replay's log-probs of P_all
against the remove-padding old_log_prob (the consistency the trainer logs, mean / p99 / max), the trainer's
standing check at ``--check-temperatures`` (the fused pass's old log-probs against verl's ``forward_step``
numerics: autocast, the temperature divided in the logits' dtype, fp32 log-probs; the largest row mean against
the threshold the trainer's check fails above), and the noise
floor of q (``benchmarks/bench_noise_floor.py``: P_all against itself beside a longer sequence, and the q of
a real variant). The last line is ``gpu mix: replay / (variants x old_log_prob) = X``.

``--mix`` (default ``both``): ``if`` is the above, then the IF prompts in ``--heavy-groups`` groups of ``--group-n``
responses timed unshared (packed varlen under flash_attention_2), shared under the old dense [L, L] mask (SDPA) and
shared block-sparse (the prefix tree's FlexAttention, the cost model choosing per forward), counts and peak memory
beside the times (``benchmarks/gpu_prompt_heavy.py``), ending ``gpu if: replay shared / unshared = X in time (dense
mask Y), ...``; ``prompt-heavy`` the same on prompts of 1-4k tokens (responses 64-512), before the IF's last line.
``--sample-responses`` (``benchmarks/gpu_sampling.py``): the responses of both mixes, and so the fused check and
its floor, sampled from the model itself (seeded, ``--sample-temperature``, 0 greedy) instead of random ids; the
per-length rows and the noise floor of q keep random ids. The weights are random; the output says which responses ran.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Optional

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the repository tree, installed or not
    sys.path.insert(0, str(REPO))

from benchmarks.bench_noise_floor import noise_floor  # noqa: E402  (torch + transformers + the core)
from benchmarks.gpu_prompt_heavy import bench_prompt_heavy, expand_groups  # noqa: E402
from benchmarks.gpu_sampling import sample_responses  # noqa: E402
from recipe.mrtpo.core.replay import hf_forward, replay_relevance  # noqa: E402  (torch-only core)
from recipe.mrtpo.passes.tree_attention import register_tree_attention  # noqa: E402  (transformers + the core)

QWEN25_7B = dict(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MIX_LENGTHS = (64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1024)  # up to max_response_length
ATTN = ("flash_attention_2", "sdpa")


def default_attn(device: str) -> str:
    if device.startswith("cuda"):
        try:
            import flash_attn  # noqa: F401
            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def build_model(args):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      intermediate_size=args.intermediate, max_position_embeddings=32768, tie_word_embeddings=False)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[args.dtype])  # parameters created in the run's dtype (no fp32 copy of 7B)
    try:
        with torch.device(args.device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.set_attn_implementation(args.attn)  # transformers' public switch (checks flash-attn is importable)
    register_tree_attention()  # the shared forwards' attention, as the worker registers it
    return model.eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def make_rows(lengths, prompt_lens: tuple[int, int], max_nv: int, vocab: int, g: torch.Generator, vary_nv: bool):
    """Rows in the given order: variants [R, NV, P] (left-padded; variant j > 0 lacks one 16-token span of P_all,
    a constraint), their lengths (0: no such variant), responses [R, T], mask, pair_variant [R, NV - 1] (-1: none).
    Prompt lengths are drawn from ``prompt_lens`` (lo, hi); with ``vary_nv`` each row has 2..max_nv variants."""
    R, T, NV = len(lengths), max(lengths), max_nv
    lo, hi = prompt_lens
    plen = torch.randint(lo, hi + 1, (R,), generator=g).tolist()
    nv = torch.randint(2, NV + 1, (R,), generator=g).tolist() if vary_nv else [NV] * R
    P = max(plen)
    responses = torch.randint(0, vocab, (R, T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    var = torch.zeros(R, NV, P, dtype=torch.long)
    lens = torch.zeros(R, NV, dtype=torch.long)
    pair = torch.full((R, NV - 1), -1, dtype=torch.long)
    for r in range(R):
        prompt = torch.randint(0, vocab, (plen[r],), generator=g)
        cut = max(1, min(16, plen[r] // (2 * NV)))
        for j in range(nv[r]):
            keep = prompt if j == 0 else torch.cat([prompt[: cut * (j - 1)], prompt[cut * j:]])
            var[r, j, P - len(keep):] = keep
            lens[r, j] = len(keep)
            if j:
                pair[r, j - 1] = j
    return var, lens, responses, mask, pair


def _rows_of(prompts, lens0, responses, mask):
    """Each row's [prompt | response] (P_all and its existing response tokens), and the response length."""
    P = prompts.shape[1]
    n = mask.sum(-1).tolist()
    return [(torch.cat([prompts[i, P - int(lens0[i]):], responses[i, : n[i]]]), n[i]) for i in range(len(n))]


def old_log_prob_padded(fwd, prompts, lens0, responses, mask, budget: int, device: str) -> torch.Tensor:
    """[prompt | response] per row, left-padded, rows packed into forwards of at most ``budget`` padded tokens."""
    seqs = _rows_of(prompts, lens0, responses, mask)
    out = torch.zeros(mask.shape, dtype=torch.float32)
    r = 0
    while r < len(seqs):
        rows, L = [r], len(seqs[r][0])
        while r + len(rows) < len(seqs) and (len(rows) + 1) * max(L, len(seqs[r + len(rows)][0])) <= budget:
            L = max(L, len(seqs[r + len(rows)][0]))
            rows.append(r + len(rows))
        ids = torch.zeros(len(rows), L, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for b, i in enumerate(rows):
            ids[b, L - len(seqs[i][0]):] = seqs[i][0]
            attn[b, L - len(seqs[i][0]):] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        T = max(seqs[i][1] for i in rows)
        logits = fwd(ids.to(device), attn.to(device), pos.to(device), T + 1)[:, :T]
        for b, i in enumerate(rows):  # one fp32 [T, V] at a time, as verl's per-row log-softmax
            n = seqs[i][1]
            y = responses[i, :n].to(device)
            out[i, :n] = torch.log_softmax(logits[b, T - n:].float(), -1).gather(-1, y[:, None]).squeeze(-1).cpu()
        del logits
        r += len(rows)
    return out


def old_log_prob_rmpad(model, prompts, lens0, responses, mask, budget: int, device: str, attn: str) -> torch.Tensor:
    """verl's remove-padding old_log_prob: sequences concatenated in one row (sum of tokens <= ``budget``),
    ``position_ids`` restarting at each, log-probs of the response tokens (module docstring)."""
    return _rmpad_log_probs(model, prompts, lens0, responses, mask, budget, device, attn, 1.0, use_autocast=False)


def verl_forward_step_log_probs(model, prompts, lens0, responses, mask, budget: int, device: str, attn: str,
                                temperature: float) -> torch.Tensor:
    """verl 0.9.1's old_log_prob numerics (``FSDPEngineWithLMHead.forward_step`` with ``use_remove_padding``), for
    the standing check on a machine without verl: the remove-padding forward under ``torch.autocast`` in the
    model's dtype (none in fp32), the logits divided as ``_scale_logits_by_temperature`` divides them
    (``logits / temperature.clamp(min=1e-8).to(logits.dtype)``, not at all at exactly 1.0), the log-prob in fp32
    (flash-attention's cross entropy, verl's GPU path)."""
    return _rmpad_log_probs(model, prompts, lens0, responses, mask, budget, device, attn, temperature, use_autocast=True)


def _rmpad_log_probs(model, prompts, lens0, responses, mask, budget: int, device: str, attn: str, temperature: float,
                     use_autocast: bool) -> torch.Tensor:
    """The remove-padding forward both functions above run: rows packed up to ``budget`` tokens, position ids
    restarting per sequence (a block-diagonal causal mask where the attention is not varlen), optionally under
    autocast in the model's dtype, logits divided by ``temperature`` in their dtype (not at all at 1.0), fp32
    log-probs of the response tokens."""
    seqs = _rows_of(prompts, lens0, responses, mask)
    out = torch.zeros(mask.shape, dtype=torch.float32)
    dtype = next(model.parameters()).dtype
    on = use_autocast and dtype != torch.float32
    autocast = torch.autocast(device_type=torch.device(device).type, dtype=dtype, enabled=on)
    r = 0
    while r < len(seqs):
        rows, total = [r], len(seqs[r][0])
        while r + len(rows) < len(seqs) and total + len(seqs[r + len(rows)][0]) <= budget:
            total += len(seqs[r + len(rows)][0])
            rows.append(r + len(rows))
        ids = torch.cat([seqs[i][0] for i in rows])[None].to(device)
        pos = torch.cat([torch.arange(len(seqs[i][0])) for i in rows])[None].to(device)
        kwargs = {}
        if attn != "flash_attention_2":  # SDPA / eager would attend across the sequences: block-diagonal mask
            seg = torch.cat([torch.full((len(seqs[i][0]),), k) for k, i in enumerate(rows)]).to(device)
            allowed = (seg[:, None] == seg[None, :]) & torch.ones(total, total, dtype=torch.bool, device=device).tril()
            mask4 = torch.zeros(1, 1, total, total, dtype=dtype, device=device)
            kwargs["attention_mask"] = mask4.masked_fill(~allowed, torch.finfo(mask4.dtype).min)
        with autocast:
            logits = model(input_ids=ids, position_ids=pos, use_cache=False, **kwargs).logits[0]
            if float(temperature) != 1.0:
                logits = logits / torch.tensor([float(temperature)], device=device).clamp(min=1e-8).to(logits.dtype)
        start = 0
        for i in rows:
            L, n = len(seqs[i][0]), seqs[i][1]
            y = responses[i, :n].to(device)
            lp = torch.log_softmax(logits[start + L - n - 1: start + L - 1].float(), -1)
            out[i, :n] = lp.gather(-1, y[:, None]).squeeze(-1).cpu()
            start += L
        del logits
        r += len(rows)
    return out


def fused_check(model, mix: dict, args, temperature: float) -> dict:
    """The trainer's standing check on the mix: the fused pass's old log-probs (``replay_relevance`` with each
    row's rollout prompt forwarded for its log-probs, under the autocast verl's engine uses, the layout the model
    table gives Qwen2 under this attention) against :func:`verl_forward_step_log_probs`; mean / p99 / max |d|."""
    from recipe.mrtpo.core.passes import PassSettings, resolve_layout
    from recipe.mrtpo.core.standing_check import FUSED_CHECK_THRESHOLDS, standing_check

    var, lens, responses, mask = mix["inputs"]
    R = var.shape[0]
    layout, packed_attention = resolve_layout("auto", args.attn, "qwen2")
    settings = PassSettings(temperature=temperature, micro_batch_size=8, token_budget=args.token_budget, layout=layout,
                            packed_attention=packed_attention)
    dtype = DTYPES[args.dtype]
    fwd = hf_forward(model)

    def autocast_fwd(*a):
        with torch.autocast(device_type=torch.device(args.device).type, dtype=dtype, enabled=dtype != torch.float32):
            return fwd(*a)

    with torch.no_grad():
        fused = replay_relevance(autocast_fwd, var, lens, responses, mask, torch.full((R, 1), -1), settings=settings,
                                 logprob_variant=torch.zeros(R, dtype=torch.long), device=args.device)["replay_logprobs"]
        verl = verl_forward_step_log_probs(model, var[:, 0], lens[:, 0], responses, mask, args.token_budget, args.device,
                                           args.attn, temperature)
        # the floor the trainer's check measures in the same step: verl's numerics on the rows in reverse order
        rev = torch.arange(R - 1, -1, -1)
        verl_rev = verl_forward_step_log_probs(model, var[rev, 0], lens[rev, 0], responses[rev], mask[rev], args.token_budget,
                                               args.device, args.attn, temperature)[rev]
    key = "fp32" if args.dtype == "fp32" else "bf16"
    m, warn = standing_check(fused, verl, verl_rev, mask, None, FUSED_CHECK_THRESHOLDS[key])
    return {"d": (fused - verl).abs()[mask > 0], "floor": (verl_rev - verl).abs()[mask > 0], "layout": layout, "key": key,
            "threshold": m["mrtpo/consistency/fused_check_threshold"], "warn": warn,
            "row_max": m["mrtpo/consistency/fused_vs_verl_row_max"], "floor_row_max": m["mrtpo/consistency/verl_vs_verl_row_max"]}


def best_time(fn, repeats: int, device: str):
    """(best seconds over ``repeats`` after one warm-up call, peak GiB of the timed calls, the last result)."""
    out = fn()
    sync(device)
    peak_reset(device)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, peak_gib(device), out


def maybe_sampled(model, var, lens, responses, args) -> tuple[torch.Tensor, str]:
    """(the responses, what they are): ``responses`` (random ids) as they are, or with ``--sample-responses`` as
    many tokens sampled from the model after each row's P_all (``benchmarks/gpu_sampling.py``)."""
    if not args.sample_responses:
        return responses, "random ids"
    t0 = time.perf_counter()
    out, logp = sample_responses(model, var[:, 0], lens[:, 0], responses.shape[1], temperature=args.sample_temperature,
                                 seed=args.sample_seed, device=args.device)
    sync(args.device)
    return out, (f"sampled from the model, temperature {args.sample_temperature}, seed {args.sample_seed}, in "
                 f"{time.perf_counter() - t0:.1f}s: mean log p {logp:.3f}, random ids' -log V = {-math.log(args.vocab):.3f}")


def bench_rows(label: str, model, lengths, args, g: torch.Generator, vary_nv: bool, sample: bool = False) -> dict:
    fwd = hf_forward(model)
    var, lens, responses, mask, pair = make_rows(lengths, tuple(args.prompt_len), args.variants, args.vocab, g, vary_nv)
    responses, note = maybe_sampled(model, var, lens, responses, args) if sample else (responses, "random ids")
    nv_mean = float((lens > 0).sum()) / len(lengths)

    def olp_pad():
        with torch.no_grad():
            return old_log_prob_padded(fwd, var[:, 0], lens[:, 0], responses, mask, args.token_budget, args.device)

    def olp_rmpad():
        with torch.no_grad():
            return old_log_prob_rmpad(model, var[:, 0], lens[:, 0], responses, mask, args.token_budget, args.device, args.attn)

    def replay(compiled: bool):
        with torch.no_grad():
            return replay_relevance(fwd, var, lens, responses, mask, pair, micro_batch_size=args.variants,
                                    token_budget=args.token_budget, device=args.device, compiled_js=compiled)

    t_pad, m_pad, _ = best_time(olp_pad, args.repeats, args.device)
    t_rm, m_rm, lp_rm = best_time(olp_rmpad, args.repeats, args.device)
    t_rep, m_rep, rep = best_time(lambda: replay(args.compile_js), args.repeats, args.device)
    x = t_rep / (nv_mean * t_rm)
    # x to 3 significant figures: a tiny ratio (a timed call stalled by the machine) must not read 0.00
    print(f"{label:>6} | {len(lengths):>4} | {int(mask.sum()):>7} | {nv_mean:>4.1f} | {t_pad * 1e3:9.1f}ms | {t_rm * 1e3:9.1f}ms | "
          f"{t_rep * 1e3:9.1f}ms | {x:13.3g} | {m_rm:9.2f} | {m_rep:9.2f}", flush=True)
    return {"x": x, "rep": rep, "lp_rmpad": lp_rm, "mask": mask, "replay": replay, "inputs": (var, lens, responses, mask),
            "note": note}


def _stats(values: torch.Tensor) -> str:
    v = values.float()
    return f"mean {v.mean().item():.2e}, p99 {torch.quantile(v, 0.99).item():.2e}, max {v.max().item():.2e}"


def main(argv: Optional[list[str]] = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--attn", choices=ATTN, default=None, help="attention (default: flash_attention_2 on CUDA when installed, else sdpa)")
    for key, value in QWEN25_7B.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 512, 1024], help="response lengths, --rows rows each")
    ap.add_argument("--rows", type=int, default=8, help="responses per length")
    ap.add_argument("--mix-lengths", nargs="+", type=int, default=list(MIX_LENGTHS), help="the mix, in a shuffled order")
    ap.add_argument("--prompt-len", nargs=2, type=int, default=[150, 400], metavar=("LO", "HI"), help="prompt lengths drawn in [LO, HI]")
    ap.add_argument("--variants", type=int, default=6, help="NV: P_all + up to NV - 1 variants per response (the mix: 2..NV)")
    ap.add_argument("--token-budget", type=int, default=24576, help="tokens per forward (log_prob_max_token_len_per_gpu)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-compile-js", dest="compile_js", action="store_false")
    ap.add_argument("--check-temperatures", nargs="+", type=float, default=[1.0, 0.7],
                    help="temperatures of the fused check against verl's old_log_prob numerics (the mix)")
    ap.add_argument("--floor-rows", type=int, default=2, help="noise floor: sequences measured")
    ap.add_argument("--floor-response-len", type=int, default=1024)
    ap.add_argument("--mix", choices=("if", "prompt-heavy", "both"), default="both",
                    help="the IF mix (lengths table, checks, floor), the prompt-heavy mix (shared prompts off / on), or both")
    ap.add_argument("--group-n", type=int, default=4, help="grouped mixes: responses per prompt (rollout.n)")
    ap.add_argument("--heavy-groups", type=int, default=4, help="grouped mixes: groups (distinct prompts)")
    ap.add_argument("--heavy-prompt-len", nargs=2, type=int, default=[1024, 4096], metavar=("LO", "HI"))
    ap.add_argument("--heavy-response-len", nargs=2, type=int, default=[64, 512], metavar=("LO", "HI"))
    ap.add_argument("--sample-responses", action="store_true",
                    help="the mixes' responses sampled from the model (seeded) instead of random ids")
    ap.add_argument("--sample-temperature", type=float, default=1.0, help="with --sample-responses; 0: greedy")
    ap.add_argument("--sample-seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.attn = args.attn or default_attn(args.device)
    if args.variants < 2 or not 0 < args.prompt_len[0] <= args.prompt_len[1]:
        ap.error("need --variants >= 2 and 0 < LO <= HI for --prompt-len")
    if args.group_n < 1 or args.heavy_groups < 1 or args.sample_temperature < 0 or not (
            0 < args.heavy_prompt_len[0] <= args.heavy_prompt_len[1] and 0 < args.heavy_response_len[0] <= args.heavy_response_len[1]):
        ap.error("need --group-n, --heavy-groups >= 1, --sample-temperature >= 0 and 0 < LO <= HI for the heavy lengths")
    run_if, run_heavy = args.mix in ("if", "both"), args.mix in ("prompt-heavy", "both")

    t0 = time.perf_counter()
    model = build_model(args)
    sync(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"device={args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}) dtype={args.dtype} "
          f"attn={args.attn} Qwen2 random weights: hidden {args.hidden}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, "
          f"intermediate {args.intermediate}, vocab {args.vocab}, {n_params / 1e9:.2f}B params (built in {time.perf_counter() - t0:.1f}s)")
    g = torch.Generator().manual_seed(0)
    if args.compile_js:  # the first replay compiles the fused JS kernel (Inductor: Triton on GPU)
        var, lens, responses, mask, pair = make_rows([16, 32], (16, 32), 2, args.vocab, g, False)
        t0 = time.perf_counter()
        with torch.no_grad():
            replay_relevance(hf_forward(model), var, lens, responses, mask, pair, micro_batch_size=2, device=args.device,
                             compiled_js=True)
        sync(args.device)
        print(f"JS kernel compiled in {time.perf_counter() - t0:.1f}s (first replay)")
    responses = (f"the mixes' sampled from the model (temperature {args.sample_temperature}, seed {args.sample_seed})"
                 if args.sample_responses else "random ids")
    print(f"prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens, token_budget={args.token_budget}, variants up to "
          f"{args.variants}, compile_js={args.compile_js}, best of {args.repeats}, mix {args.mix}, responses: {responses}")
    grouped = [("if", tuple(args.prompt_len), (min(args.mix_lengths), max(args.mix_lengths)))] if run_if else []
    mix = bench_if_mix(model, args, g) if run_if else None
    if run_heavy:
        grouped.append(("prompt-heavy", tuple(args.heavy_prompt_len), tuple(args.heavy_response_len)))
    for label, prompt_len, response_len in grouped:  # unshared, dense-mask shared, block-sparse shared
        heads = make_rows([1] * args.heavy_groups, prompt_len, args.variants, args.vocab, g, vary_nv=True)
        var, lens, responses, mask, pair = expand_groups(heads, args.group_n, response_len, args.vocab, g)
        responses, note = maybe_sampled(model, var, lens, responses, args)
        heavy = bench_prompt_heavy(model, (var, lens, responses, mask, pair), args,
                                   lambda fn: best_time(fn, args.repeats, args.device), note, label)
    if not run_if:
        return heavy["flex"]["time"] / heavy["off"]["time"]
    print(f"gpu mix: replay / (variants x old_log_prob) = {mix['x']:.2f}")
    return mix["x"]


def bench_if_mix(model, args, g: torch.Generator) -> dict:
    """The IF mix (module docstring): the per-length table and the mix, the JS comparison, the consistency, the
    standing check and the noise floor of q; the mix's result (its ratio ``x``)."""
    print(f"{'T':>6} | {'rows':>4} | {'tokens':>7} | {'NV':>4} | {'olp pad':>11} | {'olp rmpad':>11} | {'replay':>11} | "
          f"{'rep/(NV x olp)':>13} | {'olp GiB':>9} | {'rep GiB':>9}")
    for T in args.lengths:
        bench_rows(str(T), model, [T] * args.rows, args, g, vary_nv=False)
    order = torch.randperm(len(args.mix_lengths), generator=g).tolist()  # the trainer's order is not by length
    mix = bench_rows("mix", model, [args.mix_lengths[i] for i in order], args, g, vary_nv=True, sample=True)
    print("(NV: sequences per row, P_all included; olp: old_log_prob; rep/(NV x olp) against olp rmpad, verl's; "
          "peak GiB: torch.cuda.max_memory_allocated during the timed calls, weights included)")
    print(f"mix: responses {mix['note']}")

    valid = mix["mask"] > 0
    if args.compile_js:
        eager = mix["replay"](False)
        dq = (mix["rep"]["variant_relevance"] - eager["variant_relevance"]).abs().max().item()
        print(f"mix: compiled vs eager JS: max |dq| = {dq:.2e}")
    else:
        print("mix: compiled vs eager JS: skipped (--no-compile-js)")
    dlp = (mix["rep"]["replay_logprobs"] - mix["lp_rmpad"]).abs()[valid]
    print(f"mix: replay log-probs of P_all vs old_log_prob (remove padding), |d| over {int(valid.sum())} tokens: {_stats(dlp)}")
    for t in args.check_temperatures:  # the trainer's standing check (mrtpo.fused_check_every), verl's numerics
        chk = fused_check(model, mix, args, t)
        ok = "ABOVE (the check would warn)" if chk["warn"] else "ok"
        print(f"mix: fused check at temperature {t}: fused old_log_probs ({chk['layout']}) vs verl's forward_step numerics, "
              f"|d| over {chk['d'].numel()} tokens: {_stats(chk['d'])}; floor (verl's numerics vs themselves on the rows "
              f"reversed): {_stats(chk['floor'])}; largest row mean {chk['row_max']:.2e} (floor's {chk['floor_row_max']:.2e}); "
              f"{ok}: threshold 2 x the floor's largest row mean + {chk['key']} tolerance = {chk['threshold']:.2e}")
    floor = noise_floor(hf_forward(model), args.vocab, args.floor_rows, args.prompt_len[1], args.floor_response_len,
                        args.prompt_len[1] + args.floor_response_len + 256, 16, 0.5, device=args.device)
    print(f"noise floor of q over {floor['positions']} positions (P_all against itself beside a longer sequence, random "
          f"ids): mean {floor['floor_mean']:.2e}, p99 {floor['floor_p99']:.2e}, max {floor['floor_max']:.2e}; q of a real variant (16 "
          f"tokens removed) {floor['q_mean']:.4f}: floor / q = {floor['floor_mean'] / floor['q_mean']:.4f}; |dw| at beta 0.5: "
          f"mean {floor['dw_mean']:.2e}, max {floor['dw_max']:.2e}")
    return mix


if __name__ == "__main__":
    main()
