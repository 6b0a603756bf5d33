"""Build every data set that needs nothing but this repository and its offline assets, into ``data/``.

``python -m data_prep.build_offline [--out-dir data] [--seed 0] [--only chinook,...]`` writes::

    <out-dir>/chinook/chinook.sqlite                  the Chinook database (from .assets/chinook)
    <out-dir>/chinook/{train,test}.parquet            246 questions, hash split per category (20% test)
    <out-dir>/instruction_following/{train,test}.parquet
                                                      multi-constraint prompts on data_prep/data/if_base_prompts.jsonl
    <out-dir>/instruction_following_passable/{train,test}.parquet
                                                      the same base prompts, constraints a random-token
                                                      model passes part of the time (tiny CPU runs)
    <out-dir>/ifeval/test.parquet                     IFEval's 541 prompts
    <out-dir>/ifbench/test.parquet                    IFBench's 300 prompts
    <out-dir>/bfcl/{train,test}.parquet               BFCL's 8 AST-checkable categories, hash split (30% test)
    <out-dir>/bfcl_multi_turn/{train,test}.parquet    BFCL's 4 multi-turn categories, split by scenario (50% test)
    <out-dir>/bfcl_multi_turn_offline/{train,test}.parquet
                                                      9 short multi-turn questions for CPU runs (6 train, 3 test)

with each builder's defaults (see ``python -m data_prep.<builder> --help``), printing each data card
and a final summary of files, row counts and sha256. One set failing (a missing asset) is reported
and the others are still built; the exit status is then 1. Parquet paths inside rows (the Chinook
``db_path``) are absolute, so a moved ``data/`` must be rebuilt. Spider, BIRD and xLAM-style sets
need local copies and are built with their own commands.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from data_prep import multi_turn as MTB
from data_prep.common import SkipLog, print_data_card, write_splits
from data_prep.instruction_following import build as IFB
from data_prep.text_to_sql import build as SQLB
from data_prep.tool_calling import build as TOOLB

__all__ = ["SETS", "build_all", "main"]


def _chinook(out: Path, seed: int, skips: SkipLog):
    rows, read = SQLB.build_chinook_rows(db_path=out / "chinook" / "chinook.sqlite", seed=seed, skips=skips)
    return "chinook", rows, read, SQLB.card_columns()


def _if_train(out: Path, seed: int, skips: SkipLog, constraints: Optional[str] = None, name="instruction_following"):
    path = IFB.DEFAULT_BASE_PROMPTS
    if not path.is_file():
        raise FileNotFoundError(f"base prompts file not found: {path}")
    base, read = IFB.load_base_prompts(path, skips)
    kwargs = {"max_constraints": 4} if constraints == "random_passable" else {}
    rows = IFB.build_training_rows(base, seed=seed, constraints=constraints, skips=skips,
                                   source_name=str(path), **kwargs)
    return name, rows, read, IFB.card_columns()


def _if_passable(out: Path, seed: int, skips: SkipLog):
    return _if_train(out, seed, skips, "random_passable", "instruction_following_passable")


def _ifeval(out: Path, seed: int, skips: SkipLog):
    rows, read = IFB.build_eval_rows("ifeval", skips=skips)
    return "ifeval", rows, read, IFB.card_columns()


def _ifbench(out: Path, seed: int, skips: SkipLog):
    rows, read = IFB.build_eval_rows("ifbench", skips=skips)
    return "ifbench", rows, read, IFB.card_columns()


def _bfcl(out: Path, seed: int, skips: SkipLog):
    rows, read = TOOLB.build_bfcl_rows(seed=seed, skips=skips)
    return "bfcl", rows, read, TOOLB.card_columns()


_MULTI_TURN: dict[int, tuple] = {}  # seed -> (rows, read, skipped): both multi-turn sets come from one build


def _multi_turn_rows(seed: int, skips: SkipLog) -> tuple[list[dict], int]:
    if seed not in _MULTI_TURN:
        own = SkipLog(stream=open(os.devnull, "w"))  # noqa: SIM115 - replayed into each caller's log below
        rows, read = MTB.build_rows(seed=seed, skips=own)
        _MULTI_TURN[seed] = (rows, read, own.entries)
    rows, read, skipped = _MULTI_TURN[seed]
    for entry in skipped:
        skips.skip(*entry)
    return copy.deepcopy(rows), read


def _bfcl_multi_turn(out: Path, seed: int, skips: SkipLog):
    rows, read = _multi_turn_rows(seed, skips)
    return "bfcl_multi_turn", rows, read, MTB.card_columns()


def _bfcl_multi_turn_offline(out: Path, seed: int, skips: SkipLog):
    rows, read = _multi_turn_rows(seed, skips)
    return "bfcl_multi_turn_offline", MTB.offline_rows(rows), read, MTB.card_columns()


#: name -> builder(out, seed, skips) -> (folder name, rows, records read, data-card columns)
SETS: dict[str, Callable] = {
    "chinook": _chinook,
    "instruction_following": _if_train,
    "instruction_following_passable": _if_passable,
    "ifeval": _ifeval,
    "ifbench": _ifbench,
    "bfcl": _bfcl,
    "bfcl_multi_turn": _bfcl_multi_turn,
    "bfcl_multi_turn_offline": _bfcl_multi_turn_offline,
}


def build_all(out: Path, seed: int = 0, only: Optional[list[str]] = None) -> tuple[dict, list[str]]:
    """Build the sets (all, or ``only``) into ``out``. Returns ({set: {split: (path, rows, sha256)}}, failed)."""
    out = Path(out).resolve()
    results, failed = {}, []
    for name, fn in SETS.items():
        if only and name not in only:
            continue
        skips = SkipLog()
        try:
            folder, rows, read, columns = fn(out, seed, skips)
            if not rows:
                raise ValueError("no rows built")
            written = write_splits(rows, out / folder)
        except Exception as e:  # one missing asset must not stop the other sets
            print(f"error: building {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc(limit=3, file=sys.stderr)
            failed.append(name)
            continue
        print_data_card(name, rows, columns, skips=skips, read=read, written=written)
        print()
        results[name] = written
    return results, failed


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.build_offline",
        description="Build every offline data set (Chinook, instruction following, IFEval, IFBench, BFCL, BFCL "
        "multi-turn) "
        "into one folder, printing a data card for each.",
        epilog=__doc__.split("writes::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out-dir", type=Path, default=Path("data"), help="output folder (default: data)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every split and constraint draw (default 0)")
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(SETS)}")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    if only and [s for s in only if s not in SETS]:
        print(f"error: unknown sets {[s for s in only if s not in SETS]}; choose from {list(SETS)}", file=sys.stderr)
        return 2
    results, failed = build_all(args.out_dir, args.seed, only)
    print("== summary ==")
    for name, written in results.items():
        for split, (path, n, digest) in sorted(written.items()):
            print(f"{name:<32} {split:<6} {n:>6} rows  {path}  sha256 {digest[:16]}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
