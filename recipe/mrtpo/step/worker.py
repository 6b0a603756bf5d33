"""The actor worker with the recipe's passes (verl 0.9.1 ``ActorRolloutRefWorker`` + three methods).

``compute_replay_relevance`` runs on the actor's own workers with the same data-parallel dispatch as
``compute_log_prob`` (``make_nd_compute_dataproto_dispatch_fn(mesh_name="actor")``): the trainer's
rows are split across the DP ranks, each rank replays its rows through the FSDP module in eval mode
without gradients, and the outputs are gathered back in order. ``compute_ref_replay`` is the same pass
through verl's reference model (the initial policy), dispatched as ``compute_ref_log_prob`` (mesh
``ref``): RLSD's initial teacher. ``compute_opsd_teacher`` is gdpo-distill's teacher pass on the actor,
``compute_ref_opsd_teacher`` OPSD's on the reference, ``compute_sdpo_teacher`` SDPO's (with its EMA teacher). The
algorithm itself is :func:`recipe.mrtpo.core.replay.replay_relevance`; this class only binds it to verl's
engines.

A method whose actor update or state is its own (OPSD's and SDPO's losses, SDPO's EMA teacher, RLSD's synced
teacher) keeps it in its package, as its part on the actor's workers (``methods/actor_part.py``; its entry's
``actor_part``): ``update_actor``, ``save_checkpoint`` and ``load_checkpoint`` only dispatch to the parts.
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

from recipe.mrtpo.core.attention_cost import ModelShape
from recipe.mrtpo.core.model_support import module_config
from recipe.mrtpo.core.passes import PassSettings, hf_forward
from recipe.mrtpo.core.replay import replay_relevance
from recipe.mrtpo.methods.actor_part import ActorPart, rank_file
from recipe.mrtpo.methods.opsd.actor import opsd_teacher_rows
from recipe.mrtpo.methods.sdpo.actor import TEACHER_DIR, sdpo_rows
from recipe.mrtpo.methods.types import ActorPartRef
from recipe.mrtpo.passes.pass_wire import pass_counts, sync_max, wire_settings
from recipe.mrtpo.passes.tree_attention import register_tree_attention

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


def attn_implementation(module) -> str:
    """The module's attention implementation (``config._attn_implementation``; "" when it has none)."""
    cfg = module_config(module)
    return str(getattr(cfg, "_attn_implementation", "") or "") if cfg is not None else ""


def model_type(module) -> str:
    """The module's ``config.model_type`` ("" when it has none): the row of the model table it takes."""
    cfg = module_config(module)
    return str(getattr(cfg, "model_type", "") or "") if cfg is not None else ""


_SHAPE_LOGGED: set = set()


def model_shape(module):
    """The module's :class:`~recipe.mrtpo.core.attention_cost.ModelShape` (the shared-prompt cost model's), or None
    where its config lacks the keys: every forward of a shared pass then stays shared (logged once)."""
    cfg = module_config(module)
    try:
        return ModelShape.from_config(cfg) if cfg is not None else None
    except ValueError as e:
        if str(e) not in _SHAPE_LOGGED:
            _SHAPE_LOGGED.add(str(e))
            logger.warning("mrtpo.share_prompts: %s; every shared forward stays shared", e)
        return None


def check_pass_model(module, what: str) -> None:
    """Refuse a model the passes cannot run (``core.model_support.refusal``: a vision-language model); the
    launch check (``main_mrtpo.check_launch``) refuses it before Ray, this is the worker's own guard."""
    from recipe.mrtpo.core.model_support import config_facts, refusal

    cfg = module_config(module)
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


