"""``benchmarks/bench_multi_turn_lengths.py`` on the first two shipped questions of each BFCL multi-turn category.

Its counts are checked against a direct computation restated here: the prompt is ``apply_chat_template`` of the
row's first turn with ``tools=``; the response is the chat template's render of the whole gold conversation (the
gold calls as ``<tool_call>`` blocks, BFCL's own execution results of them, cut as verl cuts, the injected turns)
minus the prompt; a tool result longer than the limit is counted as cut. No network, no Ray.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by run_scripts/setup.sh")

from benchmarks import bench_multi_turn_lengths as bench  # noqa: E402


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return bench.qwen_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def rows():
    return bench.rows_of(first=2)


#: the loop's max_calls_per_step (bfcl_agent_loop.yaml)
STEP_CALLS = 64


def _ids(x):
    return x["input_ids"] if hasattr(x, "keys") else x


def bfcl_results(row: dict) -> list[list[str]]:
    """BFCL's own execution of the gold answer, turn by turn (its globals-keyed instances, a fresh key)."""
    import uuid

    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    ex = row["extra_info"]
    config, classes = json.loads(ex["initial_config"]), ex["involved_classes"]
    model = f"mrtpo_test_{uuid.uuid4().hex}"
    return [execute_multi_turn_func_call(calls, config, classes, model, ex["id"],
                                         long_context="long_context" in ex["id"])[0] for calls in row["gold"]]


def cut(text: str, limit: int) -> str:
    """verl's middle cut of a tool response (ToolAgentLoop._call_tool)."""
    if len(text) <= limit:
        return text
    return text[: limit // 2] + "...(truncated)..." + text[-(limit // 2):]


def direct_response_tokens(tok, row: dict, results: list[list[str]], limit: int, answer: str = "Done.") -> int:
    """The gold conversation rendered whole by the chat template, minus the prompt, minus the newline the template
    writes after the last ``<|im_end|>`` (the model's generation ends at ``<|im_end|>``)."""
    from recipe.mrtpo.agent.bfcl_env import injected_turn, parse_entry

    entry = parse_entry(row["extra_info"])
    tools = json.loads(row["extra_info"]["tools"])
    script = iter(bench.gold_script(row, answer))
    messages = [dict(m) for m in row["prompt"]]
    for t, calls in enumerate(row["gold"]):
        if t:
            messages += injected_turn(entry, t)
        done = 0
        while done < len(calls):  # call steps of at most the loop's max_calls_per_step calls, then the answer
            messages.append({"role": "assistant", "content": next(script)})
            messages += [{"role": "tool", "content": cut(r, limit)} for r in results[t][done:done + STEP_CALLS]]
            done += STEP_CALLS
        messages.append({"role": "assistant", "content": next(script)})
    prompt = _ids(tok.apply_chat_template(row["prompt"], tools=tools, add_generation_prompt=True, tokenize=True))
    full = _ids(tok.apply_chat_template(messages, tools=tools, tokenize=True))
    assert full[: len(prompt)] == prompt and tok.decode(full[-2:]) == "<|im_end|>\n"
    return len(full) - len(prompt) - 1


def test_tools_block_is_the_loop_tests_template():
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).parent / "test_bfcl_loop.py").read_text(encoding="utf-8"))
    (value,) = [ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["TOOLS_BLOCK"]]
    assert bench.TOOLS_BLOCK == value


def test_rows_are_the_builders_rows(rows):
    from data_prep.multi_turn import multi_turn_row
    from recipe.mrtpo.tasks.multi_turn.official import load_category

    assert [r["extra_info"]["id"] for r in rows] == [f"multi_turn_{c}_{i}" for c in bench.CATEGORIES for i in (0, 1)]
    for r in rows:
        c = r["extra_info"]["category"]
        entry, gold = load_category(c)[int(r["extra_info"]["id"].rsplit("_", 1)[1])]
        built = multi_turn_row(entry, gold, c)
        assert r["prompt"] == built["prompt"] and r["gold"] == gold
        assert {k: v for k, v in r["extra_info"].items() if k != "split"} == \
            {k: v for k, v in built["extra_info"].items() if k != "split"}
        assert r["extra_info"]["split"] in ("train", "test")


