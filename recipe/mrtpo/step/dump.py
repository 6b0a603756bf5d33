"""The relevance dump: what the trainer writes every ``mrtpo.dump.every_n_steps`` steps for the heatmap viewer
(``python -m recipe.mrtpo.tools.viz``) and the experiments.

One file per step, ``step_XXXXXX.pt`` (:data:`DUMP_NAME`), holding a plain ``dict`` saved with
``torch.save``: tensors, lists, dicts, numbers and strings only, so that :func:`load_dump` reads it with
``weights_only=True`` (no code runs on loading). Its keys are the fields of :class:`RelevanceDump`;
dumps written before ``max_realloc_rms`` and ``shuffle`` were added lack those two, and readers treat
every field but ``reward_names``, ``scores`` and ``response_mask`` as optional.

Shapes, for the first ``n`` responses of the batch (``mrtpo.dump.max_samples``), ``K`` rewards and the
``T`` positions up to the longest response among them:

=================== ======================== ==================================================
field               type / shape             meaning
=================== ======================== ==================================================
step                int                      the training step
beta                float                    beta_s of that step (docs/design.md §1.4)
max_realloc_rms     float or None            rho of the RMS constraint (§1.5); None: disabled
max_token_weight    float or None            c, the cap on one token's weight (§1.5); None (and older dumps): no cap
shuffle             bool                     the shuffle ablation was on (§1.7)
reward_names        list[str], K             reward k's name
uid                 list[str], n             the response's prompt group
scores              float [n, K]             r_k of each response; NaN: the reward is absent
replayed            bool [n, K]              pair (i, k) was replayed (else its weights are uniform)
relevance           float [n, K, T] or None  q[i,k,t] (§1.2), unshuffled; None: no replay this step
advantages          float [n, T]             the final token advantage (§1.6)
response_mask       int or bool [n, T]       1 on the response's valid tokens: the model's own (verl's
                                             response_mask; 0 on tool output and injected user turns of an
                                             agent loop's multi-turn response)
response_lengths    int [n]                  the response's tokens, tool and user spans included (positions
                                             past it are padding); absent in older dumps: the last valid + 1
response_ids        int [n, T]               the sampled token ids
response_tokens     list[list[str]], n x T   each id decoded alone
contexts            list[dict], n            per reward name: its Z_k (``{"text", "placement"}``, §2)
metrics             dict[str, float]         the step's ``mrtpo/`` metrics
spans               list[list], n or empty   agent-loop responses: per response its spans that the model did not
                                             generate, ``[kind, start, end]`` over positions < T, kind ``tool``
                                             (tool results, error feedback) or ``user`` (injected user turns);
                                             from the BFCL loop's ``bfcl_spans`` (:func:`loop_spans`); empty
                                             for one-turn responses
=================== ======================== ==================================================

Older dumps lack ``spans``; the viewer then marks every masked position alike.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import torch

__all__ = ["DUMP_NAME", "DumpError", "RelevanceDump", "SPAN_KINDS", "SPANS_KEY", "as_tensor", "check_dump", "dump_path",
           "find_dump", "load_dump", "loop_spans", "write_dump"]

#: File name of one step's dump; group 1 is the step.
DUMP_NAME = re.compile(r"^step_(\d+)\.pt$")
REQUIRED = ("reward_names", "scores", "response_mask")
#: the agent loop's per-response spans in verl's ``non_tensor_batch`` (``recipe.mrtpo.agent.bfcl_loop`` writes them as
#: ``extra_fields["bfcl_spans"]``, ``[kind, start, end, turn, step]``; a test checks the two names agree)
SPANS_KEY = "bfcl_spans"
#: the kinds of span a dump keeps: what the model did not generate (``model`` spans are the mask's 1s)
SPAN_KINDS = ("tool", "user")


class DumpError(ValueError):
    """The dump cannot be found, read or understood; the message says why."""


@dataclass(kw_only=True)
class RelevanceDump:
    """One step's dump (the module docstring gives every field's shape and meaning); built by keyword."""

    step: int
    beta: float
    max_realloc_rms: Optional[float] = 1.0
    max_token_weight: Optional[float] = None
    shuffle: bool = False
    reward_names: list[str]
    uid: list[str] = field(default_factory=list)
    scores: torch.Tensor
    replayed: Optional[torch.Tensor] = None
    relevance: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    response_mask: torch.Tensor
    response_lengths: Optional[torch.Tensor] = None
    response_ids: Optional[torch.Tensor] = None
    response_tokens: list[list[str]] = field(default_factory=list)
    contexts: list[dict] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    spans: list[list] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The plain dict that is saved (tensors are kept, not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, raw: dict) -> RelevanceDump:
        """A loaded dump dict as a :class:`RelevanceDump`, after :func:`check_dump`; fields missing from an
        older dump get their defaults, unknown keys are ignored."""
        check_dump(raw)
        if raw.get("step") is None:
            raise DumpError(f"dump has no 'step' (keys: {sorted(map(str, raw))})")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known and v is not None}
        kwargs.setdefault("beta", float((raw.get("metrics") or {}).get("mrtpo/beta", 0.0)))
        if "max_realloc_rms" in raw:
            kwargs["max_realloc_rms"] = raw["max_realloc_rms"]  # None (disabled) is kept
        return cls(**kwargs)


def loop_spans(per_response: Any, n: int, T: int) -> list[list]:
    """The ``spans`` field for the first ``n`` responses (``T`` positions) from the agent loop's per-response
    spans (``non_tensor_batch[SPANS_KEY]``; None: no agent loop, ``[]``): the :data:`SPAN_KINDS` ones as
    ``[kind, start, end]``, clipped to ``T``; an entry off its shape is left out (the viewer shows it as masked)."""
    if per_response is None:
        return []
    out = []
    for i in range(n):
        row = per_response[i] if i < len(per_response) else None
        kept = []
        for e in (list(row) if isinstance(row, (list, tuple)) or hasattr(row, "tolist") else []):
            e = e.tolist() if hasattr(e, "tolist") else e
            if not (isinstance(e, (list, tuple)) and len(e) >= 3 and e[0] in SPAN_KINDS):
                continue
            try:
                start, end = max(0, int(e[1])), min(T, int(e[2]))
            except (TypeError, ValueError):
                continue
            if start < end:
                kept.append([str(e[0]), start, end])
        out.append(kept)
    return out


def as_tensor(x: Any, name: str, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a CPU tensor of ``dtype``; a :class:`DumpError` naming dump field ``name`` if it is none."""
    try:
        return torch.as_tensor(x).to(dtype).cpu()
    except Exception as e:  # noqa: BLE001 - whatever the value is, it is not a usable tensor
        raise DumpError(f"dump field {name!r} is not a tensor: {type(e).__name__}: {e}") from e


