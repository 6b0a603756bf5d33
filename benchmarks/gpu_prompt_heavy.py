"""The prompt-heavy mix of ``benchmarks/gpu_replay.py``: the replay with shared prompts off and on, in one run.

Text-to-SQL schemas, tool specs and BFCL multi-turn prompts run to thousands of tokens while the responses are
a few hundred, and a group's n responses (``rollout.n``) follow the same prompt variants, so the unshared
layouts forward each variant n times (issue 49; docs/design.md §5.3). The mix here is ``--heavy-groups`` groups
of ``--group-n`` rows that share their prompt variants token for token (P_all of 1-4k tokens, 2..NV variants per
group), each row with its own response of 64-512 tokens (random ids, or sampled from the model), the group's
rows adjacent as verl hands them over. :func:`bench_prompt_heavy` times :func:`recipe.mrtpo.core.replay.replay_relevance`
on it twice with the pass engine's own ``share_prompts`` off and on (the layout the model table gives Qwen2 under
the run's attention), and prints the counts beside the times: forwards, tokens forwarded, tokens forwarded per
response token, and the limit (the batch's distinct prompt-variant tokens once + the response tokens of every
forwarded sequence). Shared prompts need SDPA / eager attention (a dense block mask): under flash_attention_2 the
shared run switches the model's attention to SDPA for the pass, as the worker does (``core.shared_prompts
.pass_attention`` / ``attention_switched``), so the comparison is the unshared packed varlen pass against the
shared SDPA one, what a GPU run gets.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from recipe.mrtpo.core.passes import PassSettings, resolve_layout, response_lengths
from recipe.mrtpo.core.replay import hf_forward, plan_sequences, replay_relevance
from recipe.mrtpo.core.shared_prompts import attention_switched, pass_attention, prompt_key, share_fallback_reason


def expand_groups(heads, n: int, response_lens: tuple[int, int], vocab: int, g: torch.Generator):
    """``(variants, lens, responses, mask, pair)`` of ``n`` rows per group head: each head's variants, lengths and
    replayed pairs repeated ``n`` times (adjacent), each row with its own random response of a length drawn in
    ``response_lens`` (lo, hi). ``heads``: ``gpu_replay.make_rows``' tuple (its responses are not used)."""
    var, lens, _, _, pair = heads
    lo, hi = response_lens
    idx = torch.arange(var.shape[0]).repeat_interleave(int(n))
    resp = torch.randint(lo, hi + 1, (len(idx),), generator=g)
    T = int(resp.max())
    responses = torch.randint(0, vocab, (len(idx), T), generator=g)
    mask = (torch.arange(T)[None, :] < resp[:, None]).long()
    return var[idx], lens[idx], responses, mask, pair[idx]


def replay_limit(var: torch.Tensor, lens: torch.Tensor, mask: torch.Tensor, pair: torch.Tensor) -> tuple[int, int]:
    """(limit, response tokens): the tokens a replay that forwards every distinct prompt variant of the batch
    once needs, plus the response tokens of every sequence it forwards (P_all and each replayed variant)."""
    seqs = plan_sequences(lens, pair, response_lengths(mask))
    response = sum(int(s.resp_len) for s in seqs)
    prompts = {prompt_key(var, s): int(s.prompt_len) for s in seqs}
    return sum(prompts.values()) + response, response


def bench_prompt_heavy(model, inputs, args, timer: Callable, note: str) -> dict:
    """Time the replay on the prompt-heavy ``inputs`` with shared prompts off, then on (module docstring);
    ``timer(fn) -> (best seconds, peak GiB, last result)`` (``gpu_replay.best_time``), ``note``: where the
    responses come from. Returns ``{"off": ..., "on": ...}`` (``on`` absent where skipped), each with the
    time, the peak memory and the replay's output."""
    var, lens, responses, mask, pair = inputs
    layout, _ = resolve_layout("auto", args.attn, "qwen2")
    fwd = hf_forward(model)
    groups = var.shape[0] // args.group_n
    print(f"prompt-heavy mix: {groups} groups x {args.group_n} responses sharing their prompt variants, prompts "
          f"{args.heavy_prompt_len[0]}-{args.heavy_prompt_len[1]} tokens, responses {args.heavy_response_len[0]}-"
          f"{args.heavy_response_len[1]} ({note}), 2..{args.variants} variants per group, layout {layout} ({args.attn})")
    print(f"{'share':>5} | {'forwards':>8} | {'tokens fwd':>10} | {'fwd/resp tok':>12} | {'replay':>11} | {'peak GiB':>8}")
    limit, response = replay_limit(var, lens, mask, pair)
    out: dict = {}
    for share in (False, True):
        attn = pass_attention(share, args.attn, "qwen2")  # the worker's choice: SDPA for a shared pass on flash-attention
        run_layout, packed_attention = resolve_layout("auto", attn, "qwen2")
        settings = PassSettings(temperature=1.0, micro_batch_size=args.variants, token_budget=args.token_budget,
                                layout=run_layout, packed_attention=packed_attention, share_prompts=share)
        why = share_fallback_reason(settings)
        if why is not None:  # the engine would run it unshared: no shared figure to take
            print(f"{'on':>5} | skipped: {why}")
            continue

        def replay(settings=settings, attn=attn):
            with torch.no_grad(), attention_switched(model, attn):
                return replay_relevance(fwd, var, lens, responses, mask, pair, settings=settings, device=args.device,
                                        compiled_js=args.compile_js)

        t, peak, rep = timer(replay)
        fwd_tokens = int(rep["tokens_forwarded"])
        print(f"{'on' if share else 'off':>5} | {int(rep['n_forwards']):>8} | {fwd_tokens:>10,} | {fwd_tokens / response:>12.2f} | "
              f"{t * 1e3:9.1f}ms | {peak:8.2f}", flush=True)
        out["on" if share else "off"] = {"time": t, "peak": peak, "rep": rep}
    print(f"prompt-heavy: limit {limit:,} tokens (distinct prompt-variant tokens once + {response:,} response tokens of the "
          f"forwarded sequences): {limit / response:.2f} per response token")
    off = out["off"]
    if "on" not in out:
        print(f"gpu prompt-heavy: shared timing skipped ({args.attn}); unshared replay {off['time'] * 1e3:.1f}ms")
        return out
    on = out["on"]
    valid = mask > 0
    dq = (on["rep"]["variant_relevance"] - off["rep"]["variant_relevance"]).abs().max().item()
    dlp = (on["rep"]["replay_logprobs"] - off["rep"]["replay_logprobs"]).abs()[valid].max().item()
    print(f"prompt-heavy: shared vs unshared: max |dq| = {dq:.2e}, max |d log p| of P_all = {dlp:.2e} (the order of the "
          "reductions: fp32 ~1e-5, bf16 its rounding)")
    tokens = int(on["rep"]["tokens_forwarded"]) / int(off["rep"]["tokens_forwarded"])
    forwards = int(on["rep"]["n_forwards"]) / int(off["rep"]["n_forwards"])
    print(f"gpu prompt-heavy: replay shared / unshared = {on['time'] / off['time']:.2f} in time, {tokens:.2f} in tokens "
          f"forwarded, {forwards:.2f} in forwards")
    return out
