"""Shared prompts: a forward holds each distinct prompt once and every response that follows it attends to it.

A group's n responses (``rollout.n``) are replayed, teacher-scored and old-log-prob'ed behind the same prompt
variants, and a row's variants (P_all and each P_minus_k) differ only from the point where Z_k is cut out, so they share a
long common prefix (a schema, tool documentation, a multi-turn conversation's earlier turns). The ordinary
layouts forward ``prompt | response`` whole, the prompt n times and every variant's prefix again. Here a forward
is ONE row holding the forward's distinct prompts as a prefix tree: the prompts in lexicographic order of their
tokens, each after the first holding only its tokens after the longest prefix it shares with the one before it
(in that order, the longest it shares with any earlier one), each followed by the responses that follow it.
Every token keeps the position id it has in its own sequence (a shared prefix token ``0 .. m - 1``, a
prompt's own tokens after it, a response ``p .. p + n - 1``), and the forward's attention
(:class:`~recipe.mrtpo.core.tree_mask.TreeMask`: the tree's segments and their parents, nothing of size L x L) lets
a prompt token attend to its own prompt's earlier tokens (wherever in the row the shared part lies) and a
response token to its whole prompt and its own earlier tokens, nothing else. Each response token therefore sees
exactly the keys, values and positions it sees in the unshared forward (a shared prefix token's keys and values
depend only on that prefix): the logits agree up to the order of the floating-point reductions (fp32: 1e-5 on q,
1e-4 on log-probs under FlexAttention's eager kernel, tested against every unshared layout).

The planner keeps every sequence of a row in one forward and orders the kept logits row by row, each row's
sequences in their order, so the reductions (:func:`recipe.mrtpo.core.passes.run_pass`'s ``consume``) see
exactly what the packed layout hands them (a row's reference before its variants). Rows that share a prompt
(a group) form a bundle, bundles longest first; a forward closes before a bundle that would put it over the
token budget (its shared length: the prefix tree's tokens plus the responses) or over ``micro_batch_size``
sequences, and only a bundle too big for a forward of its own is split, between rows.

A shared forward runs under FlexAttention with the tree's block-sparse mask: :func:`hf_forward` switches the
module to :data:`~recipe.mrtpo.core.tree_mask.TREE_ATTENTION` for that forward (:func:`attention_switched`), so
any attention shares, flash-attention included, and the unshared forwards keep the module's own. Tokens are
not the whole cost: :func:`plan_pass` keeps a forward shared only where the cost model
(:mod:`recipe.mrtpo.core.attention_cost`: linear tokens and attention pairs in tiles, FLOPs by the model's shape)
says it costs at most its sequences' unshared layout, else runs them unshared (logged once, counted per pass as
``<pass>_unshared_by_cost``). Only where the model type runs one sequence per forward (``single``: recurrent
layers) does the engine keep the unshared layouts for the whole pass: :func:`shares_prompts` decides, and logs
that fallback once per process; the worker counts it per pass (docs/design.md §5.3). Pure torch; reads sequences
and settings by their fields (``row``, ``variant``, ``prompt_len``, ``resp_len``; ``share_prompts``,
``packed_attention``, ``layout``, ``model_shape``) so that :mod:`recipe.mrtpo.core.passes` may import it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from recipe.mrtpo.core.attention_cost import ForwardCounts, ModelShape, layout_counts, shared_pays, tree_counts
from recipe.mrtpo.core.model_support import module_config
from recipe.mrtpo.core.tree_mask import TREE_ATTENTION, TreeMask

logger = logging.getLogger(__name__)
_FALLBACK_LOGGED: set = set()


@contextmanager
def attention_switched(module, attn_implementation: str) -> Iterator[None]:
    """Run the block under ``attn_implementation`` (transformers reads ``config._attn_implementation`` at every
    forward, and its setter carries it to the sub-configs), restoring the module's own after, also on an error.
    A module already under it, or without a config, is left alone."""
    cfg = module_config(module)
    own = getattr(cfg, "_attn_implementation", None) if cfg is not None else None
    if cfg is None or not attn_implementation or own == attn_implementation:
        yield
        return
    if ("switch", own) not in _FALLBACK_LOGGED:
        _FALLBACK_LOGGED.add(("switch", own))
        logger.warning("mrtpo.share_prompts: the shared forwards run under %s (FlexAttention, the prefix tree's block "
                       "mask), the others under the model's %s", attn_implementation, own)
    cfg._attn_implementation = attn_implementation
    try:
        yield
    finally:
        cfg._attn_implementation = own


def mask_as_taken(module, mask: torch.Tensor) -> torch.Tensor:
    """A 4D mask (boolean, True: attends; or additive) as the module's attention takes it, read at each call:
    boolean to SDPA, additive in the module's floating dtype to the others (eager adds it to the scores)."""
    if mask.dtype == torch.bool and getattr(module_config(module), "_attn_implementation", None) == "sdpa":
        return mask
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask.to(dtype)


