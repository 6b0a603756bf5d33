"""The trainer's standing check (``mrtpo.fused_check_every``, docs/fused_pass.md): does the fused pass's old_log_prob
differ from verl's own by rounding, or by a fault? Pure torch: the trainer and ``benchmarks/gpu_replay.py`` (which
runs without verl) share it."""

from __future__ import annotations

from typing import Optional

import torch

#: |fused - verl's own| old log-prob (a row's mean) above which the trainer's standing check
#: (``mrtpo.fused_check_every``) fails when the floor measures 0, by the actor's parameter dtype. The fused pass
#: computes verl's numbers (CPU, tiny Qwen2: fp32 to ~1e-6; bf16 bitwise on verl's CPU numerics, mean ~1e-5 /
#: max ~5e-4 with fp32 log-probs, the forwards padding the sequences differently); a wrong temperature rounding, row mapping or layout is far above (docs/fused_pass.md).
FUSED_CHECK_THRESHOLDS = {"fp32": 1e-4, "bf16": 1e-2}
#: the standing check fails above FUSED_CHECK_FLOOR_FACTOR x the floor measured in the same step (verl's own pass
#: against itself on the batch packed otherwise: another order and token budget) + the dtype's threshold above: at 7B in
#: bf16 on an H200 verl's pass differs from itself by 2.7e-2..4.1e-2 under another packing, as much as the fused
#: pass differs from it (4.0e-2), so a fixed threshold cannot tell rounding from a fault at every scale
FUSED_CHECK_FLOOR_FACTOR = 2.0
#: the floor's call runs at this fraction of verl's log-prob token budget (dynamic batch size): ``floor_token_budget``
FLOOR_BUDGET_FRACTION = 0.75


def fused_check_metrics(fused: torch.Tensor, verl: torch.Tensor, response_mask: torch.Tensor,
                        valid: Optional[torch.Tensor] = None) -> dict:
    """``mrtpo/consistency/fused_vs_verl_{mean,p99,max}``: |fused - verl's own| old log-prob over the valid
    response tokens of the ``valid`` rows (verl's padding rows left out), and the tokens compared."""
    m = response_mask > 0
    if valid is not None:
        m &= torch.as_tensor(valid, dtype=torch.bool).unsqueeze(-1)
    T = min(fused.shape[-1], verl.shape[-1], m.shape[-1])
    d = (fused[:, :T].float() - verl[:, :T].float()).abs()[m[:, :T]]
    out = {"mrtpo/consistency/fused_vs_verl_tokens": int(d.numel())}
    if d.numel():
        sample = d if d.numel() <= 1 << 24 else d[torch.randperm(d.numel(), generator=torch.Generator().manual_seed(0))[: 1 << 24]]
        out.update({"mrtpo/consistency/fused_vs_verl_mean": float(d.mean()),
                    "mrtpo/consistency/fused_vs_verl_p99": float(torch.quantile(sample, 0.99)),
                    "mrtpo/consistency/fused_vs_verl_max": float(d.max())})
    return out


