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

#: the non-tensor settings the trainer sends with the rows (``replay_driver.run_replay``); chunk_size 0 = auto
REPLAY_SETTINGS = ("temperature", "measure", "micro_batch_size", "chunk_size", "pad_token_id", "compile_js")

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
        settings = {k: tu.get(data, key=k) for k in REPLAY_SETTINGS}
        missing = [k for k, v in settings.items() if v is None]
        if missing:
            raise ValueError(f"compute_replay_relevance: settings {missing} missing (the trainer sends them from mrtpo.*)")
        chunk = int(settings["chunk_size"])
        with engine.eval_mode(), torch.no_grad():
            module = engine.module
            out = replay_relevance(
                hf_forward(module),
                data["variant_ids"].cpu(),
                data["variant_lens"].cpu(),
                data["responses"].cpu(),
                data["response_mask"].cpu(),
                data["pair_variant"].cpu(),
                temperature=float(settings["temperature"]),
                measure=str(settings["measure"]),
                micro_batch_size=int(settings["micro_batch_size"]),
                chunk_size=chunk if chunk > 0 else None,
                pad_id=int(settings["pad_token_id"]),
                device=_module_device(module),
                sync_forward_count=_sync_max,
                compiled_js=bool(settings["compile_js"]),
            )
        R = data["pair_variant"].shape[0]
        return TensorDict(
            {"relevance": out["relevance"], "replay_logprobs": out["replay_logprobs"]},
            batch_size=[R],
        )
