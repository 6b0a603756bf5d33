"""Guard of the only lines the recipe re-states from verl: the advantage step's fetch and write-back.

``recipe/mrtpo/seams/verl_seam.py`` mirrors steps 1, 2 and 4 of verl 0.9.1's ``PPOTrainer._compute_advantage``.
These tests fail when the installed verl's method is not the pinned one (with a diff against the copy in
``tests/integration/data/``), and check the mirrored details against the upstream text itself. The other pins
(``recipe/mrtpo/seams/source_pins.py`` reads them), each kept next to the code it guards, are checked here too: verl's
numerics and distillation path (``verl_seam``), the BFCL loop's verl pieces (``agent/pins.py``), SDPO's
(``methods/sdpo/pins.py``) and the rollout seeds' (``rollout_seed.py``).
"""

import re
from pathlib import Path

import pytest

from recipe.mrtpo.agent import pins as agent_pins
from recipe.mrtpo.methods.sdpo import pins as sdpo_pins
from recipe.mrtpo.rollout import rollout_seed
from recipe.mrtpo.seams import verl_seam
from recipe.mrtpo.seams.source_pins import file_source, named_source

PINNED = Path(__file__).resolve().parent / "data" / "verl_0.9.1_compute_advantage.py.txt"


def test_upstream_method_is_the_pinned_one():
    verl_seam.check_upstream(verl_seam.upstream_source(), PINNED.read_text())


def test_the_guard_notices_a_changed_upstream_line():
    src = verl_seam.upstream_source()
    changed = src.replace('fields = ["advantages", "returns"]', 'fields = ["advantages", "returns", "token_level_rewards"]')
    assert changed != src
    with pytest.raises(RuntimeError, match=r"(?s)changed.*\+\s+fields = \[\"advantages\", \"returns\", \"token_level_rewards\"\]"):
        verl_seam.check_upstream(changed, PINNED.read_text())


def test_mirrored_details_match_the_upstream_text():
    src = verl_seam.upstream_source()
    fetched = re.search(r"fields = (\[[^\]]*\])\n\s+data = tq\.kv_batch_get", src)
    assert fetched and eval(fetched.group(1)) == verl_seam.VERL_FIELDS  # step 1 reads the same fields
    for line in (
        'data.batch["token_level_scores"] = data.batch["rm_scores"]',
        'data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)',
        'rollout_corr_config = self.config.algorithm.get("rollout_correction", None)',
        'bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)',
        "data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)",
        'fields.append("response_mask")',
        'if "rollout_is_weights" in data.batch:',
        "output[field] = response_to_nested(data.batch[field], response_mask)",
        "batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)",
    ):
        assert line in src, line
    seam = Path(verl_seam.__file__).read_text()
    assert "compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)" in seam


OLD_LOG_PROB = Path(__file__).resolve().parent / "data" / "verl_0.9.1_compute_old_log_prob.py.txt"


def test_upstream_old_log_prob_step_is_the_pinned_one():
    verl_seam.check_upstream(verl_seam.upstream_source("_compute_old_log_prob"), OLD_LOG_PROB.read_text(), "_compute_old_log_prob")


def test_the_old_log_prob_guard_notices_a_changed_line_and_the_mirrored_lines_are_upstream():
    src = verl_seam.upstream_source("_compute_old_log_prob")
    changed = src.replace('"calculate_entropy": True,', '"calculate_entropy": False,')
    assert changed != src
    with pytest.raises(RuntimeError, match=r"(?s)_compute_old_log_prob changed.*\+\s+\"calculate_entropy\": False"):
        verl_seam.check_upstream(changed, OLD_LOG_PROB.read_text(), "_compute_old_log_prob")
    for line in (  # what write_old_log_probs re-states, in verl's words
        'fields=data.select("old_log_probs", "entropy")',
        'data["entropy"] = response_from_nested(data.pop("entropy"), data["response_mask"])',
        "loss_agg_mode=actor_config.loss_agg_mode,",
        "loss_scale_factor=actor_config.loss_scale_factor,",
        '"actor/entropy": entropy_agg.detach().item(),',
        "if self.config.actor_rollout_ref.rollout.calculate_log_probs:",
        "metrics.update(calculate_debug_metrics(data))",
        'bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)',
    ):
        assert line in src, line


# ------------------------------------------------------------------ the numerics of verl's log-prob forward
def test_the_numerics_the_pass_engine_reproduces_are_verls_pinned_ones():
    assert verl_seam.check_numerics_sources() == [], "verl changed: re-check recipe/mrtpo/core/passes.py (Numerics)"


