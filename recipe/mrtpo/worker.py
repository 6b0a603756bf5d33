"""The actor worker with the recipe's passes (verl 0.9.1 ``ActorRolloutRefWorker`` + three methods).

``compute_replay_relevance`` runs on the actor's own workers with the same data-parallel dispatch as
``compute_log_prob`` (``make_nd_compute_dataproto_dispatch_fn(mesh_name="actor")``): the trainer's
rows are split across the DP ranks, each rank replays its rows through the FSDP module in eval mode
without gradients, and the outputs are gathered back in order. ``compute_ref_replay`` is the same pass
through verl's reference model (the initial policy), dispatched as ``compute_ref_log_prob`` (mesh
``ref``): RLSD's initial teacher. ``compute_opsd_teacher`` is gdpo-distill's teacher pass on the actor,
``compute_ref_opsd_teacher`` OPSD's on the reference. The
algorithm itself is :func:`recipe.mrtpo.core.replay.replay_relevance`; this class only binds it to verl's
engines.
"""

from __future__ import annotations

import logging
import os
from functools import partial

import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker

from recipe.mrtpo.core.passes import PassSettings, hf_forward, sync_max_over_ranks
from recipe.mrtpo.core.replay import replay_relevance
from recipe.mrtpo.core.shared_prompts import share_fallback_reason

#: the non-tensor settings the trainer sends with the rows (``replay_driver.run_replay``): the pass engine's
#: (:class:`recipe.mrtpo.core.passes.PassSettings`; ``layout`` optional, "auto") and the replay's own
REPLAY_SETTINGS = (*PassSettings.WIRE_KEYS, "measure", "compile_js")
#: dtype of the compact relevance rows handed back (docs/design.md §5): q in [0, 1] needs ~3 digits, not fp32
RELEVANCE_DTYPE = torch.bfloat16

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


def pass_device() -> torch.device:
    """Where a pass's inputs go: verl's device (``get_device_name`` / ``get_device_id``), not the module's
    first parameter (with FSDP2's ``offload_policy`` the shards live on CPU while the compute runs on the
    accelerator). CPU where verl names an accelerator that this process cannot use (verl falls back to
    naming "cuda" when it detects none; the recipe's CPU runs register a "cpu" platform)."""
    from verl.utils.device import get_device_id, get_device_name

    name = get_device_name()
    module = getattr(torch, name, None)
    if name == "cpu" or module is None or not module.is_available():
        return torch.device("cpu")
    return torch.device(name, get_device_id())


def _hf_config(module):
    for m in (module, getattr(module, "_fsdp_wrapped_module", None), getattr(module, "module", None)):
        cfg = getattr(m, "config", None)
        if cfg is not None:
            return cfg
    return None


def attn_implementation(module) -> str:
    """The module's attention implementation (``config._attn_implementation``; "" when it has none)."""
    cfg = _hf_config(module)
    return str(getattr(cfg, "_attn_implementation", "") or "") if cfg is not None else ""


def model_type(module) -> str:
    """The module's ``config.model_type`` ("" when it has none): the row of the model table it takes."""
    cfg = _hf_config(module)
    return str(getattr(cfg, "model_type", "") or "") if cfg is not None else ""


def check_pass_model(module, what: str) -> None:
    """Refuse a model the passes cannot run (``core.model_support.refusal``: a vision-language model); the
    launch check (``main_mrtpo.check_launch``) refuses it before Ray, this is the worker's own guard."""
    from recipe.mrtpo.core.model_support import config_facts, refusal

    cfg = _hf_config(module)
    if cfg is None:
        return
    msg = refusal(**config_facts(cfg), what=what)
    if msg:
        raise ValueError(msg)


def engine_autocast(engine):
    """The autocast context verl 0.9.1's ``FSDPEngineWithLMHead.forward_step`` runs the model (and its
    temperature division and log-prob) under: ``torch.autocast(get_device_name(), engine._autocast_dtype)``
    (bf16 when the engine does not say), none when that dtype is fp32."""
    from contextlib import nullcontext

    from verl.utils.device import get_device_name

    dtype = getattr(engine, "_autocast_dtype", torch.bfloat16)
    return nullcontext() if dtype == torch.float32 else torch.autocast(device_type=get_device_name(), dtype=dtype)


