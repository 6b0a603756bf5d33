"""Shared prompts: a forward holds each distinct prompt once and every response that follows it attends to it.

A group's n responses (``rollout.n``) are replayed, teacher-scored and old-log-prob'ed behind the same prompt
variants, and a row's variants (P_all and each P_minus_k) differ only from the point where Z_k is cut out, so they share a
long common prefix (a schema, tool documentation, a multi-turn conversation's earlier turns). The ordinary
layouts forward ``prompt | response`` whole, the prompt n times and every variant's prefix again. Here a forward
is ONE row holding the forward's distinct prompts as a prefix tree: the prompts in lexicographic order of their
tokens, each after the first holding only its tokens after the longest prefix it shares with the one before it
(in that order, the longest it shares with any earlier one), each followed by the responses that follow it.
Every token keeps the position id it has in its own sequence (a shared prefix token ``0 .. m - 1``, a
prompt's own tokens after it, a response ``p .. p + n - 1``), and a 4D mask lets a prompt token attend to
its own prompt's earlier tokens (wherever in the row the shared part lies) and a response token to its whole
prompt and its own earlier tokens, nothing else. Each response token therefore sees exactly the keys, values
and positions it sees in the unshared forward (a shared prefix token's keys and values depend only on that
prefix): the logits agree up to the order of the floating-point reductions (fp32: 1e-5, tested against
every unshared layout).

The planner keeps every sequence of a row in one forward and orders the kept logits row by row, each row's
sequences in their order, so the reductions (:func:`recipe.mrtpo.core.passes.run_pass`'s ``consume``) see
exactly what the packed layout hands them (a row's reference before its variants). Rows that share a prompt
(a group) form a bundle, bundles longest first; a forward closes before a bundle that would put it over the
token budget (its shared length: the prefix tree's tokens plus the responses) or over ``micro_batch_size``
sequences, and only a bundle too big for a forward of its own is split, between rows.

The mask is dense ([L, L], boolean, built on the forward's device), the exact path of SDPA and eager attention.
flash-attention's varlen kernel cannot express a prefix shared by several sequences, so a pass that shares
prompts on a module loaded with flash-attention (verl's default, the GPU scripts') runs its forwards under SDPA
instead: :func:`pass_attention` names the attention a pass runs under, and :func:`attention_switched` sets the
module's attention implementation for the pass and restores it after (the update's forwards keep
flash-attention). Only where the model type runs one sequence per forward (``single``: recurrent layers), or a
caller runs a pass under a varlen attention itself, does the engine keep the unshared layouts:
:func:`shares_prompts` decides, and logs that fallback once per process; the worker counts it per pass
(docs/design.md §5.3). Pure torch; reads sequences and settings by their fields (``row``, ``variant``,
``prompt_len``, ``resp_len``; ``share_prompts``, ``packed_attention``, ``layout``) so that
:mod:`recipe.mrtpo.core.passes` may import it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import numpy as np
import torch

from recipe.mrtpo.core.model_support import VARLEN_ATTENTIONS, module_config, table_entry

logger = logging.getLogger(__name__)
_FALLBACK_LOGGED: set = set()
#: the attention a shared pass runs under where the module's is flash-attention (module docstring)
SHARED_ATTENTION = "sdpa"


def pass_attention(share_prompts: bool, attn_implementation: Optional[str], model_type: Optional[str] = None) -> str:
    """The attention implementation a no-grad pass runs under: the module's own, except that a pass sharing
    prompts on a flash-attention module (:data:`~recipe.mrtpo.core.model_support.VARLEN_ATTENTIONS`) whose type
    the model table does not run one sequence per forward takes :data:`SHARED_ATTENTION` (its block mask)."""
    attn = str(attn_implementation or "")
    if share_prompts and attn in VARLEN_ATTENTIONS and table_entry(model_type) != "single":
        return SHARED_ATTENTION
    return attn


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
        logger.warning("mrtpo.share_prompts: the model's attention is %s, which cannot share a prompt between sequences; "
                       "the shared passes run under %s (a block mask), the update under %s", own, attn_implementation, own)
    cfg._attn_implementation = attn_implementation
    try:
        yield
    finally:
        cfg._attn_implementation = own


def mask_as_taken(module, mask: torch.Tensor) -> torch.Tensor:
    """A 4D mask (boolean, True: attends; or additive) as the module's attention takes it, read at each call (a
    shared pass switches it, :func:`attention_switched`): boolean to SDPA, additive in the module's floating
    dtype to the others (eager adds it to the scores)."""
    if mask.dtype == torch.bool and getattr(module_config(module), "_attn_implementation", None) == "sdpa":
        return mask
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask.to(dtype)


def share_fallback_reason(settings) -> Optional[str]:
    """Why a pass asked to share prompts (``settings.share_prompts``) forwards them unshared, or None: a recurrent
    model type runs one sequence per forward (``layout == "single"``), and the block mask needs SDPA / eager
    attention (``packed_attention == "block_mask"``; the worker switches a flash-attention module to SDPA for a
    shared pass, :func:`pass_attention`, so this is a caller running a pass under flash-attention itself)."""
    if not settings.share_prompts:
        return None
    if settings.packed_attention != "block_mask":
        return (f"the model's attention is {settings.packed_attention} (flash-attention): its kernel cannot express a prompt "
                "shared by several sequences")
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


def shared_forward_inputs(mb: list, prompts: torch.Tensor, responses: torch.Tensor, pad_id: int = 0,
                          device: torch.device | str = "cpu"):
    """``(input_ids [1, L], attention_mask [1, 1, L, L] bool (True: attends), position_ids [1, L], keep [N], starts)``
    of one shared forward (module docstring); the mask built on ``device`` (L x L bytes: the forward's own device
    rather than a copy from the host), the rest on CPU. ``keep`` lists, sequence by sequence in ``mb``'s order, the
    position before each of its response tokens (a prompt's last position repeats for each response after it);
    ``starts[i]``: where sequence i's logits begin in the kept ones."""
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
    allowed = torch.zeros(L, L, dtype=torch.bool, device=device)
    last_prompt = [0] * len(mb)
    resp_at = [0] * len(mb)
    o, prev_key, prev_path = 0, None, torch.zeros(0, dtype=torch.long, device=device)
    for k in tree.keys:
        head, seqs = members[k]
        p = int(head.prompt_len)
        m = tree.lcp(prev_key, k) if prev_key is not None else 0  # < p: the keys are distinct and ordered
        path = torch.cat([prev_path[:m], torch.arange(o, o + p - m, device=device)])  # where its tokens lie in the row
        ids[0, o : o + p - m] = prompts[head.row, head.variant, P - p + m :]
        pos[0, o : o + p - m] = torch.arange(m, p)
        allowed[o : o + p - m][:, path] = torch.ones(p, p, dtype=torch.bool, device=device).tril()[m:]  # its prompt, causally
        o += p - m
        end = o - 1  # the prompt's last token is its own (m < p)
        for i in seqs:
            n = int(mb[i].resp_len)
            ids[0, o : o + n] = responses[mb[i].row, :n]
            pos[0, o : o + n] = torch.arange(p, p + n)
            allowed[o : o + n][:, path] = True
            allowed[o : o + n, o : o + n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            last_prompt[i], resp_at[i] = end, o
            o += n
        prev_key, prev_path = k, path
    keep, starts, n_kept = [], [], 0
    for i, s in enumerate(mb):
        n = int(s.resp_len)
        if n:
            keep.append(torch.tensor([last_prompt[i]]))
            keep.append(torch.arange(resp_at[i], resp_at[i] + n - 1))
        starts.append(n_kept)
        n_kept += n
    keep_t = torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)
    return ids, allowed[None, None], pos, keep_t, starts
