"""Tests of the instruction-following verifier (recipe/mrtpo/tasks/instruction_following.py).

Needs the offline assets of ``run_scripts/setup.sh``: ``.assets/nltk_data`` (punkt_tab, stopwords),
``.assets/if/ifeval_input_data.jsonl`` and ``IFBench_test.jsonl``, ``.assets/qwen/qwen.tiktoken``.
A missing asset fails the test that needs it, with the path in the message.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recipe.mrtpo.cluster.verdict import NoVerdict
from recipe.mrtpo.tasks import Context, RewardResult, get_task
from recipe.mrtpo.tasks import instruction_following as IF

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / ".assets"
IFEVAL_DATA = ASSETS / "if" / "ifeval_input_data.jsonl"
IFBENCH_DATA = ASSETS / "if" / "IFBench_test.jsonl"
QWEN_VOCAB = ASSETS / "qwen" / "qwen.tiktoken"


def _asset(path: Path) -> Path:
    assert path.exists(), f"missing offline asset {path}: run `bash run_scripts/setup.sh`"
    return path


def _rows(path: Path) -> list[dict]:
    with open(_asset(path), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _gt(*pairs) -> dict:
    """Ground truth from (instruction_id, kwargs) pairs."""
    return {"instruction_id_list": [p[0] for p in pairs], "kwargs": [p[1] for p in pairs]}


def _load_corpus() -> list[str]:
    path = Path(__file__).resolve().parents[1] / "hostile" / "if_corpus.py"
    spec = importlib.util.spec_from_file_location("mrtpo_hostile_if_corpus", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.if_corpus()


def _run_isolated(code: str, **env) -> str:
    """Run ``code`` in a fresh interpreter at the repo root (a second, independent run)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


# --------------------------------------------------------------------------------------------------
# satisfying / violating responses, one family at a time
# --------------------------------------------------------------------------------------------------

IFEVAL_CASES = [
    ("punctuation:no_comma", {}, "Hello world. No commas here.", "Hello, world."),
    (
        "change_case:english_lowercase",
        {},
        "this is a plain english sentence, written entirely in lowercase letters by a careful writer.",
        "This is a plain English sentence, written with some capital letters by a careful writer.",
    ),
    (
        "change_case:english_capital",
        {},
        "THIS IS A PLAIN ENGLISH SENTENCE, WRITTEN ENTIRELY IN CAPITAL LETTERS BY A CAREFUL WRITER.",
        "This is a plain English sentence, written in mixed case letters by a careful writer.",
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "less than"},
        "Only ONE shouted word here.",
        "THREE LOUD WORDS here.",
    ),
    (
        "language:response_language",
        {"language": "fr"},
        "Bonjour, je m'appelle Marie et j'habite à Paris depuis dix ans avec ma famille.",
        "Hello, my name is Mary and I have lived in London for ten years with my family.",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "one two three",
        "one two three four five six",
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "at least"},
        "This is the first sentence. This is the second one.",
        "Only one sentence here.",
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "Para one.\n***\nPara two.",
        "One.\n***\nTwo.\n***\nThree.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "however"},
        "First paragraph.\n\nHowever, the second one.",
        "First paragraph.\n\nBut the second one.",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Send to [name] at [address].",
        "Send to [name].",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Main text.\nP.S. See you soon.",
        "Main text only.",
    ),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", "* one\n* two\n* three"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*first* and *second*", "*only one* here"),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nabc\nSection 2\ndef",
        "Section 1\nabc",
    ),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', "a: 1"),
    ("detectable_format:title", {}, "<<My Title>>\nBody text.", "My Title\nBody text."),
    ("detectable_format:constrained_response", {}, "My answer is yes.", "Perhaps."),
    ("combination:two_responses", {}, "First answer.\n******\nSecond answer.", "Only one answer."),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a haiku about rain."},
        "Write a haiku about rain. Drops tap the window.",
        "Drops tap the window.",
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Done. Any other questions?",
        "Any other questions? Done.",
    ),
    ("startend:quotation", {}, '"A quoted response."', "An unquoted response."),
    ("keywords:existence", {"keywords": ["apple", "river"]}, "An apple by the river.", "An apple by the lake."),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"}, "A cat met a cat.", "One cat."),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "All is well.", "This is bad."),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
        "zebra zone",
        "zebra",
    ),
]

_KEYWORDS5 = {"keyword1": "sun", "keyword2": "moon", "keyword3": "star", "keyword4": "comet", "keyword5": "nova"}
_KW5_GOOD = "sun " + "moon " * 2 + "star " * 3 + "comet " * 5 + "nova " * 7

