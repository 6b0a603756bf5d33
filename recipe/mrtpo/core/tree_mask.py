"""The attention of a shared forward, block-sparse: the prompts' prefix tree as segments, never an [L, L] mask.

A shared forward (:mod:`recipe.mrtpo.core.shared_prompts`) is one row of ``L`` tokens cut into **segments**:
contiguous runs of rows, each a node of the prompts' compressed prefix tree (a run of prompt tokens between two
branch points) or one response. A segment's ``parent`` is the segment its first token follows (-1: a root); a
response's parent is the segment holding its prompt's last token. The rule (:meth:`TreeMask.allowed`): row ``q``
attends to row ``k`` iff ``seg(k)`` is a proper ancestor of ``seg(q)``, or ``seg(k) == seg(q)`` and ``k <= q``.
A token therefore sees exactly its own sequence's earlier tokens, wherever in the row they lie.

The mask is held as the segments plus a small ancestor table (``anc[s, d]``: the ancestor of ``s`` at depth
``d``, -1 past ``s``'s own depth), ``S x (depth + 1)`` integers. :meth:`TreeMask.block_counts` counts, for every
pair of ``block x block`` tiles, the allowed pairs in it by interval arithmetic over the segments
(``O(S x depth)`` outer products of per-tile overlaps, at most ``(L / block)^2`` cells): the tiles a
block-sparse kernel computes (any allowed pair), those it computes without the mask (all pairs allowed) and
the tree's exact pairs. :meth:`TreeMask.block_mask` turns them into FlexAttention's ``BlockMask``
(``BlockMask.from_kv_blocks``, the mask_mod evaluated only inside partial tiles), and :func:`tree_flex_attention`
is the attention function (transformers' attention-interface signature) that runs ``flex_attention`` with it:
compiled on an accelerator (a fused kernel that skips the tiles not listed), eager on CPU (exact, but it
materialises the scores: for tests at small L). Pure torch and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

#: the attention implementation name a shared forward runs under (registered with transformers by the glue,
#: ``recipe.mrtpo.passes.tree_attention.register_tree_attention``)
TREE_ATTENTION = "mrtpo_tree_flex"
#: the tile of the block-sparse kernel (FlexAttention's default) and of the counts
BLOCK = 128


@dataclass(frozen=True)
class BlockCounts:
    """Per forward: ``tiles`` computed (any allowed pair), ``full_tiles`` among them (every pair allowed: no mask
    evaluated), ``pairs`` the tree's exact allowed pairs, ``block`` the tile edge."""

    tiles: int
    full_tiles: int
    pairs: int
    block: int

    @property
    def tile_pairs(self) -> int:
        """Pairs a block-sparse kernel computes: ``tiles x block^2``."""
        return self.tiles * self.block * self.block


