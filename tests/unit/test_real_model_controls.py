"""The real-model controls of the plan's amendment 2 (``experiments/real_model/controls.py``) on tiny inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.real_model import controls as C

END = "startend:end_checker"
TITLE = "detectable_format:title"
KW = "keywords:existence"


def test_position_map_keeps_each_span_token_at_its_distance_from_the_nearer_end():
    assert C.position_map(np.array([0, 1, 8]), 10, 6).tolist() == [0, 1, 4]  # the last but one stays last but one
    assert C.position_map(np.array([9]), 10, 30).tolist() == [29]
    assert C.position_map(np.array([2, 7]), 10, 4) is None  # 2 -> 2, 7 -> 1: the order breaks
    assert C.position_map(np.array([4]), 10, 3) is None  # 4 stays 4, outside a 3-token response
    assert C.position_map(np.array([], dtype=int), 10, 10) is None


def _mask(L, idx):
    m = np.zeros(L, dtype=bool)
    m[idx] = True
    return m


def test_the_position_baseline_reads_other_types_q_at_the_same_place():
    # pair 0 (title) reads token 0; q of every response peaks at token 0: a lift there is position, not constraint
    q_peak = np.array([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])  # 5 response tokens and the end-of-turn token
    qs = [q_peak, q_peak.copy(), q_peak.copy(), np.full(6, 1 / 6)]
    masks = [_mask(6, [0]), _mask(6, [3]), _mask(6, [0]), _mask(6, [4])]
    types = [TITLE, END, TITLE, KW]
    base = C.position_baselines(types, qs, masks)
    # pair 0: recipient 1 (its span at 3, away from 0) and 3 (flat q); 2 is the same type, excluded
    assert base[0][1] == 2
    assert base[0][0] == pytest.approx((0.5 / (1 / 6) + 1.0) / 2)
    # pair 1's span (index 3 of 5, the second half) maps to 3 in every 5-token response; pair 3 has q flat
    assert base[1] == (pytest.approx((0.1 * 6 + 0.1 * 6 + 1.0) / 3), 3)
    # a recipient whose own span lies where the span would go is skipped
    masks[3] = _mask(6, [0])
    assert C.position_baselines(types, qs, masks)[0][1] == 1


def test_a_pair_without_a_recipient_gets_nan():
    base = C.position_baselines([TITLE, TITLE], [np.ones(4), np.ones(4)], [_mask(4, [0]), _mask(4, [1])])
    assert all(math.isnan(b) and n == 0 for b, n in base)


PROMPT = ("Write a poem about the sea. Do not use any commas in your response. "
          "Wrap your entire response with double quotation marks. Finish your response with 'Bye now'.")


def test_constraints_without_a_span_rule_are_located_by_the_global_cues():
    assert C.locate_constraint("punctuation:no_comma", {}, PROMPT) == ["Do not use any commas in your response."]
    assert C.locate_constraint("keywords:forbidden_words", {"forbidden_words": ["poem"]}, PROMPT) == \
        ["Write a poem about the sea."]
    assert C.locate_constraint("detectable_format:json_format", {}, PROMPT) == []


def test_the_sham_takes_another_constraints_sentence_else_one_of_similar_length():
    z = C.locate_constraint("startend:quotation", {}, PROMPT)
    assert z == ["Wrap your entire response with double quotation marks."]
    others = [C.locate_constraint("punctuation:no_comma", {}, PROMPT), C.locate_constraint(END, {"end_phrase": "Bye now"}, PROMPT)]
    assert C.sham_sentences("startend:quotation", {}, PROMPT, z, others) == \
        ("constraint", ["Do not use any commas in your response."])
    # no other constraint located: the sentence nearest Z's length that does not carry Z's cue
    kind, s = C.sham_sentences("startend:quotation", {}, PROMPT, z, [[], z])
    assert kind == "length" and s == ["Do not use any commas in your response."]
    assert C.sham_sentences("startend:quotation", {}, "Wrap it in quotation marks.", ["Wrap it in quotation marks."], []) \
        == (None, [])


def test_a_repeat_prompt_sham_never_removes_part_of_the_text_to_repeat():
    body = "Tell me a joke about cats."
    prompt = f"{body} First repeat the request word for word without change, then give your answer."
    z = C.locate_constraint("combination:repeat_prompt", {"prompt_to_repeat": body}, prompt)
    assert C.sham_sentences("combination:repeat_prompt", {"prompt_to_repeat": body}, prompt, z, []) == (None, [])


def test_shared_sentence_pairs():
    z = ["Do not use any commas and end with 'Bye'."]
    assert C.is_shared(z, [["Do not use any commas and end with 'Bye'."], []])
    assert not C.is_shared(z, [["Write in lowercase."]])


def _row(t, lift, base, sham, origin="own", shared=False):
    return {"type": t, "lift": lift, "baseline": base, "sham_lift": sham, "origin": origin, "shared": shared,
            "sham_kind": "length"}


def test_a_type_survives_both_only_when_both_differences_are_above_zero():
    rng = np.random.default_rng(1)
    rows = [_row(TITLE, 3 + e, 1 + e, 1.2, "own" if k % 2 else "constructed") for k, e in enumerate(rng.normal(0, 0.1, 12))]
    rows += [_row(END, 2 + e, 2 - e, 1.0) for e in rng.normal(0, 0.3, 12)]  # lift at its position baseline
    rows += [_row(KW, 2.0, 1.0, 2.0 + e) for e in rng.normal(0, 0.3, 12)]  # the sham moves q as much
    rows += [_row(KW, 2.0, 1.0, math.nan)]  # no sham: out of both
    out = {r["type"]: r for r in C.survival(rows, boot=2000)}
    assert out[TITLE]["survives_both"] and out[TITLE]["n"] == 12
    assert not out[END]["survives_pos"] and out[END]["survives_sham"]
    assert out[KW]["survives_pos"] and not out[KW]["survives_sham"] and out[KW]["n"] == 12
    assert out["pooled"]["n"] == 36


def test_keyword_filler_and_own_versus_constructed():
    assert C.filler_start("Cats are nice. This is about dogs. This is about mice.") == len("Cats are nice.")
    assert C.filler_start("Cats are nice.") is None
    rows = [_row(TITLE, 2.0, 1, 1, "own")] * 3 + [_row(TITLE, 4.0, 1, 1, "constructed")] * 3 + [_row(END, 1.0, 1, 1)] * 5
    assert C.own_vs_constructed(rows) == [(TITLE, 3, 2.0, 3, 4.0)]