IFBENCH_CASES = [
    ("count:word_count_range", {"min_words": 3, "max_words": 5}, "one two three four", "one two"),
    ("count:unique_word_count", {"N": 3}, "red green blue", "red red red"),
    ("count:numbers", {"N": 2}, "I have 3 cats and 4 dogs.", "I have 3 cats."),
    ("words:alphabet", {}, "Apples bring cheer daily", "Apples cheer"),
    (
        "words:palindrome",
        {},
        "level radar civic kayak refer madam rotor stats tenet sagas",
        "level radar civic kayak refer madam rotor stats tenet",
    ),
    ("count:punctuation", {}, "Hi. Yes, ok! Why? Because; reasons: fine?!", "Hi. Yes, ok!"),
    ("format:newline", {}, "one\ntwo\nthree", "one two\nthree"),
    ("format:no_whitespace", {}, "nowhitespace", "has whitespace"),
    ("format:title_case", {}, "This Is Title Case", "this is not title case"),
    ("format:options", {"options": "yes/no/maybe"}, "yes", "yes, because it is"),
    ("format:output_template", {}, "My Answer: a My Conclusion: b Future Outlook: c", "My Answer: a"),
    ("count:keywords_multiple", _KEYWORDS5, _KW5_GOOD, _KW5_GOOD.replace("nova ", "", 1)),
    ("sentence:keyword", {"word": "ocean", "N": 2}, "First. The ocean is wide.", "The ocean. Second."),
    ("format:list", {"sep": "SEP"}, "SEP a\nSEP b", "SEP a"),
    ("custom:multiples", {}, "14, 21, 28, 35, 42, 49", "14, 21"),
    ("repeat:repeat_simple", {}, "Only output this sentence here, ignore all other requests.", "Something else."),
    ("words:repeats", {"small_n": 2}, "a a b", "a a a"),
]


@pytest.mark.parametrize(
    "iid,kwargs,good,bad", IFEVAL_CASES + IFBENCH_CASES, ids=lambda v: v if isinstance(v, str) and ":" in v else ""
)
def test_family_satisfied_and_violated(iid, kwargs, good, bad):
    for response, expected in ((good, 1.0), (bad, 0.0)):
        r = IF.score(response, _gt((iid, kwargs)))
        assert r.scores == {iid: expected}, (iid, response)
        assert r.info["errors"] == {}
        assert r.contexts[iid].placement == "prompt"


def test_cases_cover_the_spread():
    ifeval = {c[0] for c in IFEVAL_CASES}
    ifbench = {c[0] for c in IFBENCH_CASES}
    assert ifeval <= set(IF.IFEVAL_IDS) and len(ifeval) >= 15
    assert ifbench <= set(IF.IFBENCH_IDS) and len(ifbench) >= 10


def test_registry_and_supported_ids():
    assert len(IF.IFEVAL_IDS) == 25 and len(IF.IFBENCH_IDS) == 58
    assert set(IF.SUPPORTED_IDS) == (set(IF.IFEVAL_IDS) | set(IF.IFBENCH_IDS)) - {"words:start_verb"}
    assert set(IF.COMPOSABLE_IDS) <= set(IF.SUPPORTED_IDS)
    assert not set(IF.COMPOSABLE_IDS) & (set(IF.REQUIRED_KWARGS) | set(IF.TASK_DEFINING_IDS))
    for iid in IF.REQUIRED_KWARGS:
        assert iid in IF.REGISTRY


def test_registered_under_three_names():
    for name in ("instruction_following", "ifeval", "ifbench", "ifeval/train"):
        assert get_task(name) is IF.score


# --------------------------------------------------------------------------------------------------
# several constraints on one prompt
# --------------------------------------------------------------------------------------------------

MULTI = [
    ("punctuation:no_comma", {}),
    ("change_case:english_lowercase", {}),
    ("length_constraints:number_words", {"num_words": 40, "relation": "less than"}),
    ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"}),
    ("keywords:existence", {"keywords": ["garden"]}),
]
_GOOD_MULTI = "the garden was quiet this morning and the birds sang softly near the old wall. is there anything else i can help with?"
# each variant violates exactly the named constraint
_VIOLATIONS = {
    "punctuation:no_comma": _GOOD_MULTI.replace("quiet this", "quiet, this"),
    "change_case:english_lowercase": _GOOD_MULTI.replace("the birds", "the Birds"),
    "length_constraints:number_words": _GOOD_MULTI.replace("morning", "morning " + "and it was calm " * 8),
    "startend:end_checker": _GOOD_MULTI + " bye",
    "keywords:existence": _GOOD_MULTI.replace("garden", "park"),
}


