"""Builders of the public training sets on project-written fixtures in each source's schema.

Every fixture is read by the same loader as a hub name (local files only; the hub is never contacted:
HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set before ``datasets`` is imported); local JSON goes through
the project's line-numbered reader, parquet through ``datasets``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import zipfile
from pathlib import Path

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

from data_prep.common import read_parquet_rows, sha256_file  # noqa: E402
from data_prep.instruction_following import build as IFB  # noqa: E402
from data_prep.text_to_sql import build as SQLB  # noqa: E402
from data_prep.tool_calling import build as TOOLB  # noqa: E402
from recipe.mrtpo.tasks import get_task  # noqa: E402
from recipe.mrtpo.tasks import toolrl as TR  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "data" / "public_sources"


def _run(main, argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _skips(card: str) -> dict[str, int]:
    """``{reason: count}`` of a printed data card's skipped-records section."""
    lines = card.split("skipped input records:", 1)[1].splitlines()[1:]
    out = {}
    for line in lines:
        if not line.startswith("  ") or not line.strip():
            break
        count, reason = line.strip().split("  ", 1)
        out[reason.strip()] = int(count)
    return out


def _rows(out_dir: Path) -> list[dict]:
    rows = []
    for f in sorted(out_dir.glob("*.parquet")):
        rows += read_parquet_rows(f)
    return rows


def _args(tmp_path, *argv):
    return [*argv, "--cache-dir", str(tmp_path / "hf_cache")]


# --------------------------------------------------------------------------------------------------
# instruction following
# --------------------------------------------------------------------------------------------------

GOLD = json.loads((FIX / "if_gold_responses.json").read_text())


@pytest.mark.parametrize("source, fixture, n_rows, skipped", [
    ("rlvr_ifeval", "rlvr_ifeval.jsonl", 7, {
        "no equivalent checker (validate_word_constraint, quantifier 'around')": 1,
        "no equivalent checker (verify_letter_frequency)": 1,
        "unknown constraint function (verify_magic_words)": 1,
        "bad ground_truth": 1,
        "missing field 'messages' (or no user turn)": 1,
    }),
    ("if_multi_constraints", "if_multi_constraints.jsonl", 3, {
        "unknown instruction id (last_word:last_word_answer)": 1,
        "instruction id not checkable offline (words:start_verb)": 1,
        "arguments the checker does not take (length_constraints:number_words)": 1,
        "bad ground_truth": 1,
        "duplicate key": 1,
    }),
])
def test_if_sources_convert_fixture_and_gold_scores_full(tmp_path, capsys, source, fixture, n_rows, skipped):
    out = tmp_path / "out"
    rc, card, err = _run(IFB.main, _args(tmp_path, source, "--input", str(FIX / fixture), "--out-dir", str(out)),
                         capsys)
    assert rc == 0, err
    assert _skips(card) == skipped
    rows = _rows(out)
    assert len(rows) == n_rows and all(r["data_source"] == "instruction_following" for r in rows)
    score = get_task("instruction_following")
    for r in rows:
        result = score(GOLD[r["extra_info"]["id"]], r["reward_model"]["ground_truth"], r["extra_info"])
        assert result.scores and all(v == 1.0 for v in result.scores.values()), (r["extra_info"]["id"], result)
        assert not result.info["errors"]
        wrong = score("", r["reward_model"]["ground_truth"], r["extra_info"])
        assert all(v == 0.0 for v in wrong.scores.values())


def test_rlvr_conversion_details(tmp_path, capsys):
    out = tmp_path / "out"
    assert IFB.main(_args(tmp_path, "rlvr_ifeval", "--input", str(FIX / "rlvr_ifeval.jsonl"), "--out-dir",
                          str(out))) == 0
    capsys.readouterr()
    by_id = {r["extra_info"]["id"]: r for r in _rows(out)}
    gt = by_id["rlvr_ifeval-3"]["reward_model"]["ground_truth"]
    assert list(gt["instruction_id_list"]) == ["length_constraints:number_words"]
    assert json.loads(gt["kwargs"][0]) == {"num_words": 51, "relation": "less than"}  # "at most 50"
    row = by_id["rlvr_ifeval-2"]
    assert list(row["extra_info"]["constraint_texts"]) == ["Include keywords ocean, salt in the response."]
    assert row["extra_info"]["constraint_texts"][0] in row["prompt"][-1]["content"]
    # 51 words fail "at most 50"
    fail = get_task("instruction_following")(" ".join(["word"] * 51), gt, None)
    assert fail.scores["length_constraints:number_words"] == 0.0


