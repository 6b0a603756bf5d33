"""Shared pieces of the data builders: reading raw JSON, reporting skipped input, splitting, writing
parquet with deterministic bytes, progress bars and the printed data card.

Row format (verl's convention, as in verl's ``examples/data_preprocess/gsm8k.py``)::

    {"data_source": str,                      # selects the verifier (recipe.mrtpo.tasks.register_task)
     "prompt": [{"role": str, "content": str}, ...],
     "ability": str,
     "reward_model": {"style": "rule", "ground_truth": <the verifier's ground truth>},
     "extra_info": {"split": str, "index": int, ...}}

Malformed input is never dropped silently and never stops a build: every record that yields no row
is reported as ``SKIP <file>:<line>: <reason>`` on stderr and counted by :class:`SkipLog`; the data
card prints the counts per reason. :func:`iter_json_records` reads JSON Lines (one object a line;
a broken line is reported with its number and reading goes on) and JSON arrays (Spider, BIRD, xLAM;
each element is located by its line; after a broken element the reader resynchronises on the next
line that opens an element at the same indentation as the first one, else the rest of the file is
reported as skipped).

Splits are decided by :func:`hash_split`: within each stratum (a category, or everything), records
are ordered by ``sha256(f"{seed}:{key}")`` and the first ``round(fraction * n)`` go to the held-out
split. The rule depends only on the seed and the record keys, so it is stable when other records are
added or removed and reproducible on any machine.

:func:`write_parquet` writes a pyarrow table (no pandas metadata, fixed compression, rows in the
given order) to a temporary file and renames it into place: the same rows give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "REPO_ROOT",
    "DATA_SOURCES",
    "SkipLog",
    "iter_json_records",
    "load_records",
    "hash_unit",
    "hash_split",
    "fraction",
    "make_row",
    "write_parquet",
    "read_parquet_rows",
    "sha256_file",
    "progress",
    "data_card",
    "print_data_card",
    "write_splits",
]

REPO_ROOT = Path(__file__).resolve().parents[1]

#: The data sources the builders emit (each has a verifier registered under that name).
DATA_SOURCES = (
    "chinook",
    "spider",
    "bird",
    "instruction_following",
    "ifeval",
    "ifbench",
    "bfcl",
    "bfcl_multi_turn",
    "tool_calling",
    "toolrl",
)

PARQUET_COMPRESSION = "zstd"
PARQUET_COMPRESSION_LEVEL = 3


# --------------------------------------------------------------------------------------------------
# skipped input
# --------------------------------------------------------------------------------------------------


class SkipLog:
    """Collects input records that yield no row: ``(file, line, reason)``, printed as they come.

    ``max_printed`` bounds the lines printed (the count and the per-reason summary stay complete).
    ``reason`` should start with a short kind ("broken JSON", "missing field 'query'", "unknown db_id")
    followed by details after ``": "``; :meth:`by_kind` groups by that kind.
    """

    def __init__(self, stream=None, max_printed: int = 200):
        self.entries: list[tuple[str, int, str]] = []
        self.stream = stream
        self.max_printed = max_printed

    def skip(self, path: Any, line: int, reason: str) -> None:
        entry = (str(path), int(line), " ".join(str(reason).split()))
        self.entries.append(entry)
        if len(self.entries) <= self.max_printed:
            print(f"SKIP {entry[0]}:{entry[1]}: {entry[2]}", file=self.stream or sys.stderr)
        elif len(self.entries) == self.max_printed + 1:
            print("SKIP ... further skipped records are counted, not printed", file=self.stream or sys.stderr)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def count(self) -> int:
        return len(self.entries)

    def by_kind(self) -> dict[str, int]:
        kinds = Counter(reason.split(": ", 1)[0] for _, _, reason in self.entries)
        return dict(sorted(kinds.items()))


# --------------------------------------------------------------------------------------------------
# reading JSON / JSON Lines with line numbers
# --------------------------------------------------------------------------------------------------

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\r\n]*")


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def iter_json_records(path: Path | str, skips: SkipLog) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, record)`` for each record of a JSON Lines file or a top-level JSON array.

    The format is decided by the first non-blank character (``[``: array, else JSON Lines). Broken
    records are reported to ``skips`` with their line and skipped; a file that cannot be read at all
    is one skipped record at line 0. Records are yielded whatever their type: callers validate them.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        skips.skip(path, 0, f"unreadable file: {type(e).__name__}: {e}")
        return
    start = _WS.match(text).end()
    if text[start:start + 1] == "[":
        yield from _iter_array(path, text, start + 1, skips)
    else:
        yield from _iter_lines(path, text, skips)


def load_records(path: Path | str, skips: SkipLog) -> tuple[list[tuple[int, Any]], int]:
    """All ``(line, record)`` of a file and the number of unparseable records reported to ``skips``."""
    before = skips.count
    records = list(iter_json_records(path, skips))
    return records, skips.count - before


def _iter_lines(path: Path, text: str, skips: SkipLog) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            skips.skip(path, number, f"broken JSON: {e}")
            continue
        yield number, record


def _iter_array(path: Path, text: str, pos: int, skips: SkipLog) -> Iterator[tuple[int, Any]]:
    element_indent: Optional[str] = None
    n = len(text)
    while True:
        pos = _WS.match(text, pos).end()
        if pos >= n:
            skips.skip(path, _line_of(text, pos), "broken JSON: the array is not closed")
            return
        if text[pos] == "]":
            return
        if text[pos] == ",":
            pos += 1
            continue
        if element_indent is None:
            line_start = text.rfind("\n", 0, pos) + 1
            prefix = text[line_start:pos]
            element_indent = prefix if line_start > 0 and not prefix.strip() else ""
        try:
            record, end = _DECODER.raw_decode(text, pos)
        except ValueError as e:
            line = _line_of(text, pos)
            resume = _resync(text, pos, element_indent)
            if resume is None:
                skips.skip(path, line, f"broken JSON: {e}; no later element found, rest of the file skipped")
                return
            skips.skip(path, line, f"broken JSON: {e}; resumed at line {_line_of(text, resume)}")
            pos = resume
            continue
        yield _line_of(text, pos), record
        pos = end


def _resync(text: str, pos: int, indent: Optional[str]) -> Optional[int]:
    """Start of the next line after ``pos`` that opens an element (``{`` or ``[``) at ``indent``."""
    if not indent:  # one-line arrays or unindented elements: no reliable boundary
        return None
    pattern = re.compile(r"\n" + re.escape(indent) + r"[\{\[]")
    m = pattern.search(text, pos + 1)
    return None if m is None else m.start() + 1 + len(indent)


# --------------------------------------------------------------------------------------------------
# splitting
# --------------------------------------------------------------------------------------------------


def hash_unit(seed: Any, key: Any) -> float:
    """A number in [0, 1) from ``sha256(f"{seed}:{key}")`` (the split rule's ordering key)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def hash_split(
    keys: Sequence[str],
    seed: Any,
    fraction: float,
    strata: Optional[Sequence[str]] = None,
    held_out: str = "test",
    rest: str = "train",
) -> list[str]:
    """The split of each key: within each stratum, keys ordered by :func:`hash_unit` (ties by key);
    the first ``round(fraction * n)`` are ``held_out``, the others ``rest``. Keys must be unique."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"split fraction must be in [0, 1], got {fraction}")
    if len(set(keys)) != len(keys):
        dup = [k for k, c in Counter(keys).items() if c > 1][:5]
        raise ValueError(f"split keys must be unique, duplicates: {dup}")
    strata = list(strata) if strata is not None else [""] * len(keys)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(strata):
        groups[s].append(i)
    out = [rest] * len(keys)
    for s in sorted(groups):
        idx = sorted(groups[s], key=lambda i: (hash_unit(seed, keys[i]), keys[i]))
        for i in idx[: int(round(fraction * len(idx)))]:
            out[i] = held_out
    return out


def fraction(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return value


# --------------------------------------------------------------------------------------------------
# rows and parquet
# --------------------------------------------------------------------------------------------------


def make_row(data_source: str, prompt: list[dict], ability: str, ground_truth: Any, extra_info: dict) -> dict:
    """One row in verl's layout (see the module docstring)."""
    if data_source not in DATA_SOURCES:
        raise ValueError(f"unknown data_source {data_source!r}; known: {DATA_SOURCES}")
    for m in prompt:
        if set(m) != {"role", "content"} or not isinstance(m["content"], str):
            raise ValueError(f"prompt messages must be {{'role', 'content': str}}, got {m!r:.200}")
    return {
        "data_source": data_source,
        "prompt": prompt,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_parquet(rows: list[dict], path: Path | str) -> str:
    """Write ``rows`` to ``path`` (parents created, atomic rename); return the file's sha256.

    Deterministic bytes for the same rows and pyarrow version: a pyarrow table built from the rows in
    their order (no pandas index metadata), zstd level 3, default row-group size.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError(f"no rows to write to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(
            table,
            tmp,
            compression=PARQUET_COMPRESSION,
            compression_level=PARQUET_COMPRESSION_LEVEL,
        )
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return sha256_file(path)


def read_parquet_rows(path: Path | str) -> list[dict]:
    """The rows of a parquet file as pandas hands them to verl (numpy arrays inside), as dicts."""
    import pandas as pd

    return pd.read_parquet(path).to_dict(orient="records")


def write_splits(rows: list[dict], out_dir: Path | str, name: str = "") -> dict[str, tuple[Path, int, str]]:
    """Write ``rows`` grouped by ``extra_info["split"]`` to ``out_dir/<split>.parquet`` (``name`` prefix
    optional); ``extra_info["index"]`` is renumbered 0..n-1 within each split. Returns
    ``{split: (path, rows, sha256)}``."""
    out_dir = Path(out_dir)
    by_split: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_split[row["extra_info"]["split"]].append(row)
    written = {}
    for split in sorted(by_split):
        part = by_split[split]
        for i, row in enumerate(part):
            row["extra_info"]["index"] = i
        path = out_dir / f"{name}{split}.parquet"
        written[split] = (path, len(part), write_parquet(part, path))
    return written


# --------------------------------------------------------------------------------------------------
# progress and data card
# --------------------------------------------------------------------------------------------------


def progress(iterable: Iterable, desc: str, total: Optional[int] = None, enabled: Optional[bool] = None):
    """A tqdm progress bar on stderr (shown on a terminal; ``enabled`` forces it on or off)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, disable=None if enabled is None else not enabled,
                dynamic_ncols=True, leave=False)


def _natural(key: str) -> tuple:
    """Sort key: leading integers numerically ("2" < "10" < "10+"), then text."""
    m = re.match(r"(\d+)", key)
    return (0, int(m.group(1)), key) if m else (1, 0, key)


def data_card(
    title: str,
    rows: list[dict],
    columns: Sequence[tuple[str, Callable[[dict], Any]]] = (),
    skips: Optional[SkipLog] = None,
    read: Optional[int] = None,
    written: Optional[dict] = None,
) -> str:
    """A plain-text data card: rows per split, then for each ``(name, fn)`` in ``columns`` the counts of
    ``fn(row)`` per split (``fn`` may return a list: each element counts), then skipped input."""
    splits = sorted({r["extra_info"]["split"] for r in rows})
    lines = [f"== data card: {title} ==", f"rows: {len(rows)}  " + "  ".join(
        f"{s}: {sum(r['extra_info']['split'] == s for r in rows)}" for s in splits)]
    if read is not None:
        lines.append(f"input records: {read}  -> rows: {len(rows)}, skipped: {skips.count if skips else 0}")
    for name, fn in columns:
        counts: dict[str, Counter] = {s: Counter() for s in splits}
        for r in rows:
            v = fn(r)
            for x in v if isinstance(v, (list, tuple)) else [v]:
                counts[r["extra_info"]["split"]][str(x)] += 1
        keys = sorted(set().union(*counts.values()), key=_natural)
        if not keys:
            continue
        width = max(len(name), *(len(k) for k in keys))
        lines.append("")
        lines.append(f"{name:<{width}}  " + "  ".join(f"{s:>7}" for s in splits))
        for k in keys:
            lines.append(f"{k:<{width}}  " + "  ".join(f"{counts[s][k]:>7}" for s in splits))
    if skips is not None:
        lines.append("")
        lines.append(f"skipped input records: {skips.count}")
        for kind, c in skips.by_kind().items():
            lines.append(f"  {c:>6}  {kind}")
    if written:
        lines.append("")
        for _split, (path, n, digest) in sorted(written.items()):
            lines.append(f"wrote {path} ({n} rows, sha256 {digest[:16]})")
    return "\n".join(lines)


def print_data_card(*args, **kwargs) -> str:
    """Print :func:`data_card` to stdout and return it."""
    card = data_card(*args, **kwargs)
    print(card, flush=True)
    return card