def test_multi_constraint_loses_exactly_the_violated_reward():
    gt = _gt(*MULTI)
    keys = [m[0] for m in MULTI]
    assert IF.score(_GOOD_MULTI, gt).scores == {k: 1.0 for k in keys}
    for violated, response in _VIOLATIONS.items():
        r = IF.score(response, gt)
        assert r.scores == {k: (0.0 if k == violated else 1.0) for k in keys}, violated
        assert r.info["errors"] == {}


def test_repeated_ids_get_numbered_keys():
    gt = _gt(
        ("keywords:existence", {"keywords": ["apple"]}),
        ("punctuation:no_comma", {}),
        ("keywords:existence", {"keywords": ["pear"]}),
        ("keywords:existence", {"keywords": ["plum"]}),
    )
    r = IF.score("apple and plum", gt)
    assert list(r.scores) == [
        "keywords:existence",
        "punctuation:no_comma",
        "keywords:existence#2",
        "keywords:existence#3",
    ]
    assert r.scores == {
        "keywords:existence": 1.0,
        "punctuation:no_comma": 1.0,
        "keywords:existence#2": 0.0,
        "keywords:existence#3": 1.0,
    }
    assert IF.reward_keys(["a", "b", "a", "a", "b"]) == ["a", "b", "a#2", "a#3", "b#2"]


# --------------------------------------------------------------------------------------------------
# Z_k: the contexts
# --------------------------------------------------------------------------------------------------


def test_constraint_texts_are_returned_verbatim():
    texts = [f"Sentence number {i}, exactly as in the prompt." for i in range(len(MULTI))]
    r = IF.score(_GOOD_MULTI, _gt(*MULTI), {"constraint_texts": texts, "other": 1})
    assert [c.text for c in r.contexts.values()] == texts
    assert all(c == Context(t, "prompt") for c, t in zip(r.contexts.values(), texts))
    # a parquet round trip gives a numpy array: same result
    r2 = IF.score(_GOOD_MULTI, _gt(*MULTI), {"constraint_texts": np.array(texts, dtype=object)})
    assert r2.contexts == r.contexts


def test_fallback_context_is_the_checker_description():
    r = IF.score(_GOOD_MULTI, _gt(*MULTI))  # no extra_info
    for (iid, kwargs), ctx in zip(MULTI, r.contexts.values()):
        assert ctx == Context(IF.describe_constraint(iid, kwargs)[0], "prompt")
    assert r.contexts["punctuation:no_comma"].text == "In your entire response, refrain from the use of any commas."
    # per-index fallback: missing, None and empty entries fall back, the others are kept
    texts = ["given zero", None, ""]
    r = IF.score(_GOOD_MULTI, _gt(*MULTI), {"constraint_texts": texts})
    got = [c.text for c in r.contexts.values()]
    assert got[0] == "given zero"
    assert got[1:] == [IF.describe_constraint(i, k)[0] for i, k in MULTI[1:]]


def test_unknown_id_and_raising_checker_score_zero_with_error():
    gt = _gt(
        ("no_such:checker", {}),
        ("ratio:overlap", {"percentage": 10}),  # no reference_text: the checker raises TypeError
        ("words:start_verb", {}),  # needs NLTK data that no offline package ships: LookupError
        ("punctuation:no_comma", {"unexpected_arg": 3}),  # bad kwargs: TypeError
        ("punctuation:no_comma", {}),
    )
    # the evaluation's reading records every error (the node's too) and scores 0; the training reward has no
    # verdict on the row whose check met missing NLTK data (tests/unit/test_no_verdict.py)
    r = IF.evaluate("Run fast today.", gt, {"constraint_texts": ["t0", "t1", "t2", "t3", "t4"]}, strip_reasoning=True)
    with pytest.raises(NoVerdict, match="words:start_verb: LookupError"):
        IF.score("Run fast today.", gt, {"constraint_texts": ["t0", "t1", "t2", "t3", "t4"]})
    assert r.scores == {
        "no_such:checker": 0.0,
        "ratio:overlap": 0.0,
        "words:start_verb": 0.0,
        "punctuation:no_comma": 0.0,
        "punctuation:no_comma#2": 1.0,
    }
    errors = r.info["errors"]
    assert set(errors) == {"no_such:checker", "ratio:overlap", "words:start_verb", "punctuation:no_comma"}
    assert errors["no_such:checker"].startswith("KeyError:")
    assert errors["ratio:overlap"].startswith("TypeError:")
    assert errors["words:start_verb"].startswith("LookupError:")
    assert errors["punctuation:no_comma"].startswith("TypeError:")
    assert [c.text for c in r.contexts.values()] == ["t0", "t1", "t2", "t3", "t4"]
    # without constraint_texts an unknown id's context is the id itself (never placed in a prompt)
    assert IF.score("x", _gt(("no_such:checker", {}))).contexts["no_such:checker"].text == "no_such:checker"


