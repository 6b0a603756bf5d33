"""Rendering the replay's prompt variants to token ids, each distinct prompt and each distinct piece once
(docs/design.md §2). Python and numpy; the chat template and the tokenizer are callables passed in.

The samples of a group share their prompt, and most of their variants; the variants of a group differ in a
sentence or an appended block and share the rest (a schema, tool documentation). :class:`CachedRender`
renders each distinct message list once; given the template's text and the tokenizer apart, it tokenizes
each distinct line-led piece of the rendered text once (:class:`PieceEncoder`). Its ``prepare`` takes the
whole batch's message lists before the planner asks for any, so that the unseen pieces go to the
tokenizer in one batched call (one Python wrapper call, the fast tokenizer's threads) instead of one call
a piece. Ids are read-only int32 arrays: a piece's ids are concatenated without a Python int per token, and
the planner copies a prompt into its packed input as one block.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

import numpy as np

from recipe.mrtpo.core.prompt_variants import as_ids

logger = logging.getLogger(__name__)

#: where a rendered prompt may be cut into pieces tokenized apart: after a run of newlines, before a
#: non-space character. Byte-level BPE pre-tokenizers (GPT-2's, Qwen2's) never join a newline run with
#: what follows a non-space character, so the ids of the pieces concatenate to the ids of the whole.
PIECE_BOUNDARY = re.compile(r"(?<=\n)(?=\S)")
_NEWLINE_BEFORE_NON_SPACE = re.compile(r"\n(?=\S)")  # its matches end exactly at PIECE_BOUNDARY

EncodeBatch = Callable[[list[str]], Sequence[Sequence[int]]]


def split_pieces(text: str) -> list[str]:
    """``PIECE_BOUNDARY.split(text)``, found by a literal-led scan (about 1.7x faster on long prompts)."""
    out, last = [], 0
    for m in _NEWLINE_BEFORE_NON_SPACE.finditer(text):
        end = m.end()
        out.append(text[last:end])
        last = end
    out.append(text[last:])
    return out


def _readonly(ids: np.ndarray) -> np.ndarray:
    """``ids`` made read-only (a cache hands out the same array to every caller)."""
    ids.flags.writeable = False
    return ids


def _frozen(ids: Sequence[int]) -> np.ndarray:
    """Ids as a read-only int32 array (:func:`as_ids`), never the caller's own array."""
    out = as_ids(ids)
    return _readonly(out.copy() if out is ids else out)


class PieceEncoder:
    """``encode_batch`` (texts -> ids each) over the texts' pieces (:data:`PIECE_BOUNDARY`), each distinct
    piece tokenized once, the unseen pieces of a call in one batched call; ids come back as read-only int32
    arrays.

    The result must equal ``encode_batch([text])[0]``; that holds for the byte-level BPE tokenizers of the
    run scripts, and is checked: the first text and every ``verify_every``-th after it are also encoded
    whole, and a mismatch (a tokenizer that merges across the boundary) switches this encoder to whole-text
    encoding for good, counted in ``mismatches`` and logged. ``pieces`` / ``piece_hits`` count pieces,
    ``batches`` the tokenizer calls.
    """

    def __init__(self, encode_batch: EncodeBatch, verify_every: int = 64):
        self._encode_batch = encode_batch
        self._cache: dict[str, np.ndarray] = {}
        self.verify_every = max(1, int(verify_every))
        self.texts = self.pieces = self.piece_hits = self.mismatches = self.batches = 0
        self.whole = False

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        self.batches += 1
        out = [_frozen(ids) for ids in self._encode_batch(texts)]
        if len(out) != len(texts):
            raise ValueError(f"encode_batch returned {len(out)} results for {len(texts)} texts")
        return out

    def __call__(self, text: str) -> np.ndarray:
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = list(texts)
        first = self.texts
        self.texts += len(texts)
        if self.whole:
            return self._encode(texts)
        split = [split_pieces(t) for t in texts]
        unseen = list(dict.fromkeys(p for pieces in split for p in pieces if p not in self._cache))
        for piece, ids in zip(unseen, self._encode(unseen)):
            self._cache[piece] = ids
        out = [_readonly(np.concatenate([self._cache[p] for p in pieces])) for pieces in split]
        self.pieces += sum(map(len, split))
        self.piece_hits += sum(map(len, split)) - len(unseen)
        checked = [i for i in range(len(texts)) if (first + i) % self.verify_every == 0]
        for i, full in zip(checked, self._encode([texts[i] for i in checked])):
            if not np.array_equal(full, out[i]):
                self.mismatches += 1
                self.whole = True
                logger.warning("PieceEncoder: pieces tokenized apart differ from the whole text; encoding whole texts from now on")
                return self._encode(texts)
        return out