def test_the_self_teachers_distillation_path_is_verl_0_9_1s():
    assert verl_seam.check_distillation_sources() == [], "verl changed: re-check recipe/mrtpo/methods/opsd/loss.py"
    out = named_source("verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.prepare_model_outputs")
    assert 'distillation_use_topk = tu.get_non_tensor_data(data=micro_batch, key="distillation_use_topk", default=False)' in out
    assert "outputs = logits_processor_func(student_logits=logits_rmpad.unsqueeze(0), data=micro_batch)" in out
    ppo = named_source("verl.trainer.distillation.losses:distillation_ppo_loss")
    assert "if student_logits is not None:" in ppo  # the logits-processor call
    assert "if not distillation_loss_config.use_task_rewards and not distillation_loss_config.use_policy_gradient:" in ppo
    init = named_source("verl.workers.engine_workers:ActorRolloutRefWorker.init_model")
    assert "distillation_ppo_loss, config=actor_config, distillation_config=distillation_config" in " ".join(init.split())
    assert "self.actor.set_loss_fn(self.loss_fn)" in init  # what worker.update_actor calls with the recipe's loss


def test_the_data_order_the_experiments_pair_on_is_verls_seeded_sampler():
    assert verl_seam.check_data_order_sources() == [], "verl changed: re-check experiments/real_model_learning (data.seed)"
    src = named_source("verl.trainer.ppo.utils:create_rl_sampler")
    assert 'seed = data_config.get("seed")' in src and "train_dataloader_generator.manual_seed(seed)" in src


def test_the_mirrored_numerics_lines_are_upstream():
    fwd = named_source("verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.forward_step")
    for line in ('autocast_dtype = getattr(self, "_autocast_dtype", torch.bfloat16)',
                 "if autocast_dtype == torch.float32", "else torch.autocast(device_type=device_name, dtype=autocast_dtype)"):
        assert line in fwd, line  # worker.engine_autocast
    scale = named_source("verl.workers.engine.fsdp.transformer_impl:_scale_logits_by_temperature")
    assert "return logits / temperature.clamp(min=1e-8).to(logits.dtype)" in scale  # passes.scale_logits
    out = named_source("verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.prepare_model_outputs")
    assert "log_probs = logprobs_from_logits(" in out and "entropy = verl_F.entropy_from_logits(logits)" in out


def test_scale_logits_is_verls_division_bit_for_bit():
    import torch
    from verl.workers.engine.fsdp.transformer_impl import _scale_logits_by_temperature

    from recipe.mrtpo.core.passes import scale_logits

    x = torch.randn(5, 7, 33) * 4
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for t in (1.0, 0.7, 0.6, 1.3):
            want = _scale_logits_by_temperature(x.to(dtype), torch.full((5, 1, 1), t), is_unit_temperature=t == 1.0)
            got = scale_logits(x.to(dtype), t)
            assert got.dtype == want.dtype and torch.equal(got, want), (dtype, t)
    assert float(torch.tensor(0.7).to(torch.bfloat16)) == 0.69921875  # the rounding verl's division makes


def test_the_vision_types_are_verls_patched_vlm_forwards():
    import inspect
    import re

    from verl.models.transformers import monkey_patch

    from recipe.mrtpo.core.model_support import VISION_TYPES

    src = inspect.getsource(monkey_patch.apply_monkey_patch)
    named = set(re.findall(r'model_type (?:in \[([^\]]*)\]|== "([^"]+)")', src))
    types = {t.strip().strip('"') for a, b in named for t in (a.split(",") if a else [b])}
    assert types == set(VISION_TYPES), types ^ set(VISION_TYPES)


def test_the_standing_checks_call_is_verls_step_1():
    """``verl_old_log_probs`` (the fused step's standing check) re-states step 1 of ``_compute_old_log_prob``."""
    src = verl_seam.upstream_source("_compute_old_log_prob")
    for line in ('"calculate_entropy": True,', '"compute_loss": False,',
                 '"temperature": self.config.actor_rollout_ref.rollout.temperature,',
                 "output: KVBatchMeta = self.actor_rollout_wg.compute_log_prob(batch)",
                 'data["old_log_probs"] = response_from_nested(data.pop("log_probs"), data["response_mask"])'):
        assert line in src, line