def verl_numerics(engine, device) -> dict:
    """The dtypes verl's own log-prob and entropy of the actor's logits come out in (``PassSettings.logprob_dtype``,
    ``entropy_dtype``), read off verl's functions under the engine's autocast: the logits are in the autocast
    dtype (fp32 without autocast); ``verl.utils.torch_functional.logprobs_from_logits`` returns fp32 through
    flash-attention's cross entropy and the logits' dtype through its fallback; the entropy is
    ``entropy_from_logits_with_chunking`` (fp32) when ``engine_config.entropy_from_logits_with_chunking``, else
    ``entropy_from_logits`` (its torch.compile'd form returns the same dtype)."""
    from verl.utils import torch_functional as verl_F
    from verl.workers.engine.fsdp import transformer_impl  # the name its prepare_model_outputs calls

    dtype = getattr(engine, "_autocast_dtype", torch.bfloat16)
    chunked = bool(getattr(getattr(engine, "engine_config", None), "entropy_from_logits_with_chunking", False))
    with engine_autocast(engine), torch.no_grad():
        x = torch.zeros(2, 4, dtype=dtype, device=device)
        lp = transformer_impl.logprobs_from_logits(x, torch.zeros(2, dtype=torch.long, device=device), inplace_backward=False)
        ent = (verl_F.entropy_from_logits_with_chunking if chunked else verl_F.entropy_from_logits)(x)
    return {"logprob_dtype": str(lp.dtype).removeprefix("torch."), "entropy_dtype": str(ent.dtype).removeprefix("torch.")}


def autocast_forward(forward, engine):
    """``forward`` run under :func:`engine_autocast` (the ForwardFn the passes get)."""

    def fwd(*args):
        with engine_autocast(engine):
            return forward(*args)

    return fwd


def _sync_max(n: int) -> int:
    """Largest local forward count over all ranks (every rank must run the same number of FSDP forwards,
    agreed before the first one: docs/design.md §5)."""
    return sync_max_over_ranks(n)


def _wire(data: TensorDict, keys: tuple[str, ...]) -> dict:
    return {k: tu.get(data, key=k) for k in keys}


def _settings(data: TensorDict, keys: tuple[str, ...], method: str, attn: str = "", **model) -> tuple[PassSettings, dict]:
    """The pass settings of ``data`` and its other settings ``keys``; a clear error naming ``method`` when
    one is missing. ``model``: what the worker knows of the model and verl (``model_type``, ``logprob_dtype``,
    ``entropy_dtype``)."""
    wire = _wire(data, tuple(dict.fromkeys((*PassSettings.WIRE_KEYS, *keys))))
    missing = [k for k in keys if k not in ("layout", "share_prompts") and wire.get(k) is None]
    if missing:
        raise ValueError(f"{method}: settings {missing} missing (the trainer sends them from mrtpo.*)")
    return PassSettings.from_wire(wire, method, attn, **model), wire


def _pass_counts(out: dict, rows: int, settings: PassSettings) -> torch.Tensor:
    """[rows, 5] long: this rank's own and agreed forward counts, its forwarded and existing tokens, and 1 where
    ``share_prompts`` was on but could not apply (``core.shared_prompts.share_fallback_reason``), the same on
    each of its rows (the driver reads one row per rank)."""
    keys = ("n_forwards", "n_forwards_global", "tokens_forwarded", "tokens_existing")
    fallback = int(share_fallback_reason(settings) is not None)
    counts = torch.tensor([int(out[k]) for k in keys] + [fallback], dtype=torch.long)
    return counts.expand(rows, counts.numel()).clone()


def replay_rows(forward, data: TensorDict, device, sync=_sync_max, attn: str = "", **model) -> TensorDict:
    """This rank's rows through :func:`replay_relevance`, answered compactly (docs/design.md §5).

    ``data``: the packed rows (``variant_ids``, ``variant_lens``, ``responses``, ``response_mask``,
    ``pair_variant``, optionally ``logprob_variant``: whose log-probs to return) and the
    :data:`REPLAY_SETTINGS`. Returns, per row, ``variant_relevance`` [R, NV', T] in
    :data:`RELEVANCE_DTYPE` (one row per variant; the driver maps them to rewards), ``replay_logprobs``
    [R, T] fp32 (the consistency check needs fp32), and ``replay_forwards`` [R, 5] (:func:`_pass_counts`);
    with the optional setting ``fused`` also ``replay_entropy`` [R, T] fp32 (verl's ``entropy`` field).
    """
    settings, wire = _settings(data, REPLAY_SETTINGS, "compute_replay_relevance", attn, **model)
    fused = bool(tu.get(data, key="fused") or False)  # optional: the old_log_prob step fused with the replay
    out = replay_relevance(
        forward,
        data["variant_ids"].cpu(),
        data["variant_lens"].cpu(),
        data["responses"].cpu(),
        data["response_mask"].cpu(),
        data["pair_variant"].cpu(),
        measure=str(wire["measure"]),
        compiled_js=bool(wire["compile_js"]),
        logprob_variant=data["logprob_variant"].cpu() if "logprob_variant" in data.keys() else None,
        settings=settings,
        device=device,
        sync_forward_count=sync,
        entropy=fused,
    )
    R = data["pair_variant"].shape[0]
    fields = {
        "variant_relevance": out["variant_relevance"].to(RELEVANCE_DTYPE),
        "replay_logprobs": out["replay_logprobs"],
        "replay_forwards": _pass_counts(out, R, settings),
    }
    if fused:
        fields["replay_entropy"] = out["replay_entropy"]
    return TensorDict(fields, batch_size=[R])


class MRTPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/ref worker plus :meth:`compute_replay_relevance`."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_replay_relevance(self, data: TensorDict) -> TensorDict:
        """Compact relevance rows and P_all log-probs for this rank's rows (:func:`replay_rows`).

        Non-tensor settings in ``data``: :data:`REPLAY_SETTINGS`. Every rank agrees on the number of
        forwards before its first one (``_sync_max``), as FSDP's per-forward all-gathers require.
        """
        return self._no_grad_pass(replay_rows, data, "the MRTPO replay")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_replay(self, data: TensorDict) -> TensorDict:
        """:meth:`compute_replay_relevance` through verl's reference model, the policy at step 0 (RLSD's
        ``mrtpo.rlsd_teacher=initial``: the log-probs of each row's teacher prompt). Dispatched as verl's
        ``compute_ref_log_prob``; no grad, eval mode, the forward count agreed across the reference's ranks."""
        if self.ref is None:
            raise RuntimeError("compute_ref_replay: this worker holds no reference model (role without 'ref')")
        return self._no_grad_pass(replay_rows, data, "the replay on the reference policy", engine=self.ref.engine)

    # ------------------------------------------------------------------ OPSD (docs/opsd.md)
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_opsd_teacher(self, data: TensorDict) -> TensorDict:
        """Teacher top-k of this rank's rows: the behaviour policy under each row's P_all (:func:`opsd_teacher_rows`).

        Dispatched like ``compute_replay_relevance``: no grad, eval mode, the forward count agreed across
        ranks (``_sync_max``) before the first forward.
        """
        return self._no_grad_pass(opsd_teacher_rows, data, "the OPSD teacher pass")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_opsd_teacher(self, data: TensorDict) -> TensorDict:
        """:meth:`compute_opsd_teacher` through verl's reference model, the policy at step 0 (OPSD's frozen
        teacher, the reference's ``--fixed_teacher``). Dispatched as ``compute_ref_log_prob``, as
        :meth:`compute_ref_replay`."""
        if self.ref is None:
            raise RuntimeError("compute_ref_opsd_teacher: this worker holds no reference model (role without 'ref')")
        return self._no_grad_pass(opsd_teacher_rows, data, "the OPSD teacher pass on the reference policy", engine=self.ref.engine)

    def _no_grad_pass(self, rows_fn, data: TensorDict, what: str, engine=None) -> TensorDict:
        """``rows_fn(forward, data, device, sync, attn, **model)`` through an FSDP engine's module (the actor's
        unless ``engine`` is given) in eval mode, without gradients, each forward under verl's autocast
        (:func:`engine_autocast`), the reductions rounded as verl's (:func:`verl_numerics`), the layout by the
        model table (the shared body of the passes above)."""
        engine = self.actor.engine if engine is None else engine
        sp = getattr(engine, "ulysses_sequence_parallel_size", 1) or 1
        if sp > 1:
            raise NotImplementedError(f"{what} runs the plain module forward: ulysses sequence parallel > 1 is not supported")
        with engine.eval_mode(), torch.no_grad():
            module = engine.module
            check_pass_model(module, what)
            device = pass_device()
            return rows_fn(autocast_forward(hf_forward(module), engine), data, device, _sync_max, attn_implementation(module),
                           model_type=model_type(module), **verl_numerics(engine, device))

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: TensorDict) -> TensorDict:
        """verl's ``update_actor``; with OPSD's or gdpo-distill's settings in the batch, through its distillation loss
        (``methods/opsd/loss.py``: OPSD's JSD or verl's ``distillation_ppo_loss``); with SDPO's, through SDPO's loss
        and then the EMA teacher's update (:meth:`_sdpo_update_actor`)."""
        from recipe.mrtpo.methods.opsd.driver import LOSS_SETTINGS_KEY
        from recipe.mrtpo.methods.opsd.loss import opsd_loss_fn, settings_key, uses_topk_logits
        from recipe.mrtpo.methods.sdpo import LOSS_SETTINGS_KEY as SDPO_SETTINGS_KEY

        sdpo = tu.pop(data, key=SDPO_SETTINGS_KEY, default=None)
        if sdpo is not None:
            return self._sdpo_update_actor(data, sdpo)
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
            tu.assign_non_tensor(data, distillation_use_topk=uses_topk_logits(settings))
        return super().update_actor(data)

    # ------------------------------------------------------------------ SDPO (docs/opsd.md, SDPO)
    # Why these worker changes: SDPO's teacher is an EMA of the actor's weights, which only the actor's workers
    # hold (a sharded copy beside the actor's shards, methods/sdpo/ema.py). So the worker owns it: it runs the
    # teacher pass with it swapped in (compute_sdpo_teacher), updates it after each actor update
    # (_sdpo_update_actor) and saves / restores it with the actor's checkpoint (save_checkpoint, load_checkpoint).
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_sdpo_teacher(self, data: TensorDict) -> TensorDict:
        """SDPO's teacher pass of this rank's rows (:func:`sdpo_rows`): the behaviour policy's top-k ids on the
        rollout prompts, then the EMA teacher (swapped into the actor's shards) at those ids on P_all."""
        return self._no_grad_pass(partial(sdpo_rows, worker=self), data, "the SDPO teacher pass")

    def _sdpo_teacher(self):
        """The EMA teacher: restored by :meth:`load_checkpoint`, else the actor's weights at the first pass (the
        initial policy); a resumed run whose checkpoint holds none is refused (its teacher is lost)."""
        from recipe.mrtpo.methods.sdpo.ema import EMATeacher

        teacher = getattr(self, "_sdpo_ema", None)
        if teacher is None:
            lost = getattr(self, "_sdpo_resumed_without", None)
            if lost:
                raise RuntimeError(f"SDPO: the run resumed from {lost}, which holds no EMA teacher ({SDPO_TEACHER_DIR}/): "
                                   "the teacher cannot be restored. Resume from an SDPO checkpoint or start a new run")
            self._sdpo_reshard()  # the local shards, not the root's gathered parameters (FSDP2 after a no-grad forward)
            teacher = self._sdpo_ema = EMATeacher.from_module(self.actor.engine.module)
        return teacher

    def _sdpo_reshard(self):
        from recipe.mrtpo.verl_seam import fsdp_reshard

        return fsdp_reshard(self.actor.engine.module)

    def _sdpo_update_actor(self, data: TensorDict, settings: dict) -> TensorDict:
        """verl's ``update_actor`` with SDPO's loss (installed once; the settings' non-tensor entries on the batch), then
        ``theta_T <- (1 - rate) theta_T + rate theta_S`` (SDPO's ``_update_teacher``, once per update call as the
        reference, after all its mini-batches)."""
        from recipe.mrtpo.methods.opsd.loss import settings_key
        from recipe.mrtpo.methods.sdpo.loss import batch_settings, sdpo_loss_fn

        key = settings_key({k: settings[k] for k in ("topk",)})
        if getattr(self, "_sdpo_loss_key", None) != key:
            verl_loss = getattr(self, "_verl_loss_fn", None) or self.loss_fn
            self._verl_loss_fn = verl_loss
            self.loss_fn = sdpo_loss_fn(verl_loss.keywords["config"], settings)
            self._sdpo_loss_key = key
            self.actor.set_loss_fn(self.loss_fn)
        teacher = self._sdpo_teacher()  # before the update: the first step's teacher is the initial policy
        tu.assign_non_tensor(data, **batch_settings(settings))
        out = super().update_actor(data)
        self._sdpo_reshard()
        teacher.update(self.actor.engine.module, float(settings["ema_rate"]))
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        """verl's, plus SDPO's EMA teacher (this rank's shards) in ``<local_path>/sdpo_ema_teacher/``."""
        out = super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
        teacher = getattr(self, "_sdpo_ema", None)
        if teacher is not None and local_path:
            folder = os.path.join(local_path, SDPO_TEACHER_DIR)
            os.makedirs(folder, exist_ok=True)
            torch.save(teacher.state_dict(), os.path.join(folder, _rank_file()))
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        """verl's, plus SDPO's EMA teacher where the checkpoint holds one (bit for bit as saved)."""
        path = os.path.join(local_path, SDPO_TEACHER_DIR, _rank_file()) if local_path else ""
        state = torch.load(path, map_location="cpu", weights_only=True) if path and os.path.exists(path) else None
        out = super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
        if state is not None:
            from recipe.mrtpo.methods.sdpo.ema import EMATeacher

            self._sdpo_reshard()
            self._sdpo_ema, self._sdpo_resumed_without = EMATeacher.from_state_dict(state, self.actor.engine.module), None
        else:
            self._sdpo_ema, self._sdpo_resumed_without = None, local_path
        return out