def hf_forward(module):
    """A ``core.passes.ForwardFn`` over a Hugging Face causal LM (also an FSDP-wrapped one).

    A 4D mask goes in as the module's attention takes it (:func:`mask_as_taken`); a
    shared forward's :class:`~recipe.mrtpo.core.tree_mask.TreeMask` as its BlockMask, the module switched to
    :data:`~recipe.mrtpo.core.tree_mask.TREE_ATTENTION` for that forward only (registered with transformers by
    ``recipe.mrtpo.passes.tree_attention.register_tree_attention``).
    """

    def fwd(input_ids, attention_mask, position_ids, keep):
        tree = isinstance(attention_mask, TreeMask)
        if tree:
            attention_mask = attention_mask.block_mask(input_ids.device)
        elif attention_mask is not None and attention_mask.dim() == 4:
            attention_mask = mask_as_taken(module, attention_mask)
        with attention_switched(module, TREE_ATTENTION if tree else ""):
            return module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                          logits_to_keep=keep).logits

    return fwd


def share_fallback_reason(settings) -> Optional[str]:
    """Why a pass asked to share prompts (``settings.share_prompts``) forwards them unshared, or None: a recurrent
    model type runs one sequence per forward (``layout == "single"``). Any attention shares: the shared forwards
    run under :data:`~recipe.mrtpo.core.tree_mask.TREE_ATTENTION` (:func:`recipe.mrtpo.core.passes.hf_forward`
    switches the module for them), the others under the module's own."""
    if not settings.share_prompts:
        return None
    if settings.layout == "single":
        return "the model type runs one sequence per forward (recurrent layers)"
    return None


def shares_prompts(settings) -> bool:
    """Whether a pass with ``settings`` forwards each distinct prompt once (:func:`plan_shared_forwards`). Where
    ``share_prompts`` is on but cannot apply (:func:`share_fallback_reason`) the pass runs unshared, exactly as
    with it off, and this logs one warning per process and reason."""
    why = share_fallback_reason(settings)
    if why is not None and why not in _FALLBACK_LOGGED:
        _FALLBACK_LOGGED.add(why)
        logger.warning("mrtpo.share_prompts: %s, so the passes forward every prompt unshared (counted per pass as "
                       "<pass>_unshared_fallback)", why)
    return bool(settings.share_prompts) and why is None


@dataclass
class PassPlan:
    """The forwards of a pass: each ``(sequences, shared inputs or None)`` (None: the unshared layout's
    ``forward_inputs``), the shared forwards the cost model ran unshared, and the pass's counts as planned."""

    forwards: list = field(default_factory=list)
    unshared_by_cost: int = 0
    counts: ForwardCounts = ForwardCounts(0, 0, 0, 0)


