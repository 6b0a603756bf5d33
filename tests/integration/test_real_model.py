"""The mechanism on a real instruct model: SmolLM2-135M-Instruct (provisioned by setup, ``recipe.mrtpo.cpu.smollm2``)
puts the replay's q on the tokens the checker reads when the constraint's sentence is removed.

A property of the real model with fixed prompts, fixed compliant responses and fp32 forwards (no sampling):
for the end-phrase and title constraints the response token with the largest q lies in the checker's span, and the
lift of q on the span (``experiments.real_model.spans.lift``) is above 2. ``docs/real_model`` holds the full
measurement (all IFEval / IFBench pairs with a span, controls, intervals).
"""

from __future__ import annotations

import numpy as np
import pytest

from experiments.real_model import spans as S

END = "startend:end_checker"
TITLE = "detectable_format:title"
# (constraint, kwargs, prompt, the constraint's sentence in it, a compliant response)
CASES = [
    (END, {"end_phrase": "Is there anything else I can help with?"},
     "Write a short note to a friend about your weekend. Finish your response with this exact phrase "
     "'Is there anything else I can help with?'. No other words should follow this phrase.",
     "Finish your response with this exact phrase 'Is there anything else I can help with?'.",
     "Hi Sam, my weekend was lovely. On Saturday I went hiking in the hills with my sister, and on Sunday I stayed "
     "at home and read a good book about old ships. Is there anything else I can help with?"),
    (END, {"end_phrase": "Any other questions?"},
     "Explain why the sky is blue in two sentences. End your response with the exact phrase 'Any other questions?'.",
     "End your response with the exact phrase 'Any other questions?'.",
     "Sunlight scatters off air molecules, and blue light scatters the most. So the sky looks blue. Any other questions?"),
    (END, {"end_phrase": "Let me know if you have additional questions."},
     "Give me one tip for learning to cook. End your response with 'Let me know if you have additional questions.'",
     "End your response with 'Let me know if you have additional questions.'",
     "Start with simple recipes, like pasta or eggs, and cook them often. Taste as you go, keep your knife sharp "
     "and clean up while things simmer. Let me know if you have additional questions."),
    (TITLE, {},
     "Write a short poem about the sea. Your answer must contain a title, wrapped in double angular brackets, "
     "such as <<poem of joy>>.",
     "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
     "<<The Sea>>\nThe waves roll in and out,\nthe gulls call all about."),
    (TITLE, {},
     "Describe a cat in three sentences. Include a title wrapped in double angular brackets, i.e. <<title>>.",
     "Include a title wrapped in double angular brackets, i.e. <<title>>.",
     "<<My Cat>>\nMy cat is small and grey. She sleeps all day. At night she plays with string."),
    (TITLE, {},
     "Write a haiku about autumn. Give it a title in double angular brackets, like <<title>>.",
     "Give it a title in double angular brackets, like <<title>>.",
     "<<Autumn Leaves>>\nRed leaves drift and fall\ncool wind whispers through the trees\nthe year grows quiet\n\n"
     "Red and gold, the leaves fall softly to the ground as the days grow short."),
]


@pytest.fixture(scope="module")
def smollm2():
    from experiments.real_model.run import load
    from recipe.mrtpo.cpu import smollm2 as asset

    return load(asset.require())  # setup provisions it; absent, require() fails with how to build it


@pytest.fixture(scope="module")
def measured(smollm2):
    from experiments.real_model.run import render, replay
    from recipe.mrtpo.core.prompt_variants import remove_from_messages

    tok, model = smollm2
    items = []
    for iid, kw, prompt, z, response in CASES:
        assert z in prompt
        msgs = [{"role": "user", "content": prompt}]
        enc = tok(response, add_special_tokens=False, return_offsets_mapping=True)
        items.append({"type": iid, "p_all": render(tok, msgs), "p_minus": render(tok, remove_from_messages(msgs, z)),
                      "resp_ids": list(enc["input_ids"]), "offsets": [tuple(o) for o in enc["offset_mapping"]] + [(0, 0)],
                      "spans": S.span_chars(iid, kw, response)})
    replay(tok, model, items, chunk=len(items))
    return items


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0].split(':')[1]}-{k}" for k, c in enumerate(CASES)])
def test_q_peaks_on_the_checkers_span(measured, i):
    it = measured[i]
    q = np.asarray(it["q"])
    in_span = S.token_mask(it["offsets"], it["spans"])
    assert 0 < in_span.sum() < len(q)
    assert in_span[int(np.argmax(q))], f"top q at token {int(np.argmax(q))}, span tokens {np.flatnonzero(in_span).tolist()}"
    assert S.lift(q, in_span) > 1.5


def test_span_rules_follow_the_checkers():
    """The plan's span rules on hand-made responses (pure; the measurement's own helpers)."""
    r = "  Hello there. Any other questions?  "
    (a, b), = S.span_chars(END, {"end_phrase": "Any other questions?"}, r)
    assert r[a:b] == "Any other questions?"
    # IFEval's TitleChecker: re.findall(r"<<[^\n]+>>") -- greedy within a line, one match per line
    assert [r2[a:b] for r2 in ["<<T>>\n<<U>>"] for a, b in S.span_chars(TITLE, {}, r2)] == ["<<T>>", "<<U>>"]
    assert [r2[a:b] for r2 in ["<<T>> x <<U>>"] for a, b in S.span_chars(TITLE, {}, r2)] == ["<<T>> x <<U>>"]
    r = "Text.\nP.S. thanks"
    assert [r[a:b].strip() for a, b in S.span_chars("detectable_content:postscript", {"postscript_marker": "P.S."}, r)] == ["P.S. thanks"]
    assert S.span_chars("startend:quotation", {}, ' "hi" ') == [(1, 2), (4, 5)]
    assert S.token_mask([(0, 2), (2, 2), (2, 5)], [(3, 4)]).tolist() == [False, False, True]
    q = np.array([0.0, 0.0, 1.0, 1.0])
    assert S.lift(q, np.array([False, False, True, True])) == pytest.approx(2.0)
    assert S.lift(np.ones(4), np.array([True, False, False, False])) == pytest.approx(1.0)
    assert S.sentences("Do it. Then P.P.S is here! ok") == ["Do it.", "Then P.P.S is here!", "ok"]
