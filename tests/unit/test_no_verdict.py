"""No verdict, never a silent 0 (``recipe/mrtpo/cluster/verdict.py``): a verifier that could not judge a response through
no fault of the response raises, and the reward table takes the row out (``RewardTable.rows_out``).

- instruction following: NLTK data missing on the node (a real ``LookupError`` from NLTK, in a child interpreter
  pointed at an empty data folder), a dependency or an asset that does not load; a checker's own failure on odd
  text (``KeyError``, ``ValueError``) still scores 0, counted; the loose mode's passing variant still decides;
- text-to-SQL: a database that vanishes after the check, one that is not a database or is corrupt, read through
  the sandbox's worker; a gold query that fails (the training reward); the model's SQL failing still scores 0.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.mrtpo.cluster import node_files
from recipe.mrtpo.cluster.verdict import NO_VERDICT_MARK, NoVerdict, is_no_verdict
from recipe.mrtpo.rewards.reward_extras import ERROR_KEY, SCORES_KEY, read_reward_table
from recipe.mrtpo.rewards.reward_manager import score_sample
from recipe.mrtpo.tasks import if_isolation
from recipe.mrtpo.tasks import instruction_following as IF
from recipe.mrtpo.tasks import text_to_sql as SQL
from recipe.mrtpo.tasks.sql_executor import environment_fault as sql_environment_fault
from recipe.mrtpo.tasks.sql_sandbox import execute_sql

REPO = Path(__file__).resolve().parents[2]
GT_IF = {"instruction_id_list": ["length_constraints:number_sentences", "punctuation:no_comma"],
         "kwargs": [{"num_sentences": 2, "relation": "at least"}, {}]}
GOLD = "SELECT name FROM singer ORDER BY name"


def _db(path: Path) -> str:
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE singer (name TEXT, age INT); INSERT INTO singer VALUES ('a', 30), ('b', 40);")
    con.commit()
    con.close()
    return str(path)


def _answer(sql: str) -> str:
    return f"```sql\n{sql}\n```"


# ------------------------------------------------------------------ instruction following
def test_missing_nltk_data_is_no_verdict_not_a_zero(tmp_path):
    """NLTK's own ``LookupError`` (its data folder empty on this node): the verifier raises ``NoVerdict`` naming the
    constraint and the resource; today's verifier scored the constraint 0."""
    code = ("import json\nfrom recipe.mrtpo.tasks import instruction_following as IF\n"
            f"gt = {GT_IF!r}\n"
            "try:\n    r = IF.score('One. Two. Three.', gt)\n    print(json.dumps({'scores': r.scores}))\n"
            "except Exception as e:\n    print(json.dumps({'raised': type(e).__name__, 'message': str(e)}))\n")
    env = {**os.environ, "MRTPO_NLTK_DATA": str(tmp_path), "NLTK_DATA": str(tmp_path), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got.get("raised") == "NoVerdict", got
    assert is_no_verdict(got["message"]) and "number_sentences" in got["message"] and "punkt" in got["message"]
    assert "\n" not in got["message"]


class _Raising:
    def __init__(self, exc):
        self.exc = exc

    def check_following(self, text):
        raise self.exc


@pytest.mark.parametrize("exc, no_verdict", [
    (LookupError("Resource 'stopwords' not found."), True),  # NLTK's error: the node's
    (ModuleNotFoundError("No module named 'langdetect'"), True),
    (OSError(errno.ESTALE, "Stale file handle"), True),
    (KeyError("x"), False),  # LookupError's subclasses: a checker failing on odd text
    (IndexError("list index out of range"), False),
    (ValueError("bad"), False),
    (RecursionError("deep"), False),
])
def test_which_checker_errors_are_the_nodes(monkeypatch, exc, no_verdict):
    assert if_isolation.environment_fault(exc) is no_verdict
    monkeypatch.setattr(IF, "_build_checker", lambda iid, kwargs: (_Raising(exc), "a sentence"))
    gt = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    if no_verdict:
        with pytest.raises(NoVerdict) as err:
            IF.score("hello", gt)
        assert "punctuation:no_comma" in str(err.value) and type(exc).__name__ in str(err.value)
    else:  # the response's doing: scored 0, the error counted (today's behaviour)
        r = IF.score("hello", gt)
        assert r.scores == {"punctuation:no_comma": 0.0} and type(exc).__name__ in r.info["errors"]["punctuation:no_comma"]


class _PassesWithoutStars:
    """Passes only the loose variants without ``*``; the others raise the node's error."""

    def check_following(self, text):
        if "*" in text:
            raise LookupError("Resource 'punkt_tab' not found.")
        return True


def test_loose_mode_a_passing_variant_decides_and_a_fail_needs_every_variant(monkeypatch):
    monkeypatch.setattr(IF, "_build_checker", lambda iid, kwargs: (_PassesWithoutStars(), "a sentence"))
    gt = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    assert IF.score_loose("*hello*", gt).scores == {"punctuation:no_comma": 1.0}  # variant 2 passes: decided
    with pytest.raises(NoVerdict):
        IF.score("*hello*", gt)  # strict: the one check raised the node's error
    recorded = IF.evaluate("*hello*", gt, mode="strict")  # the evaluation's reading: recorded and counted, as before
    assert recorded.scores == {"punctuation:no_comma": 0.0} and "LookupError" in recorded.info["errors"]["punctuation:no_comma"]


def test_an_if_row_without_a_verdict_leaves_the_table(monkeypatch):
    monkeypatch.setattr(IF, "_build_checker", lambda iid, kwargs: (_Raising(LookupError("Resource x not found.")), "s"))
    bad = score_sample("ifeval", "hello", {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}, None)
    assert json.loads(bad["reward_extra_info"][SCORES_KEY]) == {}
    extras = [bad["reward_extra_info"], {SCORES_KEY: json.dumps({"punctuation:no_comma": 1.0}), ERROR_KEY: ""}]
    table = read_reward_table(extras, ["g", "g"])
    assert table.no_verdict == [True, False] and table.missing_files == [False, False]
    assert table.rows_out.tolist() == [True, False] and table.scores[0].isnan().all()  # absent, never 0


# ------------------------------------------------------------------ text-to-SQL
def test_a_database_that_vanishes_after_the_check_is_a_missing_file(tmp_path, monkeypatch):
    """The file is there at the ``isfile`` check and gone at the open: the row goes out as a missing file does
    (today: ``executable`` 0, as if the model's SQL failed)."""
    path = _db(tmp_path / "x.sqlite")
    real = SQL.execute_sql

    def vanishing(db_path, sql, **kw):
        if os.path.exists(path):
            os.remove(path)
        return real(db_path, sql, **kw)

    monkeypatch.setattr(SQL, "execute_sql", vanishing)
    with pytest.raises(FileNotFoundError) as err:
        SQL.reward(_answer(GOLD), {"db_path": path, "gold_sql": GOLD})
    assert node_files.is_missing_file(str(err.value)) and path in str(err.value)


@pytest.mark.parametrize("damage", ["not_a_database", "corrupt"])
def test_a_database_that_cannot_be_read_is_no_verdict_through_the_sandbox(tmp_path, damage):
    path = _db(tmp_path / "x.sqlite")
    if damage == "not_a_database":
        Path(path).write_bytes(b"\x00garbage" * 512)
    else:  # the header kept, every page after it overwritten
        con = sqlite3.connect(path)
        con.executescript("INSERT INTO singer SELECT name || 'x', age FROM singer;" * 8)
        con.commit()
        con.close()
        raw = bytearray(Path(path).read_bytes())
        raw[100:] = b"\xff" * (len(raw) - 100)
        Path(path).write_bytes(bytes(raw))
    result = execute_sql(path, "SELECT name FROM singer")  # the worker process: the flag crosses its wire
    assert not result.ok and result.environment, result
    with pytest.raises(NoVerdict) as err:
        SQL.score(_answer("SELECT name FROM singer"), {"db_path": path, "gold_sql": GOLD})
    assert path in str(err.value) and str(err.value).startswith(NO_VERDICT_MARK)


def test_the_models_sql_failing_still_scores_and_a_failing_gold_is_no_verdict_in_training(tmp_path):
    path = _db(tmp_path / "x.sqlite")
    r = SQL.reward(_answer("SELECT nope FROM singer"), {"db_path": path, "gold_sql": GOLD})
    assert r.scores == {"format": 1.0, "executable": 0.0, "execution_match": 0.0}  # the model's fault: scored
    assert not execute_sql(path, "SELECT nope FROM singer").environment
    bad_gold = {"db_path": path, "gold_sql": "SELECT nope FROM singer"}
    assert SQL.score(_answer(GOLD), bad_gold).scores["execution_match"] == 0.0  # the evaluation's test-suite rule
    with pytest.raises(NoVerdict) as err:
        SQL.reward(_answer(GOLD), bad_gold)
    assert "gold SQL failed" in str(err.value)
    out = score_sample("spider", _answer(GOLD), bad_gold, {})  # the reward manager: no scores, the row taken out
    assert read_reward_table([out["reward_extra_info"]], ["g"]).rows_out.tolist() == [True]


@pytest.mark.parametrize("make, env", [
    (lambda: OSError(errno.ESTALE, "Stale file handle"), True),
    (lambda: sqlite3.OperationalError("unable to open database file"), True),
    (lambda: sqlite3.OperationalError("disk I/O error"), True),
    (lambda: sqlite3.DatabaseError("database disk image is malformed"), True),
    (lambda: sqlite3.OperationalError("no such column: nope"), False),
    (lambda: sqlite3.OperationalError("interrupted"), False),
    (lambda: sqlite3.DatabaseError("not authorized"), False),
    (lambda: MemoryError(), False),
])
def test_which_executor_errors_are_the_environments(make, env):
    """By SQLite's primary code where the error carries one (3.11+), else by its message."""
    assert sql_environment_fault(make()) is env


def _coded(cls, message: str, code: int):
    e = cls(message)
    e.sqlite_errorcode = code
    return e


@pytest.mark.parametrize("code, env", [(266, True), (1802, True), (14, True), (26, True), (13, False), (3082, False),
                                       (7, False), (9, False), (1, False), (23, False)])
def test_sqlite_codes_the_node_owns_and_those_a_query_can_cause(code, env):
    """IOERR_READ and IOERR_FSTAT (how a stale NFS handle surfaces), CANTOPEN, NOTADB are the node's; FULL
    (temporary tables), IOERR_NOMEM, NOMEM, INTERRUPT (the time limit), ERROR, AUTH are a query's doing."""
    assert sql_environment_fault(_coded(sqlite3.OperationalError, "x", code)) is env


def test_sqlites_own_codes_classify_the_errors(tmp_path):
    path = _db(tmp_path / "x.sqlite")
    con = sqlite3.connect(path)
    with pytest.raises(sqlite3.Error) as err:
        con.execute("SELECT nope FROM singer")
    assert not sql_environment_fault(err.value)
    with pytest.raises(sqlite3.Error) as err:
        sqlite3.connect(f"file:{tmp_path / 'gone.sqlite'}?mode=ro", uri=True).execute("SELECT 1")
    assert sql_environment_fault(err.value)