def row_means(a: torch.Tensor, b: torch.Tensor, response_mask: torch.Tensor,
              valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per row, the mean |a - b| over its response tokens:

        d_i = (1 / |T_i|) * sum_{t in T_i} |a[i, t] - b[i, t]|,   T_i = {t : response_mask[i, t] > 0}

    a, b: [B, T'] log-probs (compared over the common T = min of the widths); response_mask: [B, T]; valid: [B] bool
    (None: every row). Returns [R] float32: d_i of the valid rows with at least one response token, in row order."""
    m = response_mask > 0
    if valid is not None:
        m &= torch.as_tensor(valid, dtype=torch.bool).unsqueeze(-1)
    T = min(a.shape[-1], b.shape[-1], m.shape[-1])
    m = m[:, :T]
    d = (a[:, :T].float() - b[:, :T].float()).abs() * m
    n = m.sum(-1)
    keep = n > 0
    return d.sum(-1)[keep] / n[keep]


def floor_token_budget(budget: int, longest: int, fraction: float = FLOOR_BUDGET_FRACTION) -> int:
    """The token budget per GPU of the floor's call under verl's dynamic batch size:

        budget' = max(longest, floor(fraction * budget))

    verl's sequence balancing (``rearrange_micro_batches``) partitions a rank's rows by their lengths alone, so the
    rows in another order land in the same micro-batches (each rank of a batch in reverse order holds the same rows
    as a rank did); at another budget the partition changes and most rows get other companions
    (``tests/unit/test_standing_check.py``, through verl's own ``prepare_micro_batches``). ``longest``: the batch's
    longest sequence (prompt + response; verl refuses a budget below it)."""
    return max(int(longest), int(fraction * int(budget)))


def standing_check(fused: torch.Tensor, verl: torch.Tensor, verl_repacked: Optional[torch.Tensor],
                   response_mask: torch.Tensor, valid: Optional[torch.Tensor], tolerance: float,
                   factor: float = FUSED_CHECK_FLOOR_FACTOR) -> tuple[dict, bool]:
    """The standing check of one step: is |fused - verl| old log-prob rounding, or a fault? Decided per row.

    d_i = :func:`row_means` (fused, verl), f_i = :func:`row_means` (verl_repacked, verl) (verl's own pass on the same
    rows packed otherwise, same step, same weights: what rounding alone moves a row by on this model, dtype and
    hardware). Fail when

        max_i d_i > factor * max_i f_i + tolerance

    (``tolerance``: the dtype's :data:`FUSED_CHECK_THRESHOLDS`, what remains when the floor measures 0, e.g. CPU
    numerics that do not depend on the packing). A fault confined to a few rows (one row mapped to another sample,
    a 1-nat error on 2% of the rows) moves those rows' means far above any row's rounding, where the mean over all
    tokens would hide it under the floor; stale weights or another temperature move every row. The batch means are
    kept as metrics. ``verl_repacked`` None: floor 0.

    Returns the metrics (:func:`fused_check_metrics`, ``mrtpo/consistency/fused_vs_verl_row_max``, the floor's
    ``verl_vs_verl_mean`` and ``verl_vs_verl_row_max``, ``fused_check_threshold``, ``fused_check_rows_above``: the
    rows whose d_i is above the threshold) and whether the check failed.
    """
    m = fused_check_metrics(fused, verl, response_mask, valid)
    d = row_means(fused, verl, response_mask, valid)
    f = row_means(verl_repacked, verl, response_mask, valid) if verl_repacked is not None else torch.zeros(0)
    floor_mean = 0.0
    if verl_repacked is not None:
        floor_mean = fused_check_metrics(verl_repacked, verl, response_mask, valid).get(
            "mrtpo/consistency/fused_vs_verl_mean", 0.0)
    floor_row_max = float(f.max()) if f.numel() else 0.0
    threshold = factor * floor_row_max + tolerance
    row_max = float(d.max()) if d.numel() else 0.0
    m["mrtpo/consistency/fused_vs_verl_row_max"] = row_max
    m["mrtpo/consistency/verl_vs_verl_mean"] = floor_mean
    m["mrtpo/consistency/verl_vs_verl_row_max"] = floor_row_max
    m["mrtpo/consistency/fused_check_threshold"] = threshold
    m["mrtpo/consistency/fused_check_rows_above"] = int((d > threshold).sum())
    return m, row_max > threshold


def failure_line(m: dict, step, key: str, tolerance: float) -> str:
    """The one line a failed check logs (``m``: :func:`standing_check`'s metrics; ``key``: the dtype's name)."""
    return (f"mrtpo: step {step}: the fused old_log_probs differ from verl's own by up to "
            f"{m['mrtpo/consistency/fused_vs_verl_row_max']:.3g} on a row's mean ({m['mrtpo/consistency/fused_check_rows_above']} "
            f"rows above the {key} threshold {m['mrtpo/consistency/fused_check_threshold']:.3g}: {FUSED_CHECK_FLOOR_FACTOR:g} x "
            f"verl's own largest row floor {m['mrtpo/consistency/verl_vs_verl_row_max']:.3g} under another packing + "
            f"{tolerance:.0e}; batch mean {m.get('mrtpo/consistency/fused_vs_verl_mean', 0.0):.3g}, floor mean "
            f"{m['mrtpo/consistency/verl_vs_verl_mean']:.3g}); this step trains on verl's own old_log_probs: check the "
            "replay's numerics (docs/fused_pass.md)")
