"""The per-item cache of an evaluation (``OUT.partial``) and the atomic writer of its result file.

``OUT.partial`` holds one JSON line per scored item, after a header line with the generation settings
(the fingerprint); a torn last line (an interrupted write) is ignored, and a cache made with other
generation settings is refused.

Public names: :func:`read_partial`, :class:`PartialWriter`, :func:`write_json`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from recipe.mrtpo.tools.eval.items import EvalError

__all__ = ["read_partial", "PartialWriter", "write_json"]

_PARTIAL_FORMAT = 1


def read_partial(path: Path, fingerprint: dict) -> dict[str, dict]:
    """Records of ``path`` by item id (a later line wins). A torn last line is ignored; a header with
    other generation settings raises ValueError."""
    records: dict[str, dict] = {}
    if not path.is_file():
        return records
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            print(f"warning: {path}:{n}: unreadable line ignored (interrupted write?)", file=sys.stderr)
            continue
        if "header" in obj:
            old = obj["header"].get("fingerprint", {})
            diff = {k: (old.get(k), fingerprint[k]) for k in fingerprint if old.get(k) != fingerprint[k]}
            if diff:
                raise EvalError(
                    f"{path} was made with other generation settings {diff} (cached, now); "
                    "pass --overwrite to start afresh or choose another --out"
                )
        elif isinstance(obj.get("id"), str):
            records[obj["id"]] = obj
    return records


class PartialWriter:
    """Appends records to OUT.partial, one JSON line each, flushed per batch. The file is opened (and a fresh
    one gets its header) at the first record: a run that scores nothing leaves no OUT.partial behind."""

    def __init__(self, path: Path, fingerprint: dict):
        self.path, self.fingerprint, self.f = path, fingerprint, None

    def _open(self):
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not path.is_file() or path.stat().st_size == 0
        self.f = open(path, "a", encoding="utf-8")
        if not fresh:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    self.f.write("\n")  # after a torn line
        else:
            self.f.write(json.dumps({"header": {"format": _PARTIAL_FORMAT, "fingerprint": self.fingerprint}}) + "\n")

    def write(self, obj: dict) -> None:
        if self.f is None:
            self._open()
        self.f.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")

    def flush(self) -> None:
        if self.f is not None:
            self.f.flush()
            os.fsync(self.f.fileno())

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
