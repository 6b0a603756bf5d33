"""The verl code SDPO relies on (its loss, its EMA teacher, the teacher's checkpoint), pinned by name -> sha256 of the
dedented source (:mod:`recipe.mrtpo.seams.source_pins`); guarded by ``tests/integration/test_verl_seam.py``.

Standard library only (no verl import until :func:`check_sdpo_sources` reads the sources).
"""

from __future__ import annotations

from recipe.mrtpo.seams.source_pins import changed_sources

#: verl 0.9.1 code SDPO's loss and EMA teacher rely on, by ``module:qualname`` -> sha256 of the dedented source:
#: - the distillation-loss registry (``register_distillation_loss``) and ``distillation_ppo_loss`` /
#:   ``distillation_loss``: a registered top-k loss is called with the model output the logits processor filled,
#:   aggregated with ``agg_loss`` over the response mask, no policy loss when ``use_task_rewards`` and
#:   ``use_policy_gradient`` are off (``methods.sdpo.loss``);
#: - ``prepare_model_outputs`` (pinned in ``verl_seam.NUMERICS_SOURCES``) calls the loss function as a logits processor
#:   (``student_logits=``) when the micro-batch's ``distillation_use_topk`` is set;
#: - the v1 trainer's ``_save_checkpoint`` / ``_load_checkpoint`` call the actor worker group's
#:   ``save_checkpoint`` / ``load_checkpoint`` with the actor's folder (the EMA teacher is saved in it), and the
#:   worker's ``update_actor`` runs every mini-batch of the step in one call (the EMA update follows it);
#: - ``EngineEvalModeCtx.__exit__`` reshards the root only when ``fsdp_size > 1``, so the EMA swap reshards
#:   itself (``verl_seam.fsdp_reshard``).
SDPO_SOURCES = {
    "verl.trainer.distillation.losses:register_distillation_loss": "45a1074d208fd5971fe7701cdcbaa80c50ecec322bac3e2cc97be2e6bddbed6c",
    "verl.trainer.distillation.losses:distillation_ppo_loss": "7339ada238b21a87fc143d042b0b61a42dd61880f9ef86734fac32d17990db80",
    "verl.trainer.distillation.losses:distillation_loss": "2e6165dd431f2741165a8a3d908d0c314a73f687d953d9ae7600cbb04a95a7bb",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._save_checkpoint": "1ceb1e087ce91c9251f98140353938221134f8ee0fe990697de93db975fa82c0",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._load_checkpoint": "52b412c5395b2cae290a6cf24c7f981d19b9458cda623170d776be844cb7cbec",
    "verl.workers.engine_workers:ActorRolloutRefWorker.update_actor": "09c49c66ee2fd97a1b6f6737cb22b09360e6af1d6e991650c0339ee917d5a775",
    "verl.workers.engine_workers:ActorRolloutRefWorker.save_checkpoint": "31ecd24c0576b57ca544e60148de26149c2569b8cc0c153b4a656d73a4a804da",
    "verl.workers.engine_workers:ActorRolloutRefWorker.load_checkpoint": "2713c0c8f4705df9d30e610133e80ae0fbf74e2620a6577cbd86151946a6d20a",
    "verl.workers.engine.fsdp.transformer_impl:EngineEvalModeCtx.__exit__": "ecb2bbcc6f3c82d495f73b23565facc9214acdf6a0c4cdacecc2fe664b4a1139",
}


def check_sdpo_sources() -> list[str]:
    """The :data:`SDPO_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(SDPO_SOURCES)