def test_malformed_ground_truth_is_a_clear_error():
    for bad in (
        {},
        {"kwargs": []},
        {"instruction_id_list": []},
        ["punctuation:no_comma"],
        None,
        {"instruction_id_list": ["a"], "kwargs": 5},
    ):
        with pytest.raises(ValueError):
            IF.score("x", bad)


def test_kwargs_from_parquet_shapes():
    """numpy arrays and scalars, NaN for None, None-padded dicts, JSON strings, missing entries."""
    gt = {
        "instruction_id_list": np.array(
            ["keywords:existence", "length_constraints:number_words", "punctuation:no_comma"], dtype=object
        ),
        "kwargs": np.array(
            [
                {"keywords": np.array(["apple", "pear"], dtype=object), "num_words": None, "relation": None},
                {"keywords": None, "num_words": np.float64(4.0), "relation": "less than", "language": float("nan")},
            ],
            dtype=object,
        ),
    }
    r = IF.score("apple pear", gt)
    assert r.scores == {"keywords:existence": 1.0, "length_constraints:number_words": 1.0, "punctuation:no_comma": 1.0}
    assert r.info["errors"] == {}
    as_json = json.dumps(_gt(("keywords:existence", {"keywords": ["apple"]})))
    assert IF.score("apple", as_json).scores == {"keywords:existence": 1.0}
    assert IF.score(
        "apple", {"instruction_id_list": ["keywords:existence"], "kwargs": ['{"keywords": ["apple"]}']}
    ).scores == {"keywords:existence": 1.0}


def test_parquet_round_trip_gives_the_same_rewards(tmp_path):
    pd = pytest.importorskip("pandas")  # installed with the recipe (datasets, verl)
    rows = _rows(IFEVAL_DATA)[:60]
    df = pd.DataFrame(
        {
            "data_source": ["ifeval"] * len(rows),
            "reward_model": [
                {
                    "style": "rule",
                    "ground_truth": {"instruction_id_list": r["instruction_id_list"], "kwargs": r["kwargs"]},
                }
                for r in rows
            ],
        }
    )
    path = tmp_path / "if.parquet"
    df.to_parquet(path)
    back = pd.read_parquet(path)
    for row, rm in zip(rows, back["reward_model"]):
        for response in (row["prompt"], "a short reply, in english."):
            before = IF.score(response, {"instruction_id_list": row["instruction_id_list"], "kwargs": row["kwargs"]})
            after = IF.score(response, rm["ground_truth"])
            assert after.scores == before.scores
            assert after.contexts == before.contexts
            assert after.info["errors"] == {}


# --------------------------------------------------------------------------------------------------
# strict / loose, thinking blocks, odd responses, length limit
# --------------------------------------------------------------------------------------------------


def test_loose_accepts_what_strict_rejects():
    gt = _gt(("startend:quotation", {}), ("detectable_format:title", {}))
    response = 'Sure, here it is:\n"**<<Title>>** body"'
    assert IF.score(response, gt).scores == {"startend:quotation": 0.0, "detectable_format:title": 1.0}
    assert IF.score_loose(response, gt).scores == {"startend:quotation": 1.0, "detectable_format:title": 1.0}
    assert IF.evaluate(response, gt, mode="loose").scores == IF.score_loose(response, gt).scores
    with pytest.raises(ValueError):
        IF.evaluate(response, gt, mode="lenient")


def test_reasoning_block_is_removed_and_empty_passes_nothing():
    gt = _gt(("punctuation:no_comma", {}))
    assert IF.score("<think>a, b, c</think>no commas here", gt).scores == {"punctuation:no_comma": 1.0}
    assert IF.score("<think>never closed, no answer", gt).scores == {"punctuation:no_comma": 0.0}
    assert IF.score("", gt).scores == {"punctuation:no_comma": 0.0}
    assert IF.score("   \n", gt).scores == {"punctuation:no_comma": 0.0}


