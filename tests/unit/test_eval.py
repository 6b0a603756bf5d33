"""Tests of the evaluation CLI (recipe/mrtpo/tools/eval/harness.py) and its metrics (recipe/mrtpo/tools/eval/metrics.py).

CPU only. The metric functions are pinned on hand-made responses; the transformers path runs end to
end on the project's tiny random Qwen2 (real tokenizer, random weights) over a few rows of each
task, built here with data_prep's own builders; resuming is checked by counting the prompts that
reach the generator. A stub generator that answers with the gold answer for some items pins the
metrics through the whole pipeline (parquet -> prompts -> verifiers -> JSON). vLLM's path is checked
against a stand-in ``vllm`` module (no engine is started). Needs the offline assets of
``run_scripts/setup.sh`` (.assets/qwen, .assets/if, .assets/bfcl, .assets/chinook).
"""

from __future__ import annotations

import importlib.machinery
import json
import math
import sqlite3
import subprocess
import sys
import types
from pathlib import Path

import pytest

from data_prep.common import write_parquet
from data_prep.instruction_following import build as IFB
from data_prep.text_to_sql import build as SQLB
from data_prep.tool_calling import build as TOOLB
from recipe.mrtpo.tools.eval import generation as G
from recipe.mrtpo.tools.eval import harness as E
from recipe.mrtpo.tools.eval.metrics import TASK_FAMILY, aggregate, score_response

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / ".assets"
TASKS = sorted(t for t, f in TASK_FAMILY.items() if f != "multi_turn")  # multi-turn: test_eval_multi_turn.py


def _asset(rel: str) -> Path:
    path = ASSETS / rel
    assert path.exists(), f"missing offline asset {path}: run `bash run_scripts/setup.sh`"
    return path


# --------------------------------------------------------------------------------------------------
# metrics on hand-made responses
# --------------------------------------------------------------------------------------------------


def _if_gt(*pairs) -> dict:
    return {"instruction_id_list": [p[0] for p in pairs], "kwargs": [p[1] for p in pairs]}


NO_COMMA = ("punctuation:no_comma", {})
FEW_WORDS = ("length_constraints:number_words", {"num_words": 30, "relation": "less than"})
QUOTED = ("startend:quotation", {})


def _if_samples(cases) -> list[dict]:
    out = []
    for response, gt in cases:
        scores, info = score_response("if", response, gt)
        out.append({"scores": scores, "info": info})
    return out


def test_if_prompt_level_needs_every_instruction():
    samples = _if_samples([
        ("hello world", _if_gt(NO_COMMA)),                 # 1/1
        ("short answer", _if_gt(NO_COMMA, FEW_WORDS)),     # 2/2
        ("a, b", _if_gt(NO_COMMA, FEW_WORDS)),             # 1/2: the prompt fails
    ])
    m = aggregate("if", samples)
    assert m["n_responses"] == 3 and m["n_instructions"] == 5
    assert m["prompt_level_strict"] == pytest.approx(2 / 3) and round(m["prompt_level_strict"], 3) == 0.667
    assert m["inst_level_strict"] == pytest.approx(4 / 5)
    # no loose variant of "a, b" loses its comma (dropping its only line leaves nothing, which fails)
    assert m["prompt_level_loose"] == pytest.approx(2 / 3) and m["inst_level_loose"] == pytest.approx(4 / 5)
    assert m["by_instruction"]["punctuation:no_comma"] == {"n": 3, "strict": pytest.approx(2 / 3),
                                                           "loose": pytest.approx(2 / 3)}
    assert m["by_instruction"]["length_constraints:number_words"]["strict"] == 1.0


def test_if_loose_forgives_a_preamble_line_and_is_never_below_strict():
    preamble = 'Sure, here it is:\n"plain words only"'
    scores, _ = score_response("if", preamble, _if_gt(NO_COMMA, QUOTED))
    assert scores["strict"] == {"punctuation:no_comma": 0.0, "startend:quotation": 0.0}
    assert scores["loose"] == {"punctuation:no_comma": 1.0, "startend:quotation": 1.0}
    assert (scores["prompt_strict"], scores["prompt_loose"]) == (0.0, 1.0)
    samples = _if_samples([(preamble, _if_gt(NO_COMMA, QUOTED)), ("a, b", _if_gt(NO_COMMA)),
                           ('"x"', _if_gt(QUOTED, NO_COMMA)), ("**bold**, text", _if_gt(NO_COMMA))])
    m = aggregate("if", samples)
    assert (m["prompt_level_strict"], m["prompt_level_loose"]) == (pytest.approx(1 / 4), pytest.approx(2 / 4))
    assert (m["inst_level_strict"], m["inst_level_loose"]) == (pytest.approx(2 / 6), pytest.approx(4 / 6))
    for s in samples:
        for key, v in s["scores"]["strict"].items():
            assert s["scores"]["loose"][key] >= v


