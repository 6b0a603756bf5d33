"""Text-to-SQL builder: Spider / BIRD (local copies) and the shipped Chinook set -> verl parquet.

Each row's single user message shows the database schema (the ``CREATE`` statements stored in
``sqlite_master``, optionally ``--sample-rows N`` rows of every table), the question, BIRD's
``evidence`` as "External knowledge" when it is non-empty, and the output-format instruction
:data:`recipe.mrtpo.tasks.text_to_sql.SQL_FORMAT_INSTRUCTION` verbatim (the ``format`` reward's Z_k).
``reward_model.ground_truth`` is the verifier's ``{"db_path": <absolute path>, "gold_sql": str}``;
``extra_info`` holds ``split``, ``index``, ``id``, ``db_id``, ``category``, ``difficulty`` (and
``sql_timeout_s`` with ``--sql-timeout``, which the verifier reads).

Sources (``--source``):

- ``chinook``: ``data_prep/chinook_questions.jsonl`` (``{"id", "question", "gold_sql", "category",
  "difficulty"}``) on the Chinook database, built from the fixture when missing
  (:func:`data_prep.chinook_db.ensure_chinook_db`; default ``<out-dir>/chinook.sqlite``). Split rule:
  within each category, questions ordered by ``sha256(f"{seed}:{id}")``; the first
  ``round(test_fraction * n)`` are ``test``, the rest ``train`` (:func:`data_prep.common.hash_split`).
- ``spider``: question files of the official release (JSON arrays of ``{"db_id", "question", "query"}``:
  ``train_spider.json``, ``train_others.json``, ``dev.json``) with ``--db-root`` holding
  ``<db_id>/<db_id>.sqlite`` (the release's ``database/``); every row gets ``--split``.
- ``bird``: ``train.json`` / ``dev.json`` (``{"db_id", "question", "evidence", "SQL", "question_id"?,
  "difficulty"?}``) with ``--db-root`` = ``train_databases/`` or ``dev_databases/``.

Gold check (on by default, ``--no-check-gold`` turns it off): the gold answer (the gold SQL in a
```sql block) is scored by the verifier and the row is kept only if it scores 1 on ``format``,
``executable`` and ``execution_match`` (a gold query that fails, times out or that sqlglot cannot
parse would give a row no response can win). A record with a missing field, an unknown ``db_id``
(no ``<db_root>/<db_id>/<db_id>.sqlite``), a broken JSON line or a failing gold is reported as
``SKIP file:line: reason`` and counted in the data card.

CLI::

    python -m data_prep.text_to_sql --source chinook --out-dir data/chinook [--seed 0] [--test-fraction 0.2]
    python -m data_prep.text_to_sql --source spider --questions spider/train_spider.json spider/train_others.json \\
        --db-root spider/database --split train --out-dir data/spider
    python -m data_prep.text_to_sql --source bird --questions bird/dev/dev.json \\
        --db-root bird/dev/dev_databases --split test --out-dir data/bird
"""

from __future__ import annotations

import argparse
import functools
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from data_prep.common import (
    REPO_ROOT,
    SkipLog,
    fraction,
    hash_split,
    load_records,
    make_row,
    print_data_card,
    progress,
    write_splits,
)

__all__ = [
    "ABILITY",
    "DEFAULT_CHINOOK_QUESTIONS",
    "SOURCES",
    "schema_text",
    "sql_prompt",
    "gold_response",
    "gold_check",
    "db_file",
    "build_chinook_rows",
    "build_release_rows",
    "main",
]

ABILITY = "text_to_sql"
SOURCES = ("chinook", "spider", "bird")
DEFAULT_CHINOOK_QUESTIONS = REPO_ROOT / "data_prep" / "chinook_questions.jsonl"
DEFAULT_CHINOOK_TEST_FRACTION = 0.2
SAMPLE_VALUE_CHARS = 60

#: (question field, gold field, evidence field or None) of each release's question records.
FIELDS = {
    "chinook": ("question", "gold_sql", None),
    "spider": ("question", "query", None),
    "bird": ("question", "SQL", "evidence"),
}