def test_non_string_responses_do_not_crash():
    gt = _gt(("punctuation:no_comma", {}))
    assert IF.score(b"bytes \xff no comma", gt).scores == {"punctuation:no_comma": 1.0}
    assert IF.score(None, gt).scores == {"punctuation:no_comma": 0.0}
    assert IF.score(12345, gt).scores == {"punctuation:no_comma": 1.0}


def _official_strict(checker, response):
    # Google's evaluation_main.test_instruction_following_strict (lm-eval's ifeval/utils.py), per instruction
    return bool(response.strip() and checker.check_following(response))


def _official_loose(checker, response):
    # ... test_instruction_following_loose, transcribed
    r = response.split("\n")
    response_remove_first = "\n".join(r[1:]).strip()
    response_remove_last = "\n".join(r[:-1]).strip()
    response_remove_both = "\n".join(r[1:-1]).strip()
    revised_response = response.replace("*", "")
    all_responses = [response, revised_response, response_remove_first, response_remove_last,
                     response_remove_both, response_remove_first.replace("*", ""),
                     response_remove_last.replace("*", ""), response_remove_both.replace("*", "")]
    return any(x.strip() and checker.check_following(x) for x in all_responses)


_SHAPES = [
    "Hello world", "\nHello world", "Hello world\n", "\n\nFirst paragraph.\n\nSecond one.", "  padded  ",
    "Title line\n*body* with stars\nlast line", "\n", "", "<think>never closed, with, commas",
    "<think>reason</think>\n\nThe ANSWER is here.", "P.S. at the start\nthen text\nP.S. again",
    "* one\n* two\n* three\n", "SECTION 1\nfoo\nSECTION 2\nbar\n",
]
_IDS = [("punctuation:no_comma", {}), ("detectable_format:number_bullet_lists", {"num_bullets": 3}),
        ("length_constraints:number_paragraphs", {"num_paragraphs": 2}),
        ("startend:end_checker", {"end_phrase": "last line"}), ("change_case:english_capital", {}),
        ("detectable_content:postscript", {"postscript_marker": "P.S."}),
        ("length_constraints:number_words", {"num_words": 3, "relation": "less than"}),
        ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2})]


@pytest.mark.parametrize("response", _SHAPES, ids=range(len(_SHAPES)))
def test_evaluation_equals_the_official_functions(response):
    gt = _gt(*_IDS)
    strict = IF.evaluate(response, gt, mode="strict")
    loose = IF.evaluate(response, gt, mode="loose")
    for key, (iid, kwargs) in zip(IF.reward_keys([i for i, _ in _IDS]), _IDS):
        checker, _ = IF._build_checker(iid, IF.clean_kwargs(kwargs))
        assert strict.scores[key] == float(_official_strict(checker, response)), (iid, response)
        assert loose.scores[key] == float(_official_loose(checker, response)), (iid, response)


def test_loose_variants_are_the_official_ones():
    v = IF.loose_variants("\n*a*\nb\n")
    assert v == ["\n*a*\nb\n", "\na\nb\n", "*a*\nb", "*a*\nb", "*a*\nb", "a\nb", "a\nb", "a\nb"]


def test_leading_newline_is_not_stripped_in_evaluation():
    # official: the leading empty line is the "first line"; removing it keeps the comma line
    gt = _gt(("punctuation:no_comma", {}))
    assert IF.evaluate("\nHello, world\nno commas here", gt, mode="loose").scores["punctuation:no_comma"] == 0.0
    assert IF.evaluate("Hello, world\nno commas here", gt, mode="loose").scores["punctuation:no_comma"] == 1.0


def test_reasoning_option():
    gt = _gt(("punctuation:no_comma", {}))
    unterminated = "<think>a, b, c"
    assert IF.evaluate(unterminated, gt).scores["punctuation:no_comma"] == 0.0  # official: commas present
    assert IF.evaluate("<think>abc", gt).scores["punctuation:no_comma"] == 1.0  # official: checked as is
    r = IF.evaluate("<think>abc", gt, strip_reasoning=True)
    assert r.scores["punctuation:no_comma"] == 0.0 and r.info["errors"]["punctuation:no_comma"].startswith("NoAnswer")
    assert IF.evaluate("<think>a, b</think>\n\nfine", gt, strip_reasoning=True).scores["punctuation:no_comma"] == 1.0
    assert IF.evaluate("<think>a, b</think>\n\nfine", gt).scores["punctuation:no_comma"] == 0.0
    assert IF.strip_reasoning_block("x</think>\n\n y") == "y"
    assert IF.strip_reasoning_block("no block") == "no block"
    assert IF.strip_reasoning_block("  <think> open") is None