def check_dump(raw: dict) -> dict[str, Optional[torch.Tensor]]:
    """Check a dump dict's required fields and its tensors' shapes; raises :class:`DumpError` naming the
    field and the expected shape. Returns the tensors converted: ``scores`` (float32 [n, K]), ``mask``
    (bool [n, T]), ``replayed`` (bool [n, K], all False when absent), ``relevance`` (float32 [n, K, T] or
    None) and ``advantages`` (float32 [n, T] or None)."""
    if not isinstance(raw, dict):
        raise DumpError(f"a dump is a dict, got {type(raw).__name__}")
    for key in REQUIRED:
        if key not in raw:
            raise DumpError(f"dump has no {key!r} (keys: {sorted(map(str, raw))})")
    K = len(raw["reward_names"])
    scores = as_tensor(raw["scores"], "scores", torch.float32)
    mask = as_tensor(raw["response_mask"], "response_mask", torch.float32) > 0
    if scores.dim() != 2 or scores.shape[1] != K:
        raise DumpError(f"scores must be [n, K={K}], got {tuple(scores.shape)}")
    n = scores.shape[0]
    if mask.dim() != 2 or mask.shape[0] != n:
        raise DumpError(f"response_mask must be [n={n}, T], got {tuple(mask.shape)}")
    T = mask.shape[1]
    replayed = raw.get("replayed")
    replayed = torch.zeros(n, K, dtype=torch.bool) if replayed is None else as_tensor(replayed, "replayed", torch.bool)
    if tuple(replayed.shape) != (n, K):
        raise DumpError(f"replayed must be [n, K] = {(n, K)}, got {tuple(replayed.shape)}")
    relevance = raw.get("relevance")
    if relevance is not None:
        relevance = as_tensor(relevance, "relevance", torch.float32)
        if tuple(relevance.shape) != (n, K, T):
            raise DumpError(f"relevance must be [n, K, T] = {(n, K, T)}, got {tuple(relevance.shape)}")
    advantages = raw.get("advantages")
    if advantages is not None:
        advantages = as_tensor(advantages, "advantages", torch.float32)
        if tuple(advantages.shape) != (n, T):
            raise DumpError(f"advantages must be [n, T] = {(n, T)}, got {tuple(advantages.shape)}")
    lengths = raw.get("response_lengths")
    if lengths is not None:
        lengths = as_tensor(lengths, "response_lengths", torch.long)
        if tuple(lengths.shape) != (n,) or bool((lengths < 0).any()) or bool((lengths > T).any()):
            raise DumpError(f"response_lengths must be [n={n}] in [0, T={T}], got {lengths.tolist()[:8]}")
    return {"scores": scores, "mask": mask, "replayed": replayed, "relevance": relevance, "advantages": advantages}


