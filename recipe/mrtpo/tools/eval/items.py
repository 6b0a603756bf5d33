"""Evaluation items: the rows of a verl parquet file (``data_prep``'s format) as :class:`Item` s.

Public names: :data:`DEFAULT_DATA`, :data:`BUILD_HINT`, :class:`EvalError`, :class:`Item`,
:func:`load_items`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from recipe.mrtpo.tasks.base import to_plain
from recipe.mrtpo.tools.eval.metrics import FAMILY_DATA_SOURCES, TASK_FAMILY, validate_ground_truth

__all__ = ["DEFAULT_DATA", "BUILD_HINT", "EvalError", "Item", "load_items"]

DEFAULT_DATA: dict[str, str] = {task: f"data/{task}/test.parquet" for task in TASK_FAMILY}

BUILD_HINT = {
    "ifeval": "python -m data_prep.build_offline --only ifeval",
    "ifbench": "python -m data_prep.build_offline --only ifbench",
    "chinook": "python -m data_prep.build_offline --only chinook",
    "bfcl": "python -m data_prep.build_offline --only bfcl",
    "bfcl_multi_turn": "python -m data_prep.build_offline --only bfcl_multi_turn",
    "spider": "python -m data_prep.text_to_sql spider --input spider_data.zip --part dev --out-dir data/spider",
    "bird": "python -m data_prep.text_to_sql bird --input dev.zip --part dev --out-dir data/bird",
}

class EvalError(ValueError):
    """A problem with the inputs of an evaluation (data, cache, settings): reported without a traceback."""


def _plain(value: Any) -> Any:
    """A parquet cell as plain Python (numpy -> lists/scalars, NaN -> None)."""
    return to_plain(value, nan_to_none=True)


@dataclass
class Item:
    """One evaluation prompt: a parquet row with its stable id."""

    id: str
    index: int
    data_source: str
    messages: list[dict]
    ground_truth: Any
    extra_info: dict
    prompt_sha: str

    @property
    def category(self) -> str:
        return str(self.extra_info.get("category") or "")

    @property
    def difficulty(self) -> str:
        return str(self.extra_info.get("difficulty") or "")


def _messages(prompt: Any, where: str) -> list[dict]:
    prompt = _plain(prompt)
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
    ):
        raise EvalError(f"{where}: 'prompt' must be a non-empty list of {{'role', 'content'}} messages")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def load_items(path: os.PathLike, task: str, limit: Optional[int] = None) -> list[Item]:
    """The first ``limit`` rows (all when None) of a verl parquet file as :class:`Item` s.

    Item ids are ``extra_info["id"]`` (else ``"<data_source>-<row>"``), with ``#2``, ``#3``... added to
    repeats, so they are stable for a given file. Raises ValueError for a row the task's verifiers
    cannot score (wrong ``data_source``, malformed ground truth, missing database).
    """
    import pandas as pd

    family = TASK_FAMILY[task]
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    frame = pd.read_parquet(path)
    missing = [c for c in ("data_source", "prompt", "reward_model") if c not in frame.columns]
    if missing:
        raise EvalError(f"{path}: not a verl parquet file (missing columns {missing})")
    if limit is not None:
        frame = frame.iloc[: max(0, limit)]
    items, seen = [], {}
    for row_no, row in enumerate(frame.to_dict(orient="records")):
        where = f"{path} row {row_no}"
        source = str(row["data_source"])
        if source.split("/", 1)[0] not in FAMILY_DATA_SOURCES[family]:
            raise EvalError(
                f"{where}: data_source {source!r} cannot be scored as task {task!r} "
                f"(expected one of {FAMILY_DATA_SOURCES[family]}); wrong --data?"
            )
        messages = _messages(row["prompt"], where)
        reward_model = _plain(row["reward_model"])
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise EvalError(f"{where}: reward_model has no ground_truth")
        extra = _plain(row.get("extra_info"))
        extra = extra if isinstance(extra, dict) else {}
        base = str(extra.get("id") or f"{source}-{row_no}")
        seen[base] = seen.get(base, 0) + 1
        item_id = base if seen[base] == 1 else f"{base}#{seen[base]}"
        try:
            validate_ground_truth(family, reward_model["ground_truth"], extra)
        except (ValueError, KeyError, TypeError) as e:
            raise EvalError(f"{where} (id {item_id}): cannot be scored: {e}") from e
        sha = hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]
        items.append(Item(item_id, row_no, source, messages, reward_model["ground_truth"], extra, sha))
    return items
