"""Spider and BIRD from their official archives -> verl parquet (data_source ``spider`` / ``bird``).

``python -m data_prep.text_to_sql <spider|bird> --input ARCHIVE --out-dir DIR [--part train|dev]``

``--input`` is the release as downloaded: its ``.zip`` (extracted under ``<out-dir>/_archive/``; the
databases must stay on disk, the rows point at them), the folder it was extracted to, or one question
file of it together with ``--db-root`` (the release's database folder). The databases are not on the
Hugging Face hub, so the questions may come from the hub (``--input xlangai/spider``) only together
with ``--db-root``. Everything is read through :func:`data_prep.public_sources.load_records`; local
question files go through :func:`data_prep.common.load_records` (line numbers in the skip report):
Spider's parsed ``sql`` field mixes integers, booleans, nulls and lists in one array, which Arrow,
and so ``datasets``, cannot load.

Layout found in the archive (searched recursively, the shallowest match wins):

- Spider (``spider.zip`` / ``spider_data.zip``): ``train`` = ``train_spider.json`` + ``train_others.json``,
  ``dev`` = ``dev.json``; databases ``database/<db_id>/<db_id>.sqlite``. Fields ``db_id``, ``question``,
  ``query``.
- BIRD (``train.zip``, ``dev.zip``): ``train`` = ``train.json`` with ``train_databases/``, ``dev`` =
  ``dev.json`` with ``dev_databases/``; the release nests the databases as ``train_databases.zip`` /
  ``dev_databases.zip`` inside the archive: they are extracted too. Fields ``db_id``, ``question``,
  ``evidence``, ``SQL``, ``question_id``, ``difficulty``.

Rows are those of :func:`data_prep.text_to_sql.rows.release_rows` (schema, question, BIRD's evidence, the
format instruction; ground truth ``{"db_path", "gold_sql"}``); every gold SQL is run through the
verifier and must score 1 on every reward (``--no-check-gold`` keeps failing ones). Skipped and
counted by reason: a missing field, a ``db_id`` whose database is missing, an unreadable database, a
failing gold. ``--part train`` writes ``train.parquet``, ``--part dev`` writes ``test.parquet`` (the
evaluation split). Row ids are ``<source>-<question_id or line>``, prefixed by the file's stem when a
part has several question files (Spider's train).
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path
from typing import Optional

from data_prep.common import SkipLog
from data_prep.public_sources import finish, is_local, load_or_exit
from data_prep.text_to_sql.rows import card_columns, release_rows

__all__ = ["LAYOUT", "SPLIT_OF_PART", "safe_extract", "locate", "id_prefixes", "add_arguments", "run"]

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


def id_prefixes(files: list[str]) -> dict[str, str]:
    """``{file: "<stem>-"}`` when several question files make one part (ids stay unique), else ``{}``."""
    return {str(f): f"{Path(f).stem}-" for f in files} if len(files) > 1 else {}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of the ``spider`` / ``bird`` commands of ``python -m data_prep.text_to_sql``."""
    ap.add_argument("--input", required=True, help="the release's .zip, its extracted folder, or one question file "
                    "(JSON array or JSON Lines) with --db-root; or a hub name of the questions with --db-root")
    ap.add_argument("--out-dir", type=Path, required=True, help="folder for train.parquet (train) / test.parquet (dev)")
    ap.add_argument("--part", choices=sorted(SPLIT_OF_PART), default="train",
                    help="train (default) or dev; dev rows get split 'test'")
    ap.add_argument("--db-root", type=Path, default=None,
                    help="folder of <db_id>/<db_id>.sqlite (default: found in the archive or folder)")
    ap.add_argument("--split", default=None, help="hub split of the questions (default: --part)")
    ap.add_argument("--limit", type=int, default=None, help="at most N rows (a quick subset)")
    ap.add_argument("--cache-dir", default=None, help="datasets cache folder (default: the library's)")


def run(args: argparse.Namespace) -> int:
    """Build one part of a release (module docstring) from parsed ``text_to_sql`` arguments."""
    split = SPLIT_OF_PART[args.part]
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
        inputs = [str(f) for f in files]
    else:
        inputs = [args.input]
    if db_root is None or not Path(db_root).is_dir():
        print(f"error: no database folder (give --db-root; the databases are not on the hub): {db_root}",
              file=sys.stderr)
        return 1
    skips, records, malformed = SkipLog(), [], 0
    for name in inputs:
        loaded = load_or_exit(name, skips, split=args.split or args.part, cache_dir=args.cache_dir)
        if loaded is None:
            return 1
        records += loaded[0]
        malformed += loaded[1]
    rows, read = release_rows(args.source, records, Path(db_root), split, skips, args.sample_rows,
                              args.sql_timeout_s, args.check_gold, args.limit, id_prefixes(inputs))
    for i, row in enumerate(rows):
        row["extra_info"]["index"] = i
    print(f"databases: {len({r['extra_info']['db_id'] for r in rows})}")
    return finish(f"{args.source} {args.part} ({args.input})", rows, args.out_dir, skips, read + malformed,
                  card_columns())
