"""Localisation of the replay: how much of reward k's relevance mass q[i,k,:] (``docs/design.md`` §1.2)
lies on the response tokens that reward k's verifier reads.

On the synthetic-slots task reward ``slot_X`` reads exactly the value of field X, so the right answer is
known per response: :func:`read_positions` finds those tokens with the verifier's own parser,
:func:`localisation_records` scores every replayed (response, reward) pair of a relevance dump,
:func:`summarise_localisation` averages them and :func:`load_dumps` reads a run's dumps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional


def _special_ids() -> set[int]:
    from recipe.mrtpo.cpu.tiny_model import QWEN2_SPECIAL_TOKENS

    return {tid for tid, _, special in QWEN2_SPECIAL_TOKENS if special}


def read_positions(token_ids: Sequence[int], token_strings: Sequence[str], valid: int, label: str,
                   special_ids: Optional[set] = None) -> list[int]:
    """The response positions whose token overlaps the value that reward ``slot_<label>`` compares.

    The text is rebuilt from the first ``valid`` per-token strings with special tokens as empty strings
    (the reward manager decodes with ``skip_special_tokens=True``); the verifier's own parser
    (:func:`recipe.mrtpo.tasks.synthetic_slots.find_slot`) finds the value's character span. ``[]`` when
    the response has no such field (the verifier then reads nothing in particular)."""
    from recipe.mrtpo.tasks.synthetic_slots import find_slot

    special = _special_ids() if special_ids is None else special_ids
    pieces, starts, pos = [], [], 0
    for t in range(valid):
        piece = "" if int(token_ids[t]) in special else str(token_strings[t])
        starts.append(pos)
        pieces.append(piece)
        pos += len(piece)
    found = find_slot("".join(pieces), label)
    if found is None:
        return []
    lo, hi = found[1]
    return [t for t in range(valid) if pieces[t] and starts[t] < hi and starts[t] + len(pieces[t]) > lo]


def localisation_records(dump: dict) -> list[dict]:
    """One record per replayed (response, slot reward) pair of a relevance dump (``mrtpo.dump``; schema :mod:`recipe.mrtpo.step.dump`):
    ``{"step", "reward", "sample", "precision", "cross", "chance", "top1", "n_read", "n_valid", "absent"}``.

    precision = sum of q over the read positions / sum of q over the valid positions; cross = the same
    share on the positions the *other* slot rewards read (leakage onto another field's value); chance =
    read positions / valid positions (a uniform q's precision); top1 = the largest q is on a read position.
    Pairs whose response lacks the field are recorded with ``absent=True`` and no precision; pairs with
    zero total q are left out. Rewards not named ``slot_<X>`` are ignored. A dump without relevance
    (a warm-up step, or a non-replay method) gives ``[]``."""
    import torch

    rel = dump.get("relevance")
    if rel is None:
        return []
    names = list(dump["reward_names"])
    mask = torch.as_tensor(dump["response_mask"]).bool()
    replayed = torch.as_tensor(dump["replayed"]).bool()
    ids = torch.as_tensor(dump["response_ids"])
    tokens = dump["response_tokens"]
    special = _special_ids()
    out = []
    for i in range(rel.shape[0]):
        valid = int(mask[i].sum())
        for k, name in enumerate(names):
            if not name.startswith("slot_") or not bool(replayed[i, k]) or valid == 0:
                continue
            q = rel[i, k, :valid].double()
            total = float(q.sum())
            if not total > 0:
                continue
            row_ids = ids[i].tolist()
            pos = read_positions(row_ids, tokens[i], valid, name[len("slot_"):], special)
            rec = {"step": int(dump.get("step", -1)), "reward": name, "sample": i, "n_valid": valid,
                   "n_read": len(pos), "absent": not pos}
            if pos:
                rec["precision"] = float(q[pos].sum()) / total
                others = sorted({t for other in names if other.startswith("slot_") and other != name
                                 for t in read_positions(row_ids, tokens[i], valid, other[len("slot_"):], special)}
                                - set(pos))
                rec["cross"] = float(q[others].sum()) / total if others else 0.0
                rec["chance"] = len(pos) / valid
                rec["top1"] = bool(int(torch.argmax(q)) in pos)
            out.append(rec)
    return out


def summarise_localisation(records: Sequence[dict]) -> dict:
    """Means over the pairs whose field is present: precision, cross, chance, top1 (overall and per reward),
    with pair counts and the number of pairs whose response lacked the field."""

    def agg(recs):
        present = [r for r in recs if not r["absent"]]
        n = len(present)
        mean = (lambda key: sum(float(r[key]) for r in present) / n) if n else (lambda key: None)
        return {"pairs": n, "absent": len(recs) - n, "precision": mean("precision"), "cross": mean("cross"),
                "chance": mean("chance"), "top1": mean("top1")}

    out = agg(records)
    out["per_reward"] = {name: agg([r for r in records if r["reward"] == name])
                         for name in sorted({r["reward"] for r in records})}
    return out


def load_dumps(folder: Path, log: Callable[[str], None] = print) -> tuple[list[dict], int]:
    """The relevance dumps of a run (``step_XXXXXX.pt``, read by :func:`recipe.mrtpo.step.dump.load_dump`) and the
    number of files left out because they could not be read (e.g. cut short by a killed run; logged)."""
    from recipe.mrtpo.step.dump import DumpError, load_dump

    dumps, skipped = [], 0
    for p in sorted(Path(folder).glob("step_*.pt")):
        try:
            dumps.append(load_dump(p)[0])
        except DumpError as e:
            skipped += 1
            log(f"[mini] left out an unreadable relevance dump: {e}")
    return dumps, skipped
