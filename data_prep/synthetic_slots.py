"""Builder of the synthetic-slots task (``recipe.mrtpo.tasks.synthetic_slots``): prompts, and imperfect
demonstrations for a supervised warm start.

    python -m data_prep.synthetic_slots --out-dir DIR [--seed 0] [--slots 3] [--n-sft 4000]
                                        [--n-train 128] [--n-test 64] [--p-correct 0.5]

writes ``DIR/sft.parquet`` (prompts with a demonstration in ``extra_info["demo"]``), ``DIR/train.parquet``
(the RL prompts) and ``DIR/test.parquet`` (held-out prompts, e.g. to measure the warm-started model),
in verl's row layout with ``data_source = "synthetic_slots"``, and prints a data card.

Each prompt opens with a sentence of random length (``PREAMBLES``) and asks for ``--slots`` fields (labels A, B, C) with a uniformly random value from the field's
own digits (``VALUES``: A 1-3, B 4-6, C 7-9), a uniformly random answer order (so each field's value
token sits at a different position from prompt to prompt) and the request sentences in another random
order (so the order sentence, not the request order, decides the layout). A demonstration always has
the right layout, and each field's value is the requested digit with probability ``--p-correct``
(independently per field), otherwise a uniformly drawn other digit of the field's range: a model fitted
to the demonstrations is right about half the time on each reward, so the rewards vary within a group
and RL has room to improve each one separately.

The test and train prompts are distinct and none of them occurs in the SFT split; SFT prompts may
repeat (there are only 7,776 distinct 3-field prompts), each time with an independently drawn
demonstration. The files are byte-identical for the same arguments (every draw comes from
``random.Random`` seeded by a string of the seed and the split).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Optional

from data_prep.common import fraction, print_data_card, write_splits
from recipe.mrtpo.tasks.synthetic_slots import (
    DATA_SOURCE,
    LABELS,
    PREAMBLES,
    VALUES,
    answer_text,
    parse_ground_truth,
    prompt_text,
)

__all__ = ["draw_example", "demo_values", "make_row", "build_splits", "main"]

def draw_example(rng: random.Random, n_slots: int) -> dict:
    """One prompt's content: fields with random digits, the answer order, the request-sentence order and
    the opening sentence."""
    if not 1 <= n_slots <= len(LABELS):
        raise ValueError(f"--slots must be in 1..{len(LABELS)}, got {n_slots}")
    labels = list(LABELS[:n_slots])
    fields = [{"name": n, "value": rng.choice(VALUES[n])} for n in labels]
    order = rng.sample(labels, n_slots)
    request_order = rng.sample(labels, n_slots)
    preamble = rng.choice(PREAMBLES)
    return {"fields": fields, "order": order, "request_order": request_order, "preamble": preamble}


def demo_values(rng: random.Random, fields: list[dict], p_correct: float) -> dict[str, str]:
    """Per field, the requested digit with probability ``p_correct``, else a uniformly drawn other digit of
    the field's range."""
    out = {}
    for f in fields:
        if rng.random() < p_correct:
            out[f["name"]] = f["value"]
        else:
            out[f["name"]] = rng.choice([d for d in VALUES[f["name"]] if d != f["value"]])
    return out


def make_row(example: dict, split: str, index: int, demo: Optional[str] = None) -> dict:
    """A verl row (layout of ``data_prep.common``) for one drawn example."""
    ground_truth = {"fields": example["fields"], "order": example["order"]}
    parse_ground_truth(ground_truth)  # the builder never writes a row its verifier would reject
    extra = {"split": split, "index": index, "request_order": example["request_order"], "preamble": example["preamble"]}
    if demo is not None:
        extra["demo"] = demo
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": _key(example)}],
        "ability": "synthetic",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra,
    }


def _key(ex: dict) -> str:
    return prompt_text(ex["fields"], ex["order"], ex["request_order"], ex["preamble"])


def _draw(rng: random.Random, n: int, n_slots: int, taken: set, what: str, unique: bool) -> list[dict]:
    """``n`` examples whose prompts are not in ``taken`` (and, if ``unique``, not repeated; added to ``taken``)."""
    out = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise ValueError(f"could not draw {n} {what} prompts with {n_slots} slots outside the other splits "
                             f"({len(out)} found): ask for fewer rows or more slots")
        ex = draw_example(rng, n_slots)
        key = _key(ex)
        if key in taken:
            continue
        if unique:
            taken.add(key)
        out.append(ex)
    return out


def build_splits(seed: int = 0, n_slots: int = 3, n_sft: int = 4000, n_train: int = 128, n_test: int = 64,
                 p_correct: float = 0.5) -> dict[str, list[dict]]:
    """``{"test": rows, "train": rows, "sft": rows}``: test and train prompts distinct, none in sft."""
    if not 0.0 <= p_correct <= 1.0:
        raise ValueError(f"p_correct must be in [0, 1], got {p_correct}")
    taken: set = set()
    splits = {}
    for split, n in (("test", n_test), ("train", n_train), ("sft", n_sft)):
        rng = random.Random(f"synthetic_slots:{seed}:{split}")
        examples = _draw(rng, n, n_slots, taken, split, unique=split != "sft")
        rows = []
        for i, ex in enumerate(examples):
            demo = answer_text(demo_values(rng, ex["fields"], p_correct), ex["order"]) if split == "sft" else None
            rows.append(make_row(ex, split, i, demo))
        splits[split] = rows
    return splits


def _demo_correct(row: dict) -> list[str]:
    from recipe.mrtpo.tasks.synthetic_slots import score_synthetic_slots

    demo = row["extra_info"].get("demo")
    if demo is None:
        return []
    res = score_synthetic_slots(demo, row["reward_model"]["ground_truth"])
    return [f"{k}={'right' if v else 'wrong'}" for k, v in sorted(res.scores.items())]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data_prep.synthetic_slots", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slots", type=int, default=3, help=f"fields per prompt, 1..{len(LABELS)} (default 3)")
    ap.add_argument("--n-sft", type=int, default=4000, help="demonstrations (default 4000)")
    ap.add_argument("--n-train", type=int, default=128, help="RL prompts (default 128)")
    ap.add_argument("--n-test", type=int, default=64, help="held-out prompts (default 64)")
    ap.add_argument("--p-correct", type=fraction, default=0.5, help="chance that a demo field is right (default 0.5)")
    args = ap.parse_args(argv)
    try:
        splits = build_splits(args.seed, args.slots, args.n_sft, args.n_train, args.n_test, args.p_correct)
    except ValueError as e:
        print(f"synthetic_slots: {e}", file=sys.stderr)
        return 2
    rows = [r for rs in splits.values() for r in rs]
    written = write_splits(rows, args.out_dir)  # by extra_info["split"]; the index is already 0..n-1 per split
    print_data_card(
        f"synthetic_slots (seed {args.seed}, {args.slots} slots, p_correct {args.p_correct:g})",
        rows,
        columns=[("answer order", lambda r: ",".join(r["reward_model"]["ground_truth"]["order"])),
                 ("demo field", _demo_correct)],
        written=written,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
