"""Tests of the text-to-SQL verifier (recipe/mrtpo/tasks/text_to_sql.py) and its sandbox.

A small SQLite database (tables ``singer`` and ``concert``) is built in a temporary directory. The
timeout cases dominate the run time, so only one uses the default 2 s limit; the hostile corpus runs
with a 0.25 s limit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sqlite3
import time
from pathlib import Path

import pytest

from recipe.mrtpo.tasks import Context, get_task
from recipe.mrtpo.tasks.sql_compare import prepare_queries, remove_distinct, replace_cur_year
from recipe.mrtpo.tasks.sql_sandbox import DEFAULT_TIMEOUT_S, execute_gold, execute_sql
from recipe.mrtpo.tasks.text_to_sql import (
    SQL_FORMAT_INSTRUCTION,
    check_format,
    extract_sql_block,
    gold_is_ordered,
    results_match,
    reward,
    score,
)


def _load_corpus():
    # By path: verl's wheel installs a top-level ``tests`` package that shadows this directory.
    path = Path(__file__).resolve().parents[1] / "hostile" / "sql_corpus.py"
    spec = importlib.util.spec_from_file_location("mrtpo_hostile_sql_corpus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


corpus = _load_corpus()

SCHEMA = """
CREATE TABLE singer(singer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT, age INTEGER);
CREATE TABLE concert(concert_id INTEGER PRIMARY KEY, singer_id INTEGER REFERENCES singer(singer_id),
                     year INTEGER, venue TEXT, price REAL);
INSERT INTO singer VALUES (1, 'Ana', 'France', 30), (2, 'Bo', 'Norway', 25), (3, 'Cy', 'France', 41),
                          (4, 'Di', 'Japan', 25), (5, 'Ed', 'France', 52);
INSERT INTO concert VALUES (1, 1, 2019, 'Arena', 10.5), (2, 1, 2020, 'Dome', 20.0), (3, 2, 2020, 'Arena', 15.0),
                           (4, 3, 2021, 'Hall', 30.25), (5, 5, 2021, 'Dome', 20.0), (6, 5, 2022, 'Arena', 12.0);
