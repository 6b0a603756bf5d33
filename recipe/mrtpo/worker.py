"""The actor worker with the replay method (verl 0.9.1 ``ActorRolloutRefWorker`` + one method).

``compute_replay_relevance`` runs on the actor's own workers with the same data-parallel dispatch as
``compute_log_prob`` (``make_nd_compute_dataproto_dispatch_fn(mesh_name="actor")``): the trainer's
rows are split across the DP ranks, each rank replays its rows through the FSDP module in eval mode
without gradients, and the outputs are gathered back in order. The algorithm itself is
:func:`recipe.mrtpo.core.replay.replay_relevance`; this class only binds it to verl's engine.
"""

from __future__ import annotations

import logging
import os

import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker

from recipe.mrtpo.core.replay import hf_forward, replay_relevance

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


def _module_device(module) -> torch.device:
    for p in module.parameters():
        local = getattr(p, "to_local", None)  # FSDP2 DTensor
        return (local() if local else p).device
    return torch.device("cpu")


def _sync_max(n: int) -> int:
    """Largest local forward count over all ranks (every rank must run the same number of FSDP forwards)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return n
    if torch.distributed.get_world_size() == 1:
        return n
    backend = torch.distributed.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    t = torch.tensor([n], dtype=torch.long, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())


class MRTPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/ref worker plus :meth:`compute_replay_relevance`."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_replay_relevance(self, data: TensorDict) -> TensorDict:
        """Relevance q[R, K, T] and P_all log-probs [R, T] for this rank's rows (see ``replay.py``).

        Non-tensor settings in ``data``: ``temperature``, ``measure``, ``micro_batch_size``,
        ``chunk_size``, ``pad_token_id``, ``compile_js``.
        """
        engine = self.actor.engine
        sp = getattr(engine, "ulysses_sequence_parallel_size", 1) or 1
        if sp > 1:
            raise NotImplementedError("the MRTPO replay runs the plain module forward: ulysses sequence parallel > 1 is not supported")
        temperature = float(tu.get(data, key="temperature", default=self.config.rollout.temperature))
        measure = tu.get(data, key="measure", default="js_distance")
        micro = int(tu.get(data, key="micro_batch_size", default=8))
        chunk = tu.get(data, key="chunk_size", default=None)
        pad_id = int(tu.get(data, key="pad_token_id", default=0))
        compile_js = bool(tu.get(data, key="compile_js", default=False))
        with engine.eval_mode(), torch.no_grad():
            module = engine.module
            out = replay_relevance(
                hf_forward(module),
                data["variant_ids"].cpu(),
                data["variant_lens"].cpu(),
                data["responses"].cpu(),
                data["response_mask"].cpu(),
                data["pair_variant"].cpu(),
                temperature=temperature,
                measure=measure,
                micro_batch_size=micro,
                chunk_size=int(chunk) if chunk else None,
                pad_id=pad_id,
                device=_module_device(module),
                sync_forward_count=_sync_max,
                compiled_js=compile_js,
            )
        R = data["pair_variant"].shape[0]
        return TensorDict(
            {"relevance": out["relevance"], "replay_logprobs": out["replay_logprobs"]},
            batch_size=[R],
        )
