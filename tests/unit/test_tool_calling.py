"""Tests of the tool-calling verifier (recipe/mrtpo/tasks/tool_calling.py).

Run from the repository root: ``.venv/bin/python -m pytest tests/test_tool_calling.py -q``.
The BFCL tests read the offline copy that ``run_scripts/setup.sh`` provisions in ``.assets/bfcl`` and
fail (not skip) when it is missing.
"""

from __future__ import annotations

import gc
import importlib.util
import itertools
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import pytest

from recipe.mrtpo.tasks import get_task
from recipe.mrtpo.tasks import tool_calling as tc
from recipe.mrtpo.tasks.tool_calling import (
    NO_CALL_REFERENCE,
    TOOL_FORMAT_INSTRUCTION,
    calls_from_bfcl_answer,
    exact_match,
    param_valid,
    render_tool_calls,
    render_tools_system_prompt,
    score,
    standardize_string,
)
from recipe.mrtpo.tasks.tool_match import max_assignment

pytestmark = pytest.mark.timeout(120)  # a parser that loops must fail the run, not hang it

ROOT = Path(__file__).resolve().parents[2]
BFCL_DIR = ROOT / ".assets" / "bfcl"


def _load_corpus():
    # Loaded by path: site-packages holds an unrelated top-level ``tests`` package (verl's).
    spec = importlib.util.spec_from_file_location("_tool_corpus", Path(__file__).resolve().parents[1] / "hostile" / "tool_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.tool_corpus()


WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
TIME = {"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}
WEATHER_LONDON = {"name": "get_weather", "arguments": {"city": "London", "unit": "celsius"}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "default": 1},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {"name": "get_time", "description": "Local time.", "parameters": {"type": "dict", "properties": {
        "timezone": {"type": "string"}}, "required": ["timezone"]}},
]

SINGLE = {"calls": [WEATHER], "tools": TOOLS}
MULTIPLE = {"calls": [WEATHER, TIME], "tools": TOOLS}
PARALLEL = {"calls": [WEATHER, WEATHER_LONDON], "tools": TOOLS}
IRRELEVANT = {"calls": [], "tools": TOOLS}


def block(name, arguments, raw=None):
    body = raw if raw is not None else json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def scores(response, gt):
    return score(response, gt).scores


# ------------------------------------------------------------------------------------------------
# Gold answers
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gt", [SINGLE, MULTIPLE, PARALLEL], ids=["single", "multiple", "parallel"])
@pytest.mark.parametrize("think", [False, True])
def test_gold_scores_one(gt, think):
    gold = render_tool_calls(gt["calls"])
    if think:
        gold = "<think>\nThe user wants the weather; I will call the tool.\n</think>\n" + gold
    res = score(gold, gt)
    assert res.scores == {"format": 1.0, "correctness": 1.0}
    assert exact_match(gold, gt) and exact_match(gold, gt, require_format=True)


@pytest.mark.parametrize("gt", [MULTIPLE, PARALLEL], ids=["multiple", "parallel"])
def test_order_free(gt):
    reversed_gold = render_tool_calls(list(reversed(gt["calls"])))
    assert reversed_gold != render_tool_calls(gt["calls"])
    assert scores(reversed_gold, gt) == {"format": 1.0, "correctness": 1.0}
    assert exact_match(reversed_gold, gt)


def test_gold_rendering_is_deterministic_and_qwen_shaped():
    a = render_tool_calls([{"name": "f", "arguments": {"b": 1, "a": {"z": 1, "y": [2, "é"]}}}])
    b = render_tool_calls([{"name": "f", "arguments": {"a": {"y": [2, "é"], "z": 1}, "b": 1}}])
    assert a == b == '<tool_call>\n{"name": "f", "arguments": {"a": {"y": [2, "é"], "z": 1}, "b": 1}}\n</tool_call>'
    assert render_tool_calls([]) == ""
    two = render_tool_calls([WEATHER, TIME])
    assert two.count("<tool_call>\n") == 2 and "</tool_call>\n<tool_call>" in two


def test_whitespace_layout_variants_are_format_valid():
    b1, b2 = block("get_weather", WEATHER["arguments"]), block("get_time", TIME["arguments"])
    compact = '<tool_call>{"name":"get_weather","arguments":{"unit":"celsius","city":"Paris"}}</tool_call>'
    for resp in [
        "  \n" + b1 + "\n\n" + b2 + "\n  ",
        "<think></think>" + b1 + b2,
        "\n<think>\nmulti\nline\n</think>\n\n" + b1 + "\n" + b2,
    ]:
        assert scores(resp, MULTIPLE) == {"format": 1.0, "correctness": 1.0}
    assert scores(compact, SINGLE) == {"format": 1.0, "correctness": 1.0}


# ------------------------------------------------------------------------------------------------
# One defect loses the reward it concerns
# ------------------------------------------------------------------------------------------------

GOLD_SINGLE = render_tool_calls([WEATHER])
GOLD_MULTI = render_tool_calls([WEATHER, TIME])


@pytest.mark.parametrize(
    "resp, why",
    [
        (GOLD_SINGLE[: -len("</tool_call>")], "missing closing tag"),
        (GOLD_SINGLE + "\nI hope this helps!", "text after the blocks"),
        ("Sure, calling it now.\n" + GOLD_SINGLE, "text before the blocks"),
        (block(None, None, '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, "id": 1}'),
         "extra key in the call object"),
        (block(None, None, '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}'),
         "arguments as a JSON string"),
        (block(None, None, '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}} done'),
         "text after the JSON inside the block"),
        ("<think>a</think><think>b</think>" + GOLD_SINGLE, "two think blocks"),
        ("<think>plan" + GOLD_SINGLE, "unterminated think"),
        ("<think>I will use <tool_call> now</think>" + GOLD_SINGLE, "tag inside think"),
        (GOLD_SINGLE + "<think>late</think>", "think after the calls"),
        ("<tool_call>" + GOLD_SINGLE + "</tool_call>", "nested tool_call tags"),
    ],
)
def test_format_defects_keep_correctness(resp, why):
    """Documented: correctness reads calls leniently, so a pure format defect costs only format."""
    res = score(resp, SINGLE)
    assert res.scores == {"format": 0.0, "correctness": 1.0}, why
    assert res.info["format_error"], why


def test_broken_json_loses_format_and_that_call():
    """Documented: a block whose JSON does not parse is no call, so its call counts as missing."""
    broken = block(None, None, '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}')
    assert scores(broken, SINGLE) == {"format": 0.0, "correctness": 0.0}
    two = broken + "\n" + block("get_time", TIME["arguments"])
    assert scores(two, MULTIPLE) == {"format": 0.0, "correctness": 0.5}
    single_quotes = block(None, None, "{'name': 'get_weather', 'arguments': {'city': 'Paris', 'unit': 'celsius'}}")
    assert scores(single_quotes, SINGLE) == {"format": 0.0, "correctness": 0.0}


def test_wrong_argument_value_costs_correctness_only():
    resp = block("get_weather", {"city": "Lyon", "unit": "celsius"})
    s = scores(resp, SINGLE)
    assert s["format"] == 1.0
    assert s["correctness"] == pytest.approx(2 / 3)  # name + unit of name + {city, unit}
    assert not exact_match(resp, SINGLE)


def test_wrong_function_name_scores_lower_than_wrong_value():
    wrong_value = scores(block("get_weather", {"city": "Lyon", "unit": "celsius"}), SINGLE)["correctness"]
    wrong_name = scores(block("get_forecast", WEATHER["arguments"]), SINGLE)
    assert wrong_name == {"format": 1.0, "correctness": 0.0}
    assert wrong_name["correctness"] < wrong_value


def test_missing_and_extra_calls_are_partial():
    only_weather = render_tool_calls([WEATHER])
    assert scores(only_weather, MULTIPLE) == {"format": 1.0, "correctness": 0.5}
    three = render_tool_calls([WEATHER, TIME, WEATHER_LONDON])
    assert scores(three, MULTIPLE) == {"format": 1.0, "correctness": pytest.approx(2 / 3)}
    duplicated = render_tool_calls([WEATHER, WEATHER])
    assert scores(duplicated, SINGLE)["correctness"] == 0.5
    for r in (only_weather, three, duplicated):
        assert not exact_match(r, MULTIPLE if r is not duplicated else SINGLE)


@pytest.mark.parametrize(
    "arguments, expected",
    [
        ({"city": "Paris"}, 2 / 3),  # missing required argument
        ({"city": "Paris", "unit": "celsius", "extra": 1}, 3 / 4),  # undeclared argument
        ({"city": "Paris", "unit": "celsius", "days": 1}, 3 / 4),  # at its default: BFCL forgives nothing
        ({"city": "Paris", "unit": "celsius", "days": "1"}, 3 / 4),
        ({"city": "Paris", "unit": "celsius", "days": 3}, 3 / 4),
        ({"city": "Paris", "unit": "celsius", "note": None}, 3 / 4),  # null is an (invalid) value
        ({"city": "Paris", "unit": None}, 2 / 3),
        ({"city": "PARIS", "unit": "Celsius"}, 1.0),  # BFCL's string normalisation
        ({}, 1 / 3),
        ({"city": "Lyon", "unit": "kelvin"}, 1 / 3),
    ],
)
def test_partial_credit_values(arguments, expected):
    s = scores(block("get_weather", arguments), SINGLE)
    assert s["format"] == 1.0
    assert s["correctness"] == pytest.approx(expected)


def test_best_assignment_not_greedy():
    ref = {"calls": [{"name": "f", "arguments": {"a": 1, "b": 2}}, {"name": "f", "arguments": {"a": 1, "b": 3}}]}
    # pred[0] matches ref[0] and ref[1] equally on "a"; only the assignment pred0->ref1, pred1->ref0 is perfect
    resp = render_tool_calls([{"name": "f", "arguments": {"a": 1, "b": 3}}, {"name": "f", "arguments": {"a": 1, "b": 2}}])
    assert scores(resp, ref) == {"format": 1.0, "correctness": 1.0}


def test_hungarian_equals_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        n, m = rng.randint(1, 5), rng.randint(1, 5)
        w = [[rng.choice([0.0, rng.random()]) for _ in range(m)] for _ in range(n)]
        k = min(n, m)
        best = max(
            sum(w[i][j] for i, j in zip(rows, cols))
            for rows in itertools.combinations(range(n), k)
            for cols in itertools.permutations(range(m), k)
        )
        assert max_assignment(w) == pytest.approx(best)


# ------------------------------------------------------------------------------------------------
# Type normalisation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, allowed, schema, valid",
    [
        (5, [5], {"type": "integer"}, True),
        (5.0, [5], {"type": "integer"}, False),  # a float for an integer: BFCL's type error
        (5, [5.0], {"type": "number"}, True),  # an integer for a float: converted, accepted
        (5, [5.0], {"type": "float"}, True),
        (True, [1], {"type": "integer"}, False),  # booleans are not integers
        ("5", [5], {"type": "integer"}, False),
        (None, [""], {"type": "string"}, False),  # null is never a valid value
        (None, [None], None, False),
        ("New York, NY", ["new york ny"], {"type": "string"}, True),  # spaces and ,./-_*^ removed
        ("new-york", ["New York"], {"type": "string"}, True),
        ("NewYork!", ["New York"], {"type": "string"}, False),
        ("it's", ['it"s'], {"type": "string"}, True),  # ' read as "
        ("in", ["inches", "in"], {"type": "string"}, True),  # any acceptable value
        ("", ["", "x"], {"type": "string"}, True),  # BFCL accepts the omission marker itself
        (["A b", "c"], [["ab", "C"]], {"type": "array", "items": {"type": "string"}}, True),
        ([1, 2], [[2, 1]], {"type": "array", "items": {"type": "integer"}}, False),  # order matters
        ([1.5], [[1]], {"type": "array", "items": {"type": "integer"}}, False),  # item type checked
        ({"k": "A"}, [{"k": ["a", "b"], "o": ["", "x"]}], {"type": "object"}, True),
        ({"k": "a", "z": 1}, [{"k": ["a"]}], {"type": "dict"}, False),
        ({}, [{"k": ["a"]}], {"type": "object"}, False),
        ([{"f": "Age"}], [[{"f": ["age"]}]], {"type": "array", "items": {"type": "dict"}}, True),
        ("x_var", ["x_var"], {"type": "integer"}, True),  # BFCL's variable rule: the answer's type
        ("5", ["5"], None, True),  # no spec: no type check
        (5, [5.0], None, True),
    ],
)
def test_param_valid_bfcl_semantics(value, allowed, schema, valid):
    assert param_valid(value, allowed, schema) is valid


