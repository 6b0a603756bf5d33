"""Which response tokens carry the format and which the argument.

A response of the task is ``<tool_call>\\n{"name": ..., "arguments": {"<arg>": <value>}}`` (``parameters``
under ToolRL's rewards, after a ``<think> </think>`` block) followed by the
closing tag (or, broken, by nothing, ``</tool>``, a stray ``}`` or text after the block), then the end
token. :func:`call_spans` finds, with the JSON decoder, the character span of the call's JSON object and
of the argument's value; :func:`token_roles` maps them to token positions:

- **tag tokens**: every valid token with a character outside the JSON object (the opening tag, the line
  breaks, the closing tag or what stands in its place, text after it) and the special tokens after the
  object (the end token, empty when decoded): the tokens where the frame is made or broken, which is
  what the format reward decides on in this task (the object's inside is the same in every demonstration);
- **argument tokens**: the tokens that overlap the argument's value (what correctness decides on);
- **the closing position**: the first token that starts after the object (and after one line break right
  after it), where the closing tag has to begin: ``</tool_call>`` in a good frame, ``</``, ``}``, the end
  token in a broken one. It is where most broken frames break (only text after a closed block breaks
  later); the tokens after it follow from what was sampled there.
- **the position after the closing tag**: the first token that starts after the first ``</tool_call>``
  behind the object (the end token, or the line break that opens a ``<response>`` block): where the
  layout that ToolRL's format reward asks for is decided when the instruction names it
  (``data_prep.format_speed --reward toolrl``); empty when the block is not closed.

The text is rebuilt from the per-token strings of a relevance dump with special tokens as empty strings,
as the reward manager decodes (``skip_special_tokens=True``). A token is special when its id is in
``special_ids``, or, by default, when its string is one of Qwen2's special tokens (``<|im_end|>``, ...):
the dump decodes each id alone, and the strings are the same in the real Qwen2 tokenizer and in a task
vocabulary (:func:`recipe.mrtpo.cpu.tiny_model.build_task_tokenizer`), whose ids differ.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Optional

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_ARG_VALUE = re.compile(r'"(?:arguments|parameters)"\s*:\s*\{\s*"(?:[^"\\]|\\.)*"\s*:\s*')


def _special_strings() -> frozenset:
    from recipe.mrtpo.cpu.tiny_model import QWEN2_SPECIAL_TOKENS

    return frozenset(content for _, content, special in QWEN2_SPECIAL_TOKENS if special)


def call_spans(text: str) -> Optional[dict]:
    """``{"object": (lo, hi), "value": (lo, hi) or None}``: the character spans of the first block's JSON
    object (from its ``{`` to after its ``}``) and of its argument's value; ``None`` when the text has no
    ``<tool_call>`` followed by a decodable JSON object."""
    start = text.find(_OPEN)
    if start < 0:
        return None
    brace = text.find("{", start + len(_OPEN))
    if brace < 0 or text[start + len(_OPEN):brace].strip():
        return None
    try:
        obj, end = json.JSONDecoder().raw_decode(text, brace)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    value = None
    m = _ARG_VALUE.search(text, brace, end)
    if m:
        try:
            _, vend = json.JSONDecoder().raw_decode(text, m.end())
            if vend <= end:
                value = (m.end(), vend)
        except ValueError:
            pass
    return {"object": (brace, end), "value": value}


def token_roles(token_ids: Sequence[int], token_strings: Sequence[str], valid: int,
                special_ids: Optional[set] = None) -> Optional[dict]:
    """``{"tag": [positions], "argument": [positions], "close": [position] or [], "after_close": [position] or []}``
    of the first ``valid``
    tokens (see the module docstring), or ``None`` when the response holds no decodable call (nothing to
    attribute)."""
    strings = _special_strings()
    pieces, starts, pos = [], [], 0
    for t in range(valid):
        special = str(token_strings[t]) in strings if special_ids is None else int(token_ids[t]) in special_ids
        piece = "" if special else str(token_strings[t])
        starts.append(pos)
        pieces.append(piece)
        pos += len(piece)
    text = "".join(pieces)
    spans = call_spans(text)
    if spans is None:
        return None
    lo, hi = spans["object"]
    after = hi + 1 if text[hi:hi + 1] == "\n" else hi
    close = next(([t] for t in range(valid) if starts[t] >= after), [])
    shut = text.find(_CLOSE, hi)
    after_close = [] if shut < 0 else next(([t] for t in range(valid) if starts[t] >= shut + len(_CLOSE)), [])
    tag = [t for t in range(valid)
           if (pieces[t] and (starts[t] < lo or starts[t] + len(pieces[t]) > hi)) or (not pieces[t] and starts[t] >= hi)]
    arg = []
    if spans["value"] is not None:
        vlo, vhi = spans["value"]
        arg = [t for t in range(valid) if pieces[t] and starts[t] < vhi and starts[t] + len(pieces[t]) > vlo]
    return {"tag": tag, "argument": arg, "close": close, "after_close": after_close}
