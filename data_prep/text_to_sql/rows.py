"""Text-to-SQL rows shared by every SQL builder: the prompt, the gold check and the one record loop.

A leaf module (it imports only :mod:`data_prep.common`): :mod:`data_prep.text_to_sql` (Chinook, the
CLI) and :mod:`data_prep.text_to_sql.sources` (Spider / BIRD releases) both build their rows here, so a
release question becomes the same row whichever way its file was found.

Row: the user message is the schema (``CREATE`` statements, optionally sample rows), the question,
BIRD's evidence as "External knowledge", then the verifier's format instruction; ground truth
``{"db_path", "gold_sql"}``; ``extra_info`` ``split``, ``index``, ``id``, ``db_id``, ``category``,
``difficulty`` (and ``sql_timeout_s`` when given, which the verifier reads).

:func:`release_rows` is the loop over Spider / BIRD question records: a record that is not an object,
lacks ``db_id`` / the question / the gold SQL, names a database that is not
``<db_root>/<db_id>/<db_id>.sqlite``, whose database cannot be read, or whose gold SQL does not score
1 on every reward is reported as ``SKIP file:line: reason`` and counted.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from data_prep.common import SkipLog, make_row, progress
from recipe.mrtpo.cluster.node_files import relative_to_root

__all__ = [
    "ABILITY",
    "FIELDS",
    "schema_text",
    "sql_prompt",
    "gold_response",
    "gold_check",
    "db_file",
    "text_field",
    "record_problem",
    "sql_row",
    "keep_row",
    "release_rows",
    "card_columns",
]

ABILITY = "text_to_sql"
SAMPLE_VALUE_CHARS = 60

#: (question field, gold field, evidence field or None) of each release's question records.
FIELDS = {
    "chinook": ("question", "gold_sql", None),
    "spider": ("question", "query", None),
    "bird": ("question", "SQL", "evidence"),
}


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


def text_field(record: dict, key: str) -> Optional[str]:
    value = record.get(key)
    return value if isinstance(value, str) and value.strip() else None


def record_problem(rec: Any, keys: Sequence[str]) -> Optional[str]:
    """Why a question record cannot become a row (not an object, a missing or empty text field), or None."""
    if not isinstance(rec, dict):
        return f"not an object: {type(rec).__name__}"
    missing = [k for k in keys if text_field(rec, k) is None]
    return f"missing field {missing[0]!r}" if missing else None


def sql_row(
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
    ground_truth = {"db_path": relative_to_root(db_path), "gold_sql": record[gold_key].strip()}
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


def keep_row(row: Optional[dict], check_gold: bool, skips: SkipLog, path, line) -> bool:
    if row is None:
        return False
    if check_gold:
        why = gold_check(row["data_source"], row["reward_model"]["ground_truth"], row["extra_info"])
        if why is not None:
            skips.skip(path, line, why)
            return False
    return True


def release_rows(
    source: str,
    records: Iterable[tuple[Any, int, Any]],
    db_root: Path,
    split: str,
    skips: SkipLog,
    sample_rows: int = 0,
    sql_timeout_s: Optional[float] = None,
    check_gold: bool = True,
    limit: Optional[int] = None,
    id_prefix: Optional[Mapping[str, str]] = None,
) -> tuple[list[dict], int]:
    """Spider / BIRD rows of ``(file or hub name, line or row number, record)`` triples; all get
    ``split``. Row ids are ``<source>-<prefix><question_id or line>`` with ``id_prefix[file]`` (default
    ""). ``limit`` stops after that many rows. Returns (rows, records read)."""
    if source not in ("spider", "bird"):
        raise ValueError(f"source must be 'spider' or 'bird', got {source!r}")
    db_root = Path(db_root).resolve()
    q_key, gold_key, _ = FIELDS[source]
    id_prefix = id_prefix or {}
    rows, read = [], 0
    for where, n, rec in progress(records, source):
        if limit is not None and len(rows) >= limit:
            break
        read += 1
        why = record_problem(rec, ("db_id", q_key, gold_key))
        if why is not None:
            skips.skip(where, n, why)
            continue
        db_id = rec["db_id"]
        path = db_file(db_root, db_id)
        if "/" in db_id or "\\" in db_id or db_id.startswith(".") or not path.is_file():
            skips.skip(where, n, f"missing database: {db_id!r} (no {path})")
            continue
        qid = rec.get("question_id")
        rid = f"{source}-{id_prefix.get(str(where), '')}{qid if isinstance(qid, int) else n}"
        try:
            row = sql_row(source, rec, path, sample_rows, split, rid, db_id, sql_timeout_s)
        except (sqlite3.Error, ValueError) as e:
            skips.skip(where, n, f"unreadable database: {db_id}: {e}")
            continue
        if keep_row(row, check_gold, skips, where, n):
            rows.append(row)
    return rows, read


def card_columns():
    """The data card's columns of text-to-SQL rows."""
    return [
        ("category", lambda r: r["extra_info"]["category"] or "-"),
        ("difficulty", lambda r: r["extra_info"]["difficulty"] or "-"),
    ]