def test_standardize_string():
    assert standardize_string("A-b_c.d/e,f*g^h i'") == 'abcdefghi"'


def test_bfcl_semantics_in_scores():
    tools = [{"name": "f", "parameters": {"type": "dict", "required": ["n"], "properties": {
        "n": {"type": "integer"}, "x": {"type": "float"}, "s": {"type": "string"}, "u": {"type": "string"}}}}]
    gt = {"calls": [{"name": "f", "arguments": {"n": 5, "x": 2.0, "s": "Hello World"},
                     "accepted": {"n": [5], "x": [2.0], "s": ["Hello World", "hello"], "u": ["", "in"]}}],
          "tools": tools}
    assert scores(block("f", {"n": 5, "x": 2, "s": "hello"}), gt) == {"format": 1.0, "correctness": 1.0}
    assert exact_match(block("f", {"n": 5, "x": 2.0, "s": "HELLO world", "u": "in"}), gt)
    assert not exact_match(block("f", {"n": 5.0, "x": 2.0, "s": "hello"}), gt)
    assert not exact_match(block("f", {"n": 5, "x": 2.0, "s": "hello", "u": None}), gt)
    assert not exact_match(block("f", {"x": 2.0, "s": "hello"}), gt)  # required n missing
    assert not exact_match(block("f", {"n": 5, "x": 2.0}), gt)  # s has no "" : not omittable
    plain = {"calls": [{"name": "f", "arguments": {"n": 5}}], "tools": tools}  # the plain shape
    assert exact_match(block("f", {"n": 5}), plain)
    assert not exact_match(block("f", {"n": 5, "u": "in"}), plain)  # not in the reference