"""

GOLDS = [
    "SELECT name, age FROM singer WHERE country = 'France'",
    "SELECT count(*) FROM singer",
    "SELECT country, count(*) FROM singer GROUP BY country ORDER BY count(*) DESC, country",
    "SELECT s.name, c.year FROM singer AS s JOIN concert AS c ON s.singer_id = c.singer_id WHERE c.venue = 'Arena'",
    "WITH fr AS (SELECT singer_id FROM singer WHERE country = 'France') "
    "SELECT avg(price) FROM concert WHERE singer_id IN (SELECT singer_id FROM fr)",
    "SELECT name FROM singer WHERE age > 40 UNION SELECT venue FROM concert WHERE year = 2020",
    "SELECT name FROM singer ORDER BY age DESC LIMIT 2",
]


def _make_db(path: Path, schema: str = SCHEMA) -> str:
    conn = sqlite3.connect(path)
    conn.executescript(schema)
    conn.commit()
    conn.close()
    return str(path)


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _answer(sql: str, tag: str = "sql") -> str:
    return f"Let me look at the schema.\n```{tag}\n{sql}\n```"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return _make_db(tmp_path_factory.mktemp("sqldb") / "concerts.sqlite")


def _gt(db: str, gold: str) -> dict:
    return {"db_path": db, "gold_sql": gold}


# ---------------------------------------------------------------------------------------------------
# Registration and contract


@pytest.mark.parametrize("source", ["text_to_sql", "spider", "bird", "chinook", "spider/dev"])
def test_registered_for_its_data_sources(source):
    assert get_task(source) is reward  # score, with a failing gold no verdict (tests/unit/test_no_verdict.py)


@pytest.mark.parametrize("gold", GOLDS)
def test_gold_answer_scores_one_on_every_reward(db, gold):
    res = score(_answer(gold), _gt(db, gold))
    assert res.scores == {"format": 1.0, "executable": 1.0, "execution_match": 1.0}, res.info
    assert res.contexts["format"].text == SQL_FORMAT_INSTRUCTION
    assert res.contexts["format"].placement == "prompt"
    assert (res.contexts["executable"].text, res.contexts["executable"].placement) == ("executed", "appended")
    assert (res.contexts["execution_match"].text, res.contexts["execution_match"].placement) == (gold, "appended")


def test_format_instruction_can_be_overridden_by_the_builder(db):
    text = "Reply with one SQLite SELECT in a ```sql block."
    res = score(_answer(GOLDS[0]), _gt(db, GOLDS[0]), {"format_instruction": text})
    assert res.contexts["format"] == Context(text, "prompt")


def test_malformed_ground_truth_is_a_clear_error(db):
    with pytest.raises(ValueError, match="gold_sql"):
        score(_answer("SELECT 1"), {"db_path": db})
    with pytest.raises(ValueError, match="dict"):
        score(_answer("SELECT 1"), ["not", "a", "dict"])


def test_ground_truth_as_json_string_and_non_string_responses(db):
    import json

    gold = GOLDS[1]
    res = score(_answer(gold), json.dumps(_gt(db, gold)))
    assert res.scores["execution_match"] == 1.0
    for response in (None, b"\xff\xfe```sql\nSELECT 1\n```", 12345):
        res = score(response, _gt(db, gold))
        assert all(math.isfinite(v) for v in res.scores.values())
    assert score(_answer(gold).encode(), _gt(db, gold)).scores["execution_match"] == 1.0


# ---------------------------------------------------------------------------------------------------
# One defect loses exactly the reward it concerns


GOLD = "SELECT name, age FROM singer WHERE country = 'France'"


def test_wrong_column_name_is_not_executable(db):
    res = score(_answer("SELECT name, agee FROM singer WHERE country = 'France'"), _gt(db, GOLD))
    assert res.scores == {"format": 1.0, "executable": 0.0, "execution_match": 0.0}
    assert res.contexts["executable"].text == "error: no such column: agee"


def test_query_with_other_rows_loses_only_execution_match(db):
    res = score(_answer("SELECT name, age FROM singer WHERE country = 'Norway'"), _gt(db, GOLD))
    assert res.scores == {"format": 1.0, "executable": 1.0, "execution_match": 0.0}
    assert res.contexts["executable"].text == "executed"


def test_two_statements_fail_format_and_are_not_run(db):
    # Documented: the sandbox runs one statement only, so the block is not executable either.
    res = score(_answer(GOLD + "; SELECT 1"), _gt(db, GOLD))
    assert res.scores == {"format": 0.0, "executable": 0.0, "execution_match": 0.0}
    assert "one statement" in res.info["format_error"]
    assert res.contexts["executable"].text.startswith("error: ")


def test_non_select_fails_format_and_is_refused(db):
    res = score(_answer("DELETE FROM singer WHERE country = 'Japan'"), _gt(db, GOLD))
    assert res.scores == {"format": 0.0, "executable": 0.0, "execution_match": 0.0}
    assert "not a SELECT" in res.info["format_error"]


def test_drop_table_parses_in_sqlglot_but_fails_format(db):
    assert check_format("DROP TABLE singer") is not None
    assert check_format("SELECT name FROM singer") is None
    res = score(_answer("DROP TABLE singer"), _gt(db, GOLD))
    assert res.scores["format"] == 0.0 and res.scores["executable"] == 0.0


def test_unparsable_sql_fails_format_and_execution(db):
    res = score(_answer("SELEC name FROM singer"), _gt(db, GOLD))
    assert res.scores == {"format": 0.0, "executable": 0.0, "execution_match": 0.0}
    assert res.info["format_error"].startswith("does not parse")


def test_read_only_non_select_keeps_its_execution_rewards(db):
    # Documented: executable / execution_match judge the block whatever format says. VALUES is not a
    # SELECT (format 0) but is a read-only statement that SQLite runs.
    res = score(_answer("VALUES (5)"), _gt(db, "SELECT count(*) FROM singer"))
    assert res.scores == {"format": 0.0, "executable": 1.0, "execution_match": 1.0}


@pytest.mark.parametrize(
    "response",
    [
        "SELECT name, age FROM singer WHERE country = 'France'",  # no fence at all
        "```sql\nSELECT name, age FROM singer WHERE country = 'France'",  # closing fence missing
        "```\nSELECT name, age FROM singer WHERE country = 'France'\n```",  # no sql tag
        "```python\nprint('hi')\n```",
    ],
)
def test_no_valid_block_scores_zero_everywhere(db, response):
    res = score(response, _gt(db, GOLD))
    assert res.scores == {"format": 0.0, "executable": 0.0, "execution_match": 0.0}
    assert res.contexts["executable"].text == "error: no SQL block"


def test_the_last_block_is_the_answer(db):
    wrong = "SELECT name FROM singer"
    assert score(_answer(wrong) + "\nFixed:\n" + _answer(GOLD), _gt(db, GOLD)).scores["execution_match"] == 1.0
    assert score(_answer(GOLD) + "\nFixed:\n" + _answer(wrong), _gt(db, GOLD)).scores["execution_match"] == 0.0
    # a truncated final block makes the answer invalid even after a complete one
    assert score(_answer(GOLD) + "\n```sql\nSELECT", _gt(db, GOLD)).scores["format"] == 0.0


def test_block_extraction_is_tolerant():
    assert extract_sql_block("```SQL\nSELECT 1\n```") == "SELECT 1"
    assert extract_sql_block("```sqlite\nSELECT 1\n```") == "SELECT 1"
    assert extract_sql_block("```sql SELECT 2```") == "SELECT 2"
    # fences pair up in order: a ```python block's closing fence never opens a block
    assert extract_sql_block("```python\nprint(1)\n```\n```sql\nSELECT 3\n```") == "SELECT 3"
    assert extract_sql_block("```sql\nSELECT 3\n```\n```python\nprint(1)\n```") == "SELECT 3"
    assert extract_sql_block("```sqlx\nSELECT 4\n```") is None
    assert extract_sql_block("```sql\nSELECT 5") is None


# ---------------------------------------------------------------------------------------------------
# Spider execution semantics


def test_column_order_is_free(db):
    res = score(_answer("SELECT age, name FROM singer WHERE country = 'France'"), _gt(db, GOLD))
    assert res.scores["execution_match"] == 1.0


def test_row_order_ignored_without_gold_order_by(db):
    res = score(_answer(GOLD + " ORDER BY age DESC"), _gt(db, GOLD))
    assert res.scores["execution_match"] == 1.0


def test_row_order_respected_when_gold_orders(db):
    gold = "SELECT name FROM singer ORDER BY age DESC LIMIT 3"
    ok = score(_answer("SELECT name FROM singer ORDER BY age DESC LIMIT 3"), _gt(db, gold))
    reversed_ = score(_answer("SELECT name FROM (SELECT name, age FROM singer ORDER BY age DESC LIMIT 3) "
                              "ORDER BY age ASC"), _gt(db, gold))
    assert ok.scores["execution_match"] == 1.0
    assert reversed_.scores == {"format": 1.0, "executable": 1.0, "execution_match": 0.0}


def test_duplicates_count(db):
    gold = "SELECT country FROM singer"
    assert score(_answer("SELECT DISTINCT country FROM singer"), _gt(db, gold)).scores["execution_match"] == 0.0
    assert score(_answer("SELECT country FROM singer"), _gt(db, gold)).scores["execution_match"] == 1.0


def test_int_and_float_compare_equal(db):
    gold = "SELECT count(*) FROM singer"
    assert score(_answer("SELECT count(*) * 1.0 FROM singer"), _gt(db, gold)).scores["execution_match"] == 1.0
    assert score(_answer("SELECT '5'"), _gt(db, gold)).scores["execution_match"] == 0.0  # text is not a number


def test_gold_order_rule_is_test_suites_substring_test():
    # test-suite: order_matters = 'order by' in gold.lower(), anywhere in the text
    assert gold_is_ordered("SELECT a FROM t ORDER BY a")
    assert gold_is_ordered("SELECT a FROM t UNION SELECT b FROM u order by 1")
    assert gold_is_ordered("SELECT a FROM (SELECT a FROM t ORDER BY a)")  # in a subquery: counts
    assert gold_is_ordered("SELECT a FROM t WHERE b IN (SELECT b FROM u ORDER BY b LIMIT 1)")
    assert gold_is_ordered("SELECT a FROM t WHERE note = 'sort order by date'")  # even in a literal
    assert not gold_is_ordered("SELECT a FROM t ORDER  BY a")  # two spaces: not the substring
    assert not gold_is_ordered("SELECT a FROM t ORDER\nBY a")
    assert not gold_is_ordered("SELECT max(a) FROM t")


def test_order_by_in_a_gold_subquery_makes_row_order_count(db):
    gold = "SELECT name FROM singer WHERE singer_id IN (SELECT singer_id FROM singer ORDER BY age LIMIT 3)"
    same_rows_other_order = "SELECT name FROM singer WHERE age <= 30 ORDER BY name DESC"
    in_gold_order = "SELECT name FROM singer WHERE age <= 30 ORDER BY singer_id"
    assert score(_answer(same_rows_other_order), _gt(db, gold)).scores["execution_match"] == 0.0
    assert score(_answer(in_gold_order), _gt(db, gold)).scores["execution_match"] == 1.0
    # without the ORDER BY in the gold the same rows in another order match
    unordered = "SELECT name FROM singer WHERE singer_id IN (SELECT singer_id FROM singer WHERE age <= 30)"
    assert score(_answer(same_rows_other_order), _gt(db, unordered)).scores["execution_match"] == 1.0


def test_results_match_permutations_and_bags():
    gold = [(1, 2, "a"), (2, 1, "b")]
    assert results_match([("a", 2, 1), ("b", 1, 2)], gold, ordered=False)[0]  # columns permuted
    assert results_match([("b", 1, 2), ("a", 2, 1)], gold, ordered=False)[0]
    assert not results_match([("b", 1, 2), ("a", 2, 1)], gold, ordered=True)[0]
    # same multiset per column, but the rows pair the values differently
    assert not results_match([(1, 1), (2, 2)], [(1, 2), (2, 1)], ordered=False)[0]
    assert results_match([(2, 1), (1, 2)], [(1, 2), (2, 1)], ordered=False)[0]
    assert not results_match([(1,), (1,)], [(1,), (2,)], ordered=False)[0]  # bag, not set
    assert not results_match([(1, 2)], [(1,)], ordered=False)[0]  # column count
    assert results_match([], [], ordered=True)[0]
    assert results_match([(None, 2)], [(None, 2)], ordered=False)[0]  # NULL equals NULL
    # many identical columns: the search stays bounded and still finds the match
    wide = [tuple([1] * 12 + [i]) for i in range(50)]
    assert results_match([tuple(reversed(r)) for r in wide], wide, ordered=False)[0]


def test_truncated_prediction_is_executable_but_does_not_match(db):
    extra = {"sql_max_rows": 3}
    res = score(_answer("SELECT name FROM singer"), _gt(db, "SELECT name FROM singer LIMIT 2"), extra)
    assert res.scores == {"format": 1.0, "executable": 1.0, "execution_match": 0.0}
    assert "cap" in res.info["match_detail"]


# ---------------------------------------------------------------------------------------------------
# Sandbox


@pytest.mark.parametrize("isolate", [True, False])
def test_sandbox_refuses_writes_in_and_out_of_process(tmp_path, isolate):
    path = _make_db(tmp_path / "w.sqlite")
    before = _sha256(path)
    for sql in ["DELETE FROM singer", "UPDATE singer SET age = 0", "DROP TABLE concert",
                f"ATTACH '{tmp_path / 'x.db'}' AS x", "PRAGMA user_version = 7", f"VACUUM INTO '{tmp_path / 'v.db'}'",
                "SELECT load_extension('libc.so.6')", "WITH d AS (SELECT 1) DELETE FROM singer",
                "SELECT 1; DELETE FROM singer", "CREATE TEMP TABLE t(x)", "BEGIN", "SELECT randomblob(8)"]:
        res = execute_sql(path, sql, isolate=isolate)
        assert res.error is not None, sql
    assert execute_sql(path, "SELECT count(*) FROM singer", isolate=isolate).rows == ((5,),)
    assert _sha256(path) == before
    assert sorted(os.listdir(tmp_path)) == ["w.sqlite"]


def test_sandbox_never_creates_a_missing_database(tmp_path):
    res = execute_sql(str(tmp_path / "missing.sqlite"), "SELECT 1")
    assert res.error is not None and "open" in res.error
    assert not (tmp_path / "missing.sqlite").exists()


def _timed_score(db, sql, extra=None):
    score(_answer("SELECT 1"), _gt(db, "SELECT 1"))  # warm the worker so start-up is not measured
    start = time.monotonic()
    res = score(_answer(sql), _gt(db, "SELECT count(*) FROM singer"), extra)
    return res, time.monotonic() - start


# The wall-clock bounds below leave seconds of slack for a loaded CI machine: without the time limit
# each of these queries runs for minutes (or forever), so the slack does not weaken the check.
TIMEOUT = {"sql_timeout_s": 0.5}
WALL_BOUND_S = 4.0


def test_runaway_recursive_cte_stops_within_limit(db):
    res, wall = _timed_score(db, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                                 "SELECT count(*) FROM c")  # the default limit (2 s)
    assert wall < DEFAULT_TIMEOUT_S + WALL_BOUND_S
    assert res.scores["executable"] == 0.0
    assert res.contexts["executable"].text == "error: query timed out"


def test_huge_cross_join_stops_within_limit(db):
    tables = ", ".join(f"singer s{i}" for i in range(14))
    res, wall = _timed_score(db, f"SELECT count(*) FROM {tables}", TIMEOUT)
    assert wall < WALL_BOUND_S
    assert res.scores["executable"] == 0.0
    assert res.contexts["executable"].text == "error: query timed out"


def test_uninterruptible_builtin_is_killed(db):
    # printf's %c loops once per unit of precision inside one VM instruction: the progress handler never
    # runs, so only the worker kill bounds it (in-process, four of these take tens of seconds).
    bomb = "SELECT printf('" + "%.*c" * 4 + "', " + ", ".join(["2000000000, 'x'"] * 4) + ")"
    res, wall = _timed_score(db, bomb, TIMEOUT)
    assert wall < WALL_BOUND_S
    assert res.contexts["executable"].text == "error: query timed out"
    assert execute_sql(db, "SELECT count(*) FROM singer").rows == ((5,),)  # a fresh worker serves on


def test_gold_cache_is_cheap_and_follows_file_changes(tmp_path):
    path = tmp_path / "g.sqlite"
    _make_db(path)
    first = execute_gold(str(path), "SELECT count(*) FROM singer")
    assert first.rows == ((5,),)
    assert execute_gold(str(path), "SELECT count(*) FROM singer") is first  # served from the cache
    replacement = tmp_path / "g2.sqlite"
    _make_db(replacement, SCHEMA + "INSERT INTO singer VALUES (6, 'Fa', 'Peru', 60);")
    os.replace(replacement, path)
    assert execute_gold(str(path), "SELECT count(*) FROM singer").rows == ((6,),)
    assert execute_gold(str(path), "SELECT nope FROM singer").error is not None


def test_failing_gold_is_reported_for_execution_match(db):
    res = score(_answer("SELECT name FROM singer"), _gt(db, "SELECT nope FROM singer"))
    assert res.scores == {"format": 1.0, "executable": 1.0, "execution_match": 0.0}
    assert "gold SQL failed" in res.info["errors"]["execution_match"]


# ---------------------------------------------------------------------------------------------------
# Hostile corpus and determinism


def test_hostile_corpus(tmp_path):
    path = _make_db(tmp_path / "h.sqlite")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    responses = corpus.sql_corpus(str(scratch))
    writes = corpus.write_attempts(str(scratch))
    assert len(responses) >= 200 and len(writes) >= 60
    assert set(writes) <= set(responses)
    before = _sha256(path)
    gt = _gt(path, "SELECT name FROM singer")
    extra = {"sql_timeout_s": 0.25}
    results = {}
    for response in responses:
        res = score(response, gt, extra)
        assert set(res.scores) == {"format", "executable", "execution_match"}
        assert all(math.isfinite(v) and v in (0.0, 1.0) for v in res.scores.values())
        assert len(res.contexts["executable"].text) <= 300
        assert "errors" not in res.info, res.info  # no internal error, no gold failure
        results[response] = res
    for response in writes:
        assert results[response].scores["executable"] == 0.0, response[:200]
        assert results[response].scores["execution_match"] == 0.0
    assert _sha256(path) == before
    assert sorted(os.listdir(tmp_path)) == ["h.sqlite", "scratch"]
    assert os.listdir(scratch) == []
    # the slow ones were stopped by the clock, not by luck
    for sql in corpus.slow_queries():
        assert results[f"```sql\n{sql}\n```"].contexts["executable"].text == "error: query timed out"


def test_concurrent_scoring_from_threads(db):
    # verl's reward loop calls verifiers from a thread pool: each call gets its own worker process
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(g, g) for g in GOLDS] * 4 + [(GOLDS[0], GOLDS[1])] * 4
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda j: score(_answer(j[0]), _gt(db, j[1])).scores["execution_match"], jobs))
    assert results == [1.0] * (len(GOLDS) * 4) + [0.0] * 4


def test_scoring_is_deterministic(db):
    responses = [_answer(g) for g in GOLDS] + [
        _answer("SELECT age, name FROM singer WHERE country = 'France'"),
        _answer("SELECT nope FROM singer"),
        _answer("SELECT 1; SELECT 2"),
        "no block here",
    ]
    responses += [r for r in corpus.sql_corpus()[:80] if len(r) < 100_000]
    gold = GOLDS[0]
    for response in responses:
        a, b = score(response, _gt(db, gold)), score(response, _gt(db, gold))
        assert (a.scores, a.contexts, a.info) == (b.scores, b.contexts, b.info)


# ---------------------------------------------------------------------------------------------------
# test-suite-sql-eval semantics: values, DISTINCT modes, query fixes


def test_values_compare_exactly_as_test_suite():
    assert results_match([(1.0,)], [(1,)], ordered=False)[0]  # 1 == 1.0
    assert not results_match([(0.1 + 0.2,)], [(0.3,)], ordered=False)[0]  # no float tolerance
    a = 1.234567890123
    b = a + 4e-13  # the same to 12 significant digits, different in the 13th
    assert f"{a:.12g}" == f"{b:.12g}" and a != b
    assert not results_match([(b,)], [(a,)], ordered=False)[0]
    assert results_match([(a,)], [(a,)], ordered=False)[0]
    assert not results_match([(2**53 + 1,)], [(float(2**53),)], ordered=False)[0]  # exact int/float compare
    assert not results_match([("1",)], [(1,)], ordered=False)[0]  # text is not a number
    assert not results_match([(b"a",)], [("a",)], ordered=False)[0]  # blob is not text


def test_floats_differing_in_the_13th_digit_do_not_match(db):
    gold = "SELECT 1.234567890123"
    assert score(_answer("SELECT 1.2345678901234"), _gt(db, gold)).scores["execution_match"] == 0.0
    assert score(_answer("SELECT 1.234567890123"), _gt(db, gold)).scores["execution_match"] == 1.0
    assert score(_answer("SELECT 0.1 + 0.2"), _gt(db, "SELECT 0.3")).scores["execution_match"] == 0.0


def test_quick_rejection_follows_test_suite():
    # test-suite first sorts each row's values by str(v) + str(type(v)); with 1.0 next to 10 the two
    # sides sort differently, so it rejects a pair that a column permutation would match
    assert not results_match([(1.0, 10)], [(1, 10)], ordered=False)[0]
    assert results_match([(1.0, 5)], [(1, 5)], ordered=False)[0]


def test_column_permutations_with_and_without_order():
    gold = [(1, "x", 2.5), (2, "y", 3.5), (3, "y", 3.5)]
    permuted = [(c, b, a) for a, b, c in gold]
    assert results_match(permuted, gold, ordered=True)[0]
    assert results_match(list(reversed(permuted)), gold, ordered=False)[0]
    assert not results_match(list(reversed(permuted)), gold, ordered=True)[0]
    # each predicted column holds a gold column's values, but no permutation gives the gold rows
    assert not results_match([(1, "y", 2.5), (2, "x", 3.5), (3, "y", 3.5)], gold, ordered=False)[0]


def test_duplicates_are_counted_in_both_directions():
    assert not results_match([(1,), (1,), (2,)], [(1,), (2,), (2,)], ordered=False)[0]
    assert not results_match([(1,), (2,)], [(1,), (1,), (2,)], ordered=False)[0]
    assert results_match([(2,), (1,), (1,)], [(1,), (1,), (2,)], ordered=False)[0]


@pytest.mark.parametrize(
    "gold, pred, keep, default",
    [
        ("SELECT DISTINCT country FROM singer", "SELECT country FROM singer", 0.0, 1.0),  # DISTINCT in gold
        ("SELECT country FROM singer", "SELECT DISTINCT country FROM singer", 0.0, 1.0),  # in the prediction
        ("SELECT DISTINCT country FROM singer", "SELECT DISTINCT country FROM singer", 1.0, 1.0),
        ("SELECT DISTINCT country FROM singer", "SELECT country FROM singer GROUP BY country", 1.0, 0.0),
        # inside an aggregate too: count(DISTINCT country) becomes count( country) = 5
        ("SELECT count(DISTINCT country) FROM singer", "SELECT count(*) FROM singer", 0.0, 1.0),
        ("SELECT count(DISTINCT country) FROM singer", "SELECT 3", 1.0, 0.0),
    ],
)
def test_sql_modes_keep_distinct_and_spider_default(db, gold, pred, keep, default):
    by_default = score(_answer(pred), _gt(db, gold))
    kept = score(_answer(pred), _gt(db, gold), {"sql_mode": "keep_distinct"})
    removed = score(_answer(pred), _gt(db, gold), {"sql_mode": "spider_default"})
    assert by_default.scores == kept.scores
    assert (kept.scores["execution_match"], removed.scores["execution_match"]) == (keep, default)
    assert kept.scores["executable"] == removed.scores["executable"] == 1.0  # executable: the block as written


def test_unknown_sql_mode_is_a_data_error(db):
    with pytest.raises(ValueError, match="sql_mode"):
        score(_answer("SELECT 1"), _gt(db, "SELECT 1"), {"sql_mode": "distinct"})


def test_remove_distinct_is_token_level():
    assert remove_distinct("SELECT DISTINCT a FROM t") == "SELECT  a FROM t"
    assert remove_distinct("select distinct(a), COUNT(Distinct b) from t") == "select (a), COUNT( b) from t"
    kept = ("SELECT 'distinct', \"distinct\", `distinct`, [distinct], distinct_id, x.distinctive "
            "/* distinct */ FROM t -- distinct")
    assert remove_distinct(kept) == kept
    # only the first statement, with the blanks and a -- comment after its ';' (as sqlparse splits)
    assert remove_distinct("SELECT DISTINCT a FROM t; SELECT DISTINCT b FROM u") == "SELECT  a FROM t; "
    assert remove_distinct("SELECT a FROM t;\nSELECT b") == "SELECT a FROM t;"
    assert remove_distinct("SELECT a FROM t; -- order by\nSELECT b") == "SELECT a FROM t; -- order by\n"
    assert remove_distinct("SELECT 'a;b' FROM t") == "SELECT 'a;b' FROM t"


def test_test_suite_query_fixes(db):
    gold = "SELECT name FROM singer WHERE age >= 41"
    res = score(_answer("SELECT name FROM singer WHERE age > = 41"), _gt(db, gold))
    # SQLite rejects '> =' (not executable as written); test-suite runs it as '>=' and it matches
    assert (res.scores["executable"], res.scores["execution_match"]) == (0.0, 1.0)
    res = score(_answer("SELECT YEAR(CURDATE()) - 1979"), _gt(db, "SELECT 41"))
    assert (res.scores["executable"], res.scores["execution_match"]) == (0.0, 1.0)
    res = score(_answer("SELECT name FROM singer WHERE age ! = 41 AND nme = 1"), _gt(db, gold))
    assert res.scores["execution_match"] == 0.0 and "prepared prediction fails" in res.info["match_detail"]


def test_prepare_queries_applies_fixes_then_mode():
    pred, gold = prepare_queries("SELECT DISTINCT a FROM t WHERE b > = 1", "SELECT DISTINCT a FROM t", "keep_distinct")
    assert (pred, gold) == ("SELECT DISTINCT a FROM t WHERE b >= 1", "SELECT DISTINCT a FROM t")
    pred, gold = prepare_queries("SELECT DISTINCT a FROM t WHERE b > = 1", "SELECT DISTINCT a FROM t", "spider_default")
    assert (pred, gold) == ("SELECT  a FROM t WHERE b >= 1", "SELECT  a FROM t")
    assert replace_cur_year("SELECT year(curdate ( ) ) - 1") == "SELECT 2020- 1"