def test_counts_match_a_direct_render_of_the_gold_conversation(tok, rows):
    for i, row in enumerate(rows):
        got = bench.measure(tok, row, 16384, verify=(i % 2 == 0))
        tools = json.loads(row["extra_info"]["tools"])
        direct_prompt = len(_ids(tok.apply_chat_template(row["prompt"], tools=tools, add_generation_prompt=True,
                                                         tokenize=True)))
        assert got.prompt == direct_prompt == bench.prompt_token_count(tok, row), row["extra_info"]["id"]
        results = bfcl_results(row)
        assert got.response == direct_response_tokens(tok, row, results, 16384), row["extra_info"]["id"]
        assert got.response == sum(got.by_kind.values())
        assert got.tool_results == sum(len(r) for r in results)
        assert got.max_tool_chars == max((len(x) for r in results for x in r), default=0)
        assert got.tool_cut == sum(len(x) > 16384 for r in results for x in r) == 0
        assert got.end == "completed" and got.reasons == {}
        assert got.gold_ok in ((True,) if i % 2 == 0 else (None,))


def test_a_result_longer_than_the_limit_is_counted_as_cut(tok, rows):
    row = next(r for r in rows if r["extra_info"]["id"] == "multi_turn_long_context_0")
    results = bfcl_results(row)
    lengths = [len(x) for r in results for x in r]
    limit = 1000
    assert any(n > limit for n in lengths) and any(n <= limit for n in lengths)
    got = bench.measure(tok, row, limit, verify=False)
    whole = bench.measure(tok, row, 16384, verify=False)
    assert got.tool_cut == sum(n > limit for n in lengths) > 0
    assert got.max_tool_chars == max(lengths)  # measured before the cut
    assert got.response == direct_response_tokens(tok, row, results, limit) < whole.response
    assert got.by_kind["model"] == whole.by_kind["model"] and got.by_kind["user"] == whole.by_kind["user"]


def test_a_trajectory_over_the_response_limit_is_played_again_at_the_limit(tok, rows):
    row = next(r for r in rows if r["extra_info"]["id"] == "multi_turn_long_context_0")
    whole = bench.measure(tok, row, 16384, max_response=100_000)
    assert whole.end_at_limit is None and whole.ok_at_limit is None and whole.gold_ok is True
    got = bench.measure(tok, row, 16384, max_response=1000)
    assert got.response == whole.response > 1000  # measured whole
    # the loop stops where the next context would not fit: turns are left unplayed, BFCL's force_terminated
    assert got.end_at_limit == "response_length" and got.ok_at_limit is False and got.gold_ok is True
    s = bench.summarise([got, whole], max_prompt=8192, max_response=1000)
    assert (s["over_response"], s["gold_ok"], s["ok_within"]) == (2, 2, 1)


def test_a_turn_of_more_calls_than_a_step_allows_takes_more_steps():
    assert bench.default_max_calls() == STEP_CALLS
    calls = [f"ls(a={i})" for i in range(70)]
    assert bench.call_steps(calls, 32) == [calls[:32], calls[32:64], calls[64:]]
    assert bench.call_steps([], 32) == []


def test_percentiles_and_the_summary():
    assert [bench.percentile(list(range(1, 11)), q) for q in (50, 90, 99, 100)] == [5, 9, 10, 10]
    assert bench.percentile([], 50) == 0
    items = [bench.Lengths(id=f"x_{i}", category="base", split="train", prompt=p, response=r, tool_results=3,
                           tool_cut=c, max_tool_chars=m, end="completed", gold_ok=True)
             for i, (p, r, c, m) in enumerate([(100, 50, 0, 10), (9000, 20, 0, 20), (200, 8193, 2, 30000)])]
    s = bench.summarise(items, max_prompt=8192, max_response=8192)
    assert s["n"] == 3 and s["prompt"] == [200, 9000, 9000, 9000] and s["response"] == [50, 8193, 8193, 8193]
    assert (s["over_prompt"], s["over_response"], s["tool_cut"], s["tool_results"], s["questions_cut"]) == (1, 1, 2, 9, 1)
    assert s["max_tool_chars"] == 30000 and s["gold_ok"] == s["ok_within"] == 3
    lines = bench.table_lines([("base", s)])
    assert lines[0].startswith("group") and lines[2].split("|")[1].strip() == "3"


def test_a_gold_turn_of_34_calls_is_played_in_one_step(tok):
    row = bench.rows_of(["long_context"], every=38, first=2)[1]
    assert row["extra_info"]["id"] == "multi_turn_long_context_38" and len(row["gold"][0]) == 34
    assert bench.call_steps(row["gold"][0], bench.default_max_calls()) == [row["gold"][0]]  # one generation writes them
    got = bench.measure(tok, row, 16384)
    assert got.end == "completed" and got.reasons == {} and got.gold_ok is True
    assert got.tool_results == sum(len(c) for c in row["gold"]) == 35
    assert got.response == direct_response_tokens(tok, row, bfcl_results(row), 16384)