def test_if_builder_is_byte_identical_and_reads_parquet_like_json(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert IFB.main(_args(tmp_path, "if_multi_constraints", "--input", str(FIX / "if_multi_constraints.jsonl"),
                              "--out-dir", str(d))) == 0
    assert sha256_file(a / "train.parquet") == sha256_file(b / "train.parquet")
    # the same records as a parquet snapshot folder (a hub download's layout) give the same rows
    import datasets

    snap = tmp_path / "snap" / "data"
    snap.mkdir(parents=True)
    recs = [json.loads(line) for line in (FIX / "if_multi_constraints.jsonl").read_text().splitlines()]
    datasets.Dataset.from_list(recs).to_parquet(str(snap / "train-00000-of-00001.parquet"))
    c = tmp_path / "c"
    assert IFB.main(_args(tmp_path, "if_multi_constraints", "--input", str(snap.parent), "--out-dir", str(c))) == 0
    capsys.readouterr()
    key = lambda rows: [(r["extra_info"]["id"], list(r["reward_model"]["ground_truth"]["kwargs"])) for r in rows]  # noqa: E731
    assert key(_rows(c)) == key(_rows(a)) and len(_rows(a)) == 3


def test_missing_local_input_and_offline_hub_are_clear_errors(tmp_path, capsys):
    rc, _, err = _run(IFB.main, _args(tmp_path, "rlvr_ifeval", "--input", str(tmp_path / "nope.jsonl"),
                                      "--out-dir", str(tmp_path / "o")), capsys)
    assert rc == 1 and "cannot read local input" in err
    rc, _, err = _run(IFB.main, _args(tmp_path, "rlvr_ifeval", "--out-dir", str(tmp_path / "o")), capsys)
    assert rc == 1 and "allenai/RLVR-IFeval" in err and "online" in err


@pytest.mark.parametrize("main, source, fixture", [
    (IFB.main, "rlvr_ifeval", "rlvr_ifeval.jsonl"),
    (IFB.main, "if_multi_constraints", "if_multi_constraints.jsonl"),
    (TOOLB.main, "xlam", None),
])
def test_malformed_local_records_are_skipped_with_file_line_and_count(tmp_path, capsys, main, source, fixture):
    """One broken line of a local .jsonl (which ``datasets`` would refuse whole) costs only that record."""
    if fixture is None:  # xlam's fixture is a JSON array: as JSON Lines here
        good = [json.dumps(r) for r in json.loads((FIX / "xlam_function_calling.json").read_text())]
    else:
        good = (FIX / fixture).read_text().splitlines()
    clean, broken = tmp_path / "clean.jsonl", tmp_path / "broken.jsonl"
    clean.write_text("\n".join(good) + "\n", encoding="utf-8")
    lines = [good[0], '{"messages": [oops', good[1], "", "42", *good[2:]]
    broken.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rc, card_clean, _ = _run(main, _args(tmp_path, source, "--input", str(clean), "--out-dir", str(tmp_path / "a")),
                             capsys)
    assert rc == 0
    rc, card, err = _run(main, _args(tmp_path, source, "--input", str(broken), "--out-dir", str(tmp_path / "b")),
                         capsys)
    assert rc == 0, err
    assert f"SKIP {broken}:2: broken JSON" in err and f"SKIP {broken}:5: not an object: int" in err
    skips, skips_clean = _skips(card), _skips(card_clean)
    assert skips.pop("broken JSON") == 1 and skips.pop("not an object") == 1
    assert skips == skips_clean
    read = lambda c: int(c.split("input records: ", 1)[1].split()[0])  # noqa: E731
    assert read(card) == read(card_clean) + 2
    ids = lambda d: [r["extra_info"]["id"] for r in _rows(d)]  # noqa: E731
    assert len(ids(tmp_path / "b")) == len(ids(tmp_path / "a")) > 0


# --------------------------------------------------------------------------------------------------
# tool calling
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, n_rows, skipped, data_source", [
    (["toolrl", "--input", "toolrl_rlla_rl.json", "--reward", "toolrl"], 4, {
        "malformed call in the reference output": 1, "missing field 'input'": 1}, "toolrl"),
    (["toolrl", "--input", "toolrl_rlla_rl.json"], 3, {
        "multi-turn history (kept with --reward toolrl)": 1, "malformed call in the reference output": 1,
        "missing field 'input'": 1}, "tool_calling"),
    (["toolace", "--input", "toolace_data.json"], 3, {
        "malformed call": 2, "no tool list in 'system'": 1}, "tool_calling"),
    (["xlam", "--input", "xlam_function_calling.json"], 3, {
        "broken JSON in 'tools' or 'answers'": 1, "missing field 'query'": 1, "duplicate id": 1}, "tool_calling"),
])
def test_tool_sources_convert_fixture_and_gold_scores_full(tmp_path, capsys, argv, n_rows, skipped, data_source):
    argv = list(argv)
    argv[2] = str(FIX / argv[2])
    out = tmp_path / "out"
    rc, card, err = _run(TOOLB.main, _args(tmp_path, *argv, "--out-dir", str(out), "--test-fraction", "0.3"), capsys)
    assert rc == 0, err
    assert {k.split(": ")[0] if k.startswith("duplicate") else k: v for k, v in _skips(card).items()} == skipped
    rows = _rows(out)
    assert len(rows) == n_rows and {r["data_source"] for r in rows} == {data_source}
    score = get_task(data_source)
    for r in rows:
        gt = r["reward_model"]["ground_truth"]
        if data_source == "toolrl":
            gold = gt["answer"]
            full = {"format": 1.0, "correctness": TR.CORRECT_MAX if json.loads(gt["calls"]) else 0.0}
        else:
            gold = TOOLB.gold_answer(json.loads(gt["calls"]))
            full = {"format": 1.0, "correctness": 1.0}
        assert score(gold, gt, r["extra_info"]).scores == full, r["extra_info"]["id"]