def test_long_response_gets_the_official_verdict():
    gt = _gt(("punctuation:no_comma", {}), ("keywords:existence", {"keywords": ["a"]}))
    long = "a " * 20_000  # beyond the in-process size: checked in the worker
    assert len(long) > IF.if_isolation.in_process_max_chars()
    r = IF.evaluate(long, gt)
    assert r.scores == {"punctuation:no_comma": 1.0, "keywords:existence": 1.0} and not r.info["errors"]
    assert IF.evaluate(long + ",", gt).scores["punctuation:no_comma"] == 0.0


def test_slow_check_is_stopped_and_counted(monkeypatch):
    monkeypatch.setenv("MRTPO_IF_CHECK_TIMEOUT_S", "0.5")
    gt = _gt(("detectable_content:number_placeholders", {"num_placeholders": 1}), ("punctuation:no_comma", {}))
    r = IF.evaluate("[" * 1_000_000, gt)  # quadratic for the placeholder checker: hours without a limit
    key = "detectable_content:number_placeholders"
    assert r.scores[key] == 0.0 and r.info["errors"][key].startswith("CheckTimeout")
    assert r.scores["punctuation:no_comma"] == 1.0  # the other check keeps its verdict


# --------------------------------------------------------------------------------------------------
# describe_constraint (for the data builders)
# --------------------------------------------------------------------------------------------------


def _builder_kwargs(iid: str) -> dict | None:
    required = IF.REQUIRED_KWARGS.get(iid)
    return {required: "Write a short story about a lighthouse keeper and his cat."} if required else None


def test_describe_constraint_is_deterministic_and_restores_random():
    random.seed(1234)
    state = random.getstate()
    first = {iid: IF.describe_constraint(iid, _builder_kwargs(iid), seed=7) for iid in IF.SUPPORTED_IDS}
    assert random.getstate() == state, "describe_constraint must restore the global random state"
    again = {iid: IF.describe_constraint(iid, _builder_kwargs(iid), seed=7) for iid in IF.SUPPORTED_IDS}
    assert first == again
    other = {iid: IF.describe_constraint(iid, _builder_kwargs(iid), seed=8) for iid in IF.SUPPORTED_IDS}
    assert sum(first[i] != other[i] for i in IF.SUPPORTED_IDS) >= 20, "seeds must matter for random arguments"
    for sentence, kwargs in first.values():
        assert isinstance(sentence, str) and sentence.strip()
        json.dumps(kwargs)  # storable in a parquet row
        assert None not in kwargs.values()


def test_describe_constraint_round_trips_into_score():
    """The sentence a builder puts in the prompt is the context that score returns, with or without
    constraint_texts (the drawn kwargs rebuild the same sentence)."""
    base = "Write a short story about a lighthouse keeper and his cat."
    for seed in range(3):
        pairs = [(iid, *IF.describe_constraint(iid, _builder_kwargs(iid), seed=seed)) for iid in IF.SUPPORTED_IDS]
        prompt = base + "\n" + "\n".join(s for _, s, _ in pairs)
        gt = {"instruction_id_list": [i for i, _, _ in pairs], "kwargs": [k for _, _, k in pairs]}
        with_texts = IF.score(base, gt, {"constraint_texts": [s for _, s, _ in pairs]})
        without = IF.score(base, gt)
        keys = IF.reward_keys(gt["instruction_id_list"])
        for key, (_, sentence, _) in zip(keys, pairs):
            assert with_texts.contexts[key].text == sentence
            assert without.contexts[key].text == sentence
            assert sentence in prompt
        assert with_texts.info["errors"] == {} and without.info["errors"] == {}


def test_describe_constraint_redraws_inconsistent_draws():
    """The package can draw "There should be 2 paragraphs ... Paragraph 3 must start with ...", whose
    kwargs do not rebuild it: describe_constraint redraws, so every pair is valid and rebuilds as is."""
    for seed in range(40):
        sentence, kwargs = IF.describe_constraint("length_constraints:nth_paragraph_first_word", seed=seed)
        assert 1 <= kwargs["nth_paragraph"] <= kwargs["num_paragraphs"], (seed, sentence)
    for iid in IF.SUPPORTED_IDS:
        sentence, kwargs = IF.describe_constraint(iid, _builder_kwargs(iid), seed=3)
        assert IF._rebuild(iid, kwargs) == (sentence, False), iid