def test_the_floor_and_the_row_mask_rely_on_verls_pinned_pieces():
    """The standing check's floor gives verl's worker its own token budget through the call's ``extra_info``
    (taken where given, else the worker's setting), and verl splits a rank's rows by length
    (``verl_seam.FLOOR_SOURCES``); a row whose ``response_mask`` the advantage step writes 0 leaves the loss: the mask
    is the loss mask and its sum the token-mean denominator (``ROW_MASK_SOURCES``)."""
    assert verl_seam.check_floor_sources() == [], "verl changed: re-check verl_seam.floor_settings / write_advantages"
    infer = named_source("verl.workers.engine_workers:TrainingWorker.infer_batch")
    assert "max_token_len_per_gpu=self.engine_config.infer_max_token_len_per_gpu" in infer
    assert "if key not in data.keys():" in infer
    assert "tu.assign_non_tensor_data(tensor_dict=tensordict, key=key, val=val)" in named_source(
        "verl.utils.transferqueue_utils:_async_meta_to_realdata")
    assert 'data["loss_mask"] = data["response_mask"]' in named_source("verl.workers.utils.padding:left_right_2_no_padding")
    assert 'batch_num_tokens = data["loss_mask"].sum()' in named_source(
        "verl.workers.engine.fsdp.transformer_impl:FSDPEngine.forward_backward_batch")
    loss = named_source("verl.workers.utils.losses:ppo_loss")
    assert 'response_mask = data["response_mask"].to(bool)' in loss and "loss_mask=response_mask" in loss


# ------------------------------------------------------------------ the BFCL agent loop's reliance on verl
def test_the_agent_loop_pieces_are_verls_pinned_ones():
    assert agent_pins.check_agent_loop_sources() == [], "verl changed: re-check recipe/mrtpo/agent/bfcl_loop.py"


def test_the_agent_loops_mirrored_lines_are_upstream():
    from recipe.mrtpo.agent.bfcl_loop import _VERL_KWARGS, truncate_tool_text

    run = named_source("verl.experimental.agent_loop.agent_loop:AgentLoopWorker._run_agent_loop")
    for kw in sorted(_VERL_KWARGS - {"name"}):  # the keyword arguments verl passes to every loop
        assert f"{kw}=" in run, kw
    assert "tools=ToolListWrap(self.tools)" in run  # the loop accepts and ignores verl's tools
    call_tool = named_source("verl.experimental.agent_loop.tool_agent_loop:ToolAgentLoop._call_tool")
    for line in ('"(truncated)..." + tool_response_text[-self.max_tool_response_length :]',
                 'tool_response_text[: self.max_tool_response_length] + "...(truncated)"',
                 'tool_response_text[:length] + "...(truncated)..." + tool_response_text[-length:]',
                 "length = self.max_tool_response_length // 2"):
        assert line in call_tool, line
    assert truncate_tool_text("abcdefgh", 4, "left") == "(truncated)...efgh"
    assert truncate_tool_text("abcdefgh", 4, "right") == "abcd...(truncated)"
    assert truncate_tool_text("abcdefgh", 4, "middle") == "ab...(truncated)...gh"
    align = named_source("verl.utils.tokenizer.continuous_token:ContinuousTokenBuilder.align_response_metadata")
    assert "aligned_mask += [1] * merge_result.appended_token_count" in align
    assert "aligned_mask += [0] * merge_result.appended_token_count" in align and "[0] * inserted_token_count" in align


def test_the_verl_code_sdpo_relies_on_is_the_pinned_one():
    """SDPO's loss and EMA teacher rely on verl's distillation-loss registry and loss path, the v1 trainer's
    checkpoint calls and the worker's update / checkpoint methods (methods/sdpo/pins.py: SDPO_SOURCES)."""
    assert sdpo_pins.check_sdpo_sources() == [], "verl changed: re-check recipe/mrtpo/methods/sdpo/ and worker.py (SDPO)"
    # the lines SDPO's loss and checkpoint rely on, in verl's text
    loss = named_source("verl.trainer.distillation.losses:distillation_ppo_loss")
    assert "if not distillation_loss_config.use_task_rewards and not distillation_loss_config.use_policy_gradient:" in loss
    assert "return compute_topk_loss(config, distillation_config, data, student_logits, data_format)" in loss
    save = named_source("verl.trainer.ppo.v1.trainer_base:PPOTrainer._save_checkpoint")
    assert 'actor_local_path = os.path.join(local_global_step_folder, "actor")' in save
    load = named_source("verl.trainer.ppo.v1.trainer_base:PPOTrainer._load_checkpoint")
    assert 'local_path=os.path.join(global_step_folder, "actor")' in load
    out = named_source("verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.prepare_model_outputs")
    assert "outputs = logits_processor_func(student_logits=logits_rmpad.unsqueeze(0), data=micro_batch)" in out


# ------------------------------------------------------------------ the rollout's per-request seeds
def test_the_functions_the_rollout_seeds_rely_on_are_verls_pinned_ones():
    assert rollout_seed.check_rollout_seed_sources() == [], "verl changed: re-check recipe/mrtpo/rollout/rollout_seed.py"


