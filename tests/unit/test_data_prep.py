"""Tests of the data builders (data_prep/): rows in verl's layout that the verifiers score as intended.

Every check reads the parquet back with pandas (numpy arrays inside, as verl hands rows to the reward
manager) and scores through :func:`recipe.mrtpo.rewards.reward_manager.score_sample`, exactly what training
runs on a row. Needs the offline assets of ``run_scripts/setup.sh`` (``.assets/chinook``, ``.assets/if``,
``.assets/bfcl``, ``.assets/nltk_data``); a missing asset fails the test that needs it.

The whole offline build (``python -m data_prep.build_offline``) runs once into a temporary folder
(a few seconds) and most tests read its output; a second run in a fresh interpreter with another
PYTHONHASHSEED must give byte-identical parquet.
"""

from __future__ import annotations

import json
import os
import sqlite3
import string
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from data_prep import build_offline
from data_prep.common import (
    SkipLog,
    hash_split,
    iter_json_records,
    read_parquet_rows,
    sha256_file,
    write_parquet,
)
from data_prep.instruction_following import build as IFB
from data_prep.instruction_following import compat as IFC
from data_prep.text_to_sql import build as SQLB
from data_prep.tool_calling import build as TOOLB

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / ".assets"


@pytest.fixture(scope="module")
def score_sample():
    from recipe.mrtpo.rewards.reward_manager import score_sample as fn

    return fn


def rewards(score_sample, row, response) -> dict:
    """Per-reward scores of ``response`` on a parquet row, through the reward manager's entry point."""
    out = score_sample(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])
    info = out["reward_extra_info"]
    assert info["mrtpo_error"] == "", info["mrtpo_error"]
    return json.loads(info["mrtpo_rewards"])


def contexts(score_sample, row, response) -> dict:
    out = score_sample(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])
    return json.loads(out["reward_extra_info"]["mrtpo_contexts"])