def test_toolace_python_calls_and_no_call_rows(tmp_path, capsys):
    out = tmp_path / "out"
    assert TOOLB.main(_args(tmp_path, "toolace", "--input", str(FIX / "toolace_data.json"), "--out-dir",
                            str(out))) == 0
    capsys.readouterr()
    by_id = {r["extra_info"]["id"]: r for r in _rows(out)}
    calls = [{k: c[k] for k in ("name", "arguments")}
             for c in json.loads(by_id["toolace-1"]["reward_model"]["ground_truth"]["calls"])]
    assert calls == [{"name": "Get Weather Forecast", "arguments": {"city": "Paris", "days": 3}},
                     {"name": "stock.quote", "arguments": {"symbol": "AAPL"}}]
    assert json.loads(by_id["toolace-2"]["reward_model"]["ground_truth"]["calls"])[0]["arguments"] == {
        "amount": 12.5, "to": ["EUR", "USD"]}
    assert by_id["toolace-3"]["extra_info"]["category"] == "irrelevance"
    tools = json.loads(by_id["toolace-2"]["reward_model"]["ground_truth"]["tools"])
    assert tools[0]["parameters"]["type"] == "object"  # ToolACE's "dict" mapped as BFCL's handlers map it


def test_toolrl_reward_form():
    gt = {"answer": '<think> t </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1, "b": "x"}}\n</tool_call>'}
    s = lambda resp: TR.score(resp, gt).scores  # noqa: E731
    assert s(gt["answer"]) == {"format": 1.0, "correctness": 3.0}
    # right name, one of two values wrong: S = 1 (names) + 1 (keys) + 1 (one value) = 3 of S_max = 1 + 1 + 2 = 4
    half = s('<think> t </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1, "b": "y"}}\n</tool_call>')
    assert half == {"format": 1.0, "correctness": pytest.approx(6 * 3 / 4 - 3)}
    assert s('<tool_call>\n{"name": "g", "parameters": {}}\n</tool_call>') == {"format": 0.0, "correctness": -3.0}
    assert s("<think> t </think>\n<tool_call>\nnot json\n</tool_call>")["correctness"] == -3.0
    assert s('<think> t </think>\n<tool_call>\n{"name": "f", "parameters": {"a": "1", "b": "x"}}\n</tool_call>'
             )["correctness"] < 3.0  # ToolRL compares decoded JSON exactly: "1" != 1
    answer_only = {"answer": "<think> t </think>\n<response> hi </response>"}
    assert TR.score("<think> a </think>\n<response> b </response>", answer_only).scores == {
        "format": 1.0, "correctness": 0.0}
    assert TR.score("<response> b </response>", answer_only).scores["format"] == 0.0
    # without 'answer': reference from the plain calls
    plain = {"calls": json.dumps([{"name": "f", "arguments": {"a": 1}}])}
    assert TR.score('<think>x</think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>', plain
                    ).scores == {"format": 1.0, "correctness": 3.0}
    assert get_task("toolrl") is TR.score