def plan_pass(seqs: list, prompts: torch.Tensor, responses: torch.Tensor, settings,
              plan_unshared: Callable[[list, object], list]) -> PassPlan:
    """A pass's forwards: ``plan_unshared(seqs, settings)`` (``core.passes.plan_forwards``) where prompts are not
    shared; else :func:`plan_shared_forwards`, each forward kept shared where the cost model
    (:mod:`recipe.mrtpo.core.attention_cost`, ``settings.model_shape``) says it costs at most the unshared layout
    of its sequences, else replaced by that layout's forwards (logged once, counted). Without a model shape every
    forward stays shared."""
    plan = PassPlan()
    if not shares_prompts(settings):
        for mb in plan_unshared(seqs, settings):
            plan.forwards.append((mb, None))
            plan.counts += layout_counts(mb, settings.layout, settings.packed_attention)
        return plan
    shape: Optional[ModelShape] = getattr(settings, "model_shape", None)
    for mb in plan_shared_forwards(seqs, prompts, settings.token_budget, settings.micro_batch_size):
        inputs = shared_forward_inputs(mb, prompts, responses, settings.pad_id)
        shared = tree_counts(inputs[1])
        alone = plan_unshared(mb, settings)
        unshared = sum((layout_counts(b, settings.layout, settings.packed_attention) for b in alone), ForwardCounts(0, 0, 0, 0))
        if shape is None or shared_pays(shape, shared, unshared):
            plan.forwards.append((mb, inputs))
            plan.counts += shared
            continue
        if "cost" not in _FALLBACK_LOGGED:
            _FALLBACK_LOGGED.add("cost")
            logger.warning("mrtpo.share_prompts: a shared forward (%d tokens, %d attention pairs in tiles) costs more than "
                           "its sequences unshared (%d tokens, %d pairs) under the cost model, so it runs unshared "
                           "(counted per pass as <pass>_unshared_by_cost)", shared.tokens, shared.pairs, unshared.tokens,
                           unshared.pairs)
        plan.unshared_by_cost += 1
        plan.forwards += [(b, None) for b in alone]
        plan.counts += unshared
    return plan


def prompt_key(prompts: torch.Tensor, s) -> tuple[int, bytes]:
    """The identity of sequence ``s``'s prompt: its length and its tokens as int64 bytes (``prompts`` [R, NV, P]
    left-padded, any integer dtype)."""
    P = prompts.shape[-1]
    return int(s.prompt_len), prompts[s.row, s.variant, P - s.prompt_len :].long().numpy().tobytes()


def _rows(seqs: list) -> list[list]:
    """Sequences grouped by row, rows in first-appearance order, each row's sequences in their order."""
    rows: dict[int, list] = {}
    for s in seqs:
        rows.setdefault(s.row, []).append(s)
    return list(rows.values())


