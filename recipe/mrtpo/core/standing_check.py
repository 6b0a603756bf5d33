"""The trainer's standing check (``mrtpo.fused_check_every``, docs/fused_pass.md): does the fused pass's old_log_prob
differ from verl's own by rounding, or by a fault? Pure torch: the trainer and ``benchmarks/gpu_replay.py`` (which
runs without verl) share it."""

from __future__ import annotations

from typing import Optional

import torch

#: mean |fused - verl's own| old log-prob above which the trainer's standing check (``mrtpo.fused_check_every``)
#: warns, by the actor's parameter dtype. The fused pass computes verl's numbers (CPU, tiny Qwen2: fp32 to ~1e-6;
#: bf16 bitwise on verl's CPU numerics, mean ~1e-5 / max ~5e-4 with fp32 log-probs, the forwards padding the
#: sequences differently); a wrong temperature rounding, row mapping or layout is far above (docs/fused_pass.md).
FUSED_CHECK_THRESHOLDS = {"fp32": 1e-4, "bf16": 1e-2}
#: the standing check warns above FUSED_CHECK_FLOOR_FACTOR x the floor measured in the same step (verl's own pass
#: against itself on the batch in another order, i.e. packed otherwise) + the dtype's threshold above: at 7B in
#: bf16 on an H200 verl's pass differs from itself by 2.7e-2..4.1e-2 under another packing, as much as the fused
#: pass differs from it (4.0e-2), so a fixed threshold cannot tell rounding from a fault at every scale
FUSED_CHECK_FLOOR_FACTOR = 2.0


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


def standing_check(fused: torch.Tensor, verl: torch.Tensor, verl_repacked: Optional[torch.Tensor],
                   response_mask: torch.Tensor, valid: Optional[torch.Tensor], tolerance: float,
                   factor: float = FUSED_CHECK_FLOOR_FACTOR) -> tuple[dict, bool]:
    """The standing check of one step: is |fused - verl| old log-prob rounding, or a fault?

    floor = mean |verl - verl_repacked| (verl's own pass on the same rows packed otherwise, same step, same weights):
    what rounding alone moves a log-prob by on this model, dtype and hardware. Warn when

        mean |fused - verl| > factor * floor + tolerance

    (``tolerance``: the dtype's :data:`FUSED_CHECK_THRESHOLDS`, what remains when the floor measures 0, e.g. CPU
    numerics that do not depend on the packing). Stale weights, another temperature, a row mapped to another sample
    move the fused log-probs far above the floor; rounding keeps them at it. ``verl_repacked`` None: floor 0.

    Returns the metrics (:func:`fused_check_metrics` plus ``mrtpo/consistency/verl_vs_verl_mean`` (the floor) and
    ``mrtpo/consistency/fused_check_threshold``) and whether to warn.
    """
    m = fused_check_metrics(fused, verl, response_mask, valid)
    floor = 0.0
    if verl_repacked is not None:
        f = fused_check_metrics(verl_repacked, verl, response_mask, valid)
        floor = f.get("mrtpo/consistency/fused_vs_verl_mean", 0.0)
    threshold = factor * floor + tolerance
    m["mrtpo/consistency/verl_vs_verl_mean"] = floor
    m["mrtpo/consistency/fused_check_threshold"] = threshold
    return m, m.get("mrtpo/consistency/fused_vs_verl_mean", 0.0) > threshold
