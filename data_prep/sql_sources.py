"""Spider and BIRD from their official archives -> verl parquet (data_source ``spider`` / ``bird``).

``python -m data_prep.text_to_sql <spider|bird> --input ARCHIVE --out-dir DIR [--part train|dev]``

``--input`` is the release as downloaded: its ``.zip`` (extracted under ``<out-dir>/_archive/``; the
databases must stay on disk, the rows point at them) or the folder it was extracted to. The databases
are not on the Hugging Face hub, so the questions may come from the hub (``--input xlangai/spider``)
only together with ``--db-root`` (the release's database folder), read through
:func:`data_prep.public_sources.load_records`. The archive's own question files are read with
:func:`data_prep.common.load_records` (line numbers in the skip report): Spider's parsed ``sql`` field
mixes integers, booleans, nulls and lists in one array, which Arrow, and so ``datasets``, cannot load.

Layout found in the archive (searched recursively, the shallowest match wins):

- Spider (``spider.zip`` / ``spider_data.zip``): ``train`` = ``train_spider.json`` + ``train_others.json``,
  ``dev`` = ``dev.json``; databases ``database/<db_id>/<db_id>.sqlite``. Fields ``db_id``, ``question``,
  ``query``.
- BIRD (``train.zip``, ``dev.zip``): ``train`` = ``train.json`` with ``train_databases/``, ``dev`` =
  ``dev.json`` with ``dev_databases/``; the release nests the databases as ``train_databases.zip`` /
  ``dev_databases.zip`` inside the archive: they are extracted too. Fields ``db_id``, ``question``,
  ``evidence``, ``SQL``, ``question_id``, ``difficulty``.

Rows are those of :mod:`data_prep.text_to_sql` (schema, question, BIRD's evidence, the format
instruction; ground truth ``{"db_path", "gold_sql"}``); every gold SQL is run through the verifier
and must score 1 on every reward. Skipped and counted by reason: a missing field, a ``db_id`` whose
database is missing, an unreadable database, a failing gold. ``--part train`` writes ``train.parquet``,
``--part dev`` writes ``test.parquet`` (the evaluation split).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import zipfile
from pathlib import Path
from typing import Optional

from data_prep.common import SkipLog, load_records
from data_prep.public_sources import finish, is_local, load_or_exit

__all__ = ["LAYOUT", "safe_extract", "locate", "build_rows", "main"]

#: source -> part -> (question files, database folder name)
LAYOUT = {
    "spider": {"train": (("train_spider.json", "train_others.json"), "database"), "dev": (("dev.json",), "database")},
    "bird": {"train": (("train.json",), "train_databases"), "dev": (("dev.json",), "dev_databases")},
}
SPLIT_OF_PART = {"train": "train", "dev": "test"}


def _extract(archive: Path, dest: Path) -> None:
    dest = dest.resolve()
    with zipfile.ZipFile(archive) as zf:
        for member in zf.infolist():
            target = (dest / member.filename).resolve()
            if target != dest and dest not in target.parents:
                raise ValueError(f"{archive}: member escapes the folder: {member.filename!r}")
        zf.extractall(dest)


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract a zip into ``dest`` (members escaping it are refused), then the ``*_databases.zip`` found
    inside next to themselves (once: a ``.extracted`` marker is left)."""
    _extract(archive, dest)
    for inner in sorted(Path(dest).rglob("*_databases.zip")):
        done = inner.with_suffix(".extracted")
        if not done.exists():
            _extract(inner, inner.parent)
            done.write_text("ok\n")


def _shallowest(root: Path, name: str, want_dir: bool) -> Optional[Path]:
    hits = [p for p in root.rglob(name) if (p.is_dir() if want_dir else p.is_file()) and "__MACOSX" not in p.parts]
    return min(hits, key=lambda p: (len(p.parts), str(p))) if hits else None


def locate(root: Path, source: str, part: str) -> tuple[list[Path], Optional[Path]]:
    """(question files, database folder) of ``part`` under ``root``; FileNotFoundError when absent."""
    names, db_name = LAYOUT[source][part]
    files = [f for f in (_shallowest(root, n, False) for n in names) if f is not None]
    if not files:
        raise FileNotFoundError(f"no {' / '.join(names)} under {root} (is it the {source} release?)")
    return files, _shallowest(root, db_name, True)