def _bundled(seqs: list, prompts: torch.Tensor) -> list[list[tuple[list, list]]]:
    """Bundles of rows that share a prompt (transitively: a group), each row as (its sequences, their prompt
    keys); bundles by their longest sequence, longest first (stable), rows within a bundle in the given order."""
    rows = _rows(seqs)
    keys = [[prompt_key(prompts, s) for s in row] for row in rows]
    parent = list(range(len(rows)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    owner: dict = {}
    for r, ks in enumerate(keys):
        for k in ks:
            parent[find(r)] = find(owner.setdefault(k, r))
    bundles: dict[int, list[int]] = {}
    for r in range(len(rows)):
        bundles.setdefault(find(r), []).append(r)
    longest = {b: max(int(s.prompt_len) + int(s.resp_len) for r in rs for s in rows[r]) for b, rs in bundles.items()}
    return [[(rows[r], keys[r]) for r in bundles[b]] for b in sorted(bundles, key=lambda b: -longest[b])]


def _lcp(a: bytes, b: bytes) -> int:
    """Tokens two prompts' token bytes (int64 each, :func:`prompt_key`) have in common from the start."""
    x, y = np.frombuffer(a, dtype=np.int64), np.frombuffer(b, dtype=np.int64)
    m = min(x.size, y.size)
    d = np.flatnonzero(x[:m] != y[:m])
    return int(d[0]) if d.size else m


class PromptTree:
    """The distinct prompts of a forward as a prefix tree (module docstring): its ``tokens`` are the prompts'
    tokens with every shared prefix counted once, ``sum(p) - sum(lcp of neighbours)`` over the prompts in
    lexicographic order (by their int64 bytes: a lexicographic order of the token sequences, a prefix first).
    ``lcp`` caches the common prefixes of pairs (shared by the trees of one plan)."""

    def __init__(self, lcp: Optional[dict] = None):
        self.keys: list[tuple[int, bytes]] = []
        self.tokens = 0
        self._lcp = {} if lcp is None else lcp

    def lcp(self, a: tuple[int, bytes], b: tuple[int, bytes]) -> int:
        pair = (a[1], b[1])
        got = self._lcp.get(pair)
        if got is None:
            got = self._lcp[pair] = _lcp(a[1], b[1])
        return got

    def size_of(self, keys: list[tuple[int, bytes]]) -> int:
        """Tokens of the tree of ``keys`` (distinct, in order)."""
        return sum(k[0] for k in keys) - sum(self.lcp(a, b) for a, b in zip(keys, keys[1:]))

    def with_keys(self, new) -> tuple[list, int]:
        """(ordered keys, tokens) were ``new`` added (repeats and keys already held change nothing)."""
        held = set(self.keys)
        fresh = [k for k in dict.fromkeys(new) if k not in held]
        if not fresh:
            return self.keys, self.tokens
        keys = sorted(self.keys + fresh, key=lambda k: k[1])
        return keys, self.size_of(keys)

    def add(self, new) -> None:
        self.keys, self.tokens = self.with_keys(new)


def shared_tokens(mb: list, keys: list, lcp: Optional[dict] = None) -> int:
    """Tokens a shared forward of ``mb`` holds: its distinct prompts' prefix tree (:class:`PromptTree`), every
    response."""
    tree = PromptTree(lcp)
    tree.add(keys)
    return tree.tokens + sum(int(s.resp_len) for s in mb)


class _Forward:
    """The forward being filled: its sequences, its prompts' tree, its response tokens."""

    def __init__(self, lcp: dict):
        self.seqs: list = []
        self.tree = PromptTree(lcp)
        self.resp = 0

    def grown(self, rows: list[tuple[list, list]]) -> tuple[int, int]:
        """(shared length, sequences) were ``rows`` added."""
        _, prompts = self.tree.with_keys([k for _, ks in rows for k in ks])
        n = sum(len(row) for row, _ in rows)
        return prompts + self.resp + sum(int(s.resp_len) for row, _ in rows for s in row), len(self.seqs) + n

    def add(self, row: list, keys: list) -> None:
        self.seqs += row
        self.tree.add(keys)
        self.resp += sum(int(s.resp_len) for s in row)


def plan_shared_forwards(seqs: list, prompts: torch.Tensor, token_budget: Optional[int], micro_batch_size: int) -> list[list]:
    """The forwards of a shared pass: whole bundles (a group's rows, :func:`_bundled`) while the shared length
    stays within ``token_budget`` (or the forward holds at most ``micro_batch_size`` sequences); a bundle that
    does not fit a forward of its own is split between whole rows; a row over the budget runs alone."""

    def over(f: _Forward, rows) -> bool:
        tokens, n = f.grown(rows)
        return tokens > token_budget if token_budget else n > micro_batch_size

    batches: list[list] = []
    lcp: dict = {}
    cur = _Forward(lcp)
    for bundle in _bundled(seqs, prompts):
        if cur.seqs and over(cur, bundle):  # the bundle starts a forward rather than splitting its prompts
            batches.append(cur.seqs)
            cur = _Forward(lcp)
        for row, keys in bundle:
            if cur.seqs and over(cur, [(row, keys)]):
                batches.append(cur.seqs)
                cur = _Forward(lcp)
            cur.add(row, keys)
    if cur.seqs:
        batches.append(cur.seqs)
    return batches


def shared_forward_inputs(mb: list, prompts: torch.Tensor, responses: torch.Tensor, pad_id: int = 0):
    """``(input_ids [1, L], tree, position_ids [1, L], keep [N], starts)`` of one shared forward (module docstring),
    on CPU; ``tree`` the forward's :class:`~recipe.mrtpo.core.tree_mask.TreeMask` (segments of the prompts'
    compressed prefix tree and the responses: nothing of size L x L). ``keep`` lists, sequence by sequence in
    ``mb``'s order, the position before each of its response tokens (a prompt's last position repeats for each
    response after it); ``starts[i]``: where sequence i's logits begin in the kept ones."""
    P = prompts.shape[-1]
    tree = PromptTree()
    keys = [prompt_key(prompts, s) for s in mb]
    members: dict = {}  # key -> (a sequence with that prompt, the indices of its sequences)
    for i, (s, k) in enumerate(zip(mb, keys)):
        members.setdefault(k, (s, []))[1].append(i)
    tree.add(keys)
    L = tree.tokens + sum(int(s.resp_len) for s in mb)
    ids = torch.full((1, L), int(pad_id), dtype=torch.long)
    pos = torch.zeros((1, L), dtype=torch.long)
    seg_start: list[int] = []
    seg_end: list[int] = []
    parent: list[int] = []
    first_token: list[int] = []  # each prompt segment's first token's place in its prompt
    stack: list[int] = []  # the previous prompt's path, root first
    last_prompt = [0] * len(mb)
    resp_at = [0] * len(mb)
    o, prev_key = 0, None

    def segment(a: int, b: int, up: int, t0: int = -1) -> int:
        seg_start.append(a)
        seg_end.append(b)
        parent.append(up)
        first_token.append(t0)
        return len(seg_start) - 1

    for k in tree.keys:
        head, seqs = members[k]
        p = int(head.prompt_len)
        m = tree.lcp(prev_key, k) if prev_key is not None else 0  # < p: the keys are distinct and ordered
        while stack and first_token[stack[-1]] >= m:
            stack.pop()
        if stack:  # the branch point inside the deepest shared segment: split it there
            top = stack[-1]
            cut = seg_start[top] + m - first_token[top]
            if cut < seg_end[top]:
                rest = segment(cut, seg_end[top], top, m)
                for c in range(len(parent) - 1):
                    if parent[c] == top:
                        parent[c] = rest  # what followed the whole segment now follows its tail
                seg_end[top] = cut
        ids[0, o : o + p - m] = prompts[head.row, head.variant, P - p + m :]
        pos[0, o : o + p - m] = torch.arange(m, p)
        own = segment(o, o + p - m, stack[-1] if stack else -1, m)
        stack.append(own)
        o += p - m
        end = o - 1  # the prompt's last token is its own (m < p)
        for i in seqs:
            n = int(mb[i].resp_len)
            ids[0, o : o + n] = responses[mb[i].row, :n]
            pos[0, o : o + n] = torch.arange(p, p + n)
            if n:
                segment(o, o + n, own)
            last_prompt[i], resp_at[i] = end, o
            o += n
        prev_key = k
    keep, starts, n_kept = [], [], 0
    for i, s in enumerate(mb):
        n = int(s.resp_len)
        if n:
            keep.append(torch.tensor([last_prompt[i]]))
            keep.append(torch.arange(resp_at[i], resp_at[i] + n - 1))
        starts.append(n_kept)
        n_kept += n
    keep_t = torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)
    return ids, TreeMask(seg_start, seg_end, parent, L), pos, keep_t, starts