#: the folder of SDPO's EMA teacher in the actor's checkpoint (one file per rank, as verl's model shards)
SDPO_TEACHER_DIR = "sdpo_ema_teacher"


def _rank_file() -> str:
    dist = torch.distributed
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    return f"rank_{rank}_of_{world}.pt"


def sdpo_rows(forward, data: TensorDict, device, sync=_sync_max, attn: str = "", worker=None, **model) -> TensorDict:
    """This rank's rows through :func:`recipe.mrtpo.methods.sdpo.teacher.sdpo_teacher_rows`, the EMA teacher of
    ``worker`` swapped in for the teacher's forwards; answers OPSD's field names (``methods.opsd.driver``) plus
    ``teacher_fingerprint`` [R, 2] (:meth:`EMATeacher.fingerprint`, the same on every row)."""
    from recipe.mrtpo.methods.opsd.driver import TEACHER_SETTINGS
    from recipe.mrtpo.methods.sdpo.teacher import sdpo_teacher_rows

    settings, wire = _settings(data, TEACHER_SETTINGS, "compute_sdpo_teacher", attn, **model)
    teacher, module = worker._sdpo_teacher(), worker.actor.engine.module
    keys = ("prompt_ids", "prompt_lens", "student_prompt_ids", "student_prompt_lens", "responses", "response_mask")
    out = sdpo_teacher_rows(forward, {k: data[k].cpu() for k in keys}, int(wire["topk"]), settings,
                            lambda: teacher.swapped(module, worker._sdpo_reshard), device=device, sync_forward_count=sync)
    R = data["prompt_lens"].shape[0]
    fp = torch.tensor(teacher.fingerprint(), dtype=torch.float64).expand(R, 2).clone()
    return TensorDict(
        {
            "teacher_topk_logprobs": out["topk_logprobs"],
            "teacher_topk_ids": out["topk_ids"].to(torch.int32),  # < 2^31 token ids; half the bytes of k = 100 ids
            "teacher_token_logprobs": out["token_logprobs"],
            "teacher_forwards": _pass_counts(out, R, settings),
            "teacher_fingerprint": fp,
        },
        batch_size=[R],
    )