# ------------------------------------------------------------------------------------------------
# Irrelevance (reference with zero calls)
# ------------------------------------------------------------------------------------------------


def test_irrelevance_rule():
    decline = "None of the available functions can tell the stock price."
    assert scores(decline, IRRELEVANT) == {"format": 1.0, "correctness": 1.0}
    assert scores("<think>no tool fits</think>\n" + decline, IRRELEVANT) == {"format": 1.0, "correctness": 1.0}
    assert exact_match(decline, IRRELEVANT)
    # a well-formed call is still format-valid, but the wrong decision
    assert scores(GOLD_SINGLE, IRRELEVANT) == {"format": 1.0, "correctness": 0.0}
    assert not exact_match(GOLD_SINGLE, IRRELEVANT)
    # no text at all, or text with a stray tag: format 0 (no call was made, so correctness 1)
    assert scores("", IRRELEVANT) == {"format": 0.0, "correctness": 1.0}
    assert scores("<think>hmm</think>\n  ", IRRELEVANT) == {"format": 0.0, "correctness": 1.0}
    assert scores("I won't call </tool_call>", IRRELEVANT) == {"format": 0.0, "correctness": 1.0}
    # plain text when a call is expected: format 0 and correctness 0
    assert scores(decline, SINGLE) == {"format": 0.0, "correctness": 0.0}


