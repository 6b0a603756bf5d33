"""What a forward costs a GPU, machine-independently: linear-layer tokens and attention pairs, turned into FLOPs.

Tokens forwarded are the wrong count for a shared forward (:mod:`recipe.mrtpo.core.shared_prompts`): it holds fewer
tokens than the unshared layouts, but its attention is not one causal triangle per sequence. Per forward:

- **linear tokens** ``N``: the row's tokens, every projection and MLP runs once per token;
- **attention pairs** ``P``: the (query, key) pairs computed. A tiled kernel computes whole ``b x b`` tiles
  (``b`` = :data:`~recipe.mrtpo.core.tree_mask.BLOCK`, 128), so every path is counted in tiles, next to its exact
  pairs: unshared varlen (flash-attention's packed rows) computes each sequence's causal triangle, ``n_t (n_t + 1) / 2``
  tiles for ``n_t = ceil(n / b)`` (:func:`varlen_counts`); a dense mask under SDPA computes all ``L^2`` pairs
  (:func:`dense_counts`, what the shared pass did before FlexAttention); the block-sparse tree mask computes the
  tiles holding any allowed pair (:meth:`~recipe.mrtpo.core.tree_mask.TreeMask.block_counts`); the same tree
  computed segment by segment (each segment's queries against its ancestors' keys, gathered, and its own: the
  cascade / PrefixGrouper decomposition under flash-attention varlen) computes :func:`segmented_counts`, the
  reference a tiled kernel's rounding is judged by; a padded micro-batch computes ``b x longest^2``
  (:func:`padded_counts`).

:func:`forward_flops` turns them into FLOPs with the model's shape (:class:`ModelShape`, from its config):
``2 x N x W`` for the linear layers (``W`` their weights per token: Q, K, V, O projections and the gated MLP, per
layer) plus ``4 x P x H x d x layers`` for attention (``QK^T`` and ``PV``, ``H`` query heads of dimension ``d``),
plus the LM head over the kept positions (the same in every layout). :func:`shared_pays` decides per forward:
the shared forward where its FLOPs are at most the unshared layout's, else the unshared layout. Pure Python / numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recipe.mrtpo.core.tree_mask import BLOCK


@dataclass(frozen=True)
class ForwardCounts:
    """One forward's (or a pass's) ``tokens`` through the linear layers, ``pairs`` its attention computes (whole
    tiles), ``exact_pairs`` the allowed pairs among them, ``tiles`` (``pairs = tiles x block^2``)."""

    tokens: int
    pairs: int
    exact_pairs: int
    tiles: int

    def __add__(self, other: ForwardCounts) -> ForwardCounts:
        return ForwardCounts(self.tokens + other.tokens, self.pairs + other.pairs, self.exact_pairs + other.exact_pairs,
                             self.tiles + other.tiles)


ZERO = ForwardCounts(0, 0, 0, 0)


def _tiles(n: int, block: int) -> int:
    return -(-int(n) // block)


def varlen_counts(lengths, block: int = BLOCK) -> ForwardCounts:
    """Unshared varlen (a packed row under flash-attention): per sequence of ``n`` tokens, its causal triangle,
    ``n (n + 1) / 2`` pairs, in ``t (t + 1) / 2`` tiles of ``block^2`` for ``t = ceil(n / block)``."""
    tiles = sum(_tiles(n, block) * (_tiles(n, block) + 1) // 2 for n in lengths)
    return ForwardCounts(sum(int(n) for n in lengths), tiles * block * block, sum(int(n) * (int(n) + 1) // 2 for n in lengths), tiles)


def dense_counts(length: int, exact_pairs: int, block: int = BLOCK) -> ForwardCounts:
    """A dense ``[L, L]`` mask under SDPA: all ``L^2`` pairs computed (no masked tile skipped), ``exact_pairs`` of
    them allowed."""
    L = int(length)
    return ForwardCounts(L, L * L, int(exact_pairs), _tiles(L, block) ** 2)


def padded_counts(rows: int, longest: int, exact_pairs: int, block: int = BLOCK) -> ForwardCounts:
    """A micro-batch of ``rows`` left-padded to ``longest`` under a mask: ``rows x longest`` tokens,
    ``rows x longest^2`` pairs."""
    return ForwardCounts(int(rows) * int(longest), int(rows) * int(longest) ** 2, int(exact_pairs),
                         int(rows) * _tiles(longest, block) ** 2)


def tree_counts(tree) -> ForwardCounts:
    """The block-sparse tree mask's counts (``tree``: a :class:`~recipe.mrtpo.core.tree_mask.TreeMask`)."""
    c = tree.block_counts()
    return ForwardCounts(tree.length, c.tile_pairs, c.pairs, c.tiles)


