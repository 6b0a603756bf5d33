"""A method's part on the actor's workers: the one interface ``recipe.mrtpo.step.worker`` dispatches to.

A method whose actor update differs from verl's (OPSD's and gdpo-distill's losses, SDPO's loss and EMA teacher,
RLSD's teacher sync) names its part in its registry entry (``Method.actor_part``, an
:class:`~recipe.mrtpo.methods.types.ActorPartRef`) and its after-step hook puts the part's settings in the update's
batch under the ref's ``key``. The worker creates each part once, from nothing but itself (:class:`ActorPart`
``(worker)``), and then only dispatches:

- ``update_actor``: the batch's settings select the part; the worker installs the loss the part names
  (:meth:`ActorPart.loss`; verl's own where none) and calls :meth:`ActorPart.update` with verl's update;
- ``save_checkpoint`` / ``load_checkpoint``: each part's :meth:`ActorPart.state_dict` in its
  ``checkpoint_dir`` of the actor's checkpoint, one file per rank; a checkpoint without it is reported to the
  part (:meth:`ActorPart.resumed_without`), which refuses to go on where its state is lost.

The helpers below are what more than one part uses: the rank's file name, FSDP2's reshard, and the gradient norms
of the optimizer steps of one update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Optional

import torch

# verl 0.9.1 code :func:`grad_norms` relies on, ``module:qualname`` -> sha256 of the dedented source: the engine's
# ``train_batch`` calls ``self.optimizer_step()`` once per mini-batch, and the FSDP engine's ``optimizer_step``
# returns the gradient norm as a float, skipping the optimizer's step (and zeroing the gradients) when it is not
# finite (tests/unit/test_actor_parts.py compares them with the installed verl)
GRAD_NORM_SOURCES = {
    "verl.workers.engine.base:BaseEngine.train_batch":
        "bc557693396f763b7dee1e8fe37f8b821d30af9502cb32af3c1b54b60a1dfceb",
    "verl.workers.engine.fsdp.transformer_impl:FSDPEngine.optimizer_step":
        "ed1343351af608442313fb63d6c2e472c5eea32d3e5ad86237cab1588fa18e95",
}


class ActorPart:
    """One method's state and hooks on an actor worker (module docstring). The base runs verl's update unchanged."""

    def __init__(self, worker: Any):
        self.worker = worker

    def loss(self, settings: dict) -> Optional[tuple[str, Callable[[Any], Callable]]]:
        """``(key, build)``: the actor's loss as ``build(actor_config)``, rebuilt only when ``key`` changes; None:
        verl's own loss."""
        return None

    def update(self, data, settings: dict, run: Callable):
        """The actor update of ``data``; ``run(data)`` is verl's ``update_actor``."""
        return run(data)

    def state_dict(self) -> Optional[dict]:
        """This rank's state for the actor's checkpoint (None: nothing to save)."""
        return None

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError(f"{type(self).__name__} keeps no state")

    def resumed_without(self, path: str) -> None:
        """The run resumed from ``path``, a checkpoint holding none of this part's state."""


def rank_file() -> str:
    """This rank's file name in a part's checkpoint folder (one file per rank, as verl's model shards)."""
    dist = torch.distributed
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    return f"rank_{rank}_of_{world}.pt"


def reshard(module) -> None:
    """FSDP2's reshard of ``module`` (its unsharded copies dropped: the local shards are what a forward gathers next);
    nothing for a module verl did not wrap."""
    from recipe.mrtpo.seams.verl_seam import fsdp_reshard

    fsdp_reshard(module)


def check_grad_norm_sources() -> list[str]:
    """The :data:`GRAD_NORM_SOURCES` whose installed source is not the pinned one (empty: all as in verl 0.9.1)."""
    from recipe.mrtpo.seams.source_pins import changed_sources

    return changed_sources(GRAD_NORM_SOURCES)


def add_metrics(output, values: dict[str, float]) -> None:
    """``values`` into the metrics of verl's update output (the ranks that return outputs), logged as ``actor/<name>``."""
    if output is None:
        return
    from verl.utils import tensordict_utils as tu

    metrics = tu.get(output, "metrics")
    if isinstance(metrics, dict):
        metrics.update({k: [float(v)] for k, v in values.items()})


@contextmanager
def grad_norms(engine):
    """The gradient norms of the optimizer steps the body runs on ``engine`` (verl's ``optimizer_step``, watched on
    the instance and restored after; :data:`GRAD_NORM_SOURCES`)."""
    norms: list[float] = []
    own = "optimizer_step" in vars(engine)
    step = engine.optimizer_step

    def watched(*args, **kwargs):
        norm = step(*args, **kwargs)
        norms.append(float(norm))
        return norm

    engine.optimizer_step = watched
    try:
        yield norms
    finally:
        if own:
            engine.optimizer_step = step
        else:
            del engine.optimizer_step


def any_finite(norms: list[float]) -> bool:
    """Whether one optimizer step of the update had a finite gradient norm (verl applied at least one step). An
    update that ran no optimizer step at all is refused: verl changed what :func:`grad_norms` watches."""
    if not norms:
        raise RuntimeError("the actor update ran no optimizer step that the recipe saw (verl's engine.optimizer_step "
                           "was not called): verl changed; see GRAD_NORM_SOURCES in recipe/mrtpo/methods/actor_part.py")
    return any(math.isfinite(n) for n in norms)