def test_toolrl_reward_needs_toolrl_source(tmp_path, capsys):
    rc, _, err = _run(TOOLB.main, _args(tmp_path, "xlam", "--input", str(FIX / "xlam_function_calling.json"),
                                        "--reward", "toolrl", "--out-dir", str(tmp_path / "o")), capsys)
    assert rc == 2 and "toolrl" in err


# --------------------------------------------------------------------------------------------------
# text-to-SQL
# --------------------------------------------------------------------------------------------------


def _db(sql_file: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(target)
    conn.executescript(sql_file.read_text())
    conn.commit()
    conn.close()


def _spider_zip(tmp_path: Path) -> Path:
    root = tmp_path / "build" / "spider_data"
    root.mkdir(parents=True)
    for f in ("train_spider.json", "dev.json"):
        shutil.copy(FIX / "spider" / f, root / f)
    _db(FIX / "spider" / "concert_singer.sql", root / "database" / "concert_singer" / "concert_singer.sqlite")
    archive = tmp_path / "spider_data.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for p in sorted(root.rglob("*")):
            zf.write(p, p.relative_to(root.parent))
    return archive


def _bird_zip(tmp_path: Path) -> Path:
    """BIRD's layout: train/train.json and a nested train/train_databases.zip."""
    build = tmp_path / "bbuild"
    _db(FIX / "bird" / "schools.sql", build / "dbs" / "train_databases" / "schools" / "schools.sqlite")
    inner = tmp_path / "train_databases.zip"
    with zipfile.ZipFile(inner, "w") as zf:
        for p in sorted((build / "dbs").rglob("*")):
            zf.write(p, p.relative_to(build / "dbs"))
    archive = tmp_path / "train.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(FIX / "bird" / "train.json", "train/train.json")
        zf.write(inner, "train/train_databases.zip")
    return archive


@pytest.mark.parametrize("source, make, part, n_rows, skipped", [
    ("spider", _spider_zip, "train", 2, {"missing database": 1, "gold SQL fails the verifier": 1,
                                          "missing field 'query'": 1}),
    ("spider", _spider_zip, "dev", 1, {}),
    ("bird", _bird_zip, "train", 2, {"missing database": 1, "gold SQL fails the verifier": 1}),
])
def test_sql_archives_convert_and_gold_scores_full(tmp_path, capsys, source, make, part, n_rows, skipped):
    out = tmp_path / "out"
    rc, card, err = _run(SQLB.main, [source, "--input", str(make(tmp_path)), "--part", part, "--out-dir", str(out)],
                         capsys)
    assert rc == 0, err
    assert _skips(card) == skipped
    rows = _rows(out)
    assert len(rows) == n_rows and {r["data_source"] for r in rows} == {source}
    assert (out / ("train.parquet" if part == "train" else "test.parquet")).is_file()
    score = get_task(source)
    for r in rows:
        gt = r["reward_model"]["ground_truth"]
        assert Path(gt["db_path"]).is_file()
        res = score(SQLB.gold_response(gt["gold_sql"]), gt, r["extra_info"])
        assert all(v == 1.0 for v in res.scores.values()), res


def test_sql_archive_errors(tmp_path, capsys):
    rc, _, err = _run(SQLB.main, ["spider", "--input", str(tmp_path / "none.zip"), "--out-dir", str(tmp_path)],
                      capsys)
    assert rc == 1 and "no such file" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = _run(SQLB.main, ["bird", "--input", str(empty), "--out-dir", str(tmp_path / "o")], capsys)
    assert rc == 1 and "train.json" in err
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escape.json", "[]")
    rc, _, err = _run(SQLB.main, ["spider", "--input", str(evil), "--out-dir", str(tmp_path / "o2")], capsys)
    assert rc == 1 and "escapes" in err and not (tmp_path / "o2" / "escape.json").exists()
