"""Text-to-SQL builder: the shipped Chinook set and Spider / BIRD (local copies) -> verl parquet.

Each row's single user message shows the database schema (the ``CREATE`` statements stored in
``sqlite_master``, optionally ``--sample-rows N`` rows of every table), the question, BIRD's
``evidence`` as "External knowledge" when it is non-empty, and the output-format instruction
:data:`recipe.mrtpo.tasks.text_to_sql.SQL_FORMAT_INSTRUCTION` verbatim (the ``format`` reward's Z_k).
``reward_model.ground_truth`` is the verifier's ``{"db_path": <path>, "gold_sql": str}``, the
path relative to the data root (``$MRTPO_DATA_ROOT``, default ``data/``) when the database lies under it;
``extra_info`` holds ``split``, ``index``, ``id``, ``db_id``, ``category``, ``difficulty`` (and
``sql_timeout_s`` with ``--sql-timeout-s``, which the verifier reads). The rows are built by
:mod:`data_prep.text_to_sql.rows`, for every source.

Sources (the command):

- ``chinook``: ``data_prep/data/chinook_questions.jsonl`` (``{"id", "question", "gold_sql", "category",
  "difficulty"}``) on the Chinook database, built from the fixture when missing
  (:func:`data_prep.chinook_db.ensure_chinook_db`; default ``<out-dir>/chinook.sqlite``). Split rule:
  within each category, questions ordered by ``sha256(f"{seed}:{id}")``; the first
  ``round(test_fraction * n)`` are ``test``, the rest ``train`` (:func:`data_prep.common.hash_split`).
- ``spider`` / ``bird``: the official release (its ``.zip``, the extracted folder, or one question file
  with ``--db-root``), ``--part train`` or ``dev`` (:mod:`data_prep.text_to_sql.sources`).

Gold check (on by default, ``--no-check-gold`` turns it off): the gold answer (the gold SQL in a
```sql block) is scored by the verifier and the row is kept only if it scores 1 on ``format``,
``executable`` and ``execution_match`` (a gold query that fails, times out or that sqlglot cannot
parse would give a row no response can win). A record with a missing field, a ``db_id`` without
database (no ``<db_root>/<db_id>/<db_id>.sqlite``), a broken JSON line or a failing gold is reported
as ``SKIP file:line: reason`` and counted in the data card.

CLI::

    python -m data_prep.text_to_sql chinook --out-dir data/chinook [--seed 0] [--test-fraction 0.2]
    python -m data_prep.text_to_sql spider --input spider_data.zip --out-dir data/spider
    python -m data_prep.text_to_sql spider --input spider_data.zip --part dev --out-dir data/spider
    python -m data_prep.text_to_sql bird --input dev.zip --part dev --out-dir data/bird
    python -m data_prep.text_to_sql spider --input spider/dev.json --db-root spider/database --part dev \\
        --out-dir data/spider
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from data_prep.chinook_db import ChinookFixtureError, ensure_chinook_db
from data_prep.common import (
    REPO_ROOT,
    SkipLog,
    fraction,
    hash_split,
    load_records,
    print_data_card,
    progress,
    write_splits,
)
from data_prep.text_to_sql import sources as sql_sources
from data_prep.text_to_sql.rows import (  # noqa: F401 - the row API, re-exported for callers of this module
    ABILITY,
    FIELDS,
    card_columns,
    db_file,
    gold_check,
    gold_response,
    keep_row,
    record_problem,
    release_rows,
    schema_text,
    sql_prompt,
    sql_row,
    text_field,
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
    "build_parser",
    "main",
]

SOURCES = ("chinook", "spider", "bird")
DEFAULT_CHINOOK_QUESTIONS = REPO_ROOT / "data_prep" / "data" / "chinook_questions.jsonl"
DEFAULT_CHINOOK_TEST_FRACTION = 0.2


# --------------------------------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------------------------------


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
    skips = skips if skips is not None else SkipLog()
    db_path = Path(ensure_chinook_db(db_path)).resolve()
    raw, read = load_records(questions, skips)
    records, seen = [], set()
    for line, rec in raw:
        if limit is not None and len(records) >= limit:
            break
        read += 1
        why = record_problem(rec, ("id", "question", "gold_sql"))
        if why is not None:
            skips.skip(questions, line, why)
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
        row = sql_row("chinook", rec, db_path, sample_rows, split, rec["id"], "chinook", sql_timeout_s)
        if keep_row(row, check_gold, skips, questions, line):
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
    """Spider or BIRD rows from local question files (:func:`data_prep.text_to_sql.rows.release_rows`); all get
    ``split``. Returns (rows, records read, malformed ones included)."""
    skips = skips if skips is not None else SkipLog()
    records, malformed = [], 0
    for qfile in question_files:
        numbered, bad = load_records(qfile, skips)
        records += [(str(qfile), line, rec) for line, rec in numbered]
        malformed += bad
    rows, read = release_rows(source, records, db_root, split, skips, sample_rows, sql_timeout_s, check_gold,
                              limit, sql_sources.id_prefixes([str(q) for q in question_files]))
    return rows, read + malformed


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def _common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sample-rows", type=int, default=0, help="rows per table shown under the schema (default 0)")
    p.add_argument("--no-check-gold", dest="check_gold", action="store_false",
                   help="keep rows whose gold SQL does not score 1 on every reward (default: skip them)")
    p.add_argument("--sql-timeout-s", type=float, default=None,
                   help="per-query time limit in seconds, stored as extra_info['sql_timeout_s'] and used by the gold "
                   "check and the verifier (default: the sandbox's 2 s; BIRD's slow gold queries may need more)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.text_to_sql",
        description="Build text-to-SQL parquet (verl layout) from the Chinook set or the Spider / BIRD release. "
        "Writes <out-dir>/<split>.parquet and prints a data card.",
        epilog=__doc__.split("CLI::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="source", required=True, metavar="{" + ",".join(SOURCES) + "}")
    ch = sub.add_parser("chinook", help="the shipped Chinook questions on the Chinook database (offline)")
    ch.add_argument("--out-dir", type=Path, required=True, help="folder for train.parquet / test.parquet")
    ch.add_argument("--questions", type=Path, default=DEFAULT_CHINOOK_QUESTIONS,
                    help="JSON Lines of {'id', 'question', 'gold_sql', 'category', 'difficulty'} "
                    "(default data_prep/data/chinook_questions.jsonl)")
    ch.add_argument("--db", type=Path, default=None,
                    help="the SQLite file, built from the fixture if missing (default <out-dir>/chinook.sqlite)")
    ch.add_argument("--seed", type=int, default=0, help="seed of the train/test hash split (default 0)")
    ch.add_argument("--test-fraction", type=fraction, default=DEFAULT_CHINOOK_TEST_FRACTION,
                    help=f"test share per category (default {DEFAULT_CHINOOK_TEST_FRACTION})")
    ch.add_argument("--limit", type=int, default=None, help="read at most this many valid records (a quick subset)")
    _common_arguments(ch)
    for source, title in (("spider", "Spider"), ("bird", "BIRD")):
        p = sub.add_parser(source, help=f"{title} from its official release (zip, folder or question file)")
        sql_sources.add_arguments(p)
        _common_arguments(p)
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.source != "chinook":
        return sql_sources.run(args)
    skips = SkipLog()
    db = args.db or args.out_dir / "chinook.sqlite"
    try:
        rows, read = build_chinook_rows(args.questions, db, args.seed, args.test_fraction, args.sample_rows,
                                        args.check_gold, skips, args.limit, args.sql_timeout_s)
    except ChinookFixtureError as e:
        print(f"error: cannot build the Chinook database: {e}", file=sys.stderr)
        return 1
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