# --------------------------------------------------------------------------------------------------
# prompt
# --------------------------------------------------------------------------------------------------


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<blob {len(bytes(value))} bytes>"
    text = " ".join(str(value).split())
    return text if len(text) <= SAMPLE_VALUE_CHARS else text[: SAMPLE_VALUE_CHARS - 3] + "..."


@functools.lru_cache(maxsize=256)
def schema_text(db_path: str, sample_rows: int = 0) -> str:
    """The ``CREATE`` statements of the tables and views in ``sqlite_master`` (creation order), each
    followed, when ``sample_rows`` > 0, by up to that many rows in a comment::

        /*
        3 example rows:
        SELECT * FROM "album" LIMIT 3;
        id | artist | title
        1 | 1 | For Those About To Rock We Salute You
        */
    """
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        objects = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view') AND sql IS NOT NULL "
            "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
        if not objects:
            raise ValueError(f"{db_path}: no tables")
        parts = []
        for kind, name, sql in objects:
            block = sql.strip().rstrip(";") + ";"
            if sample_rows > 0 and kind == "table":
                quoted = '"' + name.replace('"', '""') + '"'
                cur = conn.execute(f"SELECT * FROM {quoted} LIMIT {int(sample_rows)}")
                header = " | ".join(d[0] for d in cur.description)
                body = [" | ".join(_cell(v) for v in row) for row in cur.fetchall()]
                block += (
                    f"\n/*\n{len(body)} example rows:\nSELECT * FROM {quoted} LIMIT {int(sample_rows)};\n"
                    + "\n".join([header, *body]) + "\n*/"
                )
            parts.append(block)
        return "\n\n".join(parts)
    finally:
        conn.close()


def sql_prompt(schema: str, question: str, evidence: Optional[str] = None) -> str:
    """The user message: schema, question, optional external knowledge, the format instruction."""
    from recipe.mrtpo.tasks.text_to_sql import SQL_FORMAT_INSTRUCTION

    parts = ["Database schema (SQLite):", schema, f"Question: {question.strip()}"]
    if evidence and evidence.strip():
        parts.append(f"External knowledge: {evidence.strip()}")
    parts.append(SQL_FORMAT_INSTRUCTION)
    return "\n\n".join(parts)


def gold_response(gold_sql: str) -> str:
    """The gold answer as a model should write it: the gold SQL in a ```sql block."""
    return f"```sql\n{gold_sql.strip()}\n```"


def gold_check(data_source: str, ground_truth: dict, extra_info: Optional[dict] = None) -> Optional[str]:
    """None if the gold answer scores 1 on every reward of the verifier, else why not."""
    from recipe.mrtpo.tasks.text_to_sql import score

    try:
        result = score(gold_response(ground_truth["gold_sql"]), ground_truth, extra_info)
    except ValueError as e:
        return f"bad ground truth: {e}"
    failed = {k: v for k, v in result.scores.items() if v != 1.0}
    if not failed:
        return None
    detail = result.info.get("errors") or result.info.get("format_error") or result.info.get("exec_error") \
        or result.info.get("match_detail") or ""
    return f"gold SQL fails the verifier: {sorted(failed)} {detail}"[:300]


def db_file(db_root: Path, db_id: str) -> Path:
    """``<db_root>/<db_id>/<db_id>.sqlite`` (the Spider and BIRD layout)."""
    return Path(db_root) / db_id / f"{db_id}.sqlite"


# --------------------------------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------------------------------


def _text_field(record: dict, key: str) -> Optional[str]:
    value = record.get(key)
    return value if isinstance(value, str) and value.strip() else None


def _sql_row(
    source: str,
    record: dict,
    db_path: Path,
    sample_rows: int,
    split: str,
    rid: str,
    db_id: str,
    sql_timeout_s: Optional[float] = None,
) -> dict:
    q_key, gold_key, ev_key = FIELDS[source]
    evidence = record.get(ev_key) if ev_key else None
    prompt = sql_prompt(schema_text(str(db_path), sample_rows), record[q_key],
                        evidence if isinstance(evidence, str) else None)
    ground_truth = {"db_path": str(db_path), "gold_sql": record[gold_key].strip()}
    extra = {
        "split": split,
        "index": 0,  # renumbered per split on writing
        "id": rid,
        "db_id": db_id,
        "category": str(record.get("category") or ""),
        "difficulty": str(record.get("difficulty") or ""),
    }
    if sql_timeout_s is not None:
        extra["sql_timeout_s"] = float(sql_timeout_s)
    return make_row(source, [{"role": "user", "content": prompt}], ABILITY, ground_truth, extra)


