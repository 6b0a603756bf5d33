"""The grouped mixes of ``benchmarks/gpu_replay.py``: the replay unshared, shared under a dense mask and block-sparse.

Text-to-SQL schemas, tool specs and BFCL multi-turn prompts run to thousands of tokens while the responses are
a few hundred, and a group's n responses (``rollout.n``) follow the same prompt variants, so the unshared
layouts forward each variant n times (issue 49; docs/design.md §5.3). The mix here is ``--heavy-groups`` groups
of ``--group-n`` rows that share their prompt variants token for token (P_all of 1-4k tokens, 2..NV variants per
group), each row with its own response of 64-512 tokens (random ids, or sampled from the model), the group's
rows adjacent as verl hands them over. :func:`bench_prompt_heavy` times :func:`recipe.mrtpo.core.replay.replay_relevance`
three times (:data:`MODES`): unshared (``share_prompts`` off, the layout the model table gives Qwen2 under the run's
attention: packed varlen under flash_attention_2), shared under the dense ``[L, L]`` mask the shared pass used
before (SDPA; :func:`dense_tree_mask`, kept here as the baseline only) and shared block-sparse (the pass engine's
own: FlexAttention with the prefix tree's BlockMask, each forward kept shared where the cost model over the model's
shape says it pays), and prints the counts beside the times and peak memory: forwards, tokens forwarded, tokens
forwarded per response token, attention pairs computed (128 x 128 tiles), the forwards the cost model ran unshared,
and the limit (the batch's distinct prompt-variant tokens once + the response tokens of every forwarded sequence).
``gpu_replay.py`` runs it on the prompt-heavy mix and on the IF mix's prompts in groups.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from recipe.mrtpo.core.attention_cost import ModelShape
from recipe.mrtpo.core.passes import PassSettings, resolve_layout, response_lengths
from recipe.mrtpo.core.replay import hf_forward, plan_sequences, replay_relevance
from recipe.mrtpo.core.shared_prompts import attention_switched, prompt_key
from recipe.mrtpo.core.tree_mask import TreeMask


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


def dense_tree_mask(tree: TreeMask, device) -> torch.Tensor:
    """[1, 1, L, L] boolean: the tree mask's rule at every pair, built on ``device`` (what the shared pass forwarded
    before the block-sparse path: the benchmark's baseline, never the package's)."""
    seg = torch.from_numpy(tree.segment_of_rows()).to(device)
    depth, anc = (torch.from_numpy(x).to(device) for x in (tree.depth, tree.anc))
    q = torch.arange(tree.length, device=device)
    return tree.allowed(q[:, None], q[None, :], seg, depth, anc)[None, None]


def dense_forward(model, fwd):
    """``fwd`` with every shared forward run as before the block-sparse path: the dense mask under SDPA."""

    def run(ids, attn, pos, keep):
        if isinstance(attn, TreeMask):
            with attention_switched(model, "sdpa"):
                return fwd(ids, dense_tree_mask(attn, ids.device), pos, keep)
        return fwd(ids, attn, pos, keep)

    return run


#: the three ways the benchmark forwards a mix: unshared (the module's own attention), shared under the old dense
#: mask (SDPA), shared block-sparse (the tree's FlexAttention, each forward kept shared where the cost model says)
MODES = ("off", "dense", "flex")


def bench_prompt_heavy(model, inputs, args, timer: Callable, note: str, label: str = "prompt-heavy") -> dict:
    """Time the replay on the grouped ``inputs`` unshared, shared under the dense mask and shared block-sparse (module
    docstring); ``timer(fn) -> (best seconds, peak GiB, last result)`` (``gpu_replay.best_time``), ``note``: where
    the responses come from, ``label``: the mix. Returns ``{mode: {"time", "peak", "rep"}}`` for :data:`MODES`."""
    var, lens, responses, mask, pair = inputs
    layout, attention = resolve_layout("auto", args.attn, "qwen2")
    fwd = hf_forward(model)
    groups = var.shape[0] // args.group_n
    lo, hi = (int(lens[:, 0].min()), int(lens[:, 0].max()))
    rl = response_lengths(mask)
    print(f"{label} mix: {groups} groups x {args.group_n} responses sharing their prompt variants, prompts {lo}-{hi} tokens, "
          f"responses {int(rl.min())}-{int(rl.max())} ({note}), 2..{args.variants} variants per group, unshared layout "
          f"{layout} ({args.attn})")
    print(f"{'share':>5} | {'forwards':>8} | {'tokens fwd':>10} | {'fwd/resp tok':>12} | {'attn pairs':>11} | {'by cost':>7} | "
          f"{'replay':>11} | {'peak GiB':>8}")
    limit, response = replay_limit(var, lens, mask, pair)
    shape = ModelShape.from_config(model.config)
    out: dict = {}
    for mode in MODES:
        settings = PassSettings(temperature=1.0, micro_batch_size=args.variants, token_budget=args.token_budget, layout=layout,
                                packed_attention=attention, share_prompts=mode != "off",
                                model_shape=shape if mode == "flex" else None)  # dense: every forward shared, as before
        run_fwd = dense_forward(model, fwd) if mode == "dense" else fwd

        def replay(settings=settings, run_fwd=run_fwd):
            with torch.no_grad():
                return replay_relevance(run_fwd, var, lens, responses, mask, pair, settings=settings, device=args.device,
                                        compiled_js=args.compile_js)

        t, peak, rep = timer(replay)
        fwd_tokens = int(rep["tokens_forwarded"])
        print(f"{mode:>5} | {int(rep['n_forwards']):>8} | {fwd_tokens:>10,} | {fwd_tokens / response:>12.2f} | "
              f"{int(rep['attention_pairs']) / 1e6:>10.1f}M | {int(rep['unshared_by_cost']):>7} | {t * 1e3:9.1f}ms | {peak:8.2f}",
              flush=True)
        out[mode] = {"time": t, "peak": peak, "rep": rep}
    print(f"{label}: limit {limit:,} tokens (distinct prompt-variant tokens once + {response:,} response tokens of the "
          f"forwarded sequences): {limit / response:.2f} per response token; attention pairs in 128 x 128 tiles (dense: "
          "every pair of each shared row); by cost: shared forwards the cost model ran unshared")
    off, dense, flex = (out[m] for m in MODES)
    valid = mask > 0
    for mode in ("dense", "flex"):
        dq = (out[mode]["rep"]["variant_relevance"] - off["rep"]["variant_relevance"]).abs().max().item()
        dlp = (out[mode]["rep"]["replay_logprobs"] - off["rep"]["replay_logprobs"]).abs()[valid].max().item()
        print(f"{label}: {mode} vs unshared: max |dq| = {dq:.2e}, max |d log p| of P_all = {dlp:.2e} (the order of the "
              "reductions: fp32 ~1e-5, bf16 its rounding)")
    tokens = int(flex["rep"]["tokens_forwarded"]) / int(off["rep"]["tokens_forwarded"])
    forwards = int(flex["rep"]["n_forwards"]) / int(off["rep"]["n_forwards"])
    print(f"gpu {label}: replay shared / unshared = {flex['time'] / off['time']:.2f} in time (dense mask "
          f"{dense['time'] / off['time']:.2f}), {tokens:.2f} in tokens forwarded, {forwards:.2f} in forwards; peak GiB "
          f"{off['peak']:.2f} / {dense['peak']:.2f} / {flex['peak']:.2f}")
    return out
