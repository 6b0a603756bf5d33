"""RLSD's part on the actor's workers (``methods.actor_part``): the frozen teacher synced to the policy every N updates.

The RLSD authors' teacher (iie-ycx/RLSD ``dp_opsd_actor._sync_teacher_from_actor``, ``freeze_teacher_model=True``,
``rlsd_teacher_sync_interval=N``) is their reference module: the initial policy, into which the actor's parameters
are copied after the update of every training step whose number is a multiple of N. The recipe's teacher is the same
module, verl's reference model (``mrtpo.rlsd_teacher=initial``: the teacher pass runs there,
``compute_ref_replay``), so the sync is the same copy: after the k-th update with k % N == 0, every local shard of
the reference model <- the actor's (:func:`recipe.mrtpo.core.shards.copy_shards_`, cast to the reference's dtype as
the authors' ``copy_``: a bf16 reference holds the bf16-rounded policy, an fp32 one the policy exactly). Between
syncs nothing writes the reference: the teacher stays frozen. It costs no memory (the reference exists already);
the copy is one pass over this rank's shards.

That needs the reference model in the actor's own worker (verl's hybrid engine, ``ActorRolloutRef``); a worker
without it is refused. The update count and, once synced, the teacher's shards are saved with the actor's checkpoint
and restored on resume (verl reloads its reference model from the initial weights); a resumed run whose checkpoint
holds neither is refused (its teacher is lost).
"""

from __future__ import annotations

from recipe.mrtpo.core.shards import copy_shards_, local_shard
from recipe.mrtpo.methods.actor_part import ActorPart, add_metrics, reshard


class RLSDActorPart(ActorPart):
    """The update count and the sync of verl's reference model to the actor (module docstring)."""

    def __init__(self, worker):
        super().__init__(worker)
        self.updates = 0  # actor updates this run has made with the sync on (restored on resume)
        self.lost = None

    def reference(self):
        ref = getattr(self.worker, "ref", None)
        if ref is None:
            raise RuntimeError("mrtpo.rlsd_teacher_sync_steps copies the policy into verl's reference model, which this "
                               "actor worker does not hold (a standalone reference worker: hybrid_engine=False?). Run "
                               "the hybrid engine or set mrtpo.rlsd_teacher_sync_steps=0")
        return ref.engine.module

    def sync(self) -> int:
        """The reference model's local shards <- the actor's (both resharded first: FSDP2 keeps a root's gathered
        parameters after a no-grad forward, which would otherwise shadow the copy). Returns the parameters copied."""
        actor, ref = self.worker.actor.engine.module, self.reference()
        reshard(actor)
        reshard(ref)
        return copy_shards_(ref, actor)

    def update(self, data, settings: dict, run):
        every = int(settings["teacher_sync_steps"])
        if self.lost and self.updates == 0:
            raise RuntimeError(f"RLSD: the run resumed from {self.lost}, which holds no synced teacher "
                               f"(rlsd_synced_teacher/): the teacher synced every {every} updates cannot be restored. "
                               "Resume from a checkpoint of this run or start a new run")
        self.reference()  # refused before the first update where there is none
        out = run(data)
        self.updates += 1
        synced = every > 0 and self.updates % every == 0
        if synced:
            self.sync()
        add_metrics(out, {"rlsd/teacher_synced": float(synced), "rlsd/updates": float(self.updates)})
        return out

    def state_dict(self):
        """The update count and this rank's shards of the teacher (verl's reference model, on CPU)."""
        return {"updates": self.updates,
                "teacher": {n: local_shard(p).detach().cpu() for n, p in self.reference().named_parameters()}}

    def load_state_dict(self, state: dict) -> None:
        ref = self.reference()
        reshard(ref)
        params = dict(ref.named_parameters())
        if list(params) != list(state["teacher"]):
            raise ValueError("the saved RLSD teacher does not match verl's reference model's parameters")
        for n, t in state["teacher"].items():
            s = local_shard(params[n])
            if s.shape != t.shape:
                raise ValueError(f"the saved RLSD teacher's shard of {n} is {tuple(t.shape)}, the reference's {tuple(s.shape)}")
            s.copy_(t)
        self.updates, self.lost = int(state["updates"]), None

    def resumed_without(self, path: str) -> None:
        self.lost = path