def user_text(row) -> str:
    return "\n".join(m["content"] for m in row["prompt"])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every offline set, built once by the one command."""
    for needed in ("chinook/initial_data.json", "if/ifeval_input_data.jsonl", "if/IFBench_test.jsonl",
                   "bfcl/BFCL_v4_simple_python.json"):
        assert (ASSETS / needed).is_file(), f"missing offline asset .assets/{needed}: run `bash run_scripts/setup.sh`"
    out = tmp_path_factory.mktemp("data")
    assert build_offline.main(["--out-dir", str(out), "--seed", "0"]) == 0
    return out


def load(out: Path, name: str, split: str) -> list[dict]:
    return read_parquet_rows(out / name / f"{split}.parquet")


# --------------------------------------------------------------------------------------------------
# common: reading, splitting, writing
# --------------------------------------------------------------------------------------------------


def test_every_builder_has_help(capsys):
    for mod in (SQLB, IFB, TOOLB, build_offline):
        with pytest.raises(SystemExit) as e:
            mod.main(["--help"])
        assert e.value.code == 0
        assert "usage: python -m data_prep." in capsys.readouterr().out


def test_bad_arguments_are_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        TOOLB.main(["bfcl", "--out-dir", str(tmp_path), "--test-fraction", "1.5"])
    assert e.value.code == 2 and "must be in [0, 1]" in capsys.readouterr().err
    assert IFB.main(["train", "--out-dir", str(tmp_path), "--min-constraints", "0"]) == 2
    assert IFB.main(["train", "--out-dir", str(tmp_path), "--constraints", "combination:repeat_prompt"]) == 2
    assert not list(tmp_path.iterdir())


def test_hash_split_is_seeded_stratified_and_stable():
    keys = [f"k{i}" for i in range(200)]
    strata = ["a" if i % 4 else "b" for i in range(200)]
    s0 = hash_split(keys, 0, 0.2, strata)
    assert s0 == hash_split(keys, 0, 0.2, strata)
    assert s0 != hash_split(keys, 1, 0.2, strata)
    counts = Counter((st, sp) for st, sp in zip(strata, s0))
    assert counts[("a", "test")] == 30 and counts[("b", "test")] == 10
    # a key's split does not depend on unrelated keys of other strata
    sub = [i for i in range(200) if strata[i] == "b"]
    assert [s0[i] for i in sub] == hash_split([keys[i] for i in sub], 0, 0.2, ["b"] * len(sub))
    with pytest.raises(ValueError):
        hash_split(["x", "x"], 0, 0.5)


def test_json_reader_reports_file_and_line_and_resyncs(tmp_path):
    lines = tmp_path / "a.jsonl"
    lines.write_text('{"a": 1}\n{broken\n\n{"a": 3}\n', encoding="utf-8")
    skips = SkipLog(stream=sys.stdout)
    assert list(iter_json_records(lines, skips)) == [(1, {"a": 1}), (4, {"a": 3})]
    assert [(e[1], e[2].split(":")[0]) for e in skips.entries] == [(2, "broken JSON")]

    array = tmp_path / "b.json"
    text = json.dumps([{"q": i, "nested": {"x": [1, 2]}} for i in range(4)], indent=4)
    broken = text.replace('"q": 1,', '"q": 1 oops,', 1)
    array.write_text(broken, encoding="utf-8")
    skips = SkipLog(stream=sys.stdout)
    got = list(iter_json_records(array, skips))
    assert [r["q"] for _, r in got] == [0, 2, 3]
    start_of_broken = next(i for i, t in enumerate(broken.splitlines(), 1) if "oops" in t) - 1
    assert got[0][0] == 2 and skips.entries[0][1] == start_of_broken == 11
    assert "resumed at line 20" in skips.entries[0][2] and got[1][0] == 20

    one_line = tmp_path / "c.json"
    one_line.write_text('[{"q": 0}, {"q": 1 oops}, {"q": 2}]', encoding="utf-8")
    skips = SkipLog(stream=sys.stdout)
    assert [r["q"] for _, r in iter_json_records(one_line, skips)] == [0]
    assert skips.count == 1 and "rest of the file skipped" in skips.entries[0][2]

    missing = SkipLog(stream=sys.stdout)
    assert list(iter_json_records(tmp_path / "nope.json", missing)) == [] and missing.count == 1


def test_write_parquet_is_deterministic(tmp_path):
    rows = [{"data_source": "x", "prompt": [{"role": "user", "content": "é"}], "extra_info": {"split": "train",
             "index": i, "ids": ["a", "b"][: i + 1]}} for i in range(2)]
    a, b = write_parquet(rows, tmp_path / "a.parquet"), write_parquet(rows, tmp_path / "b.parquet")
    assert a == b == sha256_file(tmp_path / "a.parquet")
    assert read_parquet_rows(tmp_path / "a.parquet")[1]["extra_info"]["ids"].tolist() == ["a", "b"]
    with pytest.raises(ValueError):
        write_parquet([], tmp_path / "c.parquet")


# --------------------------------------------------------------------------------------------------
# the one offline command
# --------------------------------------------------------------------------------------------------


EXPECTED_FILES = {
    "chinook": ("train", "test"),
    "instruction_following": ("train", "test"),
    "instruction_following_passable": ("train", "test"),
    "ifeval": ("test",),
    "ifbench": ("test",),
    "bfcl": ("train", "test"),
    "bfcl_multi_turn": ("train", "test"),
    "bfcl_multi_turn_offline": ("train", "test"),
}


def test_offline_build_layout_and_row_format(built):
    from data_prep.common import DATA_SOURCES

    assert (built / "chinook" / "chinook.sqlite").is_file()
    for name, splits in EXPECTED_FILES.items():
        assert sorted(p.stem for p in (built / name).glob("*.parquet")) == sorted(splits), name
        for split in splits:
            rows = load(built, name, split)
            assert rows, (name, split)
            for i, row in enumerate(rows):
                agent = ["agent_name"] if row["data_source"] == "bfcl_multi_turn" else []  # the loop that plays the turns
                assert list(row) == ["data_source", "prompt", "ability", "reward_model", "extra_info", *agent]
                assert row["data_source"] in DATA_SOURCES
                assert row["reward_model"]["style"] == "rule"
                assert row["extra_info"]["split"] == split and row["extra_info"]["index"] == i
                assert all(set(m) == {"role", "content"} and m["content"] for m in row["prompt"])
                assert row["prompt"][-1]["role"] == "user"


def test_offline_build_is_byte_identical_in_a_fresh_interpreter(built, tmp_path):
    """Same seed, another process and hash seed, same output folder: the same bytes."""
    first = {p.relative_to(built): sha256_file(p) for p in sorted(built.rglob("*.parquet"))}
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-m", "data_prep.build_offline", "--out-dir", str(built), "--seed", "0"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "== summary ==" in out.stdout and "== data card: chinook ==" in out.stdout
    second = {p.relative_to(built): sha256_file(p) for p in sorted(built.rglob("*.parquet"))}
    assert first == second and len(first) == 14
    # another seed gives other splits
    other = tmp_path / "other"
    assert build_offline.main(["--out-dir", str(other), "--seed", "1", "--only", "chinook"]) == 0
    assert sha256_file(other / "chinook" / "train.parquet") != first[Path("chinook/train.parquet")]


def test_offline_build_rejects_unknown_sets(tmp_path, capsys):
    assert build_offline.main(["--out-dir", str(tmp_path), "--only", "chinook,nope"]) == 2
    assert "nope" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# text-to-SQL
# --------------------------------------------------------------------------------------------------

WRONG_SQL = "```sql\nSELECT 'mrtpo-wrong-answer' AS x\n```"


def test_chinook_rows_gold_scores_one_and_wrong_does_not(built, score_sample):
    from recipe.mrtpo.tasks.text_to_sql import SQL_FORMAT_INSTRUCTION

    rows = load(built, "chinook", "train") + load(built, "chinook", "test")
    questions = [json.loads(line) for line in SQLB.DEFAULT_CHINOOK_QUESTIONS.read_text().splitlines() if line.strip()]
    assert len(rows) == len(questions) == 246
    by_id = {q["id"]: q for q in questions}
    db = str((built / "chinook" / "chinook.sqlite").resolve())
    for row in rows:
        q = by_id[row["extra_info"]["id"]]
        gt = row["reward_model"]["ground_truth"]
        assert gt["db_path"] == db and os.path.isabs(gt["db_path"]) and gt["gold_sql"] == q["gold_sql"]
        prompt = row["prompt"][0]["content"]
        assert len(row["prompt"]) == 1 and prompt.count(SQL_FORMAT_INSTRUCTION) == 1
        assert f"Question: {q['question']}" in prompt and 'CREATE TABLE "track"' in prompt
        assert row["extra_info"]["category"] == q["category"] and row["ability"] == "text_to_sql"
        # a generous time limit: this checks the rows, not the 2 s default (a loaded CI machine may exceed it)
        row = {**row, "extra_info": {**row["extra_info"], "sql_timeout_s": 30.0}}
        assert rewards(score_sample, row, SQLB.gold_response(gt["gold_sql"])) == {
            "format": 1.0, "executable": 1.0, "execution_match": 1.0}, q["id"]
        assert rewards(score_sample, row, WRONG_SQL) == {"format": 1.0, "executable": 1.0, "execution_match": 0.0}
    assert rewards(score_sample, rows[0], "SELECT name FROM track") == {
        "format": 0.0, "executable": 0.0, "execution_match": 0.0}
    ctx = contexts(score_sample, rows[0], WRONG_SQL)
    assert ctx["format"] == {"text": SQL_FORMAT_INSTRUCTION, "placement": "prompt"}
    assert ctx["execution_match"]["text"] == rows[0]["reward_model"]["ground_truth"]["gold_sql"]


def test_chinook_split_rule(built):
    train, test = load(built, "chinook", "train"), load(built, "chinook", "test")
    ids = {s: {r["extra_info"]["id"] for r in rows} for s, rows in (("train", train), ("test", test))}
    assert not ids["train"] & ids["test"]
    per_cat = Counter(r["extra_info"]["category"] for r in test)
    total = Counter(r["extra_info"]["category"] for r in train + test)
    assert all(per_cat[c] == round(0.2 * n) for c, n in total.items())
    expected = hash_split(sorted(ids["train"] | ids["test"]), 0, 0.2,
                          strata=[next(r for r in train + test if r["extra_info"]["id"] == i)["extra_info"]["category"]
                                  for i in sorted(ids["train"] | ids["test"])])
    assert {i for i, s in zip(sorted(ids["train"] | ids["test"]), expected) if s == "test"} == ids["test"]


def test_schema_sample_rows(built):
    text = SQLB.schema_text(str(built / "chinook" / "chinook.sqlite"), 2)
    assert 'SELECT * FROM "artist" LIMIT 2;' in text and "2 example rows:" in text and "AC/DC" in text
    assert text.count("CREATE TABLE") == 11


def test_chinook_malformed_questions_are_reported_and_skipped(built, tmp_path, capsys):
    good = SQLB.DEFAULT_CHINOOK_QUESTIONS.read_text().splitlines()[:3]
    bad_gold = {**json.loads(good[0]), "id": "x-badgold", "gold_sql": "SELECT nope FROM track"}
    dup = good[1]
    lines = [good[0], "{not json", json.dumps({"id": "x-1", "question": "Q?"}), good[1], json.dumps(bad_gold),
             dup, good[2], "[1, 2]"]
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code = SQLB.main(["chinook", "--questions", str(path), "--db",
                      str(built / "chinook" / "chinook.sqlite"), "--out-dir", str(out), "--test-fraction", "0"])
    captured = capsys.readouterr()
    assert code == 0
    for line, why in ((2, "broken JSON"), (3, "missing field 'gold_sql'"), (5, "gold SQL fails the verifier"),
                      (6, "duplicate id"), (8, "not an object")):
        assert f"SKIP {path}:{line}: {why}" in captured.err, (line, captured.err)
    assert "skipped input records: 5" in captured.out and "input records: 8  -> rows: 3, skipped: 5" in captured.out
    assert len(read_parquet_rows(out / "train.parquet")) == 3


def _fake_release(root: Path, source: str) -> tuple[Path, Path]:
    """A Spider/BIRD-shaped release: database/<db_id>/<db_id>.sqlite and a pretty-printed questions array."""
    db_dir = root / "database" / "shop"
    db_dir.mkdir(parents=True)
    conn = sqlite3.connect(db_dir / "shop.sqlite")
    conn.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL);"
        "INSERT INTO item VALUES (1, 'pen', 1.5), (2, 'book', 12.0), (3, 'lamp', 30.0);"
    )
    conn.commit()
    conn.close()
    gold, ev = ("query", None) if source == "spider" else ("SQL", "evidence")
    recs = [
        {"db_id": "shop", "question": "Which items cost more than 10?", gold: "SELECT name FROM item WHERE price > 10"},
        {"db_id": "shop", "question": "How many items are there?", gold: "SELECT count(*) FROM item"},
        {"db_id": "shop", "question": "missing gold"},
        {"db_id": "warehouse", "question": "Unknown database?", gold: "SELECT 1"},
        {"db_id": "shop", "question": "BROKEN", gold: "SELECT 1"},
        {"db_id": "shop", "question": "Cheapest item?", gold: "SELECT name FROM item ORDER BY price LIMIT 1"},
        {"db_id": "shop", "question": "Bad gold?", gold: "SELECT name FROM nowhere"},
    ]
    if ev:
        for r in recs:
            r[ev] = "expensive means price > 10" if "cost" in r["question"] else ""
    text = json.dumps(recs, indent=4).replace('"question": "BROKEN",', '"question": "BROKEN" "x",', 1)
    qfile = root / "questions.json"
    qfile.write_text(text, encoding="utf-8")
    return qfile, root / "database"


@pytest.mark.parametrize("source", ["spider", "bird"])
def test_release_builder_rows_and_malformed_input(source, tmp_path, capsys, score_sample):
    qfile, db_root = _fake_release(tmp_path, source)
    out = tmp_path / "out"
    assert SQLB.main([source, "--input", str(qfile), "--db-root", str(db_root), "--part", "dev",
                      "--out-dir", str(out), "--sample-rows", "1", "--sql-timeout-s", "3"]) == 0
    captured = capsys.readouterr()
    text = qfile.read_text().splitlines()

    def line_of(question):
        return next(i for i, t in enumerate(text, 1) if question in t) - 2  # the element's "{" line

    assert f"{qfile}:{line_of('missing gold')}: missing field" in captured.err
    assert f"{qfile}:{line_of('Unknown database?')}: missing database: 'warehouse'" in captured.err
    assert f"{qfile}:{line_of('BROKEN')}: broken JSON" in captured.err
    assert f"{qfile}:{line_of('Bad gold?')}: gold SQL fails the verifier" in captured.err
    assert "input records: 7  -> rows: 3, skipped: 4" in captured.out
    rows = read_parquet_rows(out / "test.parquet")
    assert [r["extra_info"]["db_id"] for r in rows] == ["shop"] * 3 and {r["data_source"] for r in rows} == {source}
    assert {r["extra_info"]["sql_timeout_s"] for r in rows} == {3.0}
    prompt = rows[0]["prompt"][0]["content"]
    assert "CREATE TABLE item" in prompt and "1 example rows:" in prompt and "pen" in prompt
    assert ("External knowledge: expensive means price > 10" in prompt) == (source == "bird")
    assert "External knowledge" not in rows[1]["prompt"][0]["content"]
    for row in rows:
        gt = row["reward_model"]["ground_truth"]
        assert gt["db_path"] == str((db_root / "shop" / "shop.sqlite").resolve())
        assert set(rewards(score_sample, row, SQLB.gold_response(gt["gold_sql"])).values()) == {1.0}
        assert rewards(score_sample, row, WRONG_SQL)["execution_match"] == 0.0


def test_release_builder_needs_its_inputs(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        SQLB.main(["spider", "--out-dir", str(tmp_path)])
    assert e.value.code == 2 and "--input" in capsys.readouterr().err
    qfile, _ = _fake_release(tmp_path, "spider")  # a question file alone: its databases are not in it
    assert SQLB.main(["spider", "--input", str(qfile), "--out-dir", str(tmp_path / "o")]) == 1
    assert "--db-root" in capsys.readouterr().err


def test_release_rows_one_loop_for_files_and_the_builder_api(tmp_path, capsys):
    """build_release_rows (local files) and the CLI give the same rows: one record loop."""
    qfile, db_root = _fake_release(tmp_path, "spider")
    rows, read = SQLB.build_release_rows("spider", [qfile], db_root, split="test")
    assert read == 7 and len(rows) == 3
    out = tmp_path / "out"
    assert SQLB.main(["spider", "--input", str(qfile), "--db-root", str(db_root), "--part", "dev",
                      "--out-dir", str(out)]) == 0
    capsys.readouterr()
    assert [r["extra_info"]["id"] for r in read_parquet_rows(out / "test.parquet")] == \
        [r["extra_info"]["id"] for r in rows]


# --------------------------------------------------------------------------------------------------
# instruction following
# --------------------------------------------------------------------------------------------------

NAMES = ("Emma Liam Sophia Jackson Olivia Noah Ava Lucas Isabella Mason Mia Ethan Charlotte Alexander Amelia "
         "Benjamin Harper Leo Zoe Daniel Chloe Samuel Lily Matthew Grace Owen Abigail Gabriel Ella Jacob Scarlett "
         "Nathan Victoria Elijah Layla Nicholas Audrey David Hannah Christopher Penelope Thomas Nora Andrew Aria "
         "Joseph Claire Ryan Stella Jonathan").split()
PALINDROMES = ["level", "radar", "civic", "kayak", "refer", "madam", "rotor", "stats", "tenet", "sagas"]
LANG_TEXT = {
    "en": "The weather is pleasant today and the children are playing happily in the garden near the old house.",
    "fr": "Bonjour, je m'appelle Marie et j'habite à Paris depuis dix ans avec ma famille et mes deux chats.",
    "de": "Heute ist das Wetter sehr schön und die Kinder spielen fröhlich im Garten hinter dem alten Haus.",
    "es": "Hoy hace muy buen tiempo y los niños juegan felices en el jardín detrás de la casa vieja de mi abuela.",
    "it": "Oggi il tempo è molto bello e i bambini giocano felici nel giardino dietro la vecchia casa della nonna.",
    "ru": "Сегодня очень хорошая погода, и дети весело играют в саду за старым домом моей бабушки.",
    "ja": "今日はとても良い天気で、子供たちは祖母の古い家の後ろの庭で楽しく遊んでいます。",
}
CAPS = "This is a plain English sentence, written entirely in capital letters by a careful writer."


def _words(n: int) -> list[str]:
    """n distinct made-up words (no stop words, no digits)."""
    a = string.ascii_lowercase
    return [f"zq{a[(i // 676) % 26]}{a[(i // 26) % 26]}{a[i % 26]}x" for i in range(n)]


def _sentences(n: int) -> str:
    return " ".join(f"Cats sleep here {'now' if i % 2 else 'today'}." for i in range(n))


def if_responses(iid: str, kw: dict) -> tuple[str, str]:
    """(satisfying, violating) response for one constraint with the row's arguments."""
    rel = kw.get("relation") or kw.get("capital_relation") or kw.get("let_relation")

    def by_relation(many: str, few: str) -> tuple[str, str]:
        return (few, many) if rel == "less than" else (many, few)

    simple = {
        "change_case:english_capital": (CAPS.upper(), CAPS),
        "change_case:english_lowercase": (CAPS.lower(), CAPS),
        "combination:two_responses": ("First answer here.\n******\nSecond answer there.", "Only one answer."),
        "detectable_format:constrained_response": ("My answer is yes.", "Perhaps."),
        "detectable_format:json_format": ('{"a": 1}', "a: 1"),
        "detectable_format:title": ("<<My Title>>\nBody text.", "My Title\nBody text."),
        "punctuation:no_comma": ("No commas here.", "Yes, commas."),
        "startend:quotation": ('"A quoted response."', "An unquoted response."),
        "count:conjunctions": ("Cats and dogs, but not birds or fish, nor mice, so yet for all.", "Cats sleep."),
        "count:punctuation": ("Hi. Yes, ok! Why? Because; reasons: fine?!", "Hi."),
        "format:emoji": ("Hello there 😀. Nice day 🌞.", "Hello there. Nice day."),
        "format:line_indent": ("a\n b\n  c", "a\nb\nc"),
        "format:newline": ("one\ntwo\nthree", "one two\nthree"),
        "format:no_bullets_bullets": ("First sentence. Second sentence.\n* a\n* b", "* a\n* b"),
        "format:no_whitespace": ("nowhitespace", "has whitespace"),
        "format:output_template": ("My Answer: a My Conclusion: b Future Outlook: c", "My Answer: a"),
        "format:parentheses": ("Look (at [this {nested (deep [thing])}]) here.", "Look (at this) here."),
        "format:quote_unquote": ('He said "hello" to greet me.', 'He said "hello"'),
        "format:quotes": ("\"She said 'he said \"hi\" today' loudly\" indeed.", '"Just one level" here.'),
        "format:sub-bullets": ("* apples\n - red\n* pears\n - green", "* apples\n* pears"),
        "format:thesis": ("<i>Cats are great.</i> Here is why.", "Cats are great. Here is why."),
        "format:title_case": ("This Is Title Case", "this is not title case"),
        "ratio:sentence_balance": ("Cats sleep. Do cats sleep? Cats sleep!", "Cats sleep. Dogs sleep."),
        "ratio:sentence_type": ("Cats sleep. Dogs sleep. Do birds sleep?", "Cats sleep. Do birds sleep?"),
        "ratio:sentence_words": ("Cats run. Dogs sit. Owls fly.", "Cats run. Dogs sit."),
        "ratio:stop_words": ("Cats chase mice quickly.", "the and of it is the to a."),
        "sentence:alliteration_increment": ("Cats run. Big bears eat.", "Big bears eat. Cats run."),
        "words:alphabet": ("Apples bring cheer daily", "Apples cheer"),
        "words:consonants": ("strong plants thrive", "a cat"),
        "words:last_first": ("I like cats. Cats like me.", "I like cats. Dogs like me."),
        "words:no_consecutive": ("apple banana cherry", "apple avocado"),
        "words:odd_even_syllables": ("cat apple dog water", "cat dog"),
        "words:palindrome": (" ".join(PALINDROMES), " ".join(PALINDROMES[:9])),
        "words:paragraph_last_first": ("hello world hello\nbye now bye", "hello world"),
        "words:prime_lengths": ("is the cat", "four"),
        "words:vowel": ("I am a cat", "education is our future"),
    }
    if iid in simple:
        return simple[iid]
    if iid == "change_case:capital_word_frequency":
        return by_relation(" ".join(["LOUD"] * kw["capital_frequency"]) + " words here.", "quiet words here.")
    if iid == "detectable_content:number_placeholders":
        return "Send " + " ".join(f"[p{i}]" for i in range(kw["num_placeholders"])) + ".", "Send nothing."
    if iid == "detectable_content:postscript":
        return f"Main text.\n{kw['postscript_marker']} See you soon.", "Main text only."
    if iid == "detectable_format:multiple_sections":
        return "\n".join(f"{kw['section_spliter']} {i}\ncontent {i}" for i in range(1, kw["num_sections"] + 1)), \
            "no sections at all"
    if iid == "detectable_format:number_bullet_lists":
        n = kw["num_bullets"]
        return "\n".join(f"* item {i}" for i in range(n)), "\n".join(f"* item {i}" for i in range(n + 1))
    if iid == "detectable_format:number_highlighted_sections":
        return " ".join(f"*part {i}*" for i in range(kw["num_highlights"])), "nothing highlighted"
    if iid == "keywords:existence":
        return "Text: " + " ".join(kw["keywords"]) + ".", "Xyzzy plugh."
    if iid == "keywords:forbidden_words":
        return "Xyzzy plugh.", "Text: " + " ".join(kw["forbidden_words"]) + "."
    if iid == "keywords:frequency":
        return by_relation(" ".join([kw["keyword"]] * kw["frequency"]) + ".", "xyzzy.")
    if iid == "keywords:letter_frequency":
        return by_relation(" ".join([kw["letter"]] * kw["let_frequency"]) + ".", "123 456.")
    if iid == "language:response_language":
        return LANG_TEXT[kw["language"]], LANG_TEXT["fr" if kw["language"] != "fr" else "en"]
    if iid == "length_constraints:nth_paragraph_first_word":
        n, k = kw["num_paragraphs"], kw["nth_paragraph"]
        paras = lambda first: "\n\n".join(  # noqa: E731
            f"{first} starts this paragraph." if i == k else f"Paragraph {i} text." for i in range(1, n + 1))
        return paras(kw["first_word"]), paras("Xyzzy")
    if iid == "length_constraints:number_paragraphs":
        n = kw["num_paragraphs"]
        return "\n***\n".join(f"Para {i}." for i in range(n)), "\n***\n".join(f"Para {i}." for i in range(n + 1))
    if iid == "length_constraints:number_sentences":
        n = kw["num_sentences"]
        if rel == "less than":
            return _sentences(n - 1), _sentences(n)
        return _sentences(n), _sentences(n - 1) if n > 1 else "no sentence end"
    if iid == "length_constraints:number_words":
        n = kw["num_words"]
        return (" ".join(_words(n - 1)), " ".join(_words(n))) if rel == "less than" else \
            (" ".join(_words(n)), " ".join(_words(n - 1)))
    if iid == "startend:end_checker":
        return f"Done. {kw['end_phrase']}", f"{kw['end_phrase']} Done."
    if iid == "count:keywords_multiple":
        ks = [kw[f"keyword{i}"] for i in range(1, 6)]
        good = " ".join(" ".join([k] * c) for k, c in zip(ks, (1, 2, 3, 5, 7)))
        return good, good.replace(ks[4], "xyzzy", 1)
    if iid == "count:numbers":
        n = kw["N"]
        return " ".join(map(str, range(1, n + 1))) + " apples.", " ".join(map(str, range(1, n + 2))) + " apples."
    if iid == "count:person_names":
        return ", ".join(NAMES[: kw["N"]]) + ".", ", ".join(NAMES[: kw["N"] - 1]) + " and nobody else."
    if iid == "count:pronouns":
        return " ".join(["they"] * kw["N"]) + ".", " ".join(["they"] * (kw["N"] - 1)) + " cats."
    if iid == "count:unique_word_count":
        return " ".join(_words(kw["N"])), " ".join(_words(kw["N"] - 1))
    if iid == "count:word_count_range":
        return " ".join(_words(kw["min_words"])), " ".join(_words(kw["max_words"] + 1))
    if iid == "count:words_japanese":
        n = kw["N"]
        return " ".join("日本" if (i + 1) % n == 0 else "cat" for i in range(2 * n)), " ".join(["cat"] * (2 * n))
    if iid == "format:list":
        return f"{kw['sep']} apples\n{kw['sep']} pears", f"{kw['sep']} apples only"
    if iid == "format:options":
        opts = kw["options"]
        sep = "/" if "/" in opts else ("or" if "or" in opts else ",")
        return opts.split(sep)[0].strip(), opts + " because reasons"
    if iid == "sentence:increment":
        return "Cats sleep. " + " ".join(["cats"] * (2 + kw["small_n"])) + ".", "Cats sleep. Dogs sleep."
    if iid == "sentence:keyword":
        n = kw["N"]
        good = " ".join(f"Sentence {kw['word']} here." if i == n else "Filler line here." for i in range(1, n + 1))
        return good, " ".join("Filler line here." for _ in range(n))
    if iid == "words:keywords_specific_position":
        k, n, m = kw["keyword"], kw["n"], kw["m"]
        target, other = " ".join(["fill"] * (m - 1) + [k, "end"]) + ".", " ".join(["fill"] * m + [k]) + "."
        text = lambda s: " ".join(s if i == n else "Filler line here." for i in range(1, n + 1))  # noqa: E731
        return text(target), text(other)
    if iid == "words:repeats":
        n = kw["small_n"]
        return " ".join(["cat"] * n) + " dog.", " ".join(["cat"] * (n + 1)) + " dog."
    if iid == "words:words_position":
        return f"The {kw['keyword']} is the {kw['keyword']} .", "The cat sat on the mat ."
    raise KeyError(f"no test responses for {iid}")