def test_if_repeated_instruction_ids_share_one_breakdown_entry():
    gt = _if_gt(NO_COMMA, NO_COMMA)
    scores, _ = score_response("if", "no commas here", gt)
    assert set(scores["strict"]) == {"punctuation:no_comma", "punctuation:no_comma#2"}
    m = aggregate("if", [{"scores": scores, "info": {}}])
    assert m["by_instruction"] == {"punctuation:no_comma": {"n": 2, "strict": 1.0, "loose": 1.0}}


@pytest.fixture(scope="module")
def shop_db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("shop") / "shop.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL);"
        "INSERT INTO item VALUES (1, 'pen', 1.5), (2, 'book', 12.0), (3, 'lamp', 30.0);"
    )
    conn.commit()
    conn.close()
    return str(path)


def test_sql_execution_accuracy_format_and_executable_rates(shop_db):
    gt = {"db_path": shop_db, "gold_sql": "SELECT name FROM item WHERE price > 10"}
    responses = [
        ("```sql\nSELECT name FROM item WHERE price > 10\n```", "hard"),        # match
        ("```sql\nSELECT name FROM item WHERE 10 < price\n```", "hard"),        # match, other SQL
        ("```sql\nSELECT name FROM item\n```", "easy"),                         # runs, wrong rows
        ("```sql\nSELECT nme FROM item\n```", "easy"),                          # parses, does not run
        ("The answer is book and lamp.", "easy"),                               # no SQL block
    ]
    samples = []
    for text, difficulty in responses:
        scores, info = score_response("sql", text, gt)
        assert set(scores) == {"format", "executable", "execution_match"}
        samples.append({"scores": scores, "info": info, "difficulty": difficulty})
    assert "exec_error" in samples[3]["info"] and samples[4]["info"]["format_error"] == "no SQL block"
    m = aggregate("sql", samples)
    assert m["execution_accuracy"] == pytest.approx(2 / 5)
    assert m["format_rate"] == pytest.approx(4 / 5)
    assert m["executable_rate"] == pytest.approx(3 / 5)
    assert m["by_difficulty"]["hard"]["execution_accuracy"] == 1.0
    assert m["by_difficulty"]["easy"] == {"n": 3, "execution_accuracy": 0.0, "format_rate": pytest.approx(2 / 3),
                                          "executable_rate": pytest.approx(1 / 3)}
    assert "by_category" not in m and m["n_gold_errors"] == 0