class TreeMask:
    """The attention of one shared forward as segments (module docstring).

    ``starts`` / ``ends`` [S]: each segment's rows ``[start, end)`` (disjoint, covering ``[0, L)``, any order);
    ``parent`` [S]: its parent segment, -1 for a root. ``shape`` is ``(1, 1, L, L)`` as a 4D mask's (what
    transformers' mask preparation reads to pass a prepared mask through), though nothing of that size exists.
    """

    def __init__(self, starts, ends, parent, length: int, block: int = BLOCK):
        self.starts = np.asarray(starts, dtype=np.int64)
        self.ends = np.asarray(ends, dtype=np.int64)
        self.parent = np.asarray(parent, dtype=np.int64)
        self.length, self.block = int(length), int(block)
        S = len(self.starts)
        if not (len(self.ends) == len(self.parent) == S) or S == 0 and self.length:
            raise ValueError(f"TreeMask: {S} starts, {len(self.ends)} ends, {len(self.parent)} parents for {self.length} rows")
        if S and (np.any(self.ends <= self.starts) or int((self.ends - self.starts).sum()) != self.length
                  or np.any(self.parent >= S) or np.any(self.parent < -1)):
            raise ValueError("TreeMask: segments must be non-empty runs covering the row once, parents in range")
        self.depth, self.anc = _ancestors(self.parent)
        self.shape = (1, 1, self.length, self.length)

    @classmethod
    def sequences(cls, lengths, block: int = BLOCK) -> TreeMask:
        """Consecutive independent causal sequences of ``lengths`` (a packed row, nothing shared)."""
        ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        return cls(ends - np.asarray(lengths, dtype=np.int64), ends, np.full(len(ends), -1), int(ends[-1]) if len(ends) else 0, block)

    def segment_of_rows(self) -> np.ndarray:
        """[L] each row's segment."""
        seg = np.empty(self.length, dtype=np.int64)
        for s, (a, b) in enumerate(zip(self.starts, self.ends)):
            seg[a:b] = s
        return seg

    def allowed(self, q: torch.Tensor, k: torch.Tensor, seg: Optional[torch.Tensor] = None,
                depth: Optional[torch.Tensor] = None, anc: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The rule (module docstring) at row indices ``q``, ``k`` (broadcast; the mask_mod's body): ``seg(k)``
        is ``seg(q)``'s ancestor at ``seg(k)``'s depth, and not a later row of the same segment."""
        if seg is None:
            seg, depth, anc = (torch.from_numpy(x) for x in (self.segment_of_rows(), self.depth, self.anc))
        return _allowed(q, k, seg, depth, anc)

    def block_counts(self) -> BlockCounts:
        """The tiles and exact pairs of this mask (module docstring)."""
        count = self.tile_pair_counts()
        full = count == self.block * self.block
        return BlockCounts(int((count > 0).sum()), int(full.sum()), int(count.sum()), self.block)

    def tile_pair_counts(self) -> np.ndarray:
        """[NB, NB] allowed pairs in each (query tile, key tile), ``NB = ceil(L / block)``."""
        B = self.block
        n = -(-self.length // B)
        count = np.zeros((n, n), dtype=np.int64)
        over = [_overlaps(int(a), int(b), B) for a, b in zip(self.starts, self.ends)]
        for s, (j0, c) in enumerate(over):
            j1 = j0 + len(c)
            u = self.parent[s]
            while u >= 0:  # every ancestor: all of it
                k0, kc = over[u]
                count[j0:j1, k0:k0 + len(kc)] += np.outer(c, kc)
                u = self.parent[u]
            own = np.tril(np.outer(c, c), -1)  # its own earlier tiles whole, its diagonal tiles causally
            own[np.diag_indices(len(c))] = c * (c + 1) // 2
            count[j0:j1, j0:j1] += own
        return count

    def block_mask(self, device: torch.device | str = "cpu"):
        """FlexAttention's ``BlockMask`` of this mask on ``device``: the partial and full tiles of
        :meth:`tile_pair_counts`, the mask_mod (:meth:`allowed` over the padded row) for the partial ones only."""
        from torch.nn.attention.flex_attention import BlockMask

        B = self.block
        count = self.tile_pair_counts()
        n = count.shape[0]
        full = count == B * B  # a ragged last tile stays partial: the mask_mod's padding segment bounds it
        partial = (count > 0) & ~full

        def indexed(m: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            num = m.sum(1).astype(np.int32)
            order = np.argsort(~m, axis=1, kind="stable").astype(np.int32)  # each row's tiles first, ascending
            return (torch.from_numpy(num)[None, None].to(device), torch.from_numpy(np.ascontiguousarray(order))[None, None].to(device))

        S = len(self.starts)
        seg = np.full(n * B, S, dtype=np.int64)  # rows past L: a padding segment nothing attends to or from
        seg[: self.length] = self.segment_of_rows()
        D = self.anc.shape[1]  # its width bucketed (8, 16, ...): a compiled kernel sees few distinct shapes
        anc = np.full((S + 1, max(8, 1 << (D - 1).bit_length())), -1, dtype=np.int64)
        anc[:S, :D] = self.anc
        seg_t, depth_t, anc_t = (torch.from_numpy(x).to(device) for x in (seg, np.append(self.depth, 0), anc))

        def mask_mod(b, h, q_idx, kv_idx):
            return _allowed(q_idx, kv_idx, seg_t, depth_t, anc_t)

        kv_num, kv_idx = indexed(partial)
        full_num, full_idx = indexed(full)
        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=B, mask_mod=mask_mod,
                                        seq_lengths=(self.length, self.length))


def _allowed(q, k, seg, depth, anc):
    """:meth:`TreeMask.allowed`'s rule on tensors (the mask_mod: no Python object captured)."""
    sq, sk = seg[q], seg[k]
    return (anc[sq, depth[sk]] == sk) & ((sq != sk) | (k <= q))


def _overlaps(a: int, b: int, B: int) -> tuple[int, np.ndarray]:
    """(first tile, rows of ``[a, b)`` in each tile from it)."""
    j0, j1 = a // B, (b - 1) // B
    edges = np.arange(j0, j1 + 2) * B
    return j0, np.minimum(edges[1:], b) - np.maximum(edges[:-1], a)


def _ancestors(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(depth [S], anc [S, D + 1]: the ancestor of each segment at each depth, itself at its own, -1 past it)."""
    S = len(parent)
    depth = np.full(S, -1, dtype=np.int64)
    for s in range(S):
        chain = []
        u = s
        while u >= 0 and depth[u] < 0:
            chain.append(u)
            u = int(parent[u])
            if len(chain) > S:
                raise ValueError("TreeMask: the segments' parents form a cycle")
        d = depth[u] if u >= 0 else -1
        for v in reversed(chain):
            d += 1
            depth[v] = d
    D = int(depth.max()) + 1 if S else 1
    anc = np.full((S, D), -1, dtype=np.int64)
    for s in range(S):
        u = s
        while u >= 0:
            anc[s, depth[u]] = u
            u = int(parent[u])
    return depth, anc


_COMPILED: dict = {}


def _flex(device_type: str):
    """``flex_attention``: eager on CPU (exact; it materialises the scores), compiled once per device type elsewhere
    (the fused block-sparse kernel; eager there would materialise them too)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device_type == "cpu":
        return flex_attention
    if device_type not in _COMPILED:
        _COMPILED[device_type] = torch.compile(flex_attention)
    return _COMPILED[device_type]


def tree_flex_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                        scaling: Optional[float] = None, dropout: float = 0.0, **kwargs):
    """transformers' attention-interface function for :data:`TREE_ATTENTION`: ``query`` [b, H, L, d], ``key`` /
    ``value`` [b, H_kv, L, d], ``attention_mask`` the forward's ``BlockMask`` (:meth:`TreeMask.block_mask`);
    returns ``([b, L, H, d], None)``. Refuses what the tree mask cannot express (a sliding window shorter than
    the row, logit softcapping, attention sinks, dropout) rather than ignoring it."""
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(attention_mask, BlockMask):
        raise TypeError(f"{TREE_ATTENTION} runs a shared forward's BlockMask, got {type(attention_mask).__name__}")
    window = kwargs.get("sliding_window")
    if window is not None and int(window) < query.shape[-2]:
        raise NotImplementedError(f"{TREE_ATTENTION}: a sliding window of {window} tokens over a {query.shape[-2]}-token "
                                  "shared row is not expressed by the prefix tree's mask; set mrtpo.share_prompts=false")
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or dropout:
        raise NotImplementedError(f"{TREE_ATTENTION}: logit softcapping, attention sinks and dropout are not supported; "
                                  "set mrtpo.share_prompts=false")
    out = _flex(query.device.type)(query, key, value, block_mask=attention_mask, scale=scaling,
                                   enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None