@pytest.fixture(scope="module")
def base_prompts():
    skips = SkipLog(stream=sys.stdout)
    assert IFB.DEFAULT_BASE_PROMPTS.is_file(), f"missing {IFB.DEFAULT_BASE_PROMPTS}"
    prompts, read = IFB.load_base_prompts(IFB.DEFAULT_BASE_PROMPTS, skips)
    assert skips.count == 0 and len(prompts) == read >= 300
    return prompts


def test_if_training_rows_carry_their_constraints_verbatim(built):
    from recipe.mrtpo.core.prompt_variants import remove_from_messages
    from recipe.mrtpo.tasks.instruction_following import COMPOSABLE_IDS

    rows = load(built, "instruction_following", "train") + load(built, "instruction_following", "test")
    base = dict(IFB.load_base_prompts(IFB.DEFAULT_BASE_PROMPTS, SkipLog(stream=sys.stdout))[0])
    assert len(rows) == len(base) * IFB.DEFAULT_SAMPLES_PER_PROMPT
    sizes, used = Counter(), set()
    for row in rows:
        gt, extra = row["reward_model"]["ground_truth"], row["extra_info"]
        ids, texts = list(gt["instruction_id_list"]), list(extra["constraint_texts"])
        kws = [json.loads(k) for k in gt["kwargs"]]
        prompt = row["prompt"][0]["content"]
        assert 1 <= len(ids) <= 5 and len(ids) == len(kws) == len(texts) == len(set(ids))
        assert prompt == IFB.if_prompt(base[extra["base_id"]], texts)
        for t in texts:
            assert prompt.count(t) == 1, t
            removed = remove_from_messages(list(row["prompt"]), t)
            assert removed is not None and t not in removed[0]["content"]
        assert not any(IFC.conflicts(a, b) for i, a in enumerate(ids) for b in ids[i + 1:]), ids
        assert IFC.kwargs_conflict(list(zip(ids, kws))) is None
        assert len(ids) == 1 or not set(ids) & IFC.SOLO_IDS
        sizes[len(ids)] += 1
        used |= set(ids)
    assert set(sizes) == {1, 2, 3, 4, 5} and min(sizes.values()) > len(rows) / 10
    assert used == set(COMPOSABLE_IDS)  # the default pool; each has a family test below
    # hash split by base prompt: no base prompt in both splits
    splits = {}
    for row in rows:
        splits.setdefault(row["extra_info"]["base_id"], set()).add(row["extra_info"]["split"])
    assert all(len(s) == 1 for s in splits.values())


