"""What ``docs/real_model/analysis_plan.md`` fixes in advance, as pure functions: which IFEval / IFBench constraint
types have a locatable span, where Z_k sits in a prompt (the type's cue), which characters of a response the
official checker reads (its own rule), how a non-compliant sample is made compliant, and the per-pair metrics.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Optional

import numpy as np

KEYWORD_TYPES = ("keywords:existence", "keywords:frequency", "count:keywords_multiple",
                 "words:keywords_specific_position")
SPAN_TYPES = ("startend:end_checker", "detectable_format:title", "detectable_content:postscript",
              "startend:quotation", *KEYWORD_TYPES, "detectable_content:number_placeholders",
              "detectable_format:number_highlighted_sections", "detectable_format:number_bullet_lists",
              "combination:repeat_prompt")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"'])\s+|\n+")
_KEYWORD_CUES = ("keyword", "word", "include", "mention", "use", "appear", "time")


def keywords(iid: str, kw: dict) -> list[str]:
    """The keywords a keyword checker looks for."""
    if iid == "keywords:existence":
        return [str(k) for k in kw.get("keywords") or []]
    if iid == "count:keywords_multiple":
        return [str(kw[f"keyword{i}"]) for i in range(1, 6) if kw.get(f"keyword{i}")]
    return [str(kw["keyword"])] if kw.get("keyword") else []


def sentences(prompt: str) -> list[str]:
    """The prompt's sentences: split after ``.``, ``!``, ``?`` and at new lines (stripped, non-empty)."""
    return [s.strip() for s in _SENTENCE_END.split(prompt) if s.strip()]


def has_cue(iid: str, kw: dict, sentence: str) -> bool:
    """Whether ``sentence`` carries the cue of type ``iid`` (the plan's table)."""
    s = sentence.lower()
    if iid == "startend:end_checker":
        phrase = str(kw.get("end_phrase") or "").lower().strip()
        return (bool(phrase) and phrase in s) or (("end" in s or "finish" in s) and ("phrase" in s or "response" in s))
    if iid == "detectable_format:title":
        return "title" in s or "<<" in s
    if iid == "detectable_content:postscript":
        marker = str(kw.get("postscript_marker") or "").lower().strip()
        return (bool(marker) and marker in s) or "postscript" in s or "post script" in s
    if iid == "startend:quotation":
        return "quot" in s
    if iid in KEYWORD_TYPES:
        return any(k.lower() in s for k in keywords(iid, kw)) and any(c in s for c in _KEYWORD_CUES)
    if iid == "detectable_content:number_placeholders":
        return "placeholder" in s or "square bracket" in s
    if iid == "detectable_format:number_highlighted_sections":
        return any(c in s for c in ("highlight", "markdown", "italic", "asterisk"))
    if iid == "detectable_format:number_bullet_lists":
        return "bullet" in s
    if iid == "combination:repeat_prompt":
        return "repeat" in s
    return False


def locate_z(iid: str, kw: dict, prompt: str, verbatim: str = "") -> list[str]:
    """Z_k's text(s) in ``prompt``: the recipe's verbatim checker sentence if given, else every sentence with the
    type's cue (for repeat_prompt never a sentence of the text to repeat). [] when nothing is found."""
    if verbatim and verbatim in prompt:
        return [verbatim]
    if iid not in SPAN_TYPES:
        return []
    found = [s for s in sentences(prompt) if has_cue(iid, kw, s)]
    if iid == "combination:repeat_prompt":
        body = str(kw.get("prompt_to_repeat") or "")
        found = [s for s in found if s not in body]
    return list(dict.fromkeys(found))


def span_chars(iid: str, kw: dict, response: str) -> list[tuple[int, int]]:
    """The character ranges of ``response`` that the official checker reads (the plan's rules)."""
    out: list[tuple[int, int]] = []
    lead = len(response) - len(response.lstrip())
    stripped = response.strip()
    if iid == "startend:end_checker":
        n = len(str(kw.get("end_phrase") or "").strip())
        end = lead + len(stripped)
        return [(end - n, end)] if n else []
    if iid == "combination:repeat_prompt":
        n = len(str(kw.get("prompt_to_repeat") or "").strip())
        return [(lead, lead + n)] if n else []
    if iid == "startend:quotation":
        return [(lead, lead + 1), (lead + len(stripped) - 1, lead + len(stripped))] if stripped else []
    pats: list[tuple[str, int]] = []
    if iid == "detectable_format:title":
        pats = [(r"<<[^\n]+>>", 0)]
    elif iid == "detectable_content:postscript":
        marker = str(kw.get("postscript_marker") or "P.S.").lower()
        pats = [(r"\s*p\.\s?p\.\s?s.*$" if marker == "p.p.s" else r"\s*p\.\s?s\..*$", re.MULTILINE)]
        return [m.span() for p, f in pats for m in re.finditer(p, response.lower(), flags=f) if m.end() > m.start()]
    elif iid in KEYWORD_TYPES:
        pats = [(re.escape(k), re.IGNORECASE) for k in keywords(iid, kw)]
    elif iid == "detectable_content:number_placeholders":
        pats = [(r"\[.*?\]", 0)]
    elif iid == "detectable_format:number_highlighted_sections":
        pats = [(r"\*[^\n\*]*\*", 0), (r"\*\*[^\n\*]*\*\*", 0)]
    elif iid == "detectable_format:number_bullet_lists":
        pats = [(r"^\s*\*[^\*].*$", re.MULTILINE), (r"^\s*-.*$", re.MULTILINE)]
    for p, f in pats:
        out += [m.span() for m in re.finditer(p, response, flags=f) if m.end() > m.start()]
    return out