# ------------------------------------------------------------------------------------------------
# Contexts, rendering, registration
# ------------------------------------------------------------------------------------------------


def test_contexts():
    res = score("anything", MULTIPLE)
    assert res.contexts["format"].text == TOOL_FORMAT_INSTRUCTION
    assert res.contexts["format"].placement == "prompt"
    assert res.contexts["correctness"].text == render_tool_calls(MULTIPLE["calls"])
    assert res.contexts["correctness"].placement == "appended"
    assert set(res.scores) == set(res.contexts) == {"format", "correctness"}
    other = score("x", SINGLE, {"format_instruction": "Reply with <tool_call> blocks only."})
    assert other.contexts["format"].text == "Reply with <tool_call> blocks only."
    assert score("x", IRRELEVANT).contexts["correctness"].text == NO_CALL_REFERENCE


def test_format_instruction_text():
    for needle in ("<think></think>", "<tool_call></tool_call>", '{"name": <function-name>, "arguments": <args-json-object>}'):
        assert needle in TOOL_FORMAT_INSTRUCTION


def test_tools_system_prompt_mirrors_qwen_template():
    section = render_tools_system_prompt(TOOLS)
    assert section.startswith(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    )
    assert section.endswith("\n</tools>\n\n" + TOOL_FORMAT_INSTRUCTION)
    assert section.count(TOOL_FORMAT_INSTRUCTION) == 1
    lines = section.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    specs = [json.loads(line) for line in lines]
    assert specs[0] == TOOLS[0]
    assert specs[1] == {"type": "function", "function": TOOLS[1]}  # bare spec wrapped as Qwen's template does
    # removing Z_format (P_minus_k) leaves the tools intact
    assert "<tools>" in section.replace(TOOL_FORMAT_INSTRUCTION, "")