def test_if_rows_score_through_the_reward_manager(built, score_sample):
    rows = load(built, "instruction_following", "train")[:400]
    for row in rows:
        ids, texts = list(row["reward_model"]["ground_truth"]["instruction_id_list"]), \
            list(row["extra_info"]["constraint_texts"])
        scores = rewards(score_sample, row, "A short reply, in English.")
        assert list(scores) == sorted(ids) or set(scores) == set(ids)
        ctx = contexts(score_sample, row, "A short reply.")
        assert {k: c["text"] for k, c in ctx.items()} == dict(zip(ids, texts))
        assert all(c["placement"] == "prompt" for c in ctx.values())


@pytest.fixture(scope="module")
def family_rows(base_prompts, tmp_path_factory):
    """For every composable id, single-constraint rows built by the builder, through parquet."""
    from recipe.mrtpo.tasks.instruction_following import COMPOSABLE_IDS

    rows = []
    for iid in COMPOSABLE_IDS:
        n = 12 if iid == "language:response_language" else 2
        rows += IFB.build_training_rows(base_prompts[:n], seed=7, samples_per_prompt=2, min_constraints=1,
                                        max_constraints=1, constraints=iid, test_fraction=0.0)
    path = tmp_path_factory.mktemp("if_family") / "train.parquet"
    for i, row in enumerate(rows):
        row["extra_info"]["index"] = i
    write_parquet(rows, path)
    return read_parquet_rows(path)