def replay_rows(forward, data: TensorDict, device, sync=sync_max, attn: str = "", **model) -> TensorDict:
    """This rank's rows through :func:`replay_relevance`, answered compactly (docs/design.md §5).

    ``data``: the packed rows (``variant_ids``, ``variant_lens``, ``responses``, ``response_mask``,
    ``pair_variant``, optionally ``logprob_variant``: whose log-probs to return) and the
    :data:`REPLAY_SETTINGS`. Returns, per row, ``variant_relevance`` [R, NV', T] in
    :data:`RELEVANCE_DTYPE` (one row per variant; the driver maps them to rewards), ``replay_logprobs``
    [R, T] fp32 (the consistency check needs fp32), and ``replay_forwards`` [R, 7] (``pass_wire.pass_counts``);
    with the optional setting ``fused`` also ``replay_entropy`` [R, T] fp32 (verl's ``entropy`` field).
    """
    settings, wire = wire_settings(data, REPLAY_SETTINGS, "compute_replay_relevance", attn, **model)
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
        "replay_forwards": pass_counts(out, R, settings),
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
        forwards before its first one (``pass_wire.sync_max``), as FSDP's per-forward all-gathers require.
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
        ranks (``pass_wire.sync_max``) before the first forward.
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
        model table (the shared body of the passes above). A pass sharing prompts runs its shared forwards under the
        prefix tree's FlexAttention (``tree_attention``; ``core.passes.hf_forward`` switches the module per forward),
        each kept shared where the cost model over the module's shape says it pays (:func:`model_shape`)."""
        engine = self.actor.engine if engine is None else engine
        sp = getattr(engine, "ulysses_sequence_parallel_size", 1) or 1
        if sp > 1:
            raise NotImplementedError(f"{what} runs the plain module forward: ulysses sequence parallel > 1 is not supported")
        with engine.eval_mode(), torch.no_grad():
            module = engine.module
            check_pass_model(module, what)
            device = pass_device()
            register_tree_attention()
            return rows_fn(autocast_forward(hf_forward(module), engine), data, device, sync_max, attn_implementation(module),
                           model_type=model_type(module), model_shape=model_shape(module), **verl_numerics(engine, device))

    # ------------------------------------------------------------------ SDPO (docs/opsd.md, SDPO)
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_sdpo_teacher(self, data: TensorDict) -> TensorDict:
        """SDPO's teacher pass of this rank's rows (``methods.sdpo.actor.sdpo_rows``): the behaviour policy's top-k ids
        on the rollout prompts, then SDPO's part's EMA teacher (swapped into the actor's shards) at those ids on P_all."""
        from recipe.mrtpo.methods.sdpo import SDPO

        return self._no_grad_pass(partial(sdpo_rows, part=self.actor_part(SDPO.actor_part)), data, "the SDPO teacher pass")

    # ------------------------------------------------------------------ the methods' parts (methods/actor_part.py)
    def actor_part(self, ref: ActorPartRef) -> ActorPart:
        """The method's part on this worker (``ref``: its entry's ``actor_part``), created once."""
        parts = self.__dict__.setdefault("_actor_parts", {})
        if ref.key not in parts:
            part = parts[ref.key] = ref.load()(self)
            resumed, states = self.__dict__.get("_part_resume", ("", {}))
            if ref.key in states:  # the run resumed from a checkpoint holding this part's state
                part.load_state_dict(states.pop(ref.key))
            elif resumed and ref.checkpoint_dir:
                part.resumed_without(resumed)
        return parts[ref.key]

    def _install_loss(self, loss) -> None:
        """The actor's loss: a part's ``(key, build)`` (rebuilt when the key changes), or verl's own (None)."""
        installed = getattr(self, "_part_loss_key", None)
        if loss is None:
            if installed is not None:  # back to verl's own loss
                self.loss_fn, self._part_loss_key = self._verl_loss_fn, None
                self.actor.set_loss_fn(self.loss_fn)
            return
        key, build = loss
        if installed != key:
            if installed is None:
                self._verl_loss_fn = self.loss_fn
            self.loss_fn, self._part_loss_key = build(self._verl_loss_fn.keywords["config"]), key
            self.actor.set_loss_fn(self.loss_fn)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: TensorDict) -> TensorDict:
        """verl's ``update_actor``, or, where the batch carries a method's settings (its after-step hook put them under its
        part's key), that method's part's update (``methods.actor_part``) with the loss the part names."""
        found = [(ref, tu.pop(data, key=ref.key, default=None)) for ref in actor_part_refs()]
        found = [(ref, settings) for ref, settings in found if settings is not None]
        if len(found) > 1:
            raise ValueError(f"the update's batch carries the settings of several methods' parts: {[r.key for r, _ in found]}")
        if not found:
            self._install_loss(None)
            return super().update_actor(data)
        (ref, settings), = found
        part = self.actor_part(ref)
        self._install_loss(part.loss(settings))
        return part.update(data, settings, super().update_actor)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        """verl's, plus each method part's state (this rank's) in ``<local_path>/<its checkpoint_dir>/``."""
        out = super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
        for ref in actor_part_refs():
            part = self.__dict__.get("_actor_parts", {}).get(ref.key)
            state = part.state_dict() if part is not None and ref.checkpoint_dir and local_path else None
            if state is not None:
                folder = os.path.join(local_path, ref.checkpoint_dir)
                os.makedirs(folder, exist_ok=True)
                torch.save(state, os.path.join(folder, rank_file()))
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        """verl's, plus each method part's state where the checkpoint holds one (restored now, bit for bit as saved).
        A part whose state the checkpoint lacks is told so (``resumed_without``: it refuses where it needs it) when
        its method first uses it (:meth:`actor_part`): a method's run never builds another method's part, whose
        save would then fail (an MRTPO run resumed must not save RLSD's teacher)."""
        states = {}
        for ref in actor_part_refs():
            path = os.path.join(local_path, ref.checkpoint_dir, rank_file()) if local_path and ref.checkpoint_dir else ""
            if path and os.path.exists(path):
                states[ref.key] = torch.load(path, map_location="cpu", weights_only=True)
        out = super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
        self._part_resume = (local_path or "", states)
        for ref in actor_part_refs():
            if ref.checkpoint_dir:
                self.__dict__.get("_actor_parts", {}).pop(ref.key, None)  # built again from the checkpoint
                if ref.key in states:  # the method that saved it: its state restored now
                    self.actor_part(ref)
        return out


#: the folder of SDPO's EMA teacher in the actor's checkpoint (``methods.sdpo.actor``)
SDPO_TEACHER_DIR = TEACHER_DIR


def actor_part_refs() -> tuple[ActorPartRef, ...]:
    """Every method's part on the actor's workers, once each (the registry's entries)."""
    from recipe.mrtpo.methods.registry import METHODS

    return tuple({m.actor_part.key: m.actor_part for m in METHODS.values() if m.actor_part is not None}.values())
