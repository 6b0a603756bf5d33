"""What ``docs/real_model_learning/analysis_plan.md`` fixes: the constraint pool, the data build, the arms, the seeds
and every setting of a run, as the verl overrides of one (arm, seed) (:func:`run_overrides`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.mini_credit.common import REPO, ExperimentError

SPAN_READ = ("startend:end_checker", "detectable_format:title", "detectable_content:postscript", "keywords:existence",
             "detectable_content:number_placeholders")
GLOBAL = ("punctuation:no_comma", "change_case:english_lowercase")
#: ``python -m data_prep.instruction_following train`` arguments (besides --out-dir)
DATA_ARGS = ("--constraints", ",".join(SPAN_READ + GLOBAL), "--min-constraints", "2", "--max-constraints", "3",
             "--samples-per-prompt", "4", "--test-fraction", "0.2", "--seed", "0")

ARMS = ("gdpo", "mrtpo", "shuffle")  # shuffle: the third arm, run only where the plan's budget allows it
PILOT_SEEDS = (100, 101, 102)
STEPS, PROMPTS_PER_STEP, RESPONSES_PER_PROMPT, RESPONSE_LENGTH, PROMPT_LENGTH, LR = 30, 8, 4, 128, 192, 1e-5
IFEVAL_TOKENS = 256
#: prompts a step of the confirmatory runs, set by the plan's amendment 1 (the pilot's clean runs took 6,064 s on
#: average, over the 1.5 h rule's 5,400 s, so the prompts a step are halved before seeds are cut)
CONFIRMATORY_PROMPTS_PER_STEP = PROMPTS_PER_STEP // 2
MODEL_NAME = "smollm2-135m"
TASK = "instruction_following"
PROJECT = "mrtpo_real_model_learning"

#: the method's knobs, set where the arm's method reads them (the miniatures' values)
METHOD_KNOBS = {"beta": 0.5, "warmup_steps": 1, "max_realloc_rms": 1.0, "measure": "js_distance",
                "fused_check_every": 0}
#: how the passes run, pinned for every arm: a later change of a default (exact in fp32, not bit for bit) reaches
#: no run of this experiment
ENGINE = ("mrtpo.share_prompts=False", "mrtpo.compile_js=False", "mrtpo.replay_micro_batch_size=8",
          "mrtpo.chunk_size=null", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
          "actor_rollout_ref.actor.use_dynamic_bsz=False")


def run_name(arm: str, seed: int) -> str:
    """``<model>_<task>_<method>_seed<k>``, the name ``tools.report`` reads a run's method and seed from."""
    return f"{MODEL_NAME}_{TASK}_{arm}_seed{seed}"


def report_folder(docs: Path, kind: str, seed: int) -> Path:
    """Where ``tools.report`` reads a run of ``seed`` (``kind``: ``report_runs`` or ``report_heldout``):
    ``docs/<kind>`` for the pilot (the base model is written there once), ``docs/confirmatory/<kind>`` for the
    confirmatory set. The two sets may run different prompts a step (:func:`prompts_per_step`), so one report over
    one folder never pools them into one mean over seeds."""
    return Path(docs) / kind if seed in PILOT_SEEDS else Path(docs) / "confirmatory" / kind


BASE_NAME = f"{MODEL_NAME}_{TASK}_base"  # the base model's report folder: the reference line of both sets' reports


def prompts_per_step(seed: int) -> int:
    """The prompts a step of ``seed``'s runs: the pilot's for the pilot seeds, the amendment's for the confirmatory
    set (the PPO mini-batch is the batch either way: one update a step)."""
    return PROMPTS_PER_STEP if seed in PILOT_SEEDS else CONFIRMATORY_PROMPTS_PER_STEP


def run_overrides(arm: str, seed: int, model: Path, data: Path, run_dir: Path, steps: int = STEPS) -> list[str]:
    """The verl overrides of one run (the plan's fixed settings), the actor in fp32 last."""
    from recipe.mrtpo.cpu.launcher import tiny_run_overrides
    from recipe.mrtpo.cpu.runtime import FP32_ACTOR
    from recipe.mrtpo.methods import get

    if arm not in ARMS:
        raise ExperimentError(f"unknown arm {arm!r}; known: {list(ARMS)}")
    method = get(arm)
    prompts = prompts_per_step(seed)
    changed = {"data.train_batch_size": prompts, "actor_rollout_ref.actor.ppo_mini_batch_size": prompts,
               "data.max_response_length": RESPONSE_LENGTH, "data.max_prompt_length": PROMPT_LENGTH,
               "data.shuffle": True, "actor_rollout_ref.rollout.n": RESPONSES_PER_PROMPT}
    base = []
    for o in tiny_run_overrides(model, data, run_dir, method.estimator, steps, lr=LR):
        key = o.split("=", 1)[0]
        base.append(f"{key}={changed[key]}" if key in changed else o)
    knobs = {**METHOD_KNOBS, "seed": seed}
    return [
        *base,
        *method.overrides[1:],
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"trainer.save_freq={steps}",  # one checkpoint, the last step's: what the export reads
        "trainer.resume_mode=disable",
        f"trainer.project_name={PROJECT}",
        f"trainer.experiment_name={run_name(arm, seed)}",
        f"trainer.rollout_data_dir={Path(run_dir) / 'rollouts'}",
        *(f"mrtpo.{k}={v}" for k, v in knobs.items() if method.reads_knob(k)),
        *ENGINE,
        FP32_ACTOR,
    ]


def span_read_share(by_id: dict[str, Sequence[int]], ids: Sequence[str] = SPAN_READ) -> float | None:
    """The micro-averaged pass rate over the constraint instances of ``ids``: ``by_id[id] = (passed, total)``."""
    passed, total = (sum(by_id.get(i, (0, 0))[j] for i in ids) for j in (0, 1))
    return passed / total if total else None


def repo_relative(path: Path) -> str:
    """A path as a record keeps it: relative to the repository where it lies inside it."""
    try:
        return Path(path).resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)