def dump_path(folder: str | Path, step: int) -> Path:
    """``folder/step_XXXXXX.pt``."""
    return Path(folder) / f"step_{int(step):06d}.pt"


def write_dump(dump: RelevanceDump, folder: str | Path) -> Path:
    """Check ``dump`` (:func:`check_dump`) and save it as a plain dict into ``folder/step_XXXXXX.pt``
    (created if needed); the file appears whole (written aside, then renamed). Returns its path."""
    raw = dump.to_dict()
    check_dump(raw)
    path = dump_path(folder, dump.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(raw, tmp)
    os.replace(tmp, path)
    return path


def find_dump(path: str | Path, step: Optional[int] = None) -> Path:
    """The dump file: ``path`` itself, or in a folder the latest ``step_*.pt`` (or step ``step``)."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise DumpError(f"no such dump file or folder: {p}")
    found = {}
    for f in p.iterdir():
        m = DUMP_NAME.match(f.name)
        if m and f.is_file():
            found[int(m.group(1))] = f
    if not found:
        raise DumpError(f"no step_XXXXXX.pt dumps in {p} (is mrtpo.dump.every_n_steps > 0?)")
    if step is None:
        return found[max(found)]
    if step not in found:
        steps = ", ".join(str(s) for s in sorted(found))
        raise DumpError(f"no dump for step {step} in {p}; available steps: {steps}")
    return found[step]


def load_dump(path: str | Path, step: Optional[int] = None) -> tuple[dict, Path]:
    """(the raw dump dict, its file) of :func:`find_dump`'s choice, read with ``torch.load(weights_only=True)``
    (tensors, lists, dicts, numbers, strings). Only the dict itself and its step are checked here;
    :func:`check_dump` checks the rest."""
    f = find_dump(path, step)
    try:
        raw = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a DumpError with its cause
        raise DumpError(f"cannot read {f} as a relevance dump: {type(e).__name__}: {e}") from e
    if not isinstance(raw, dict):
        raise DumpError(f"{f} holds a {type(raw).__name__}, not the trainer's dump dict")
    if step is not None and raw.get("step") is not None and int(raw["step"]) != int(step):
        raise DumpError(f"{f} is the dump of step {raw['step']}, not step {step}")
    return raw, f