def _key(messages: list[dict]):
    """The cache key of a message list: (role, content) pairs when that is all it holds (the common case,
    ~4x cheaper than JSON), else its JSON (a str: the two kinds never collide)."""
    if all(type(m) is dict and len(m) == 2 and type(m.get("content")) is str and type(m.get("role")) is str for m in messages):
        return tuple((m["role"], m["content"]) for m in messages)
    return json.dumps(messages, sort_keys=True, ensure_ascii=False, default=str)


class CachedRender:
    """``render`` (messages -> prompt ids) with one call per distinct message list.

    The n samples of a group carry the same prompt, and their P_all / P_minus_k variants repeat whenever
    their contexts do (prompt-placed Z always do), so a batch's planning renders each distinct prompt once.
    Holds the ids of one batch (make one per batch). ``calls`` / ``hits`` count.

    With ``render_text`` (messages -> the chat template's text) and ``encode_batch`` (texts -> ids, no
    special tokens added: what ``apply_chat_template(tokenize=True)`` does after rendering), a distinct
    prompt is rendered to text and encoded by a :class:`PieceEncoder` (``self.encoder``) instead of
    ``render``; :meth:`prepare` then encodes a whole batch's prompts at once. ``encoder`` instead of
    ``encode_batch``: a PieceEncoder shared with other renders of the same tokenizer (the renders of rows with
    different tool lists: their tool documentation's pieces are tokenized once for all of them).
    """

    def __init__(self, render: Optional[Callable[[list[dict]], Sequence[int]]] = None,
                 render_text: Optional[Callable[[list[dict]], str]] = None,
                 encode_batch: Optional[EncodeBatch] = None, encoder: Optional[PieceEncoder] = None):
        if encoder is None and encode_batch is not None:
            encoder = PieceEncoder(encode_batch)
        elif encode_batch is not None:
            raise ValueError("CachedRender takes encode_batch or encoder, not both")
        if (render_text is None) != (encoder is None) or (render is None and render_text is None):
            raise ValueError("CachedRender needs render, or render_text and encode_batch (or encoder)")
        self.encoder = encoder
        self._render = render
        self._render_text = render_text
        self._cache: dict[object, np.ndarray] = {}
        self.calls = 0
        self.hits = 0

    def prepare(self, batch: Iterable[list[dict]]) -> None:
        """Render and encode every not yet cached message list of ``batch`` (later calls are hits)."""
        if self.encoder is None:
            return
        todo: dict[object, list[dict]] = {}
        for messages in batch:
            key = _key(messages)
            if key not in self._cache:
                todo.setdefault(key, messages)
        texts = [self._render_text(m) for m in todo.values()]
        for key, ids in zip(todo, self.encoder.encode_many(texts)):
            self._cache[key] = ids

    def __call__(self, messages: list[dict]) -> np.ndarray:
        """The prompt's ids, a read-only int32 array (the cached one: ``.tolist()`` for a list)."""
        self.calls += 1
        key = _key(messages)
        ids = self._cache.get(key)
        if ids is None:
            if self.encoder is not None:
                ids = self.encoder(self._render_text(messages))
            else:
                ids = _frozen(self._render(messages))
            self._cache[key] = ids
        else:
            self.hits += 1
        return ids