def opsd_teacher_rows(forward, data: TensorDict, device, sync=_sync_max, attn: str = "", **model) -> TensorDict:
    """This rank's rows through :func:`recipe.mrtpo.methods.opsd.teacher.teacher_topk_rows` (the trainer-free part of
    :meth:`MRTPOActorRolloutRefWorker.compute_opsd_teacher`; settings: ``methods.opsd.driver.TEACHER_SETTINGS``)."""
    from recipe.mrtpo.methods.opsd.driver import TEACHER_SETTINGS
    from recipe.mrtpo.methods.opsd.teacher import teacher_topk_rows

    settings, wire = _settings(data, TEACHER_SETTINGS, "compute_opsd_teacher", attn, **model)
    out = teacher_topk_rows(
        forward,
        data["prompt_ids"].cpu(),
        data["prompt_lens"].cpu(),
        data["responses"].cpu(),
        data["response_mask"].cpu(),
        k=int(wire["topk"]),
        settings=settings,
        device=device,
        sync_forward_count=sync,
    )
    R = data["prompt_lens"].shape[0]
    return TensorDict(
        {
            "teacher_topk_logprobs": out["topk_logprobs"],
            "teacher_topk_ids": out["topk_ids"],
            "teacher_token_logprobs": out["token_logprobs"],
            "teacher_forwards": _pass_counts(out, R, settings),
        },
        batch_size=[R],
    )