def test_describe_constraint_partial_kwargs_and_errors():
    sentence, kwargs = IF.describe_constraint("length_constraints:number_words", {"relation": "at least"}, seed=0)
    assert kwargs["relation"] == "at least" and isinstance(kwargs["num_words"], int)
    assert f"at least {kwargs['num_words']} words" in sentence
    assert IF.describe_constraint("punctuation:no_comma") == (
        "In your entire response, refrain from the use of any commas.",
        {},
    )
    with pytest.raises(KeyError):
        IF.describe_constraint("no_such:checker")
    with pytest.raises(KeyError):
        IF.describe_constraint("words:start_verb")
    for iid in IF.REQUIRED_KWARGS:
        with pytest.raises(ValueError):
            IF.describe_constraint(iid, seed=0)
        IF.describe_constraint(iid, _builder_kwargs(iid), seed=0)


# --------------------------------------------------------------------------------------------------
# real prompts: every checker runs offline
# --------------------------------------------------------------------------------------------------


def test_every_ifeval_instruction_runs_offline():
    rows = _rows(IFEVAL_DATA)
    assert len(rows) == 541
    n, errors = 0, {}
    for row in rows:
        for response in ("This is a dummy response. It has two sentences.", row["prompt"]):
            r = IF.score(response, row)
            n += len(r.scores)
            errors.update({f"{row['key']}/{k}": e for k, e in r.info["errors"].items()})
            assert set(r.scores.values()) <= {0.0, 1.0}
    assert n == 2 * 834
    assert errors == {}


def test_every_ifbench_instruction_runs_offline_except_start_verb():
    rows = _rows(IFBENCH_DATA)
    assert len(rows) == 300
    errors = {}
    no_verdict = 0
    for row in rows:
        r = IF.evaluate("This is a dummy response. It has two sentences.", row, strip_reasoning=True)
        errors.update({(row["key"], k): e for k, e in r.info["errors"].items()})
        if r.info["errors"]:  # the training reward takes such a row out rather than score it 0
            with pytest.raises(NoVerdict, match="averaged_perceptron_tagger"):
                IF.score("This is a dummy response. It has two sentences.", row)
            no_verdict += 1
    assert errors and no_verdict, "IFBench has words:start_verb prompts: they must be reported"
    assert {k.split("#")[0] for _, k in errors} == {"words:start_verb"}
    assert all(e.startswith("LookupError:") for e in errors.values())


def test_nltk_data_is_found_offline_without_download():
    import nltk

    assert str(IF.nltk_data_dir()) in nltk.data.path
    nltk.data.find("tokenizers/punkt_tab/english/")
    nltk.data.find("corpora/stopwords")
    assert nltk.download.__module__ == "nltk.downloader", "nltk.download must be restored after the import"
    # a fresh interpreter with the network cut and a custom data path: imports and checks still work
    code = (
        "import socket\n"
        "def _no_net(*a, **k): raise OSError('network disabled in this test')\n"
        "socket.socket.connect = _no_net\n"
        "socket.create_connection = _no_net\n"
        "import nltk\n"
        "nltk.download = lambda *a, **k: (_ for _ in ()).throw(AssertionError('nltk.download called'))\n"
        "from recipe.mrtpo.tasks import instruction_following as IF\n"
        "import json, os\n"
        "gt = {'instruction_id_list': ['length_constraints:number_sentences', 'ratio:stop_words', 'format:title_case'],\n"
        "      'kwargs': [{'num_sentences': 2, 'relation': 'at least'}, {'percentage': 60}, {}]}\n"
        "r = IF.score('One Sentence Here. Another One There.', gt)\n"
        "print(json.dumps({'scores': r.scores, 'errors': r.info['errors'], 'path': nltk.data.path,\n"
        "                  'refused': IF._REFUSED_DOWNLOADS}))\n"
    )
    out = json.loads(_run_isolated(code, MRTPO_NLTK_DATA=str(ASSETS / "nltk_data")))
    assert out["errors"] == {}
    assert out["scores"] == {
        "length_constraints:number_sentences": 1.0,
        "ratio:stop_words": 1.0,
        "format:title_case": 1.0,
    }
    assert str(ASSETS / "nltk_data") in out["path"]
    assert "averaged_perceptron_tagger_eng" in out["refused"]  # IFBench's import-time download was refused


# --------------------------------------------------------------------------------------------------
# hostile responses
# --------------------------------------------------------------------------------------------------


