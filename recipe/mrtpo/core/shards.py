"""This rank's parameter shards, pure torch: read one, and copy one module's shards into another's.

verl's FSDP2 engines hold each parameter as a DTensor whose ``to_local()`` is this rank's shard; a plain module's
parameter is its own shard. Two modules built by the same engine code from the same model (verl's actor and its
reference model, on the same ranks and mesh) have the same parameter names and shard shapes: :func:`copy_shards_`
checks both and refuses a mismatch instead of copying a wrong slice.
"""

from __future__ import annotations

import torch


def local_shard(p: torch.Tensor) -> torch.Tensor:
    """This rank's part of parameter ``p`` as a plain tensor sharing its storage (DTensor: ``to_local()``)."""
    data = p.data
    return data.to_local() if hasattr(data, "to_local") else data


@torch.no_grad()
def copy_shards_(dst: torch.nn.Module, src: torch.nn.Module) -> int:
    """In place: every local shard of ``dst`` <- the same parameter's local shard of ``src`` (cast to ``dst``'s dtype
    and device: exact where the dtypes agree). Returns the number of parameters copied. Raises ValueError, copying
    nothing, when the names or a shard's shape differ."""
    d, s = dict(dst.named_parameters()), dict(src.named_parameters())
    if list(d) != list(s):
        missing, extra = sorted(set(s) - set(d)), sorted(set(d) - set(s))
        raise ValueError(f"the modules' parameters differ (missing {missing[:3]}, extra {extra[:3]})")
    pairs = [(local_shard(d[n]), local_shard(s[n]), n) for n in d]
    for a, b, n in pairs:
        if a.shape != b.shape:
            raise ValueError(f"the shard of {n} is {tuple(a.shape)} in one module and {tuple(b.shape)} in the other "
                             "(another sharding?)")
    for a, b, _ in pairs:
        a.copy_(b)
    return len(pairs)