def test_registered():
    assert get_task("tool_calling") is score
    assert get_task("bfcl") is score
    assert get_task("bfcl/simple_python") is score


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"ground_truth": {"calls": [WEATHER, TIME], "tools": [json.dumps(t) for t in TOOLS]}},
        {"ground_truth": {"calls": [{"name": "g", "arguments": {"ids": [1, 2], "opts": {"deep": True}}}], "tools": []}},
        {"ground_truth": {"calls": [], "tools": []}},
    ]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    back = pq.read_table(path).to_pandas()["ground_truth"].tolist()
    assert isinstance(back[0]["calls"], np.ndarray)  # what verl's dataloader hands the verifier
    # struct columns pad every row with the other rows' argument keys as None: "null = absent" undoes it
    assert any(v is None for v in back[0]["calls"][0]["arguments"].values())
    for original, gt in zip(rows, back):
        gold = render_tool_calls(original["ground_truth"]["calls"]) or "No function fits."
        assert render_tool_calls(gt["calls"]) == render_tool_calls(original["ground_truth"]["calls"])
        assert scores(gold, gt) == {"format": 1.0, "correctness": 1.0}
    # JSON-string storage (what the data builder should prefer)
    as_json = {"calls": json.dumps([WEATHER]), "tools": json.dumps(TOOLS)}
    assert scores(GOLD_SINGLE, as_json) == {"format": 1.0, "correctness": 1.0}
    as_json_args = {"calls": [{"name": "get_weather", "arguments": json.dumps(WEATHER["arguments"])}]}
    assert scores(GOLD_SINGLE, as_json_args) == {"format": 1.0, "correctness": 1.0}
    assert scores(GOLD_SINGLE, json.dumps(SINGLE)) == {"format": 1.0, "correctness": 1.0}
    numpy_scalars = {"calls": np.array([{"name": "f", "arguments": {"n": np.int64(5), "x": np.float32(0.5)}}])}
    assert scores(block("f", {"n": 5, "x": 0.5}), numpy_scalars) == {"format": 1.0, "correctness": 1.0}


@pytest.mark.parametrize(
    "gt",
    [None, {}, {"calls": 5}, {"calls": [{"arguments": {}}]}, {"calls": [{"name": "f", "arguments": [1]}]},
     {"calls": [{"name": "f", "arguments": {"x": float("nan")}}]}, {"calls": "not json"}],
)
def test_malformed_ground_truth_is_a_clear_error(gt):
    with pytest.raises(ValueError):
        score(GOLD_SINGLE, gt)


# ------------------------------------------------------------------------------------------------
# Hostile input
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "get_weather", "arguments": {"city": NaN, "unit": "celsius"}}',
        '{"name": "get_weather", "arguments": {"city": Infinity, "unit": "celsius"}}',
        '{"name": "get_weather", "arguments": {"city": 1e999999, "unit": "celsius"}}',
        '{"name": "get_weather", "arguments": {"city": ' + "9" * 2000 + ', "unit": "celsius"}}',  # over MAX_INT_DIGITS
        '{"name": "get_weather", "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        '{"name": "get_weather", "arguments": {"city": "Paris", "city": "Paris", "unit": "celsius"}}',
        '{"name": "get_weather", "arguments": {"city": ' + "[" * 100 + "]" * 100 + ', "unit": "celsius"}}',
        '{"name": "get_weather", "arguments": {"city": "' + "x" * 40_000 + '", "unit": "celsius"}}',
    ],
)
def test_json_bombs_are_invalid(body):
    res = score(block(None, None, body), SINGLE)
    assert res.scores == {"format": 0.0, "correctness": 0.0}
    assert "error" not in res.info