def build_rows(source: str, records: list[tuple[int, dict]], db_root: Path, split: str, skips: SkipLog, name: str,
               sample_rows: int = 0, sql_timeout_s: Optional[float] = None, id_prefix: str = "") -> list[dict]:
    """Rows of the ``(line or row number, record)`` pairs whose database exists and whose gold SQL passes."""
    from data_prep.text_to_sql import FIELDS, _keep, _sql_row, db_file

    q_key, gold_key, _ = FIELDS[source]
    rows = []
    for n, rec in records:
        if not isinstance(rec, dict):
            skips.skip(name, n, f"not an object: {type(rec).__name__}")
            continue
        missing = [k for k in ("db_id", q_key, gold_key) if not (isinstance(rec.get(k), str) and rec[k].strip())]
        if missing:
            skips.skip(name, n, f"missing field {missing[0]!r}")
            continue
        db_id = rec["db_id"]
        path = db_file(db_root, db_id)
        if "/" in db_id or "\\" in db_id or db_id.startswith(".") or not path.is_file():
            skips.skip(name, n, f"missing database: {db_id!r} (no {path})")
            continue
        qid = rec.get("question_id")
        rid = f"{source}-{id_prefix}{qid if isinstance(qid, int) else n}"
        try:
            row = _sql_row(source, rec, path, sample_rows, split, rid, db_id, sql_timeout_s)
        except (sqlite3.Error, ValueError) as e:
            skips.skip(name, n, f"unreadable database: {db_id}: {e}")
            continue
        if _keep(row, True, skips, name, n):
            rows.append(row)
    return rows


def build_parser(prog: str = "python -m data_prep.text_to_sql") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="Build Spider / BIRD parquet from the official archive "
                                 "(zip or extracted folder). Prints a data card.")
    ap.add_argument("source", choices=sorted(LAYOUT))
    ap.add_argument("--input", required=True, help="the release's .zip or extracted folder; or a hub name of the "
                    "questions together with --db-root")
    ap.add_argument("--out-dir", type=Path, required=True, help="folder for train.parquet (train) / test.parquet (dev)")
    ap.add_argument("--part", choices=sorted(SPLIT_OF_PART), default="train", help="train (default) or dev")
    ap.add_argument("--db-root", type=Path, default=None, help="database folder (default: found in the archive)")
    ap.add_argument("--split", default=None, help="hub split of the questions (default: --part)")
    ap.add_argument("--sample-rows", type=int, default=0, help="rows per table shown under the schema (default 0)")
    ap.add_argument("--sql-timeout", type=float, default=None, help="per-query seconds (extra_info['sql_timeout_s'])")
    ap.add_argument("--limit", type=int, default=None, help="read only the first N questions of each file")
    ap.add_argument("--cache-dir", default=None, help="datasets cache folder (default: the library's)")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    split = SPLIT_OF_PART[args.part]
    inputs: list[tuple[str, str]]  # (name, id prefix)
    db_root = args.db_root
    if is_local(args.input):
        root = Path(args.input).expanduser()
        if not root.exists():
            print(f"error: no such file or folder: {root}", file=sys.stderr)
            return 1
        try:
            if root.is_file() and root.suffix.lower() == ".zip":
                dest = args.out_dir / "_archive"
                safe_extract(root, dest)
                root = dest
            files, found_db = (locate(root, args.source, args.part) if root.is_dir() else ([root], None))
        except (FileNotFoundError, ValueError, zipfile.BadZipFile) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        db_root = db_root or found_db
        inputs = [(str(f), f"{f.stem}-" if len(files) > 1 else "") for f in files]
    else:
        inputs = [(args.input, "")]
    if db_root is None or not Path(db_root).is_dir():
        print(f"error: no database folder (give --db-root; the databases are not on the hub): {db_root}",
              file=sys.stderr)
        return 1
    skips, rows, read = SkipLog(), [], 0
    for name, prefix in inputs:
        if is_local(name):
            numbered, read_bad = load_records(name, skips)
            numbered = numbered[: args.limit] if args.limit is not None else numbered
            read += read_bad
        else:
            records = load_or_exit(name, split=args.split or args.part, cache_dir=args.cache_dir, limit=args.limit)
            if records is None:
                return 1
            numbered = list(enumerate(records, start=1))
        read += len(numbered)
        rows += build_rows(args.source, numbered, Path(db_root).resolve(), split, skips, name, args.sample_rows,
                           args.sql_timeout, prefix)
    for i, row in enumerate(rows):
        row["extra_info"]["index"] = i
    print(f"databases: {len({r['extra_info']['db_id'] for r in rows})}")
    return finish(f"{args.source} {args.part} ({args.input})", rows, args.out_dir, skips, read,
                  [("difficulty", lambda r: r["extra_info"]["difficulty"] or "-")])


if __name__ == "__main__":
    raise SystemExit(main())