def test_every_constraint_family_has_a_satisfying_and_a_violating_response(family_rows, score_sample):
    from recipe.mrtpo.tasks.instruction_following import COMPOSABLE_IDS

    tested = Counter()
    for row in family_rows:
        (iid,) = row["reward_model"]["ground_truth"]["instruction_id_list"]
        kw = json.loads(row["reward_model"]["ground_truth"]["kwargs"][0])
        if iid == "language:response_language" and kw["language"] not in LANG_TEXT:
            continue
        good, bad = if_responses(iid, kw)
        assert rewards(score_sample, row, good) == {iid: 1.0}, (iid, kw, good)
        assert rewards(score_sample, row, bad) == {iid: 0.0}, (iid, kw, bad)
        tested[iid] += 1
    assert set(tested) == set(COMPOSABLE_IDS), sorted(set(COMPOSABLE_IDS) - set(tested))


def test_multi_constraint_rows_lose_only_the_violated_reward(base_prompts, score_sample, tmp_path):
    """Four joinable constraints in one built row: a response meeting all scores 1 on each reward, and
    breaking one constraint costs exactly that reward."""
    pool = "punctuation:no_comma,detectable_format:title,detectable_content:postscript,keywords:existence"
    rows = IFB.build_training_rows(base_prompts[:8], seed=5, samples_per_prompt=1, min_constraints=4,
                                   max_constraints=4, constraints=pool, test_fraction=0.0)
    write_parquet(rows, tmp_path / "t.parquet")
    rows = read_parquet_rows(tmp_path / "t.parquet")
    assert len(rows) == 8
    for row in rows:
        gt = row["reward_model"]["ground_truth"]
        kws = dict(zip(gt["instruction_id_list"], (json.loads(k) for k in gt["kwargs"])))
        assert sorted(kws) == sorted(pool.split(","))
        marker, keywords = kws["detectable_content:postscript"]["postscript_marker"], \
            kws["keywords:existence"]["keywords"]
        parts = {"title": "<<A Title>>", "body": "Text about " + " and ".join(keywords) + ".",
                 "ps": f"{marker} See you."}
        good = "\n".join(parts.values())
        assert rewards(score_sample, row, good) == dict.fromkeys(kws, 1.0)
        for iid, bad in (("detectable_format:title", good.replace("<<A Title>>", "A Title")),
                         ("punctuation:no_comma", good.replace("Text about", "Text, about")),
                         ("detectable_content:postscript", good.replace(parts["ps"], "See you.")),
                         ("keywords:existence", good.replace(parts["body"], "Text about nothing."))):
            assert rewards(score_sample, row, bad) == {**dict.fromkeys(kws, 1.0), iid: 0.0}, (iid, bad)