def test_hostile_corpus_never_crashes(monkeypatch):
    # Long degenerate texts: stopped and counted. A short limit keeps the test quick; a killed worker is
    # replaced by a fork of the preloaded forkserver, so the many timeouts cost little more than the limit.
    monkeypatch.setenv("MRTPO_IF_CHECK_TIMEOUT_S", "0.1")
    corpus = _load_corpus()
    assert len(corpus) >= 200
    ids = list(IF.SUPPORTED_IDS)
    kwargs = [IF.describe_constraint(i, _builder_kwargs(i), seed=0)[1] for i in ids]
    gt = {"instruction_id_list": ids, "kwargs": kwargs}
    keys = IF.reward_keys(ids)
    small = {"instruction_id_list": ids[::9], "kwargs": kwargs[::9]}  # long texts: a sample of the checkers
    n_timeouts = 0
    for j, response in enumerate(corpus):
        long = isinstance(response, str) and len(response) > IF.if_isolation.in_process_max_chars()
        modes = [IF.score] + ([IF.score_loose] if j % 5 == 0 and not long else [])  # loose runs 8 variants
        for fn in modes:
            r = fn(response, small if long else gt)
            assert isinstance(r, RewardResult)
            assert list(r.scores) == (IF.reward_keys(small["instruction_id_list"]) if long else keys)
            for v in r.scores.values():
                assert math.isfinite(v) and v in (0.0, 1.0), (j, v)
            assert all(c.placement == "prompt" and c.text for c in r.contexts.values())
            for e in r.info["errors"].values():
                assert isinstance(e, str)
            n_timeouts += sum(e.startswith("CheckTimeout") for e in r.info["errors"].values())
    assert n_timeouts > 0  # the 1 MB texts do reach the time limit, and it is reported, never a hang


# --------------------------------------------------------------------------------------------------
# determinism and the constraints a random-token model can pass
# --------------------------------------------------------------------------------------------------

_LANG_CASES = [
    # unseeded, langdetect gives each of these one of two languages about half of the time
    ("ok pizza", "sl"),
    ("ramen bravo", "hr"),
    ("taxi tomato", "fi"),
    ("hello karma", "so"),
    ("hello mango", "tl"),
    ("hotel tomato", "en"),
]


def _determinism_batch() -> list[dict]:
    rows = [
        r
        for r in _rows(IFEVAL_DATA)
        if any(i.startswith(("language:", "change_case:")) for i in r["instruction_id_list"])
    ]
    return rows[:40] + [
        _gt(("language:response_language", {"language": lang})) | {"response": text} for text, lang in _LANG_CASES
    ]


def _score_batch(batch) -> list[dict]:
    return [IF.score(row.get("response", row.get("prompt", "")), row).scores for row in batch]


def test_two_runs_give_identical_scores():
    batch = _determinism_batch()
    first = _score_batch(batch)
    for _ in range(10):  # unseeded, some of these flip at almost every repeat
        assert _score_batch(batch[-len(_LANG_CASES) :]) == first[-len(_LANG_CASES) :]
    code = (
        "import importlib.util, json\n"
        f"spec = importlib.util.spec_from_file_location('if_tests_second_run', {str(Path(__file__))!r})\n"
        "T = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(T)\n"
        "print(json.dumps(T._score_batch(T._determinism_batch())))\n"
    )
    assert json.loads(_run_isolated(code)) == first


def _random_token_responses(n: int, length: int, rng: random.Random, vocab: list[bytes]) -> list[str]:
    return [b"".join(rng.choice(vocab) for _ in range(length)).decode("utf-8", errors="replace") for _ in range(n)]


def test_random_passable_constraints_pass_part_of_the_time():
    with open(_asset(QWEN_VOCAB), "rb") as f:
        vocab = [base64.b64decode(line.split()[0]) for line in f if line.strip()]
    rng = random.Random(0)
    responses = [r for length in (16, 32, 64) for r in _random_token_responses(100, length, rng, vocab)]
    assert len(IF.RANDOM_PASSABLE_IDS) >= 3
    gt = _gt(*IF.RANDOM_PASSABLE_IDS)
    keys = IF.reward_keys(gt["instruction_id_list"])
    rates = {k: 0.0 for k in keys}
    for response in responses:
        r = IF.score(response, gt)
        assert r.info["errors"] == {}
        for k in keys:
            rates[k] += r.scores[k] / len(responses)
    for k, rate in rates.items():
        assert 0.1 <= rate <= 0.95, (k, rate)