def construct(iid: str, kw: dict, prompt: str, sample: str) -> str:
    """The plan's fixed rule that makes ``sample`` compliant with one constraint (checked by the caller)."""
    s = sample.strip()
    if iid == "startend:end_checker":
        return f"{s} {str(kw['end_phrase']).strip()}"
    if iid == "detectable_format:title":
        return "<<" + " ".join(re.findall(r"[A-Za-z']+", prompt)[:4]) + ">>\n\n" + s
    if iid == "detectable_content:postscript":
        return f"{s}\n\n{kw.get('postscript_marker') or 'P.S.'} Thank you for reading."
    if iid == "startend:quotation":
        return '"' + s.strip('"') + '"'
    if iid in KEYWORD_TYPES:
        need = {k: 1 for k in keywords(iid, kw)}
        if iid == "keywords:frequency" and kw.get("relation") != "less than":
            need = {k: int(kw.get("frequency") or 1) for k in need}
        if iid == "count:keywords_multiple":
            need = dict(zip(keywords(iid, kw), (1, 2, 3, 5, 7)))
        extra = [f"This is about {k}." for k, n in need.items()
                 for _ in range(max(0, n - len(re.findall(re.escape(k), s, flags=re.IGNORECASE))))]
        return " ".join([s, *extra])
    if iid == "detectable_content:number_placeholders":
        names = ("name", "place", "date", "time", "address", "company", "city", "country")
        n = int(kw.get("num_placeholders") or 1)
        return s + "\n\n" + " ".join(f"[{names[i % len(names)]}{i // len(names) or ''}]" for i in range(n))
    if iid == "detectable_format:number_highlighted_sections":
        n = int(kw.get("num_highlights") or 1)
        lines = [ln for ln in s.replace("*", "").split("\n") if ln.strip()]
        lines += [f"Point {i + 1}." for i in range(max(0, n - len(lines)))]
        return "\n".join(f"*{ln.strip()}*" if i < n else ln for i, ln in enumerate(lines))
    if iid == "detectable_format:number_bullet_lists":
        n = int(kw.get("num_bullets") or 1)
        body = re.sub(r"^\s*[\*-]", "", s, flags=re.MULTILINE)
        return body + "\n\n" + "\n".join(f"* Point {i + 1}." for i in range(n))
    if iid == "combination:repeat_prompt":
        return f"{str(kw['prompt_to_repeat']).strip()} {s}"
    raise ValueError(f"no construction rule for {iid}")


def token_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """[L] bool: the tokens whose character range overlaps a span (zero-width tokens never)."""
    return np.array([e > s and any(s < b and a < e for a, b in spans) for s, e in offsets], dtype=bool)


def lift(q: np.ndarray, in_span: np.ndarray) -> float:
    """(sum of q over the span / sum of q) / (span tokens / all tokens); nan when q sums to 0 or no span."""
    total, n = float(q.sum()), len(q)
    if total <= 0 or not in_span.any():
        return math.nan
    return float(q[in_span].sum() / total) / (float(in_span.sum()) / n)


def top_precision(q: np.ndarray, in_span: np.ndarray, share: float = 0.1) -> float:
    """The share of the ceil(share * L) tokens with the largest q that lie in the span (stable order on ties)."""
    k = max(1, math.ceil(share * len(q)))
    top = np.argsort(-q, kind="stable")[:k]
    return float(in_span[top].mean())


def shuffle_lift(q: np.ndarray, in_span: np.ndarray, n: int = 200, rng: Optional[np.random.Generator] = None) -> float:
    """The mean lift of ``n`` within-response permutations of q (the shuffle control)."""
    rng = rng or np.random.default_rng(0)
    return float(np.mean([lift(rng.permutation(q), in_span) for _ in range(n)]))