def segmented_counts(tree, block: int = BLOCK) -> ForwardCounts:
    """The prefix tree ``tree`` (a :class:`~recipe.mrtpo.core.tree_mask.TreeMask`) computed segment by segment: a
    segment of ``R`` rows under ancestors of ``A`` rows in all is a varlen sequence of ``R`` queries over ``A + R``
    keys, causal from the bottom right, so its query tile ``i`` computes ``ceil((A + min((i + 1) b, R)) / b)`` key
    tiles. The tree's exact pairs, ``R A + R (R + 1) / 2`` a segment, in the fewest whole tiles a kernel that keeps
    the segments apart computes; the keys a segment gathers (``A`` rows) are extra bytes, not extra tokens."""
    lengths = tree.ends - tree.starts
    # rows of each segment's ancestors, itself included (the tree's ancestor table; -1 past its depth reads the 0
    # appended), less its own
    above = (np.append(lengths, 0)[tree.anc].sum(axis=1) - lengths).tolist()
    lengths = lengths.tolist()
    tiles = sum(_tiles(a + min((i + 1) * block, r), block) for a, r in zip(above, lengths) for i in range(_tiles(r, block)))
    exact = sum(r * a + r * (r + 1) // 2 for a, r in zip(above, lengths))
    return ForwardCounts(int(tree.length), tiles * block * block, exact, tiles)


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs of a forward depend on (a decoder's config): ``hidden``, ``layers``, ``intermediate`` (the MLP's
    width a token goes through: an MoE's active experts' together), ``vocab``, ``heads`` / ``kv_heads`` and
    ``head_dim``."""

    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config) -> ModelShape:
        """From a Hugging Face config object or config.json dict (a multimodal config's ``text_config``); a clear
        error naming the missing keys."""
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        text = get("text_config", None)
        if text is not None:
            return cls.from_config(text)
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if get(k, None) is None]
        if missing or (get("intermediate_size", None) is None and get("moe_intermediate_size", None) is None):
            raise ValueError(f"the model's config lacks {missing or ['intermediate_size']}: the shared-prompt cost model "
                             "needs the decoder's shape")
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        experts = int(get("num_experts_per_tok", 0) or 0)
        if experts and get("moe_intermediate_size", None) is not None:
            width = experts * int(get("moe_intermediate_size")) + int(get("shared_expert_intermediate_size", 0) or 0)
        else:
            width = int(get("intermediate_size"))
        return cls(hidden, int(get("num_hidden_layers")), width, int(get("vocab_size")), heads,
                   int(get("num_key_value_heads", None) or heads), int(get("head_dim", None) or hidden // heads))

    def linear_weights_per_token(self) -> int:
        """Multiply-adds per token of the decoder layers' linear maps: Q and O (``hidden x heads x head_dim``
        each), K and V (``hidden x kv_heads x head_dim`` each), the gated MLP (3 x ``hidden x intermediate``)."""
        attn = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return self.layers * (attn + 3 * self.hidden * self.intermediate)


def forward_flops(shape: ModelShape, counts: ForwardCounts, kept: int = 0) -> float:
    """FLOPs of a forward: ``2 x tokens x weights per token + 4 x pairs x heads x head_dim x layers`` plus the LM
    head's ``2 x hidden x vocab`` per kept position (module docstring)."""
    linear = 2.0 * counts.tokens * shape.linear_weights_per_token()
    return linear + attention_flops(shape, counts) + 2.0 * kept * shape.hidden * shape.vocab


def attention_flops(shape: ModelShape, counts: ForwardCounts) -> float:
    """The attention's part of :func:`forward_flops`: ``4 x pairs x heads x head_dim x layers`` (``QK^T`` and ``PV``)."""
    return 4.0 * counts.pairs * shape.heads * shape.head_dim * shape.layers


def shared_pays(shape: ModelShape, shared: ForwardCounts, unshared: ForwardCounts) -> bool:
    """Whether the shared forward costs at most the unshared layout of the same sequences (the kept positions,
    the same in both, left out)."""
    return forward_flops(shape, shared) <= forward_flops(shape, unshared)


def layout_counts(mb: list, layout: str, attention: str = "varlen", block: int = BLOCK) -> ForwardCounts:
    """An unshared forward of the sequences ``mb`` (fields ``length``) in ``layout``: a packed row under varlen
    (:func:`varlen_counts`) or under a dense block-diagonal mask (:func:`dense_counts`), else one padded
    micro-batch (:func:`padded_counts`)."""
    lengths = [int(s.length) for s in mb]
    if layout == "packed":
        counts = varlen_counts(lengths, block)
        return counts if attention == "varlen" else dense_counts(counts.tokens, counts.exact_pairs, block)
    return padded_counts(len(lengths), max(lengths), sum(n * (n + 1) // 2 for n in lengths), block)
