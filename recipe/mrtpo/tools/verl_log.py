"""The one parser of verl's training logs: the console logger's step lines and the file logger's JSON lines.

verl's console logger (``trainer.logger=[console]``) prints one line per step::

    step:3 - actor/pg_loss:0.01 - mrtpo/reward/format/mean:0.75 - num_turns/mean:np.float64(2.0)

each value being the ``pprint.pformat`` of a number; Ray prefixes (``(TaskRunner pid=..)``) and ANSI
colours may surround it. Its ``file`` logger (``trainer.logger=[console,file]``) writes JSON lines
``{"step": N, "data": {...}}`` (verl's ``utils/tracking.py`` ``FileLogger``: to ``$VERL_FILE_LOGGER_PATH``, else
``$VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl``, the root defaulting to the working
directory). Its ``wandb`` logger (``trainer.logger=[console,wandb]``, ``WANDB_MODE=offline``) leaves a run
folder ``wandb/offline-run-<time>-<id>/run-<id>.wandb``: :func:`parse_wandb_run` reads its records.

Two readers of the console format, for two uses:

- :func:`parse_steps` is lenient and fast: every line matching :data:`STEP_LINE`, every ``key:value``
  part whose value ``float()`` accepts (numpy reprs are dropped). The CPU launcher uses it on its own
  runs' logs.
- :func:`parse_console_log` is strict: it also reads numpy reprs and ``True``/``False``, strips ANSI
  colours, and skips (and counts) any step line with a part that does not parse: a line cut off or
  interleaved with another process's output. The report and the experiments use it on logs of any origin.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path
from typing import Optional

__all__ = ["STEP_LINE", "parse_value", "parse_steps", "parse_console_log", "parse_file_logger", "parse_wandb_run"]

#: A console-logger step line: group 1 the step, group 2 the ``key:value - key:value ...`` rest.
STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)$")
_STEP_START = re.compile(r"\bstep:(\d+)(?: -|$)")  # what a step line, even a cut one, starts with
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NP_SCALAR = re.compile(r"^np\.(?:float|int|uint|bool_?)\w*\((.*)\)$")


def parse_value(text: str) -> Optional[float]:
    """A console-logger value (``pprint.pformat`` of a number): ``0.5``, ``nan``, ``True``,
    ``np.float64(2.0)``, ``np.int32(2)``; ``None`` if it is none of these."""
    text = text.strip()
    m = _NP_SCALAR.match(text)
    if m:
        text = m.group(1).strip()
    if text in ("True", "False"):
        return float(text == "True")
    try:
        return float(text)
    except ValueError:
        return None


def parse_steps(log_text: str) -> dict[int, dict[str, float]]:
    """Every console-logger step line -> ``{step: {metric: value}}``, keeping the parts whose value
    ``float()`` reads and dropping the others; a later line for a step replaces an earlier one."""
    steps = {}
    for line in log_text.splitlines():
        m = STEP_LINE.search(line)
        if not m:
            continue
        metrics = {}
        for part in m.group(2).split(" - "):
            key, sep, value = part.rpartition(":")
            if sep:
                try:
                    metrics[key.strip()] = float(value)
                except ValueError:
                    pass
        steps[int(m.group(1))] = metrics
    return steps


def parse_console_log(text: str) -> tuple[dict[int, dict[str, float]], int]:
    """verl's console-logger lines -> (``{step: {metric: value}}``, number of corrupt step lines).

    Metrics are those of :func:`parse_steps`, plus the numpy-scalar and boolean values it drops (verl
    prints ``np.float64(2.0)`` for some). A step line with any part that is not ``key:value`` with a
    numeric value (cut off, or interleaved with another process's output) is skipped whole and counted.
    A line cut inside its last number cannot be told from a complete one. A later line for the same
    step replaces an earlier one (a resumed run re-logging a step)."""
    steps: dict[int, dict[str, float]] = {}
    corrupt = 0
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        m = STEP_LINE.search(line)
        if not m:
            corrupt += bool(_STEP_START.search(line))  # "step:5" or "step:5 -" alone: cut off
            continue
        extra, ok = {}, bool(m.group(2).strip())
        for part in m.group(2).split(" - "):
            key, sep, value = part.rpartition(":")
            num = parse_value(value) if sep and key.strip() else None
            if num is None:
                ok = False
                break
            extra[key.strip()] = num
        if not ok:
            corrupt += 1
            continue
        step = int(m.group(1))
        metrics = parse_steps(line[m.start():]).get(step, {})
        metrics.update({k: v for k, v in extra.items() if k not in metrics})
        steps[step] = metrics
    return steps, corrupt


def parse_file_logger(text: str) -> tuple[dict[int, dict[str, float]], int, bool]:
    """verl's ``file`` logger JSON lines (``{"step": N, "data": {...}}``) -> (steps, corrupt lines,
    whether the text is such a log at all: at least one valid record). Non-numeric values are dropped;
    a later record for a step replaces an earlier one."""
    steps: dict[int, dict[str, float]] = {}
    corrupt = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            step, data = rec["step"], rec["data"]
            if not isinstance(data, dict) or isinstance(step, bool) or int(step) != step:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            corrupt += 1
            continue
        steps[int(step)] = {
            k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    return steps, corrupt, bool(steps)


_WANDB_MAGIC = b":W&B"
_BLOCK = 32768  # the LevelDB log layout wandb's transaction log uses: 32 KiB blocks of 7-byte-headed chunks


def _wandb_records(data: bytes):
    """The serialised ``Record`` protos of a ``run-<id>.wandb`` file and the number of chunks whose CRC failed
    (LevelDB log format: header ``:W&B`` + 2-byte magic + version, then chunks ``crc32 | length | type``,
    type 1 full, 2 first, 3 middle, 4 last; a block's tail under 7 bytes is padding)."""
    pos, pending, bad, out = 7, b"", 0, []
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:  # zero padding: the end of what was written
            break
        if len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF != crc:
            bad, pending = bad + 1, b""
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            out.append(pending)
            pending = b""
    return out, bad


def parse_wandb_run(path) -> tuple[dict[int, dict[str, float]], dict, int]:
    """A wandb run's transaction log (``run-<id>.wandb``, offline or synced) -> (``{step: {metric: value}}``,
    ``{"name": display name (verl: trainer.experiment_name), "project", "config": the logged config}``, number
    of unreadable chunks). Only numeric history values are kept (wandb's own ``_step``, ``_runtime`` and
    ``_timestamp`` are dropped); the step is the one verl passed to ``wandb.log(data, step=step)``.
    ImportError without the ``wandb`` package (its protobuf classes decode the records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != _WANDB_MAGIC:
        raise ValueError(f"{path}: not a wandb transaction log")
    raw, bad = _wandb_records(data)
    steps: dict[int, dict[str, float]] = {}
    meta: dict = {"config": {}}

    def items(updates):
        for item in updates:
            key = item.key or "/".join(item.nested_key)
            try:
                yield key, json.loads(item.value_json)
            except ValueError:
                continue

    for blob in raw:
        rec = pb.Record()
        try:
            rec.ParseFromString(blob)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError; counted like a bad chunk
            bad += 1
            continue
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            meta["name"], meta["project"] = rec.run.display_name, rec.run.project
            meta["config"].update(dict(items(rec.run.config.update)))
        elif kind == "config":
            meta["config"].update(dict(items(rec.config.update)))
        elif kind == "history":
            values = dict(items(rec.history.item))
            step = rec.history.step.num if rec.history.HasField("step") else values.get("_step")
            if not isinstance(step, int):
                continue
            steps.setdefault(int(step), {}).update({
                k: float(v) for k, v in values.items()
                if not k.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)})
    # wandb stores each config group as {"value": ..., "desc": ...}
    meta["config"] = {k: v.get("value", v) if isinstance(v, dict) else v for k, v in meta["config"].items()}
    return steps, meta, bad