def test_if_random_passable_pool(built):
    from recipe.mrtpo.tasks.instruction_following import RANDOM_PASSABLE_IDS

    allowed = {iid: kw for iid, kw in RANDOM_PASSABLE_IDS}
    rows = load(built, "instruction_following_passable", "train")
    assert rows and max(len(r["reward_model"]["ground_truth"]["instruction_id_list"]) for r in rows) == 4
    for row in rows:
        gt = row["reward_model"]["ground_truth"]
        for iid, kw in zip(gt["instruction_id_list"], gt["kwargs"]):
            assert json.loads(kw) == allowed[iid]
    with pytest.raises(ValueError):
        IFC.constraint_pool("punctuation:no_comma,combination:repeat_prompt")


def test_conflict_rules():
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_CONFLICTS

    from recipe.mrtpo.tasks.instruction_following import COMPOSABLE_IDS

    for a in COMPOSABLE_IDS:
        assert IFC.conflicts(a, a)
        for b in COMPOSABLE_IDS:
            assert IFC.conflicts(a, b) == IFC.conflicts(b, a)
    for a, bs in INSTRUCTION_CONFLICTS.items():
        for b in bs:
            if a in COMPOSABLE_IDS and b in COMPOSABLE_IDS:
                assert IFC.conflicts(a, b)
    assert not IFC.conflicts("punctuation:no_comma", "detectable_format:title")
    assert IFC.conflicts("punctuation:no_comma", "count:punctuation")
    assert IFC.conflicts("language:response_language", "count:conjunctions")
    assert IFC.kwargs_conflict([("keywords:existence", {"keywords": ["apple"]}),
                                ("keywords:forbidden_words", {"forbidden_words": ["apples"]})])
    assert IFC.kwargs_conflict([("words:repeats", {"small_n": 1}), ("words:words_position", {"keyword": "x"})])
    assert IFC.kwargs_conflict([("length_constraints:number_sentences", {"num_sentences": 1, "relation": "less than"})])
    assert IFC.kwargs_conflict([("keywords:existence", {"keywords": ["apple"]}),
                                ("keywords:forbidden_words", {"forbidden_words": ["pear"]})]) is None


