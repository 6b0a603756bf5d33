"""Instruction-following builder: multi-constraint training prompts and the IFEval / IFBench sets.

Training prompts (``train``): each base prompt (``data_prep/data/if_base_prompts.jsonl`` by default: JSON
Lines with at least ``{"id", "prompt"}``) gives ``--samples-per-prompt`` rows. A row draws its number
of constraints k uniformly from ``[--min-constraints, --max-constraints]`` (default 1 to 5), then k
mutually compatible instruction ids from the pool (default the verifier's ``COMPOSABLE_IDS``: IFEval's
and IFBench's checkers that can be appended to any prompt and run offline), and each constraint's
sentence and arguments with the checker's own generator,
:func:`recipe.mrtpo.tasks.instruction_following.describe_constraint`, seeded per row and constraint.
The user message is the base prompt, a blank line, then the constraint sentences one per line; every
sentence Z_k is recorded in ``extra_info["constraint_texts"]`` (instruction order) and occurs exactly
once in the prompt. ``reward_model.ground_truth`` is ``{"instruction_id_list": [...], "kwargs": [JSON
string per instruction]}`` (JSON keeps heterogeneous arguments exact through parquet; the verifier
reads either form). All draws depend only on ``--seed`` and the base prompt's id and sample number.

Split: base prompts (not rows) are split by the seeded hash rule of
:func:`data_prep.common.hash_split` on their id, ``--test-fraction`` (default 0.05) to ``test``, so
that no base prompt is in both splits.

Compatibility: :mod:`data_prep.instruction_following.compat` (which ids and arguments may share a row).

Evaluation sets (``eval``): IFEval's 541 prompts (``.assets/if/ifeval_input_data.jsonl``,
data_source ``ifeval``) and IFBench's 300 (``.assets/if/IFBench_test.jsonl``, ``ifbench``), split
``test``. Their prompts state the constraints in their own words: ``constraint_texts[i]`` is the
checker's sentence for those arguments when it occurs verbatim in the prompt, else ``""`` (the
verifier then falls back to the checker's description, and the replay gives that reward uniform
weights); the data card counts both.

The peers' public training sets (``rlvr_ifeval``, ``if_multi_constraints``; a hub name or local files
in their schema) are built by :mod:`data_prep.instruction_following.sources`, through the same command.

CLI::

    python -m data_prep.instruction_following train --out-dir data/instruction_following \\
        [--base-prompts data_prep/data/if_base_prompts.jsonl] [--samples-per-prompt 4] [--seed 0] \\
        [--min-constraints 1] [--max-constraints 5] [--constraints random_passable | ID,ID,...]
    python -m data_prep.instruction_following eval --benchmark ifeval --out-dir data/ifeval
    python -m data_prep.instruction_following eval --benchmark ifbench --out-dir data/ifbench
    python -m data_prep.instruction_following if_multi_constraints --out-dir data/if_multi_constraints
    python -m data_prep.instruction_following rlvr_ifeval --input rlvr_ifeval.jsonl --out-dir data/rlvr_ifeval
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from data_prep.chinook_db import assets_dir
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
from data_prep.instruction_following import sources as if_sources
from data_prep.instruction_following.compat import SOLO_IDS, conflicts, constraint_pool, kwargs_conflict
from data_prep.instruction_following.rows import ABILITY, card_columns, verbatim_sentence

__all__ = [
    "ABILITY",
    "DEFAULT_BASE_PROMPTS",
    "EVAL_SETS",
    "load_base_prompts",
    "draw_constraints",
    "if_prompt",
    "build_training_rows",
    "build_eval_rows",
    "main",
]

DEFAULT_BASE_PROMPTS = REPO_ROOT / "data_prep" / "data" / "if_base_prompts.jsonl"
_ASSETS = assets_dir() / "if"  # $MRTPO_ASSETS or <repo>/.assets
#: benchmark -> (data_source, default input file)
EVAL_SETS = {
    "ifeval": ("ifeval", _ASSETS / "ifeval_input_data.jsonl"),
    "ifbench": ("ifbench", _ASSETS / "IFBench_test.jsonl"),
}
DEFAULT_SAMPLES_PER_PROMPT = 4
DEFAULT_TEST_FRACTION = 0.05
MAX_REDRAWS = 8

# --------------------------------------------------------------------------------------------------
# training prompts
# --------------------------------------------------------------------------------------------------


def load_base_prompts(path: Path, skips: SkipLog) -> tuple[list[tuple[str, str]], int]:
    """``[(id, prompt)]`` from JSON Lines; bad records reported to ``skips``. Returns (prompts, read)."""
    records, read = load_records(path, skips)
    out, seen = [], set()
    for line, rec in records:
        read += 1
        if not isinstance(rec, dict):
            skips.skip(path, line, f"not an object: {type(rec).__name__}")
            continue
        pid, prompt = rec.get("id"), rec.get("prompt")
        if not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid).strip() == "":
            skips.skip(path, line, "missing field 'id'")
            continue
        if not isinstance(prompt, str) or not prompt.strip():
            skips.skip(path, line, "missing field 'prompt'")
            continue
        if str(pid) in seen:
            skips.skip(path, line, f"duplicate id: {pid}")
            continue
        seen.add(str(pid))
        out.append((str(pid), prompt.strip()))
    return out, read


def if_prompt(base_prompt: str, sentences: Sequence[str]) -> str:
    """The user message: the base prompt, a blank line, one constraint sentence per line."""
    return base_prompt.strip() + "\n\n" + "\n".join(sentences)


def draw_constraints(
    base_prompt: str,
    row_seed: str,
    pool: Sequence[str],
    fixed_kwargs: dict[str, dict],
    min_k: int,
    max_k: int,
) -> list[tuple[str, dict, str]]:
    """``[(id, kwargs, sentence)]`` for one row, deterministic in ``row_seed`` (module docstring)."""
    from recipe.mrtpo.tasks.instruction_following import describe_constraint

    rng = random.Random(f"mrtpo-if-ids|{row_seed}")
    k = rng.randint(min_k, max_k)
    candidates = [i for i in pool if k == 1 or i not in SOLO_IDS]
    chosen: list[tuple[str, dict, str]] = []
    while len(chosen) < k:
        avail = [i for i in candidates if not any(conflicts(i, c[0]) for c in chosen)]
        if not avail:
            break
        iid = rng.choice(avail)
        candidates.remove(iid)
        for attempt in range(MAX_REDRAWS):
            try:
                sentence, kw = describe_constraint(iid, fixed_kwargs.get(iid), seed=f"{row_seed}|{iid}|{attempt}")
            except ValueError:
                continue
            texts = [base_prompt] + [c[2] for c in chosen]
            if not sentence.strip() or any(sentence in t or t in sentence for t in texts):
                continue  # Z_k must occur exactly once in the prompt
            if kwargs_conflict([(c[0], c[1]) for c in chosen] + [(iid, kw)]) is None:
                chosen.append((iid, kw, sentence))
                break
            if iid in fixed_kwargs:
                break  # fixed arguments: a redraw gives the same
    return chosen


def build_training_rows(
    base_prompts: Sequence[tuple[str, str]],
    seed: int = 0,
    samples_per_prompt: int = DEFAULT_SAMPLES_PER_PROMPT,
    min_constraints: int = 1,
    max_constraints: int = 5,
    constraints: Optional[str] = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    skips: Optional[SkipLog] = None,
    source_name: str = "",
) -> list[dict]:
    """Training rows (data_source ``instruction_following``) from ``(id, prompt)`` base prompts."""
    if not 1 <= min_constraints <= max_constraints:
        raise ValueError(f"need 1 <= min_constraints <= max_constraints, got {min_constraints}, {max_constraints}")
    pool, fixed = constraint_pool(constraints)
    splits = hash_split([pid for pid, _ in base_prompts], seed, test_fraction)
    rows = []
    jobs = [(pid, prompt, split, s) for (pid, prompt), split in zip(base_prompts, splits)
            for s in range(samples_per_prompt)]
    for pid, prompt, split, sample in progress(jobs, "instruction_following"):
        chosen = draw_constraints(prompt, f"{seed}|{pid}|{sample}", pool, fixed, min_constraints, max_constraints)
        if not chosen:
            if skips is not None:
                skips.skip(source_name or "base prompts", 0, f"no constraint could be drawn: base prompt {pid}")
            continue
        ground_truth = {
            "instruction_id_list": [c[0] for c in chosen],
            "kwargs": [json.dumps(c[1], sort_keys=True, ensure_ascii=False) for c in chosen],
        }
        extra = {
            "split": split,
            "index": 0,
            "id": f"{pid}#{sample}",
            "base_id": pid,
            "constraint_texts": [c[2] for c in chosen],
        }
        rows.append(make_row("instruction_following",
                             [{"role": "user", "content": if_prompt(prompt, [c[2] for c in chosen])}],
                             ABILITY, ground_truth, extra))
    return rows


# --------------------------------------------------------------------------------------------------
# evaluation sets
# --------------------------------------------------------------------------------------------------


def build_eval_rows(
    benchmark: str, path: Optional[Path] = None, skips: Optional[SkipLog] = None
) -> tuple[list[dict], int]:
    """IFEval / IFBench rows (split ``test``) from the packaged JSON Lines. Returns (rows, read)."""
    from recipe.mrtpo.tasks.instruction_following import REGISTRY, clean_kwargs

    if benchmark not in EVAL_SETS:
        raise ValueError(f"benchmark must be one of {sorted(EVAL_SETS)}, got {benchmark!r}")
    data_source, default_path = EVAL_SETS[benchmark]
    path = Path(path) if path is not None else default_path
    skips = skips if skips is not None else SkipLog()
    records, read = load_records(path, skips)
    rows, seen = [], set()
    for line, rec in progress(records, benchmark):
        read += 1
        if not isinstance(rec, dict):
            skips.skip(path, line, f"not an object: {type(rec).__name__}")
            continue
        prompt, ids, kwargs = rec.get("prompt"), rec.get("instruction_id_list"), rec.get("kwargs")
        if not isinstance(prompt, str) or not prompt.strip():
            skips.skip(path, line, "missing field 'prompt'")
            continue
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            skips.skip(path, line, "missing field 'instruction_id_list'")
            continue
        if not isinstance(kwargs, list) or len(kwargs) != len(ids):
            skips.skip(path, line, "missing field 'kwargs' (one per instruction)")
            continue
        unknown = [i for i in ids if i not in REGISTRY]
        if unknown:
            skips.skip(path, line, f"unknown instruction id: {unknown[0]}")
            continue
        try:
            kws = [clean_kwargs(k) for k in kwargs]
        except (TypeError, ValueError) as e:
            skips.skip(path, line, f"bad kwargs: {e}")
            continue
        key = str(rec.get("key", line))
        if key in seen:
            skips.skip(path, line, f"duplicate key: {key}")
            continue
        seen.add(key)
        ground_truth = {
            "instruction_id_list": list(ids),
            "kwargs": [json.dumps(k, sort_keys=True, ensure_ascii=False) for k in kws],
        }
        extra = {
            "split": "test",
            "index": 0,
            "id": f"{benchmark}-{key}",
            "base_id": "",
            "constraint_texts": [verbatim_sentence(i, k, prompt, "mrtpo-if-eval") for i, k in zip(ids, kws)],
        }
        rows.append(make_row(data_source, [{"role": "user", "content": prompt}], ABILITY, ground_truth, extra))
    return rows, read


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.instruction_following",
        description="Build instruction-following parquet (verl layout): multi-constraint training prompts "
        "('train'), the IFEval / IFBench evaluation sets ('eval') or a peer's public training set "
        "('rlvr_ifeval', 'if_multi_constraints': hub name or local files). Prints a data card.",
        epilog=__doc__.split("CLI::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="multi-constraint training prompts on base prompts")
    tr.add_argument("--out-dir", type=Path, required=True, help="folder for train.parquet / test.parquet")
    tr.add_argument("--base-prompts", type=Path, default=DEFAULT_BASE_PROMPTS,
                    help="JSON Lines with {'id', 'prompt'} (default data_prep/data/if_base_prompts.jsonl)")
    tr.add_argument("--seed", type=int, default=0, help="seed of the split and of every constraint draw (default 0)")
    tr.add_argument("--samples-per-prompt", type=int, default=DEFAULT_SAMPLES_PER_PROMPT,
                    help=f"rows per base prompt, each with its own constraints (default {DEFAULT_SAMPLES_PER_PROMPT})")
    tr.add_argument("--min-constraints", type=int, default=1, help="fewest constraints in a row (default 1)")
    tr.add_argument("--max-constraints", type=int, default=5, help="most constraints in a row (default 5)")
    tr.add_argument("--constraints", default=None,
                    help="restrict the pool: 'random_passable' (the verifier's RANDOM_PASSABLE_IDS with fixed "
                    "arguments, for tiny-model runs) or comma-separated instruction ids (default: COMPOSABLE_IDS)")
    tr.add_argument("--test-fraction", type=fraction, default=DEFAULT_TEST_FRACTION,
                    help=f"share of base prompts held out as 'test' (default {DEFAULT_TEST_FRACTION})")
    tr.add_argument("--limit", type=int, default=None, help="use only the first N valid base prompts")
    ev = sub.add_parser("eval", help="IFEval (541) or IFBench (300) from the packaged JSON Lines")
    ev.add_argument("--benchmark", choices=sorted(EVAL_SETS), required=True)
    ev.add_argument("--input", type=Path, default=None, help="JSON Lines (default: the packaged file in .assets/if)")
    ev.add_argument("--out-dir", type=Path, required=True, help="folder for test.parquet")
    for source, (hub, _) in sorted(if_sources.SOURCES.items()):
        if_sources.add_arguments(sub.add_parser(source, help=f"{hub} (hub name) or local files in its schema"))
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in if_sources.SOURCES:
        return if_sources.run(args)
    skips = SkipLog()
    if args.command == "train":
        try:
            constraint_pool(args.constraints)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if not 1 <= args.min_constraints <= args.max_constraints or args.samples_per_prompt < 1:
            print("error: need 1 <= --min-constraints <= --max-constraints and --samples-per-prompt >= 1",
                  file=sys.stderr)
            return 2
        if not args.base_prompts.is_file():
            print(f"error: base prompts file not found: {args.base_prompts}", file=sys.stderr)
            return 1
        base, read = load_base_prompts(args.base_prompts, skips)
        base = base[: args.limit] if args.limit is not None else base
        rows = build_training_rows(base, args.seed, args.samples_per_prompt, args.min_constraints,
                                   args.max_constraints, args.constraints, args.test_fraction, skips,
                                   str(args.base_prompts))
        title = f"instruction_following (base prompts: {len(base)} of {read} records)"
    else:
        rows, read = build_eval_rows(args.benchmark, args.input, skips)
        title = args.benchmark
    if not rows:
        print_data_card(title, rows, skips=skips)
        print("error: no rows built", file=sys.stderr)
        return 1
    written = write_splits(rows, args.out_dir)
    print_data_card(title, rows, card_columns(), skips=skips,
                    read=None if args.command == "train" else read, written=written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