TOOLS = json.dumps([{"name": "add", "description": "add two numbers",
                     "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                    "required": ["a", "b"]}}])


def _call(args: str) -> str:
    return f'<tool_call>\n{{"name": "add", "arguments": {args}}}\n</tool_call>'


def test_bfcl_ast_accuracy_is_strict_and_format_is_separate():
    gt = {"calls": json.dumps([{"name": "add", "arguments": {"a": 2, "b": 3}}]), "tools": TOOLS}
    cases = [
        (_call('{"a": 2, "b": 3}'), "simple"),                           # exact, formatted
        (_call('{"b": 3, "a": 2}') + "\nDone.", "simple"),                # exact calls, text after: format 0
        (_call('{"a": "2", "b": 3}'), "multiple"),                       # "2" != 2 under BFCL's type check
        ("I would call add(2, 3).", "multiple"),                         # no call
    ]
    samples = []
    for text, category in cases:
        scores, info = score_response("tool", text, gt)
        samples.append({"scores": scores, "info": info, "category": category})
    got = [(s["scores"]["ast_match"], s["scores"]["ast_match_formatted"], s["scores"]["format"]) for s in samples]
    assert got == [(1.0, 1.0, 1.0), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0), (0.0, 0.0, 0.0)]
    assert samples[2]["scores"]["correctness"] == pytest.approx(2 / 3)  # "2" is not BFCL-valid: partial credit
    m = aggregate("tool", samples)
    assert m["ast_accuracy"] == 0.5 and m["ast_formatted_accuracy"] == 0.25 and m["format_rate"] == 0.5
    assert m["correctness_mean"] == pytest.approx(2 / 3)
    assert "bfcl_official_ast_accuracy" not in m  # rows without the official BFCL data
    assert m["by_category"]["simple"]["ast_accuracy"] == 1.0 and m["by_category"]["multiple"]["ast_accuracy"] == 0.0
    assert m["ast_accuracy_category_mean"] == 0.5


def test_bfcl_official_column_next_to_the_recipe():
    functions = [{"name": "add", "description": "", "parameters": {"type": "dict", "required": ["a", "b"],
                  "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}]
    answer = [{"add": {"a": [2], "b": [3]}}]
    gt = {"calls": json.dumps([{"name": "add", "arguments": {"a": 2, "b": 3}}]), "tools": TOOLS,
          "bfcl": json.dumps({"id": "simple_python_0", "category": "simple_python", "function": functions,
                              "ground_truth": answer})}
    samples = []
    for text in (_call('{"a": 2, "b": 3}'), _call('{"a": 2.0, "b": 3}'), "no call"):
        scores, info = score_response("tool", text, gt)
        samples.append({"scores": scores, "info": info, "category": "simple_python"})
    assert [s["scores"]["bfcl_official_ast"] for s in samples] == [1.0, 0.0, 0.0]
    assert [s["scores"]["ast_match"] for s in samples] == [1.0, 0.0, 0.0]
    m = aggregate("tool", samples)
    assert m["bfcl_official_ast_accuracy"] == pytest.approx(1 / 3) and m["n_official_differs"] == 0
    assert m["by_category"]["simple_python"]["bfcl_official_ast_accuracy"] == pytest.approx(1 / 3)
    assert m["bfcl_official_summary"]["summary_ast_non_live"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("family", ["if", "sql", "tool"])
def test_aggregate_of_nothing_is_none_not_nan(family):
    m = aggregate(family, [])
    assert m["n_responses"] == 0
    assert all(v is None for k, v in m.items() if not k.startswith("n_") and not isinstance(v, dict))


def test_unknown_family_and_malformed_ground_truth_raise():
    with pytest.raises(ValueError, match="unknown family"):
        score_response("math", "x", {})
    with pytest.raises(ValueError):
        score_response("sql", "```sql\nSELECT 1\n```", {"gold_sql": "SELECT 1"})


# --------------------------------------------------------------------------------------------------
# a few rows of every task, built with data_prep's builders
# --------------------------------------------------------------------------------------------------


def _fake_release(root: Path, source: str) -> list[dict]:
    """Spider/BIRD-shaped release on a small database -> rows (data_prep.text_to_sql's builder)."""
    db_dir = root / "database" / "shop"
    db_dir.mkdir(parents=True)
    conn = sqlite3.connect(db_dir / "shop.sqlite")
    conn.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL);"
        "INSERT INTO item VALUES (1, 'pen', 1.5), (2, 'book', 12.0), (3, 'lamp', 30.0);"
    )
    conn.commit()
    conn.close()
    gold = "query" if source == "spider" else "SQL"
    recs = [
        {"db_id": "shop", "question": "Which items cost more than 10?", gold: "SELECT name FROM item WHERE price > 10"},
        {"db_id": "shop", "question": "How many items are there?", gold: "SELECT count(*) FROM item"},
        {"db_id": "shop", "question": "Cheapest item?", gold: "SELECT name FROM item ORDER BY price LIMIT 1"},
        {"db_id": "shop", "question": "Most expensive item?", gold: "SELECT name FROM item ORDER BY price DESC LIMIT 1"},
    ]
    if source == "bird":
        for r, d in zip(recs, ["simple", "simple", "moderate", "challenging"]):
            r.update(evidence="", difficulty=d)
    qfile = root / "questions.json"
    qfile.write_text(json.dumps(recs, indent=2), encoding="utf-8")
    rows, _ = SQLB.build_release_rows(source, [qfile], root / "database", split="test")
    return rows


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """``{task: test.parquet}`` with 4-6 rows each."""
    root = tmp_path_factory.mktemp("eval_data")
    rows: dict[str, list[dict]] = {}
    for bench, rel in (("ifeval", "if/ifeval_input_data.jsonl"), ("ifbench", "if/IFBench_test.jsonl")):
        src = root / f"{bench}.jsonl"
        src.write_text("".join(_asset(rel).read_text(encoding="utf-8").splitlines(True)[:6]), encoding="utf-8")
        rows[bench], _ = IFB.build_eval_rows(bench, src)
    _asset("chinook/initial_data.json")
    rows["chinook"], _ = SQLB.build_chinook_rows(db_path=root / "chinook" / "chinook.sqlite", limit=6)
    _asset("bfcl")
    rows["bfcl"], _ = TOOLB.build_bfcl_rows(categories=("simple_python", "multiple", "parallel"), limit_per_category=2)
    for source in ("spider", "bird"):
        rows[source] = _fake_release(root / f"{source}_release", source)
    paths = {}
    for task, task_rows in rows.items():
        assert len(task_rows) >= 4, f"{task}: builder gave {len(task_rows)} rows"
        paths[task] = root / task / "test.parquet"
        write_parquet(task_rows, paths[task])
    return paths


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    _asset("qwen/qwen.tiktoken")
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model")


GEN_ARGS = ["--backend", "hf", "--max-new-tokens", "6", "--temperature", "1.0", "--seed", "0"]


def _args(task: str, model, data: Path, out: Path, *extra: str):
    return E.build_parser().parse_args(
        ["--task", task, "--model", str(model), "--data", str(data), "--out", str(out), *GEN_ARGS, *extra]
    )


class _Counting:
    """Wraps a generator; counts the prompts it is asked for."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, 0
        self.backend = getattr(inner, "backend", "stub")

    def generate(self, batch):
        self.prompts += len(batch)
        return self.inner.generate(batch)


@pytest.fixture(scope="module")
def hf_generator(tiny_model, data, tmp_path_factory):
    """One real transformers generator on the tiny model (built by make_generator), shared to save time."""
    args = _args("ifeval", tiny_model, data["ifeval"], tmp_path_factory.mktemp("o") / "x.json")
    gen = E.make_generator(args, "hf")
    assert isinstance(gen, E.HFGenerator)
    return gen


def _check_result(result: dict, task: str, n: int, out: Path) -> None:
    assert json.loads(out.read_text()) == result  # what is returned is what is written
    assert {"task", "model", "n", "metrics", "config", "items", "stats"} <= set(result)
    assert result["task"] == task and result["n"] == n == len(result["items"])
    assert result["config"]["backend"] == "hf" and result["config"]["max_new_tokens"] == 6
    ids = [it["id"] for it in result["items"]]
    assert len(set(ids)) == n
    for item in result["items"]:
        assert isinstance(item["response"], str) and isinstance(item["scores"], dict)
        assert 0 < item["n_tokens"] <= 6 and isinstance(item["finished"], bool)
    metrics = result["metrics"]
    assert metrics["n_responses"] == n
    family = TASK_FAMILY[task]
    headline = {"if": ["prompt_level_strict", "inst_level_strict", "prompt_level_loose", "inst_level_loose"],
                "sql": ["execution_accuracy", "format_rate", "executable_rate"],
                "tool": ["ast_accuracy", "format_rate", "correctness_mean"]}[family]
    for key in headline:
        assert isinstance(metrics[key], float) and math.isfinite(metrics[key]) and 0.0 <= metrics[key] <= 1.0, key
    if family == "if":
        assert metrics["prompt_level_loose"] >= metrics["prompt_level_strict"]
        assert metrics["inst_level_loose"] >= metrics["inst_level_strict"]
    if family == "tool":
        assert set(metrics["by_category"]) == {it["category"] for it in result["items"]}


@pytest.mark.parametrize("task", TASKS)
def test_transformers_path_end_to_end(task, data, hf_generator, tmp_path):
    counting = _Counting(hf_generator)
    out = tmp_path / f"{task}.json"
    result = E.run_eval(_args(task, "tiny", data[task], out, "--limit", "3"), generator_factory=lambda a, b: counting)
    _check_result(result, task, 3, out)
    assert counting.prompts == 3 and result["stats"] == {**result["stats"], "generated": 3, "reused": 0}
    lines = (out.parent / f"{task}.json.partial").read_text().splitlines()
    assert "header" in json.loads(lines[0])  # then one record per item, in generation order
    assert sorted(json.loads(x)["id"] for x in lines[1:]) == sorted(i["id"] for i in result["items"])


def test_cli_resumes_and_generates_only_new_items(data, tiny_model, tmp_path, monkeypatch, capsys):
    """--limit 3 then --limit 5 through main(): the second run generates 2 items and keeps the first 3."""
    prompts = []
    real = E.HFGenerator.generate

    def counted(self, batch):
        prompts.extend(batch)
        return real(self, batch)

    monkeypatch.setattr(E.HFGenerator, "generate", counted)
    out = tmp_path / "chinook.json"
    argv = ["--task", "chinook", "--model", str(tiny_model), "--data", str(data["chinook"]), "--out", str(out), *GEN_ARGS]
    assert E.main([*argv, "--limit", "3", "--batch-size", "2"]) == 0
    first = json.loads(out.read_text())
    assert len(prompts) == 3 and first["stats"]["generated"] == 3
    assert E.main([*argv, "--limit", "5", "--batch-size", "2"]) == 0
    second = json.loads(out.read_text())
    assert len(prompts) == 5 and (second["stats"]["generated"], second["stats"]["reused"]) == (2, 3)
    assert second["items"][:3] == first["items"]
    assert "chinook: 5 items (2 generated, 3 reused)" in capsys.readouterr().out
    _check_result(second, "chinook", 5, out)
    assert E.main([*argv, "--limit", "5"]) == 0  # everything cached: no model is even loaded
    assert len(prompts) == 5 and json.loads(out.read_text())["items"] == second["items"]


# --------------------------------------------------------------------------------------------------
# the whole pipeline with a stub generator: pinned metrics
# --------------------------------------------------------------------------------------------------


class _GoldStub:
    """Answers the gold answer for the prompts in ``gold`` (keyed by the last message) and junk otherwise."""

    backend = "stub"

    def __init__(self, gold: dict[str, str], junk: str = "I do not know."):
        self.gold, self.junk, self.prompts = gold, junk, 0

    def generate(self, batch):
        self.prompts += len(batch)
        return [[E.Generation(self.gold.get(m[-1]["content"], self.junk), 3, True)] for m in batch]


def _gold_answer(task: str, item: E.Item) -> str:
    if TASK_FAMILY[task] == "sql":
        return SQLB.gold_response(item.ground_truth["gold_sql"])
    from recipe.mrtpo.tasks.tool_calling import normalise_calls, render_tool_calls

    return render_tool_calls(normalise_calls(item.ground_truth["calls"]))


@pytest.mark.parametrize("task", ["chinook", "spider", "bird", "bfcl"])
def test_gold_answers_give_pinned_metrics(task, data, tmp_path):
    items = E.load_items(data[task], task)
    gold = {it.messages[-1]["content"]: _gold_answer(task, it) for it in items[::2]}  # every other item
    n_gold = len(items[::2])
    stub = _GoldStub(gold)
    out = tmp_path / "r.json"
    result = E.run_eval(_args(task, "stub-model", data[task], out), generator_factory=lambda a, b: stub)
    m = result["metrics"]
    assert stub.prompts == result["n"] == len(items)
    expected = n_gold / len(items)
    if task == "bfcl":
        assert (m["ast_accuracy"], m["ast_formatted_accuracy"], m["format_rate"]) == (pytest.approx(expected),) * 3
        cats = {}
        for i, it in enumerate(items):
            cats.setdefault(it.category, []).append(1.0 if i % 2 == 0 else 0.0)
        assert {c: g["ast_accuracy"] for c, g in m["by_category"].items()} == {
            c: pytest.approx(sum(v) / len(v)) for c, v in cats.items()}
    else:
        assert (m["execution_accuracy"], m["format_rate"], m["executable_rate"]) == (pytest.approx(expected),) * 3
        if task == "bird":
            assert set(m["by_difficulty"]) == {"simple", "moderate", "challenging"}
    for i, record in enumerate(result["items"]):
        key = "ast_match" if task == "bfcl" else "execution_match"
        assert record["scores"][key] == (1.0 if i % 2 == 0 else 0.0), record["id"]


def test_several_samples_per_prompt_are_all_scored(data, tmp_path):
    class TwoSamples:
        def generate(self, batch):
            return [[E.Generation("no commas here", 3, True), E.Generation("a, b", 4, True)] for _ in batch]

    out = tmp_path / "n2.json"
    args = _args("ifeval", "stub", data["ifeval"], out, "--limit", "2", "--n", "2")
    result = E.run_eval(args, generator_factory=lambda a, b: TwoSamples())
    assert result["metrics"]["n_responses"] == 4 and result["config"]["n_samples"] == 2
    for item in result["items"]:
        assert [s["response"] for s in item["samples"]] == ["no commas here", "a, b"]
        assert item["response"] == "no commas here" and item["scores"] == item["samples"][0]["scores"]
        assert item["samples"][1]["scores"]["strict"].get("punctuation:no_comma", 0.0) == 0.0


def test_generator_returning_the_wrong_count_is_an_error(data, tmp_path):
    class Short:
        def generate(self, batch):
            return [[E.Generation("x", 1, True)] for _ in batch[:-1]]

    with pytest.raises(RuntimeError, match="generator returned"):
        E.run_eval(_args("ifeval", "stub", data["ifeval"], tmp_path / "o.json", "--limit", "2"),
                   generator_factory=lambda a, b: Short())


# --------------------------------------------------------------------------------------------------
# the cache: torn lines, other settings, changed prompts, --overwrite, --rescore
# --------------------------------------------------------------------------------------------------


def _run_stub(task, data_path, out, *extra, stub=None):
    stub = stub or _GoldStub({})
    result = E.run_eval(_args(task, "stub-model", data_path, out, *extra), generator_factory=lambda a, b: stub)
    return result, stub


def test_cache_survives_a_torn_line(data, tmp_path, capsys):
    out = tmp_path / "r.json"
    _run_stub("bfcl", data["bfcl"], out, "--limit", "3")
    partial = out.with_name("r.json.partial")
    text = partial.read_text()
    partial.write_text(text[: text.rstrip("\n").rfind("\n") + 1] + '{"id": "torn', encoding="utf-8")  # last record cut
    result, stub = _run_stub("bfcl", data["bfcl"], out, "--limit", "3")
    assert stub.prompts == 1 and result["stats"]["reused"] == 2
    assert "unreadable line ignored" in capsys.readouterr().err
    result, stub = _run_stub("bfcl", data["bfcl"], out, "--limit", "3")  # the torn line did not break the file
    assert stub.prompts == 0 and result["n"] == 3


def test_cache_from_other_settings_is_refused_and_overwrite_regenerates(data, tmp_path):
    out = tmp_path / "r.json"
    _run_stub("bfcl", data["bfcl"], out, "--limit", "2")
    with pytest.raises(E.EvalError, match="max_new_tokens"):
        _run_stub("bfcl", data["bfcl"], out, "--limit", "2", "--max-new-tokens", "7")
    result, stub = _run_stub("bfcl", data["bfcl"], out, "--limit", "2", "--max-new-tokens", "7", "--overwrite")
    assert stub.prompts == 2 and result["stats"]["generated"] == 2 and result["config"]["max_new_tokens"] == 7


def test_changed_prompt_is_regenerated_and_rescore_reruns_the_verifiers(data, tmp_path):
    import pandas as pd

    out = tmp_path / "r.json"
    first, _ = _run_stub("chinook", data["chinook"], out, "--limit", "3")
    frame = pd.read_parquet(data["chinook"])
    prompt = list(frame.at[1, "prompt"])
    prompt[-1] = {**prompt[-1], "content": prompt[-1]["content"] + "\nPlease be brief."}
    frame.at[1, "prompt"] = prompt
    changed = tmp_path / "changed.parquet"
    frame.to_parquet(changed)
    result, stub = _run_stub("chinook", changed, out, "--limit", "3")
    assert stub.prompts == 1 and result["stats"] == {**result["stats"], "stale": 1, "reused": 2}
    assert result["items"][1]["prompt_sha"] != first["items"][1]["prompt_sha"]
    # --rescore: cached responses scored again (a tampered cached score is corrected), nothing generated
    partial = out.with_name("r.json.partial")
    lines = [json.loads(x) for x in partial.read_text().splitlines()]
    lines[-1]["scores"]["execution_match"] = 7.0
    partial.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result, stub = _run_stub("chinook", changed, out, "--limit", "3", "--rescore")
    assert stub.prompts == 0 and all(it["scores"]["execution_match"] in (0.0, 1.0) for it in result["items"])


# --------------------------------------------------------------------------------------------------
# scoring options: --strip-reasoning, --sql-mode, --sql-timeout-s
# --------------------------------------------------------------------------------------------------


def test_strip_reasoning_is_off_by_default_and_passed_to_the_if_verifier():
    gt = _if_gt(NO_COMMA)
    response = "<think>First, a comma.</think>\nno commas here"
    as_generated, _ = score_response("if", response, gt)
    stripped, _ = score_response("if", response, gt, strip_reasoning=True)
    assert (as_generated["prompt_strict"], stripped["prompt_strict"]) == (0.0, 1.0)
    unterminated, info = score_response("if", "<think>no commas ever", gt, strip_reasoning=True)
    assert unterminated["prompt_strict"] == unterminated["prompt_loose"] == 0.0 and info["errors"]


def test_sql_mode_is_passed_to_the_sql_verifier(shop_db):
    gt = {"db_path": shop_db, "gold_sql": "SELECT DISTINCT x FROM (SELECT 1 AS x UNION ALL SELECT 1)"}
    response = "```sql\nSELECT 1\n```"
    default, _ = score_response("sql", response, gt)
    kept, _ = score_response("sql", response, gt, sql_mode="keep_distinct")
    removed, info = score_response("sql", response, gt, sql_mode="spider_default")
    assert default == kept and kept["execution_match"] == 1.0
    assert removed["execution_match"] == 0.0 and "row count" in info["match_detail"]
    row_says, _ = score_response("sql", response, gt, {"sql_mode": "spider_default"})
    assert row_says["execution_match"] == 0.0  # the row's extra_info setting, unless overridden
    overridden, _ = score_response("sql", response, gt, {"sql_mode": "spider_default"}, sql_mode="keep_distinct")
    assert overridden["execution_match"] == 1.0


def test_cached_records_are_rescored_when_the_scoring_options_change(data, tmp_path):
    out = tmp_path / "r.json"
    items = E.load_items(data["chinook"], "chinook", 3)
    stub = _GoldStub({it.messages[-1]["content"]: _gold_answer("chinook", it) for it in items})
    first, _ = _run_stub("chinook", data["chinook"], out, "--limit", "3", stub=stub)
    assert first["config"]["scoring"] == {"strip_reasoning": False, "sql_mode": None, "sql_timeout_s": None}
    assert first["stats"]["rescored"] == 0 and all(it["scoring"] == first["config"]["scoring"] for it in first["items"])
    second, stub2 = _run_stub("chinook", data["chinook"], out, "--limit", "3", "--sql-mode", "spider_default")
    assert stub2.prompts == 0 and second["stats"]["rescored"] == 3 and second["stats"]["reused"] == 3
    assert all(it["scoring"]["sql_mode"] == "spider_default" for it in second["items"])
    assert second["metrics"]["execution_accuracy"] == 1.0  # the gold answer matches itself in both modes
    third, stub3 = _run_stub("chinook", data["chinook"], out, "--limit", "3", "--sql-mode", "spider_default")
    assert stub3.prompts == 0 and third["stats"]["rescored"] == 0  # the re-scored records were cached


# --------------------------------------------------------------------------------------------------
# inputs, CLI errors, backends
# --------------------------------------------------------------------------------------------------


def test_item_ids_are_stable_and_unique(data):
    items = E.load_items(data["bfcl"], "bfcl")
    assert [it.id for it in items] == [it.id for it in E.load_items(data["bfcl"], "bfcl")]
    assert len({it.id for it in items}) == len(items) and all(it.category for it in items)
    assert [it.id for it in E.load_items(data["bfcl"], "bfcl", limit=2)] == [it.id for it in items[:2]]


def test_wrong_data_for_the_task_and_missing_data_are_clear_errors(data, tmp_path, capsys):
    base = ["--model", "stub", "--out", str(tmp_path / "o.json"), "--backend", "hf"]
    assert E.main(["--task", "bfcl", "--data", str(data["chinook"]), *base]) == 2
    assert "data_source 'chinook' cannot be scored as task 'bfcl'" in capsys.readouterr().err
    assert E.main(["--task", "spider", "--data", str(tmp_path / "nope.parquet"), *base]) == 2
    err = capsys.readouterr().err
    assert "data file not found" in err and "data_prep.text_to_sql spider --input" in err
    assert not (tmp_path / "o.json").exists()


def test_missing_or_unloadable_model_is_one_line_and_leaves_no_partial(data, tmp_path, capsys):
    """``--model /nonexistent`` and a folder that is no model: one line on stderr, exit 2, no OUT, no OUT.partial."""
    out = tmp_path / "o.json"
    base = ["--task", "ifeval", "--data", str(data["ifeval"]), "--out", str(out), "--backend", "hf", "--limit", "2"]
    not_a_model = tmp_path / "ckpt"
    not_a_model.mkdir()
    (not_a_model / "model_world_size_1_rank_0.pt").write_bytes(b"x")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # no tokenizer, no weights
    for model, message in ((tmp_path / "nonexistent", "no such folder"),
                           (not_a_model, "no config.json, not a Hugging Face model folder"),
                           (broken, "cannot load --model")):
        assert E.main([*base, "--model", str(model)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not out.exists() and not out.with_name("o.json.partial").exists()


def test_limited_result_records_its_subset(data, hf_generator, tmp_path):
    out = tmp_path / "r.json"
    n_rows = len(E.load_items(data["ifeval"], "ifeval"))
    result = E.run_eval(_args("ifeval", "tiny", data["ifeval"], out, "--limit", "2"),
                        generator_factory=lambda a, b: hf_generator)
    assert result["subset"]["items"] == 2 and result["subset"]["of"] == n_rows > 2
    whole = E.run_eval(_args("ifeval", "tiny", data["ifeval"], out, "--limit", str(n_rows + 5)),
                       generator_factory=lambda a, b: hf_generator)
    assert "subset" not in whole  # a limit over the file's length scores all of it


def test_moved_sql_database_is_reported_before_generation(data, tmp_path):
    import pandas as pd

    frame = pd.read_parquet(data["spider"])
    frame.at[0, "reward_model"] = {**frame.at[0, "reward_model"],
                                   "ground_truth": {"db_path": str(tmp_path / "gone.sqlite"), "gold_sql": "SELECT 1"}}
    moved = tmp_path / "moved.parquet"
    frame.to_parquet(moved)
    with pytest.raises(E.EvalError, match="database file not found"):
        E.load_items(moved, "spider")


@pytest.mark.parametrize("extra, message", [
    (["--n", "2"], "--n > 1 needs --temperature > 0"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-p", "0"], "--top-p must be in"),
    (["--chat-template-kwargs", "[1]"], "must be a JSON object"),
    (["--limit", "-1"], "must be >= 0"),
    (["--sql-mode", "distinct"], "invalid choice"),
    (["--sql-timeout-s", "120"], "--sql-timeout-s must be in (0, 60]"),
])
def test_bad_arguments_are_usage_errors(extra, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        E.main(["--task", "ifeval", "--model", "m", "--out", str(tmp_path / "o.json"), *extra])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_module_runs_as_a_script():
    out = subprocess.run([sys.executable, "-m", "recipe.mrtpo.tools.eval.harness", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--task" in out.stdout and "bfcl" in out.stdout


def test_backend_choice(monkeypatch):
    import torch

    found = {"vllm": object()}
    monkeypatch.setattr(G.importlib.util, "find_spec", lambda name: found.get(name))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert E.choose_backend("auto") == "hf" and E.choose_backend("vllm") == "vllm"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert E.choose_backend("auto") == "vllm"
    found.clear()
    assert E.choose_backend("auto") == "hf" and E.choose_backend("hf") == "hf"
    with pytest.raises(E.EvalError, match="vllm is not installed"):
        E.choose_backend("vllm")


def _fake_vllm(calls: dict) -> types.ModuleType:
    """A stand-in ``vllm`` module recording how it is called (no engine)."""
    mod = types.ModuleType("vllm")
    mod.__spec__ = importlib.machinery.ModuleSpec("vllm", None)

    class SamplingParams:
        def __init__(self, **kwargs):
            calls["sampling"] = kwargs
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs

        def generate(self, prompts, params, use_tqdm=True):
            calls["prompts"] = prompts
            n = params.kwargs["n"]
            out = types.SimpleNamespace
            return [out(outputs=[out(text=f"r{i}.{j}", token_ids=[1] * (j + 2), finish_reason=("stop", "length")[j % 2])
                                 for j in range(n)]) for i in range(len(prompts))]

    mod.SamplingParams, mod.LLM = SamplingParams, LLM
    return mod


@pytest.mark.parametrize("temperature, n", [(0.0, 1), (0.8, 2)])
def test_vllm_generator_feeds_rendered_token_ids_and_reads_outputs(temperature, n, tiny_model, monkeypatch):
    calls: dict = {}
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(calls))
    sampling = E.SamplingConfig(max_new_tokens=9, temperature=temperature, top_p=0.9, n=n, seed=5)
    gen = E.VLLMGenerator(str(tiny_model), sampling, dtype="bfloat16", tensor_parallel_size=2,
                          gpu_memory_utilization=0.5, max_model_len=4096)
    assert calls["llm"] == {"model": str(tiny_model), "tokenizer": str(tiny_model), "dtype": "bfloat16", "seed": 5,
                            "tensor_parallel_size": 2, "gpu_memory_utilization": 0.5, "max_model_len": 4096}
    if temperature == 0:
        assert calls["sampling"] == {"n": 1, "temperature": 0.0, "max_tokens": 9}
    else:
        assert calls["sampling"] == {"n": 2, "temperature": 0.8, "max_tokens": 9, "top_p": 0.9, "seed": 5}
    convs = [[{"role": "user", "content": "Hello, world!"}], [{"role": "system", "content": "S"},
                                                              {"role": "user", "content": "Hi"}]]
    result = gen.generate(convs)
    expected = [gen.tok(gen.tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)["input_ids"] for c in convs]
    assert calls["prompts"] == [{"prompt_token_ids": ids} for ids in expected]
    assert expected[0][-3:] == [151644, 77091, 198]  # "<|im_start|>assistant\n": the generation prompt
    assert [[(g.text, g.n_tokens, g.finished) for g in gens] for gens in result] == [
        [(f"r{i}.{j}", j + 2, j % 2 == 0) for j in range(n)] for i in range(2)]


def test_sql_agreement_cases_cover_the_semantics_and_run(shop_db):
    from recipe.mrtpo.tools.eval.agreement import sql_cases

    gold = "SELECT DISTINCT name, avg(price), count(DISTINCT id) FROM item GROUP BY name HAVING price >= 1 " \
           "ORDER BY name DESC LIMIT 2"
    cases = dict(sql_cases(gold))
    assert {"gold", "distinct_removed", "columns_reversed", "values_as_float", "values_rounded", "empty_filter",
            "count_distinct_toggled", "avg_as_sum_over_count", "order_removed", "order_reversed", "limit_plus_one",
            "rows_doubled", "spaced_operators", "second_statement"} <= set(cases)
    assert cases["distinct_removed"].startswith("SELECT name")
    assert "count(id)" in cases["count_distinct_toggled"].lower() and "LIMIT 3" in cases["limit_plus_one"]
    assert "> =" in cases["spaced_operators"] and cases["second_statement"].endswith("; SELECT 1")
    conn = sqlite3.connect(shop_db)
    for kind, sql in cases.items():
        if kind not in ("spaced_operators", "second_statement"):  # SQLite refuses those as written
            conn.execute(sql).fetchall()
    conn.close()
