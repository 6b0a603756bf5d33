"""Loading the public training sets by hub name or from local files.

:func:`load_records` takes ``NAME_OR_PATH``:

- an existing local file (``.json`` / ``.jsonl`` / ``.parquet``; a JSON file may be a top-level array, as
  Spider, BIRD, xLAM, ToolACE and ToolRL ship theirs) or a folder (every such file under it, in sorted
  order, e.g. a downloaded hub snapshot ``data/train-00000-of-00001.parquet``; JSON and parquet are
  not mixed);
- otherwise a hub name (``allenai/RLVR-IFeval``), read with ``datasets.load_dataset(name, split=...)``.
  That needs a machine that reaches the Hugging Face hub (or its cache); offline, ``datasets`` raises
  and the builders print the error and exit 1. A name that looks like a path (starts with ``.`` or
  ``/``, or ends in a data-file suffix) but does not exist is an error, never a hub look-up.

Local JSON and JSON Lines files are read with :func:`data_prep.common.load_records`, as every other
builder reads its input: a malformed record (a broken line, a broken array element, a record that is
not an object) is reported as ``SKIP <file>:<line>: <reason>``, counted, and the rest of the file is
still read. Local parquet files and hub datasets are read through ``datasets`` (their records are
numbered from 1 in file or split order, reported as ``SKIP <file or name>:<row>: <reason>``). Either
way the records come as ``(file or hub name, line or row, record)`` triples, in sorted file order and
file order within a file (deterministic for the same files).

Every builder of the public sets (:mod:`data_prep.instruction_following.sources`, :mod:`data_prep.tool_calling.sources`,
:mod:`data_prep.text_to_sql.sources`) uses :func:`load_records` and :func:`finish`, which splits by the
seeded hash rule, writes ``<out-dir>/<split>.parquet`` and prints the data card (rows, skipped
records by reason).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from data_prep.common import SkipLog, hash_split, print_data_card, write_splits
from data_prep.common import load_records as common_load_records

__all__ = ["DATA_SUFFIXES", "is_local", "local_files", "load_records", "assign_splits", "finish"]

#: suffix -> ``datasets`` packaged builder
DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def is_local(name_or_path: str) -> bool:
    """Whether ``name_or_path`` is meant as a local path (exists, or looks like one)."""
    p = Path(name_or_path)
    if p.exists():
        return True
    s = str(name_or_path)
    return s.startswith((".", "/", "~")) or p.suffix.lower() in DATA_SUFFIXES or s.endswith(".zip")


def local_files(path: Path) -> tuple[str, list[str]]:
    """(``datasets`` builder, sorted data files) of a local file or folder; ValueError when there are
    none or when JSON and parquet are mixed."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    files = [path] if path.is_file() else sorted(
        f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in DATA_SUFFIXES
        and not any(part.startswith(".") for part in f.relative_to(path).parts))
    if not files:
        raise ValueError(f"no .json/.jsonl/.parquet file in {path}")
    builders = {DATA_SUFFIXES.get(f.suffix.lower()) for f in files}
    if None in builders:
        raise ValueError(f"unsupported file type {files[0].suffix!r} (use .json, .jsonl or .parquet): {files[0]}")
    if len(builders) > 1:
        raise ValueError(f"{path} mixes JSON and parquet files; point --input at one of them")
    return builders.pop(), [str(f) for f in files]


def load_records(
    name_or_path: str,
    skips: SkipLog,
    split: str = "train",
    cache_dir: Optional[str] = None,
    limit: Optional[int] = None,
    name: Optional[str] = None,
) -> tuple[list[tuple[str, int, dict]], int]:
    """``(where, line or row, record)`` of a hub dataset or of local files in the same schema (module
    docstring), at most ``limit`` of them, and the number of malformed records reported to ``skips``."""
    before = skips.count
    out: list[tuple[str, int, dict]] = []
    if is_local(name_or_path):
        builder, files = local_files(Path(name_or_path))
        for f in files:
            if limit is not None and len(out) >= limit:
                break
            if builder == "json":
                for line, rec in common_load_records(f, skips)[0]:
                    if isinstance(rec, dict):
                        out.append((f, line, rec))
                    else:
                        skips.skip(f, line, f"not an object: {type(rec).__name__}")
            else:
                out += [(f, n, rec) for n, rec in enumerate(_dataset_records("parquet", f, split, cache_dir), 1)]
    else:
        out = [(name_or_path, n, rec) for n, rec in
               enumerate(_dataset_records(name_or_path, None, split, cache_dir, name, limit), start=1)]
    return (out if limit is None else out[: max(0, int(limit))]), skips.count - before


def _dataset_records(builder: str, data_file: Optional[str], split: str, cache_dir: Optional[str],
                     name: Optional[str] = None, limit: Optional[int] = None) -> list[dict]:
    import datasets

    kwargs: dict[str, Any] = {"cache_dir": str(cache_dir)} if cache_dir else {}
    if data_file is not None:
        ds = datasets.load_dataset(builder, data_files={"train": [data_file]}, split="train", **kwargs)
    else:
        ds = datasets.load_dataset(builder, name, split=split, **kwargs)
    n = len(ds) if limit is None else min(len(ds), max(0, int(limit)))
    return [dict(ds[i]) for i in range(n)]


def assign_splits(rows: list[dict], seed: int, test_fraction: float, strata: Optional[Sequence[str]] = None) -> None:
    """Set ``extra_info["split"]`` of every row by :func:`data_prep.common.hash_split` on its id."""
    splits = hash_split([r["extra_info"]["id"] for r in rows], seed, test_fraction, strata=strata)
    for row, split in zip(rows, splits):
        row["extra_info"]["split"] = split


def finish(
    title: str,
    rows: list[dict],
    out_dir: Path,
    skips: SkipLog,
    read: int,
    columns: Sequence[tuple[str, Callable[[dict], Any]]] = (),
) -> int:
    """Write the splits and print the data card; exit status 1 when no row was built."""
    if not rows:
        print_data_card(title, rows, skips=skips, read=read)
        print("error: no rows built", file=sys.stderr)
        return 1
    written = write_splits(rows, out_dir)
    print_data_card(title, rows, columns, skips=skips, read=read, written=written)
    return 0


def load_or_exit(name_or_path: str, skips: SkipLog, **kwargs) -> Optional[tuple[list[tuple[str, int, dict]], int]]:
    """:func:`load_records`, or None after printing why the input cannot be read."""
    try:
        return load_records(name_or_path, skips, **kwargs)
    except Exception as e:  # noqa: BLE001 - any reader/hub failure is reported, not a traceback
        where = "local input" if is_local(name_or_path) else "hub dataset (is the machine online?)"
        print(f"error: cannot read {where} {name_or_path!r}: {type(e).__name__}: {str(e)[:500]}", file=sys.stderr)
        return None