def test_call_count_is_bounded():
    assert scores(GOLD_SINGLE * 64, SINGLE) == {"format": 1.0, "correctness": 1 / 64}
    assert scores(GOLD_SINGLE * 65, SINGLE) == {"format": 0.0, "correctness": 1 / 64}
    assert len(tc.extract_calls(GOLD_SINGLE * 10_000)) == tc.MAX_CALLS


def test_think_blocks_are_skipped_by_correctness():
    draft = "<think>maybe " + block("get_weather", {"city": "Rome", "unit": "celsius"}) + "</think>\n"
    # format 0 (tag inside think); the drafted call is not read, so correctness sees only the real one
    assert scores(draft + GOLD_SINGLE, SINGLE) == {"format": 0.0, "correctness": 1.0}
    assert scores(draft, SINGLE) == {"format": 0.0, "correctness": 0.0}
    # a template that opens the think block in the prompt: everything before the first </think> is thought
    opened_by_prompt = "Draft: " + block("get_weather", {"city": "Rome", "unit": "celsius"}) + "\n</think>\n"
    assert scores(opened_by_prompt + GOLD_SINGLE, SINGLE) == {"format": 0.0, "correctness": 1.0}
    assert scores(GOLD_SINGLE + "<think>" + block("x", {}) + "</think>", SINGLE)["correctness"] == 1.0


def test_closing_tag_inside_a_string_splits_the_block():
    """Documented consequence of tag-based splitting (Qwen's own parser does the same)."""
    resp = block(None, None, '{"name": "f", "arguments": {"x": "</tool_call>"}}')
    gt = {"calls": [{"name": "f", "arguments": {"x": "</tool_call>"}}]}
    assert scores(resp, gt) == {"format": 0.0, "correctness": 0.0}


def test_hostile_corpus():
    corpus = _load_corpus()
    assert len(corpus) >= 200
    assert sum(len(r) >= 1 << 20 for r in corpus) >= 5  # ~1 MB responses are in
    gts = [SINGLE, MULTIPLE, IRRELEVANT]
    # A guard against super-linear parsing (a quadratic path on the ~1 MB responses would take minutes),
    # not a benchmark: locally the slowest call takes ~16 ms. CPU time of this process with the garbage
    # collector paused, so neither a loaded CI machine nor a full collection of the suite's heap (a
    # wall-clock 0.5 s bound failed on CI once) is counted.
    slowest = 0.0
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i, resp in enumerate(corpus):
            for gt in gts:
                t0 = time.process_time()
                res = score(resp, gt)
                slowest = max(slowest, time.process_time() - t0)
                assert "error" not in res.info, (i, res.info)
                for k, v in res.scores.items():
                    assert math.isfinite(v) and 0.0 <= v <= 1.0, (i, k, v)
                assert res.scores["format"] in (0.0, 1.0)
                assert isinstance(exact_match(resp, gt), bool)
    finally:
        if gc_was_enabled:
            gc.enable()
    assert slowest < 2.0, f"slowest scoring call took {slowest:.3f}s of CPU time"


def test_non_string_responses_do_not_crash():
    for resp in [None, b"\xff\xfe<tool_call>", 12345, bytearray(b"abc")]:
        res = score(resp, SINGLE)
        assert res.scores == {"format": 0.0, "correctness": 0.0}


# ------------------------------------------------------------------------------------------------
# BFCL ground truth conversion
# ------------------------------------------------------------------------------------------------

BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")


