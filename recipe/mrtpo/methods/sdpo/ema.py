"""SDPO's EMA teacher as a sharded copy of the actor's parameters on the actor's own workers (pure torch).

    theta_T <- (1 - rate) * theta_T + rate * theta_S        after each actor update (SDPO's _update_teacher)

The reference keeps the teacher as a second FSDP module (verl's reference model, initialised from the
initial policy) and runs it in the update. Here the teacher pass runs before the update on the actor's
own module, so the teacher needs no module of its own: :class:`EMATeacher` holds one tensor per parameter,
a copy of this rank's local shard (FSDP2's DTensor ``to_local()``; the parameter itself for a plain
module), in the shard's dtype and on its device. :meth:`EMATeacher.swapped` exchanges the contents of the
actor's shards and the teacher's in place, one parameter at a time (one parameter's scratch memory), runs
the body with the teacher's weights and exchanges them back, also on an error. The extra memory is one
sharded copy of the parameters (the optimizer state is 2-3 such copies), against a second module's
copy plus its FSDP buffers.

FSDP2 keeps the root module's parameters unsharded after a no-grad forward (``named_parameters()`` then gives
the gathered tensors); ``reshard`` (the worker passes ``FSDPModule.reshard``) is called before each exchange,
so the exchange sees the shards and the next forward gathers the swapped ones; the worker also reshards
before taking, updating or restoring the teacher. A shard of the wrong shape is refused, never exchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Optional

import torch

from recipe.mrtpo.core.shards import local_shard  # noqa: F401  (re-exported)


def ema_update_(teacher: torch.Tensor, student: torch.Tensor, rate: float) -> None:
    """In place: ``teacher <- (1 - rate) * teacher + rate * student`` (SDPO's ``mul_(1 - rate).add_(student, alpha=rate)``)."""
    teacher.mul_(1.0 - rate).add_(student.to(device=teacher.device, dtype=teacher.dtype), alpha=rate)


def _sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = values.to(device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu()


class EMATeacher:
    """The EMA teacher's local shards, in ``module.named_parameters()`` order (module docstring)."""

    def __init__(self, shards: dict[str, torch.Tensor]):
        self.shards = shards

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> EMATeacher:
        """A teacher equal to the module's current weights (the initial policy when taken before the first update)."""
        with torch.no_grad():
            return cls({n: local_shard(p).detach().clone() for n, p in module.named_parameters()})

    def _pairs(self, module: torch.nn.Module) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        names = [n for n, _ in module.named_parameters()]
        if names != list(self.shards):
            missing, extra = sorted(set(names) - set(self.shards)), sorted(set(self.shards) - set(names))
            raise ValueError(f"the SDPO teacher does not match the actor's parameters (missing {missing[:3]}, extra {extra[:3]})")
        for n, p in module.named_parameters():
            s, t = local_shard(p), self.shards[n]
            if s.shape != t.shape:
                raise ValueError(f"the SDPO teacher's shard of {n} is {tuple(t.shape)}, the actor's {tuple(s.shape)} (another sharding?)")
            yield s, t

    @torch.no_grad()
    def update(self, module: torch.nn.Module, rate: float) -> None:
        """``theta_T <- (1 - rate) theta_T + rate theta_S`` with the module's current (student) shards; rate 0 leaves it."""
        if rate == 0.0:
            return
        for s, t in self._pairs(module):
            ema_update_(t, s, float(rate))

    @torch.no_grad()
    def _exchange(self, module: torch.nn.Module) -> None:
        for s, t in self._pairs(module):
            tmp = s.clone()
            s.copy_(t)
            t.copy_(tmp)
            del tmp

    @contextmanager
    def swapped(self, module: torch.nn.Module, reshard: Optional[Callable[[], None]] = None):
        """The body runs with the teacher's weights in the module's shards; the student's are back afterwards."""
        if reshard is not None:
            reshard()
        self._exchange(module)
        try:
            yield
        finally:
            if reshard is not None:
                reshard()
            self._exchange(module)

    @torch.no_grad()
    def fingerprint(self) -> tuple[float, float]:
        """``(sum theta_T, sum theta_T^2)`` in float64 over every shard of every rank: equal teachers, equal numbers."""
        v = torch.zeros(2, dtype=torch.float64)
        for t in self.shards.values():
            d = t.detach().double()
            v[0] += d.sum().cpu()
            v[1] += (d * d).sum().cpu()
        v = _sum_over_ranks(v)
        return float(v[0]), float(v[1])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shards on CPU (what the worker saves beside the actor's checkpoint)."""
        return {n: t.detach().cpu() for n, t in self.shards.items()}

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], module: torch.nn.Module) -> EMATeacher:
        """The saved shards, each on its parameter's device and in its dtype, checked against the module."""
        shards = {}
        params = dict(module.named_parameters())
        for n, t in state.items():
            if n not in params:
                raise ValueError(f"the saved SDPO teacher has a parameter {n} the actor does not")
            s = local_shard(params[n])
            shards[n] = t.to(device=s.device, dtype=s.dtype).clone()
        teacher = cls(shards)
        list(teacher._pairs(module))  # the same names and shapes, or a clear error
        return teacher
