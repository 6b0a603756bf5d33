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

from recipe.mrtpo.core.replay import hf_forward, replay_relevance, sync_max_over_ranks

#: the non-tensor settings the trainer sends with the rows (``replay_driver.run_replay``); chunk_size 0 = auto,
#: token_budget 0 = micro-batches of ``micro_batch_size`` sequences
REPLAY_SETTINGS = ("temperature", "measure", "micro_batch_size", "token_budget", "chunk_size", "pad_token_id", "compile_js")
#: dtype of the compact relevance rows handed back (docs/design.md §5): q in [0, 1] needs ~3 digits, not fp32
RELEVANCE_DTYPE = torch.bfloat16

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


def _module_device(module) -> torch.device:
    for p in module.parameters():
        local = getattr(p, "to_local", None)  # FSDP2 DTensor
        return (local() if local else p).device
    return torch.device("cpu")


def _sync_max(n: int) -> int:
    """Largest local forward count over all ranks (every rank must run the same number of FSDP forwards,
    agreed before the first one: docs/design.md §5)."""
    return sync_max_over_ranks(n)


def _settings(data: TensorDict, keys: tuple[str, ...], method: str) -> dict:
    """The non-tensor settings ``keys`` of ``data``; a clear error naming ``method`` when one is missing."""
    settings = {k: tu.get(data, key=k) for k in keys}
    missing = [k for k, v in settings.items() if v is None]
    if missing:
        raise ValueError(f"{method}: settings {missing} missing (the trainer sends them from mrtpo.*)")
    return settings


def _pass_options(settings: dict, device, sync) -> dict:
    """The keyword arguments that the replay and the OPSD teacher pass share (chunk_size / token_budget 0 = auto)."""
    chunk, budget = int(settings["chunk_size"]), int(settings["token_budget"])
    return {
        "temperature": float(settings["temperature"]),
        "micro_batch_size": int(settings["micro_batch_size"]),
        "token_budget": budget if budget > 0 else None,
        "chunk_size": chunk if chunk > 0 else None,
        "pad_id": int(settings["pad_token_id"]),
        "device": device,
        "sync_forward_count": sync,
    }


def _forward_counts(out: dict, rows: int) -> torch.Tensor:
    """[rows, 2] long: this rank's own and the agreed forward counts of a pass, the same on each of its rows."""
    counts = torch.tensor([int(out["n_forwards"]), int(out["n_forwards_global"])], dtype=torch.long)
    return counts.expand(rows, 2).clone()


def replay_rows(forward, data: TensorDict, device, sync=_sync_max) -> TensorDict:
    """This rank's rows through :func:`replay_relevance`, answered compactly (docs/design.md §5).

    ``data``: the packed rows (``variant_ids``, ``variant_lens``, ``responses``, ``response_mask``,
    ``pair_variant``, optionally ``logprob_variant``: whose log-probs to return) and the :data:`REPLAY_SETTINGS`. Returns, per row, ``variant_relevance``
    [R, NV', T] in :data:`RELEVANCE_DTYPE` (one row per variant; the driver maps them to rewards),
    ``replay_logprobs`` [R, T] fp32 (the consistency check needs fp32), and ``replay_forwards`` [R, 2]
    (this rank's own and agreed forward counts, the same on each of its rows).
    """
    settings = _settings(data, REPLAY_SETTINGS, "compute_replay_relevance")
    out = replay_relevance(
        forward,
        data["variant_ids"].cpu(),
        data["variant_lens"].cpu(),
        data["responses"].cpu(),
        data["response_mask"].cpu(),
        data["pair_variant"].cpu(),
        measure=str(settings["measure"]),
        compiled_js=bool(settings["compile_js"]),
        logprob_variant=data["logprob_variant"].cpu() if "logprob_variant" in data.keys() else None,
        **_pass_options(settings, device, sync),
    )
    R = data["pair_variant"].shape[0]
    return TensorDict(
        {
            "variant_relevance": out["variant_relevance"].to(RELEVANCE_DTYPE),
            "replay_logprobs": out["replay_logprobs"],
            "replay_forwards": _forward_counts(out, R),
        },
        batch_size=[R],
    )


class MRTPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/ref worker plus :meth:`compute_replay_relevance`."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_replay_relevance(self, data: TensorDict) -> TensorDict:
        """Compact relevance rows and P_all log-probs for this rank's rows (:func:`replay_rows`).

        Non-tensor settings in ``data``: :data:`REPLAY_SETTINGS`. Every rank agrees on the number of
        forwards before its first one (``_sync_max``), as FSDP's per-forward all-gathers require.
        """
        return self._no_grad_pass(replay_rows, data, "the MRTPO replay")

    # ------------------------------------------------------------------ OPSD (docs/opsd.md)
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_opsd_teacher(self, data: TensorDict) -> TensorDict:
        """Teacher top-k of this rank's rows: the behaviour policy under each row's P_all (:func:`opsd_teacher_rows`).

        Dispatched like ``compute_replay_relevance``: no grad, eval mode, the forward count agreed across
        ranks (``_sync_max``) before the first forward.
        """
        return self._no_grad_pass(opsd_teacher_rows, data, "the OPSD teacher pass")

    def _no_grad_pass(self, rows_fn, data: TensorDict, what: str) -> TensorDict:
        """``rows_fn(forward, data, device, sync)`` through the actor's FSDP module in eval mode, without
        gradients (the shared body of the two passes above)."""
        engine = self.actor.engine
        sp = getattr(engine, "ulysses_sequence_parallel_size", 1) or 1
        if sp > 1:
            raise NotImplementedError(f"{what} runs the plain module forward: ulysses sequence parallel > 1 is not supported")
        with engine.eval_mode(), torch.no_grad():
            module = engine.module
            return rows_fn(hf_forward(module), data, _module_device(module), _sync_max)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: TensorDict) -> TensorDict:
        """verl's ``update_actor``; with OPSD settings in the batch, through verl's distillation loss (``opsd_loss.py``)."""
        from recipe.mrtpo.config.schema import OPSD_TOPK_LOSS_MODES
        from recipe.mrtpo.opsd_driver import LOSS_SETTINGS_KEY
        from recipe.mrtpo.opsd_loss import opsd_loss_fn, settings_key

        settings = tu.pop(data, key=LOSS_SETTINGS_KEY, default=None)
        installed = getattr(self, "_opsd_loss_key", None)
        if settings is None and installed is not None:  # back to verl's own loss
            self.loss_fn, self._opsd_loss_key = self._verl_loss_fn, None
            self.actor.set_loss_fn(self.loss_fn)
        elif settings is not None:
            if installed != settings_key(settings):
                if installed is None:
                    self._verl_loss_fn = self.loss_fn
                self.loss_fn = opsd_loss_fn(self._verl_loss_fn.keywords["config"], settings)
                self._opsd_loss_key = settings_key(settings)
                self.actor.set_loss_fn(self.loss_fn)
            tu.assign_non_tensor(data, distillation_use_topk=settings["loss_mode"] in OPSD_TOPK_LOSS_MODES)
        return super().update_actor(data)


def opsd_teacher_rows(forward, data: TensorDict, device, sync=_sync_max) -> TensorDict:
    """This rank's rows through :func:`recipe.mrtpo.core.opsd.teacher_topk_rows` (the trainer-free part of
    :meth:`MRTPOActorRolloutRefWorker.compute_opsd_teacher`; settings: ``opsd_driver.TEACHER_SETTINGS``)."""
    from recipe.mrtpo.core.opsd import teacher_topk_rows
    from recipe.mrtpo.opsd_driver import TEACHER_SETTINGS

    settings = _settings(data, TEACHER_SETTINGS, "compute_opsd_teacher")
    out = teacher_topk_rows(
        forward,
        data["prompt_ids"].cpu(),
        data["prompt_lens"].cpu(),
        data["responses"].cpu(),
        data["response_mask"].cpu(),
        k=int(settings["topk"]),
        **_pass_options(settings, device, sync),
    )
    R = data["prompt_lens"].shape[0]
    return TensorDict(
        {
            "teacher_topk_logprobs": out["topk_logprobs"],
            "teacher_topk_ids": out["topk_ids"],
            "teacher_token_logprobs": out["token_logprobs"],
            "teacher_forwards": _forward_counts(out, R),
        },
        batch_size=[R],
    )