def _keep(row: Optional[dict], check_gold: bool, skips: SkipLog, path, line) -> bool:
    if row is None:
        return False
    if check_gold:
        why = gold_check(row["data_source"], row["reward_model"]["ground_truth"], row["extra_info"])
        if why is not None:
            skips.skip(path, line, why)
            return False
    return True


def build_chinook_rows(
    questions: Path = DEFAULT_CHINOOK_QUESTIONS,
    db_path: Optional[Path] = None,
    seed: int = 0,
    test_fraction: float = DEFAULT_CHINOOK_TEST_FRACTION,
    sample_rows: int = 0,
    check_gold: bool = True,
    skips: Optional[SkipLog] = None,
    limit: Optional[int] = None,
    sql_timeout_s: Optional[float] = None,
) -> tuple[list[dict], int]:
    """Chinook rows (split by the seeded hash rule, stratified by category) and the records read."""
    from data_prep.chinook_db import ensure_chinook_db

    skips = skips if skips is not None else SkipLog()
    db_path = Path(ensure_chinook_db(db_path)).resolve()
    raw, read = load_records(questions, skips)
    records, seen = [], set()
    for line, rec in raw:
        if limit is not None and len(records) >= limit:
            break
        read += 1
        if not isinstance(rec, dict):
            skips.skip(questions, line, f"not an object: {type(rec).__name__}")
            continue
        missing = [k for k in ("id", "question", "gold_sql") if _text_field(rec, k) is None]
        if missing:
            skips.skip(questions, line, f"missing field {missing[0]!r}")
            continue
        if rec["id"] in seen:
            skips.skip(questions, line, f"duplicate id: {rec['id']}")
            continue
        seen.add(rec["id"])
        records.append((line, rec))
    splits = hash_split([r["id"] for _, r in records], seed, test_fraction,
                        strata=[str(r.get("category") or "") for _, r in records])
    rows = []
    for (line, rec), split in progress(list(zip(records, splits)), "chinook"):
        row = _sql_row("chinook", rec, db_path, sample_rows, split, rec["id"], "chinook", sql_timeout_s)
        if _keep(row, check_gold, skips, questions, line):
            rows.append(row)
    return rows, read