def test_if_eval_sets(built, score_sample):
    from recipe.mrtpo.tasks import instruction_following as IF

    for name, count in (("ifeval", 541), ("ifbench", 300)):
        rows = load(built, name, "test")
        raw = [json.loads(line) for line in IFB.EVAL_SETS[name][1].read_text(encoding="utf-8").splitlines()
               if line.strip()]
        assert len(rows) == len(raw) == count and {r["data_source"] for r in rows} == {name}
        found = 0
        for row, rec in zip(rows, raw):
            prompt = row["prompt"][0]["content"]
            assert prompt == rec["prompt"]  # verbatim, as the benchmark ships it
            texts = list(row["extra_info"]["constraint_texts"])
            assert len(texts) == len(rec["instruction_id_list"])
            assert all(t in prompt for t in texts if t)
            found += sum(bool(t) for t in texts)
        assert found > (200 if name == "ifbench" else 10)
        for row, rec in list(zip(rows, raw))[:60]:  # parity with the raw rows after the parquet round trip
            response = rec["prompt"]
            assert rewards(score_sample, row, response) == IF.score(
                response, {"instruction_id_list": rec["instruction_id_list"], "kwargs": rec["kwargs"]}).scores


def test_if_malformed_base_prompts_are_reported(tmp_path, capsys):
    path = tmp_path / "base.jsonl"
    path.write_text("\n".join([
        json.dumps({"id": "a", "prompt": "Write a poem about the sea."}),
        "{oops",
        json.dumps({"id": "b"}),
        json.dumps({"prompt": "no id"}),
        json.dumps({"id": "a", "prompt": "duplicate"}),
        json.dumps({"id": "c", "prompt": "Describe a market."}),
    ]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert IFB.main(["train", "--base-prompts", str(path), "--out-dir", str(out), "--test-fraction", "0"]) == 0
    captured = capsys.readouterr()
    for line, why in ((2, "broken JSON"), (3, "missing field 'prompt'"), (4, "missing field 'id'"),
                      (5, "duplicate id")):
        assert f"SKIP {path}:{line}: {why}" in captured.err
    assert "skipped input records: 4" in captured.out
    rows = read_parquet_rows(out / "train.parquet")
    assert sorted({r["extra_info"]["base_id"] for r in rows}) == ["a", "c"]
    assert IFB.main(["train", "--base-prompts", str(tmp_path / "nope.jsonl"), "--out-dir", str(out)]) == 1


def test_if_eval_malformed_input(tmp_path, capsys):
    path = tmp_path / "ifeval.jsonl"
    good = IFB.EVAL_SETS["ifeval"][1].read_text(encoding="utf-8").splitlines()[0]
    path.write_text("\n".join([good, "{", json.dumps({"key": 9, "prompt": "x", "instruction_id_list": ["nope:id"],
                                                     "kwargs": [{}]}),
                               json.dumps({"key": 8, "prompt": "x"})]) + "\n", encoding="utf-8")
    rows, read = IFB.build_eval_rows("ifeval", path, SkipLog())
    err = capsys.readouterr().err
    assert len(rows) == 1 and read == 4
    assert f"{path}:2: broken JSON" in err and f"{path}:3: unknown instruction id" in err
    assert f"{path}:4: missing field 'instruction_id_list'" in err


def test_if_builder_is_deterministic_in_process(base_prompts):
    a = IFB.build_training_rows(base_prompts[:30], seed=3)
    b = IFB.build_training_rows(base_prompts[:30], seed=3)
    c = IFB.build_training_rows(base_prompts[:30], seed=4)
    assert a == b and a != c


# --------------------------------------------------------------------------------------------------
# tool calling
# --------------------------------------------------------------------------------------------------


def _wrong_calls(calls: list) -> list:
    wrong = json.loads(json.dumps(calls))
    wrong[0]["name"] = wrong[0]["name"] + "_wrong"
    return wrong


def test_bfcl_rows_gold_scores_one_and_wrong_does_not(built, score_sample):
    from recipe.mrtpo.tasks.tool_calling import TOOL_FORMAT_INSTRUCTION, render_tool_calls

    rows = load(built, "bfcl", "train") + load(built, "bfcl", "test")
    assert len(rows) == 2346  # 2351 entries less the 5 whose official answer BFCL itself can never accept
    questions = {}
    for cat in TOOLB.BFCL_CATEGORIES:
        for line in (ASSETS / "bfcl" / f"BFCL_v4_{cat}.json").read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                questions[rec["id"]] = rec
    for row in rows:
        gt = row["reward_model"]["ground_truth"]
        calls, tools = json.loads(gt["calls"]), json.loads(gt["tools"])
        rec = questions[row["extra_info"]["id"]]
        system = row["prompt"][0]
        assert system["role"] == "system" and system["content"].count(TOOL_FORMAT_INSTRUCTION) == 1
        assert system["content"].count("\n</tools>\n\n") == 1 and len(tools) == len(rec["function"])
        assert all(json.dumps(t["name"]) in system["content"] for t in tools)
        assert [m["content"] for m in row["prompt"][1:]] == [m["content"] for m in rec["question"][0]
                                                             if m["role"] != "system"]
        assert rewards(score_sample, row, render_tool_calls(calls)) == {"format": 1.0, "correctness": 1.0}
        wrong = rewards(score_sample, row, render_tool_calls(_wrong_calls(calls)))
        assert wrong["format"] == 1.0 and wrong["correctness"] < 1.0
        assert rewards(score_sample, row, "I would call a function.")["format"] == 0.0
    ctx = contexts(score_sample, rows[0], "x")
    assert ctx["format"] == {"text": TOOL_FORMAT_INSTRUCTION, "placement": "prompt"}


def test_bfcl_split_rule(built):
    rows = load(built, "bfcl", "train") + load(built, "bfcl", "test")
    cats = [r["extra_info"]["category"] for r in rows]
    total, test = Counter(cats), Counter(c for c, r in zip(cats, rows) if r["extra_info"]["split"] == "test")
    assert all(test[c] == round(0.3 * n) for c, n in total.items())
    ids = [r["extra_info"]["id"] for r in rows]
    assert [r["extra_info"]["split"] for r in rows] == hash_split(ids, 0, 0.3, cats)


def test_bfcl_types_are_json_schema(built):
    rows = load(built, "bfcl", "train")
    seen = Counter()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                seen[node["type"]] += 1
            for key in ("properties",):
                for v in (node.get(key) or {}).values():
                    walk(v)
            walk(node.get("items"))

    for row in rows:
        for tool in json.loads(row["reward_model"]["ground_truth"]["tools"]):
            walk(tool["parameters"])
    assert set(seen) <= {"object", "string", "integer", "number", "boolean", "array"}, seen


def test_bfcl_malformed_input(tmp_path, capsys):
    src = ASSETS / "bfcl"
    (tmp_path / "possible_answer").mkdir()
    q = (src / "BFCL_v4_simple_python.json").read_text(encoding="utf-8").splitlines()[:4]
    a = (src / "possible_answer" / "BFCL_v4_simple_python.json").read_text(encoding="utf-8").splitlines()[:3]
    no_function = json.loads(q[2])
    del no_function["function"]
    qfile = tmp_path / "BFCL_v4_simple_python.json"
    qfile.write_text("\n".join([q[0], "{broken", json.dumps(no_function), q[1], q[3]]) + "\n", encoding="utf-8")
    (tmp_path / "possible_answer" / "BFCL_v4_simple_python.json").write_text("\n".join(a) + "\n", encoding="utf-8")
    rows, read = TOOLB.build_bfcl_rows(tmp_path, ["simple_python", "multiple"], skips=SkipLog())
    err = capsys.readouterr().err
    assert [r["extra_info"]["id"] for r in rows] == ["simple_python_0", "simple_python_1"] and read == 5
    assert f"{qfile}:2: broken JSON" in err and f"{qfile}:3: missing field 'function'" in err
    assert f"{qfile}:5: no answer" in err and "missing file: category multiple" in err


XLAM = [
    {"id": 1, "query": "What is the weather in Paris?",
     "tools": json.dumps([{"name": "get_weather", "description": "Weather of a city.",
                           "parameters": {"city": {"type": "str", "description": "City name."},
                                          "unit": {"type": "str, optional", "description": "Unit.",
                                                   "default": "celsius"}}}]),
     "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])},
    {"id": 2, "query": "Add 2 and 3, and 4 and 5.",
     "tools": json.dumps([{"name": "add", "description": "Add.",
                           "parameters": {"a": {"type": "int", "description": "x"},
                                          "b": {"type": "List[int]", "description": "y"}}}]),
     "answers": json.dumps([{"name": "add", "arguments": {"a": 2, "b": [3]}},
                            {"name": "add", "arguments": {"a": 4, "b": [5]}}])},
    {"id": 3, "query": "Tell me a joke.",
     "tools": json.dumps([{"name": "add", "description": "Add.", "parameters": {"a": {"type": "int"}}}]),
     "answers": "[]"},
    {"id": 4, "query": "missing answers", "tools": "[]"},
    {"id": 5, "query": "broken tools", "tools": "[{", "answers": "[]"},
    {"id": 6, "query": "BROKEN", "tools": "[]", "answers": "[]"},
]


def test_xlam_converter(tmp_path, capsys, score_sample):
    from recipe.mrtpo.tasks.tool_calling import NO_CALL_REFERENCE, render_tool_calls

    # a record that does not parse is skipped with its line; the other records of the file are read
    text = json.dumps(XLAM, indent=2).replace('"query": "BROKEN",', '"query": BROKEN,')
    broken = tmp_path / "broken.json"
    broken.write_text(text, encoding="utf-8")
    assert TOOLB.main(["xlam", "--input", str(broken), "--out-dir", str(tmp_path / "o2"), "--test-fraction", "0"]) == 0
    captured = capsys.readouterr()
    element = next(i for i, t in enumerate(text.splitlines(), 1) if "BROKEN" in t) - 2  # its "{" line
    assert f"SKIP {broken}:{element}: broken JSON" in captured.err
    assert "input records: 6  -> rows: 3, skipped: 3" in captured.out
    # malformed records inside a readable file are skipped, counted and reported by line
    path = tmp_path / "xlam.json"
    text = json.dumps(XLAM[:5], indent=2)
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    assert TOOLB.main(["xlam", "--input", str(path), "--out-dir", str(out), "--test-fraction", "0"]) == 0
    captured = capsys.readouterr()
    lines = text.splitlines()
    line_of = lambda q: next(i for i, t in enumerate(lines, 1) if f'"query": "{q}"' in t) - 2  # noqa: E731
    assert f"{path}:{line_of('missing answers')}: missing field 'tools'" in captured.err
    assert f"{path}:{line_of('broken tools')}: broken JSON in 'tools' or 'answers'" in captured.err
    assert "input records: 5  -> rows: 3, skipped: 2" in captured.out
    rows = read_parquet_rows(out / "train.parquet")
    assert [r["extra_info"]["category"] for r in rows] == ["simple", "parallel", "irrelevance"]
    assert {r["data_source"] for r in rows} == {"tool_calling"}
    tools = json.loads(rows[0]["reward_model"]["ground_truth"]["tools"])
    assert tools[0]["parameters"] == {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string", "description": "City name."},
                       "unit": {"type": "string", "description": "Unit.", "default": "celsius"}}}
    assert json.loads(rows[1]["reward_model"]["ground_truth"]["tools"])[0]["parameters"]["properties"]["b"]["type"] \
        == "array"
    for row in rows:
        calls = json.loads(row["reward_model"]["ground_truth"]["calls"])
        assert rewards(score_sample, row, TOOLB.gold_answer(calls)) == {"format": 1.0, "correctness": 1.0}
        wrong = render_tool_calls(_wrong_calls(calls)) if calls else render_tool_calls([{"name": "add",
                                                                                        "arguments": {"a": 1}}])
        assert rewards(score_sample, row, wrong)["correctness"] < 1.0
    # the unit default: leaving it out scores 1; spelling out a value the reference does not accept is not
    # full credit (BFCL's rule: no forgiveness because the spec's default equals it), but partial credit
    assert rewards(score_sample, rows[0], render_tool_calls(
        [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}])) == {"format": 1.0,
                                                                                         "correctness": 2 / 3}
    assert contexts(score_sample, rows[2], "x")["correctness"]["text"] == NO_CALL_REFERENCE


def test_tool_builder_is_deterministic(tmp_path):
    shas = []
    for _ in range(2):
        assert TOOLB.main(["bfcl", "--out-dir", str(tmp_path), "--categories", "parallel,live_parallel",
                           "--limit", "30"]) == 0
        shas.append((sha256_file(tmp_path / "train.parquet"), sha256_file(tmp_path / "test.parquet")))
    assert shas[0] == shas[1]
    assert TOOLB.main(["bfcl", "--out-dir", str(tmp_path), "--categories", "irrelevance"]) == 2
