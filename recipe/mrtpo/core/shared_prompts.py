"""Shared prompts: a forward holds each distinct prompt once and every response that follows it attends to it.

A group's n responses (``rollout.n``) are replayed, teacher-scored and old-log-prob'ed behind the same prompt
variants; the ordinary layouts forward ``prompt | response`` whole, the prompt n times. Here a forward is ONE
row of segments ``prompt | response_1 | response_2 | ...``: a segment per distinct prompt (by its tokens), each
response positioned as if it directly followed the prompt (position ids ``p .. p + n - 1``), and a 4D block
mask in which a prompt token attends causally to its segment's prompt and a response token to that prompt
and to its own earlier tokens, nothing else. Each response token therefore sees exactly the keys, values
and positions it sees in the unshared forward: the logits agree up to the order of the floating-point
reductions (fp32: 1e-5, tested against every unshared layout).

The planner keeps every sequence of a row in one forward and orders the kept logits row by row, each row's
sequences in their order, so the reductions (:func:`recipe.mrtpo.core.passes.run_pass`'s ``consume``) see
exactly what the packed layout hands them (a row's reference before its variants). Rows that share a prompt
(a group) form a bundle, bundles longest first; a forward closes before a bundle that would put it over the
token budget (its shared length, prompts once) or over ``micro_batch_size`` sequences, and only a bundle too
big for a forward of its own is split, between rows.

The mask is dense ([L, L]), the exact path of SDPA and eager attention (CPU, tests, small lengths);
flash-attention's varlen kernel cannot express a prefix shared by several sequences, so under it (and in the
``single`` layout of recurrent model types) the engine keeps the unshared layouts: :func:`shares_prompts`
decides, and logs that fallback once per process; the worker counts it per pass (docs/design.md §5.3).
Pure torch; reads sequences and settings by their fields (``row``, ``variant``, ``prompt_len``,
``resp_len``; ``share_prompts``, ``packed_attention``, ``layout``) so that :mod:`recipe.mrtpo.core.passes`
may import it.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)
_FALLBACK_LOGGED: set = set()


def share_fallback_reason(settings) -> Optional[str]:
    """Why a pass asked to share prompts (``settings.share_prompts``) forwards them unshared, or None: the
    block mask needs SDPA / eager attention (``packed_attention == "block_mask"``), and a recurrent model type
    runs one sequence per forward (``layout == "single"``)."""
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
    """The identity of sequence ``s``'s prompt: its length and its tokens (``prompts`` [R, NV, P] left-padded)."""
    P = prompts.shape[-1]
    return int(s.prompt_len), prompts[s.row, s.variant, P - s.prompt_len :].numpy().tobytes()


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


def shared_tokens(mb: list, keys: list) -> int:
    """Tokens a shared forward of ``mb`` holds: each distinct prompt once, every response."""
    seen: dict = {}
    for s, k in zip(mb, keys):
        seen[k] = int(s.prompt_len)
    return sum(seen.values()) + sum(int(s.resp_len) for s in mb)


class _Forward:
    """The forward being filled: its sequences, its distinct prompts' lengths, its response tokens."""

    def __init__(self):
        self.seqs: list = []
        self.prompts: dict = {}
        self.resp = 0

    def grown(self, rows: list[tuple[list, list]]) -> tuple[int, int]:
        """(shared length, sequences) were ``rows`` added."""
        new = {k: int(s.prompt_len) for row, ks in rows for s, k in zip(row, ks) if k not in self.prompts}
        n = sum(len(row) for row, _ in rows)
        return (sum(self.prompts.values()) + sum(new.values()) + self.resp + sum(int(s.resp_len) for row, _ in rows for s in row),
                len(self.seqs) + n)

    def add(self, row: list, keys: list) -> None:
        self.seqs += row
        self.prompts.update((k, int(s.prompt_len)) for s, k in zip(row, keys))
        self.resp += sum(int(s.resp_len) for s in row)


def plan_shared_forwards(seqs: list, prompts: torch.Tensor, token_budget: Optional[int], micro_batch_size: int) -> list[list]:
    """The forwards of a shared pass: whole bundles (a group's rows, :func:`_bundled`) while the shared length
    stays within ``token_budget`` (or the forward holds at most ``micro_batch_size`` sequences); a bundle that
    does not fit a forward of its own is split between whole rows; a row over the budget runs alone."""

    def over(f: _Forward, rows) -> bool:
        tokens, n = f.grown(rows)
        return tokens > token_budget if token_budget else n > micro_batch_size

    batches: list[list] = []
    cur = _Forward()
    for bundle in _bundled(seqs, prompts):
        if cur.seqs and over(cur, bundle):  # the bundle starts a forward rather than splitting its prompts
            batches.append(cur.seqs)
            cur = _Forward()
        for row, keys in bundle:
            if cur.seqs and over(cur, [(row, keys)]):
                batches.append(cur.seqs)
                cur = _Forward()
            cur.add(row, keys)
    if cur.seqs:
        batches.append(cur.seqs)
    return batches


def shared_forward_inputs(mb: list, prompts: torch.Tensor, responses: torch.Tensor, pad_id: int = 0):
    """``(input_ids [1, L], attention_mask [1, 1, L, L] additive fp32, position_ids [1, L], keep [N], starts)`` of
    one shared forward, on CPU (module docstring). ``keep`` lists, sequence by sequence in ``mb``'s order, the
    position before each of its response tokens (a prompt's last position repeats for each response after it);
    ``starts[i]``: where sequence i's logits begin in the kept ones."""
    P = prompts.shape[-1]
    keys = [prompt_key(prompts, s) for s in mb]
    segs: dict = {}  # key -> [prompt sequence, its sequences' indices]
    for i, (s, k) in enumerate(zip(mb, keys)):
        segs.setdefault(k, [s, []])[1].append(i)
    L = shared_tokens(mb, keys)
    ids = torch.full((1, L), int(pad_id), dtype=torch.long)
    pos = torch.zeros((1, L), dtype=torch.long)
    seg = torch.empty(L, dtype=torch.long)
    own = torch.full((L,), -1, dtype=torch.long)  # the response a token belongs to; -1: a prompt token
    last_prompt = [0] * len(mb)
    resp_at = [0] * len(mb)
    o = 0
    for g, (head, members) in enumerate(segs.values()):
        p = int(head.prompt_len)
        ids[0, o : o + p] = prompts[head.row, head.variant, P - p :]
        pos[0, o : o + p] = torch.arange(p)
        seg[o : o + p] = g
        prompt_end = o + p - 1
        o += p
        for i in members:
            n = int(mb[i].resp_len)
            ids[0, o : o + n] = responses[mb[i].row, :n]
            pos[0, o : o + n] = torch.arange(p, p + n)
            seg[o : o + n] = g
            own[o : o + n] = i
            last_prompt[i], resp_at[i] = prompt_end, o
            o += n
    keep, starts, n_kept = [], [], 0
    for i, s in enumerate(mb):
        n = int(s.resp_len)
        if n:
            keep.append(torch.tensor([last_prompt[i]]))
            keep.append(torch.arange(resp_at[i], resp_at[i] + n - 1))
        starts.append(n_kept)
        n_kept += n
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    allowed = causal & (seg.unsqueeze(0) == seg.unsqueeze(1)) & ((own.unsqueeze(0) == -1) | (own.unsqueeze(0) == own.unsqueeze(1)))
    attn = torch.zeros(1, 1, L, L).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    keep_t = torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)
    return ids, attn, pos, keep_t, starts
