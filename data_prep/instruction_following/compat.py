"""Which instruction ids and arguments may share a training row.

A documented (:func:`conflicts`, :func:`kwargs_conflict`) best effort so that every
constraint set can be satisfied at once:

- IFEval's own ``INSTRUCTION_CONFLICTS`` (made symmetric), applied to every pair;
- :data:`SOLO_IDS`: constraints that shape every word or the whole response (one-word answers, JSON
  only, no whitespace, alphabet loops, ...) appear only in rows with one constraint;
- :data:`GROUPS`: at most one constraint per aspect (length and sentence counts, layout, letter case,
  the end of the response, the sentence-type mix);
- :data:`PAIRS`: further pairs that cannot hold together (e.g. ``punctuation:no_comma`` and
  ``count:punctuation``, lower case and a mixed-case end phrase), and ``language:response_language``
  with any IFBench checker (they count English words);
- arguments: keywords of different constraints share no word (nor a word contained in another), the
  five keywords of ``count:keywords_multiple`` neither; ``words:repeats`` allows every keyword's
  required count; ``length_constraints:number_sentences`` never asks for "less than 1".
  A draw that breaks an argument rule is redrawn (another seed), then the id is dropped for the row.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Optional

__all__ = ["SOLO_IDS", "GROUPS", "PAIRS", "conflicts", "kwargs_conflict", "constraint_pool"]

#: Constraints that shape every word or the whole response: only in rows with a single constraint.
SOLO_IDS = frozenset({
    "detectable_format:constrained_response",
    "detectable_format:json_format",
    "format:options",
    "format:no_whitespace",
    "format:output_template",
    "format:newline",
    "format:line_indent",
    "words:alphabet",
    "words:consonants",
    "words:prime_lengths",
    "words:odd_even_syllables",
    "words:no_consecutive",
    "words:vowel",
    "words:last_first",
    "words:paragraph_last_first",
    "sentence:alliteration_increment",
    "sentence:increment",
    "ratio:sentence_words",
    "count:words_japanese",
})

#: Aspects a response has once: at most one constraint of each group in a row.
GROUPS: dict[str, frozenset] = {
    "length": frozenset({
        "length_constraints:number_words", "count:word_count_range", "count:unique_word_count",
        "length_constraints:number_sentences", "sentence:keyword", "words:keywords_specific_position",
        "words:repeats",
    }),
    "layout": frozenset({
        "detectable_format:multiple_sections", "length_constraints:number_paragraphs",
        "length_constraints:nth_paragraph_first_word", "detectable_format:number_bullet_lists",
        "format:list", "format:sub-bullets", "format:no_bullets_bullets", "combination:two_responses",
    }),
    "case": frozenset({
        "change_case:capital_word_frequency", "change_case:english_capital", "change_case:english_lowercase",
        "format:title_case",
    }),
    "ending": frozenset({"startend:end_checker", "startend:quotation", "format:emoji"}),
    "sentence_mix": frozenset({"ratio:sentence_type", "ratio:sentence_balance"}),
}

#: Further incompatible pairs (symmetric).
PAIRS = frozenset(frozenset(p) for p in [
    ("punctuation:no_comma", "count:punctuation"),
    ("startend:end_checker", "change_case:english_lowercase"),
    ("startend:end_checker", "change_case:english_capital"),
    ("startend:end_checker", "format:title_case"),
    ("change_case:english_lowercase", "detectable_format:multiple_sections"),
    ("change_case:english_capital", "detectable_format:multiple_sections"),
    ("change_case:english_lowercase", "count:person_names"),
    ("change_case:english_capital", "count:person_names"),
    ("change_case:english_capital", "format:thesis"),
    ("change_case:english_capital", "words:words_position"),
    ("change_case:english_capital", "words:keywords_specific_position"),
    ("format:title_case", "words:words_position"),
    ("format:title_case", "words:keywords_specific_position"),
    ("count:numbers", "detectable_format:multiple_sections"),
    ("startend:quotation", "format:quote_unquote"),
    ("format:sub-bullets", "detectable_format:number_highlighted_sections"),
    ("format:sub-bullets", "detectable_content:postscript"),
    ("format:no_bullets_bullets", "detectable_content:postscript"),
    ("length_constraints:number_sentences", "ratio:sentence_type"),
    ("length_constraints:number_sentences", "ratio:sentence_balance"),
    ("format:emoji", "ratio:sentence_type"),
    ("format:emoji", "ratio:sentence_balance"),
    ("words:repeats", "count:keywords_multiple"),
])

_LANGUAGE = "language:response_language"


def _ifeval_conflicts() -> dict[str, set]:
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_CONFLICTS, conflict_make

    return conflict_make(copy.deepcopy({k: set(v) for k, v in INSTRUCTION_CONFLICTS.items()}))


_IFEVAL_CONFLICTS: Optional[dict[str, set]] = None


def conflicts(a: str, b: str) -> bool:
    """Whether instruction ids ``a`` and ``b`` must not share a row (module docstring)."""
    global _IFEVAL_CONFLICTS
    from recipe.mrtpo.tasks.instruction_following import IFBENCH_IDS

    if a == b or a in SOLO_IDS or b in SOLO_IDS:
        return True
    if _IFEVAL_CONFLICTS is None:
        _IFEVAL_CONFLICTS = _ifeval_conflicts()
    if b in _IFEVAL_CONFLICTS.get(a, ()) or a in _IFEVAL_CONFLICTS.get(b, ()):
        return True
    if any(a in g and b in g for g in GROUPS.values()):
        return True
    if frozenset((a, b)) in PAIRS:
        return True
    if (a == _LANGUAGE and b in IFBENCH_IDS) or (b == _LANGUAGE and a in IFBENCH_IDS):
        return True
    return False


def _keywords(iid: str, kw: dict) -> list[str]:
    """Words a constraint asks for or forbids (lower case)."""
    if iid == "keywords:existence":
        words = kw.get("keywords") or []
    elif iid == "keywords:forbidden_words":
        words = kw.get("forbidden_words") or []
    elif iid in ("keywords:frequency", "words:keywords_specific_position", "words:words_position"):
        words = [kw.get("keyword")]
    elif iid == "count:keywords_multiple":
        words = [kw.get(f"keyword{i}") for i in range(1, 6)]
    elif iid == "sentence:keyword":
        words = [kw.get("word")]
    elif iid == "startend:end_checker":
        words = str(kw.get("end_phrase") or "").split()
    else:
        words = []
    return [str(w).lower().strip(".,;:!?\"'") for w in words if w]


def _required_count(iid: str, kw: dict) -> int:
    """The most times a constraint needs one word to occur (for ``words:repeats``)."""
    if iid == "keywords:frequency" and kw.get("relation") == "at least":
        return int(kw.get("frequency") or 0)
    return {"count:keywords_multiple": 7, "words:words_position": 2}.get(iid, 1 if _keywords(iid, kw) else 0)


def _clash(u: str, v: str) -> bool:
    return bool(u) and bool(v) and (u in v or v in u)


def kwargs_conflict(chosen: Sequence[tuple[str, dict]]) -> Optional[str]:
    """Why the arguments of ``chosen`` (id, kwargs) pairs cannot hold together, or None."""
    for iid, kw in chosen:
        if iid == "length_constraints:number_sentences" and kw.get("relation") == "less than" \
                and int(kw.get("num_sentences", 2)) < 2:
            return "fewer than 1 sentence"
        if iid == "count:keywords_multiple":
            ws = _keywords(iid, kw)
            if any(_clash(ws[i], ws[j]) for i in range(len(ws)) for j in range(i + 1, len(ws))):
                return "keywords_multiple keywords overlap"
    for i, (a, ka) in enumerate(chosen):
        for b, kb in chosen[i + 1:]:
            if any(_clash(u, v) for u in _keywords(a, ka) for v in _keywords(b, kb)):
                return f"{a} and {b} share a keyword"
    repeats = [int(kw.get("small_n", 0)) for iid, kw in chosen if iid == "words:repeats"]
    if repeats and any(_required_count(iid, kw) > repeats[0] for iid, kw in chosen):
        return "words:repeats allows fewer repeats than a keyword needs"
    return None


def constraint_pool(spec: Optional[str]) -> tuple[list[str], dict[str, dict]]:
    """(ids, fixed kwargs) for ``--constraints``: None -> COMPOSABLE_IDS; ``random_passable`` -> the
    verifier's RANDOM_PASSABLE_IDS with their fixed arguments; else comma-separated composable ids."""
    from recipe.mrtpo.tasks.instruction_following import COMPOSABLE_IDS, RANDOM_PASSABLE_IDS

    if spec is None or spec.strip() in ("", "all", "composable"):
        return sorted(COMPOSABLE_IDS), {}
    if spec.strip() == "random_passable":
        fixed = {iid: dict(kw) for iid, kw in RANDOM_PASSABLE_IDS}
        return sorted(fixed), fixed
    ids = sorted({s.strip() for s in spec.split(",") if s.strip()})
    bad = [i for i in ids if i not in COMPOSABLE_IDS]
    if bad:
        raise ValueError(f"not composable instruction ids: {bad}; choose from {sorted(COMPOSABLE_IDS)}")
    return ids, {}
