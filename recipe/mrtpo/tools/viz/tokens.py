"""Token text for the heatmap page: byte-level BPE pieces decoded, and any value made printable.

A dump's ``response_tokens`` are each id decoded alone; a tokenizer without a decoder leaves them as raw
byte-level BPE pieces ('Ġword', 'Ċ'), which :func:`looks_byte_level` recognises and
:func:`decode_byte_level` turns back into text. Everything that came from a model or a dataset is
hostile: :func:`sanitize_text` makes it valid and visible before it is HTML-escaped.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen2 byte-level BPE alphabet: byte -> printable unicode character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_OF = {c: b for b, c in _bytes_to_unicode().items()}
_SHIFTED = {c for c, b in _BYTE_OF.items() if ord(c) >= 256}  # 'Ġ' (space), 'Ċ' (newline), ...


def looks_byte_level(tokens: Sequence[Sequence[Any]]) -> bool:
    """True when every token is made of byte-level BPE characters and some use the shifted range ('Ġ', 'Ċ').

    Decoded text almost always holds a plain space (not in that alphabet) or a character outside it.
    """
    shifted = False
    for row in tokens:
        for tok in row:
            if not isinstance(tok, str):
                return False
            for ch in tok:
                if ch not in _BYTE_OF:
                    return False
                shifted = shifted or ch in _SHIFTED
    return shifted


def decode_byte_level(piece: str) -> str:
    """A raw byte-level BPE piece ('Ġword', 'Ċ', 'Ã©') as text; partial UTF-8 becomes U+FFFD."""
    if any(ch not in _BYTE_OF for ch in piece):
        return piece
    return bytes(_BYTE_OF[ch] for ch in piece).decode("utf-8", errors="replace")


def sanitize_text(s: Any) -> str:
    """Any value as printable text: valid UTF-8, controls and format characters shown as escapes.

    Keeps newlines and tabs; lone surrogates become U+FFFD; C0/C1 controls, bidi overrides and other
    format characters (Unicode category Cc/Cf) become visible ``\\xNN`` / ``\\uNNNN``.
    """
    if isinstance(s, bytes):
        s = s.decode("utf-8", errors="replace")
    elif not isinstance(s, str):
        s = str(s)
    s = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    out = []
    for ch in s:
        if ch in "\n\t":
            out.append(ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn") and ch != "\ufffd":
            cp = ord(ch)
            out.append(f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}")
        else:
            out.append(ch)
    return "".join(out)