def _bfcl_rows(category: str):
    if not BFCL_DIR.is_dir():
        pytest.fail(f"BFCL assets missing at {BFCL_DIR}: run `bash run_scripts/setup.sh` first")
    qfile = BFCL_DIR / f"BFCL_v4_{category}.json"
    afile = BFCL_DIR / "possible_answer" / f"BFCL_v4_{category}.json"
    questions = {r["id"]: r for r in map(json.loads, qfile.read_text().splitlines())}
    answers = [json.loads(line) for line in afile.read_text().splitlines()]
    assert len(answers) >= 100, f"{afile} looks truncated"
    return [(questions[a["id"]], a) for a in answers]


def test_calls_from_bfcl_answer_examples():
    answer = [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}},
              {"math.hypot": {"x": [4], "z": ["", 0], "opts": [{"k": ["a", "b"], "o": ["", "x"]}],
                              "conds": [[{"f": ["age"]}, {"f": ["job"]}]]}}]
    calls = calls_from_bfcl_answer(answer)
    assert [{k: c[k] for k in ("name", "arguments")} for c in calls] == [
        {"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": "units"}},
        {"name": "math.hypot", "arguments": {"x": 4, "opts": {"k": "a"}, "conds": [{"f": "age"}, {"f": "job"}]}},
    ]
    assert calls[0]["accepted"] == answer[0]["calculate_triangle_area"]  # every acceptable value kept
    assert calls_from_bfcl_answer({"id": "x", "ground_truth": answer}) == calls
    # a required argument whose allowed values start with "" takes its first other value
    functions = [{"name": "math.hypot", "parameters": {"type": "dict", "required": ["x", "z"], "properties": {
        "x": {}, "z": {}, "opts": {}, "conds": {}}}}]
    assert calls_from_bfcl_answer(answer[1:], functions)[0]["arguments"]["z"] == 0
    # an argument the function does not declare is dropped and reported
    dropped = []
    narrow = [{"name": "math.hypot", "parameters": {"type": "dict", "properties": {"x": {}}}}]
    out = calls_from_bfcl_answer(answer[1:], narrow, dropped)
    assert out[0]["arguments"] == {"x": 4} and set(out[0]["accepted"]) == {"x"}
    assert sorted(dropped) == [("math.hypot", "conds"), ("math.hypot", "opts"), ("math.hypot", "z")]
    with pytest.raises(ValueError):
        calls_from_bfcl_answer([{"a": {}, "b": {}}])


@pytest.mark.parametrize("category", BFCL_CATEGORIES)
def test_bfcl_gold_answers_score_one(category):
    rng = random.Random(category)
    n_checked = 0
    rows = _bfcl_rows(category)
    for question, answer in rows:
        calls = calls_from_bfcl_answer(answer["ground_truth"], question["function"])
        assert len(calls) == len(answer["ground_truth"]) >= 1
        functions = {f["name"]: f for f in question["function"]}
        for call, entry in zip(calls, answer["ground_truth"]):
            (fname, allowed), = entry.items()
            assert call["name"] == fname and fname in functions
            # every converted value is the first allowed one; every required parameter is present
            for arg, value in call["arguments"].items():
                first = allowed[arg][0]
                assert not isinstance(first, dict) or isinstance(value, dict)
                if first == "" and arg in functions[fname]["parameters"].get("required", []):
                    first = allowed[arg][1]
                if not isinstance(first, (dict, list)):
                    assert value == first
            for req in functions[fname]["parameters"].get("required", []):
                assert req in call["arguments"], (answer["id"], fname, req)
        gt = {"calls": calls, "tools": question["function"]}
        gold = render_tool_calls(calls)
        assert score(gold, gt).scores == {"format": 1.0, "correctness": 1.0}, answer["id"]
        thought = "<think>\nI need " + ", ".join(c["name"] for c in calls) + ".\n</think>\n"
        shuffled = calls[:]
        rng.shuffle(shuffled)
        assert score(thought + render_tool_calls(shuffled), gt).scores == {"format": 1.0, "correctness": 1.0}
        assert exact_match(gold, gt)
        # the system prompt section carries every tool and the format instruction
        section = render_tools_system_prompt(question["function"])
        assert all(json.dumps(f["name"]) in section for f in question["function"])
        n_checked += 1
    assert n_checked == len(rows) >= 100