def test_the_rollout_seeds_assumptions_are_upstream_lines():
    src = {n.rsplit(":", 1)[1]: file_source(n) for n in rollout_seed.ROLLOUT_SEED_SOURCES}
    # verl's server seeds a request only when the caller did not (our seed wins, also under full_determinism) ...
    assert 'sampling_params.setdefault("seed", self.replica_rank + self.config.seed)' in src["vLLMHttpServer.generate"]
    assert "SamplingParams(max_tokens=max_tokens, **sampling_params)" in src["vLLMHttpServer.generate"]
    # ... the TQ worker hands every prompt field (tensors too) and the sample's session id to _run_agent_loop ...
    assert "prompt[k] = v[i]" in src["AgentLoopWorkerTQ.generate_sequences"]
    assert "session_id=i, **prompt" in src["AgentLoopWorkerTQ._run_prompt"]
    assert "await agent_loop.run(sampling_params, **kwargs)" in src["AgentLoopWorker._run_agent_loop"]
    # ... and the manager's worker class is an attribute read when the workers start, the batch split after
    assert "self.agent_loop_workers_class = AgentLoopWorkerTQ" in src["AgentLoopManagerTQ.__init__"]
    assert "chunkes = prompts.chunk(len(self.agent_loop_workers))" in src["AgentLoopManagerTQ.generate_sequences"]
    assert 'get("agent_loop_manager_class")' in src["TaskRunnerV1.init_agent_loop_manager"]
    # the batch's row order: uuid4 uids (no "_"), keys uid_session_index, balancing right after sampling
    assert 'str(uuid.uuid4())' in src["PPOTrainer._fetch_one_gen_batch"]
    assert 'keys=list(batch["uid"])' in src["PPOTrainer._submit_batch_to_rollout"]
    assert 'keys.append(f"{uid}_{session_id}_{i}")' in src["AgentLoopWorkerTQ._agent_loop_postprocess"]
    step = src["PPOTrainer._step_once"]
    assert step.index("self.replay_buffer.sample(") < step.index("self._balance_batch(batch") < step.index("_compute_advantage")
    assert "batch.reorder(" in src["PPOTrainer._balance_batch"]


def test_the_rollout_seed_guard_notices_a_changed_line(monkeypatch):
    name = "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.generate"
    real = file_source
    monkeypatch.setattr(rollout_seed, "file_source",
                        lambda n: real(n).replace("setdefault(\"seed\"", "__setitem__(\"seed\"") if n == name else real(n))
    assert rollout_seed.check_rollout_seed_sources() == [name]


def test_the_recipe_config_selects_the_seeded_manager_and_it_subclasses_verls():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

    yaml = OmegaConf.load(Path(verl_seam.__file__).parents[1] / "config" / "mrtpo_trainer.yaml")
    fqn = yaml.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert fqn == "recipe.mrtpo.rollout.rollout_seed.SeededAgentLoopManager"
    assert issubclass(rollout_seed.SeededAgentLoopManager, AgentLoopManagerTQ)
    assert issubclass(rollout_seed.SeededAgentLoopWorker.__ray_actor_class__, AgentLoopWorkerTQ.__ray_actor_class__)


# ------------------------------------------------------------------ the checkpoint checks
def test_the_verl_code_the_checkpoint_checks_rely_on_is_the_pinned_one():
    """``checkpoint_shards`` and the trainer's resume / save rely on verl's global pool, its save's folders and
    tracker, its resume's look-up and the FSDP manager's per-rank shard names (verl_seam.CHECKPOINT_SOURCES)."""
    assert verl_seam.check_checkpoint_sources() == [], "verl changed: re-check recipe/mrtpo/cluster/checkpoint_shards.py"
    pool = named_source("verl.trainer.ppo.v1.trainer_base:PPOTrainer._init_resource_pool_mgr")
    assert "global_pool_id: [config.trainer.n_gpus_per_node] * config.trainer.nnodes," in pool
    save = named_source("verl.trainer.ppo.v1.trainer_base:PPOTrainer._save_checkpoint")
    assert 'self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"' in save
    assert 'self.config.trainer.default_local_dir, "latest_checkpointed_iteration.txt"' in save
    find = named_source("verl.utils.checkpoint.checkpoint_manager:find_latest_ckpt_path")
    assert "if not os.path.exists(tracker_file):" in find
    load = named_source("verl.utils.checkpoint.fsdp_checkpoint_manager:FSDPCheckpointManager.load_checkpoint")
    assert 'f"model_world_size_{self.world_size}_rank_{self.rank}.pt"' in load