def build_release_rows(
    source: str,
    question_files: Sequence[Path],
    db_root: Path,
    split: str,
    sample_rows: int = 0,
    check_gold: bool = True,
    skips: Optional[SkipLog] = None,
    limit: Optional[int] = None,
    sql_timeout_s: Optional[float] = None,
) -> tuple[list[dict], int]:
    """Spider or BIRD rows from the release's question files; all get ``split``. Returns (rows, read)."""
    if source not in ("spider", "bird"):
        raise ValueError(f"source must be 'spider' or 'bird', got {source!r}")
    skips = skips if skips is not None else SkipLog()
    db_root = Path(db_root).resolve()
    q_key, gold_key, _ = FIELDS[source]
    rows, read = [], 0
    for qfile in question_files:
        qfile = Path(qfile)
        records, unparsed = load_records(qfile, skips)
        read += unparsed
        for position, (line, rec) in enumerate(progress(records, f"{source}:{qfile.name}")):
            if limit is not None and len(rows) >= limit:
                break
            read += 1
            if not isinstance(rec, dict):
                skips.skip(qfile, line, f"not an object: {type(rec).__name__}")
                continue
            missing = [k for k in ("db_id", q_key, gold_key) if _text_field(rec, k) is None]
            if missing:
                skips.skip(qfile, line, f"missing field {missing[0]!r}")
                continue
            db_id = rec["db_id"]
            path = db_file(db_root, db_id)
            if "/" in db_id or "\\" in db_id or db_id.startswith(".") or not path.is_file():
                skips.skip(qfile, line, f"unknown db_id: {db_id!r} (no {path})")
                continue
            qid = rec.get("question_id")
            rid = f"{source}-{qfile.stem}-{qid if isinstance(qid, int) else position}"
            try:
                row = _sql_row(source, rec, path, sample_rows, split, rid, db_id, sql_timeout_s)
            except (sqlite3.Error, ValueError) as e:
                skips.skip(qfile, line, f"unreadable database: {db_id}: {e}")
                continue
            if _keep(row, check_gold, skips, qfile, line):
                rows.append(row)
    return rows, read


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def card_columns():
    return [
        ("category", lambda r: r["extra_info"]["category"] or "-"),
        ("difficulty", lambda r: r["extra_info"]["difficulty"] or "-"),
    ]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.text_to_sql",
        description="Build text-to-SQL parquet (verl layout) from the Chinook set or a local Spider/BIRD copy. "
        "Writes <out-dir>/<split>.parquet and prints a data card.",
        epilog=__doc__.split("CLI::", 1)[1] if "CLI::" in __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--source", choices=SOURCES, required=True)
    ap.add_argument("--out-dir", type=Path, required=True, help="folder for <split>.parquet")
    ap.add_argument("--questions", type=Path, nargs="+", default=None,
                    help="question file(s): JSON array or JSON Lines "
                    "(chinook default: data_prep/chinook_questions.jsonl)")
    ap.add_argument("--db-root", type=Path, default=None, help="spider/bird: folder of <db_id>/<db_id>.sqlite")
    ap.add_argument("--db", type=Path, default=None,
                    help="chinook: the SQLite file, built from the fixture if missing "
                    "(default <out-dir>/chinook.sqlite)")
    ap.add_argument("--split", default="train", help="spider/bird: split name of every row (default train)")
    ap.add_argument("--seed", type=int, default=0, help="chinook: seed of the train/test hash split (default 0)")
    ap.add_argument("--test-fraction", type=fraction, default=DEFAULT_CHINOOK_TEST_FRACTION,
                    help=f"chinook: test share per category (default {DEFAULT_CHINOOK_TEST_FRACTION})")
    ap.add_argument("--sample-rows", type=int, default=0, help="rows per table shown under the schema (default 0)")
    ap.add_argument("--no-check-gold", dest="check_gold", action="store_false",
                    help="keep rows whose gold SQL does not score 1 on every reward (default: skip them)")
    ap.add_argument("--sql-timeout", type=float, default=None,
                    help="per-query time limit in seconds, stored as extra_info['sql_timeout_s'] and used by the gold "
                    "check and the verifier (default: the sandbox's 2 s; BIRD's slow gold queries may need more)")
    ap.add_argument("--limit", type=int, default=None, help="read at most this many valid records (a quick subset)")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("spider", "bird"):  # official archives: `<source> --input ARCHIVE --out-dir DIR`
        from data_prep.sql_sources import main as archive_main

        return archive_main(argv)
    args = build_parser().parse_args(argv)
    skips = SkipLog()
    if args.source == "chinook":
        questions = args.questions[0] if args.questions else DEFAULT_CHINOOK_QUESTIONS
        db = args.db or args.out_dir / "chinook.sqlite"
        from data_prep.chinook_db import ChinookFixtureError

        try:
            rows, read = build_chinook_rows(questions, db, args.seed, args.test_fraction, args.sample_rows,
                                            args.check_gold, skips, args.limit, args.sql_timeout)
        except ChinookFixtureError as e:
            print(f"error: cannot build the Chinook database: {e}", file=sys.stderr)
            return 1
    else:
        if not args.questions or args.db_root is None:
            print(f"error: --source {args.source} needs --questions and --db-root", file=sys.stderr)
            return 2
        rows, read = build_release_rows(args.source, args.questions, args.db_root, args.split, args.sample_rows,
                                        args.check_gold, skips, args.limit, args.sql_timeout)
    if not rows:
        print_data_card(args.source, rows, skips=skips, read=read)
        print("error: no rows built", file=sys.stderr)
        return 1
    written = write_splits(rows, args.out_dir)
    print(f"databases: {len({r['extra_info']['db_id'] for r in rows})}")
    print_data_card(args.source, rows, card_columns(), skips=skips, read=read, written=written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
