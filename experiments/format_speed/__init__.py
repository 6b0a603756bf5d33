"""The format-speed miniature: how fast a format reward is learned beside a content reward, under GRPO,
GDPO, MRTPO and MRTPO+shuffle, through verl's real loop on CPU.

    python -m experiments.format_speed [--out outputs/format_speed] [--seeds 0 1 2 3 4 5] [--steps 12]
        [--methods grpo gdpo mrtpo shuffle] [--docs docs/format_speed] [--reward tool_calling|toolrl]
        [--prompts-per-step 4] [--ignore-gate] [--prepare-only | --preflight-only | --analyse-only]

(``bash run_scripts/format_speed_experiment.sh`` runs the setup first, then this.) Once, it

1. builds the data (``data_prep.format_speed``): one-tool prompts scored by the real tool-calling
   verifier (``data_source = "tool_calling"``: ``format`` with the format instruction of the prompt as
   Z_k, ``correctness`` with the reference call appended as Z_k), e.g. "Reply with the call as JSON inside
   <tool_call></tool_call> tags. Tool: set_timer(minutes: integer). Set a timer for 27 minutes.";
2. warm-starts a tiny Qwen2 (real tokenizer, hidden 128, 2 layers) by SFT in plain PyTorch
   (:mod:`.warm_start`) on demonstrations whose frame is broken with probability 0.7 and whose argument
   is right with probability 0.5, independently; cached (``OUT/warm_start``). Every run starts from these
   weights and sees the same prompts in the same order: a seed (``actor_rollout_ref.rollout.seed``,
   ``mrtpo.seed``) varies the RL sampling only (one warm start per seed did not fit the time on a
   shared 2-core machine);
3. per seed, runs every method with ``python -m recipe.mrtpo.main_mrtpo`` (:mod:`.runs`; 4 prompts x 4 responses a
   step, relevance dumps of every step for the replay methods), each run holding the machine-wide lock.

Under ``--reward toolrl`` the task is the one of ``data_prep.format_speed --reward toolrl`` (ToolRL's
rewards, format {0, 1} and correctness [-3, 3], on the layout the instruction names; the warm start
follows it 80% / 20% of the time) and ``--prompts-per-step`` sets the prompts a step (x 4 responses,
responses up to 40 tokens), and the tiny Qwen2 is built on a task vocabulary (Qwen2's tokenizer
pipeline, special tokens and template over a BPE of ~450 tokens trained on the task's texts,
:attr:`.common.Condition.task_vocab`; the 151,936-row LM head was nearly all of a step's time).
A condition other than the control (``tool_calling``, 4 prompts: the first
grid, whose folders and run keys stay as they were) lives in ``OUT/<reward>-p<prompts>/``
(:class:`.common.Condition`). Before the grid, :mod:`.preflight` samples the warm start on the first RL
prompts, replays the samples as a training step does and measures q_format's share on the position
where the frame is decided against that position's share of the tokens; the grid starts only when the
share is above it (exit 3 otherwise; ``--ignore-gate`` runs it anyway).

Then (:mod:`.results`) per method, mean and spread over seeds: the steps until the format reward's
running mean first reaches ``--threshold``, the format rate after ``--after`` steps, the format and
correctness curves, and from the replay runs' dumps the share of q_format on the tag tokens and the
mechanism's diagnostic (:mod:`.diagnostic`): on tag tokens, how often GDPO's and MRTPO's summed advantage
has the sign of the format advantage (:mod:`.tokens` says which tokens are tag tokens); where the
instruction names a layout, the format rate under each instruction and the prompt groups whose format
varies, per step (:mod:`.layouts`). Writes ``OUT/results.md``, ``OUT/results.json``, ``OUT/curves.png``,
``OUT/diagnostic.png``, ``OUT/layouts.png`` (and copies them to ``--docs``). Finished runs are kept: an interrupted experiment resumes; ``--analyse-only`` only rebuilds
the outputs.

The grid that settles the speed claim (24 seeds a method, seeded and paired by seed, two ablations) runs under
the analysis plan ``docs/format_speed/analysis_plan.md``: :mod:`.grid` (``python -m experiments.format_speed.grid``:
the arms, the seeds, the run key with the code's hash, the committable run records), :mod:`.analysis`
(``python -m experiments.format_speed.analysis``: the plan's comparisons on the records), :mod:`.stats` (the tests,
intervals and power), :mod:`.instability` (the instability measures).

Modules: :mod:`.common`, :mod:`.warm_start`, :mod:`.runs`, :mod:`.tokens`, :mod:`.diagnostic`,
:mod:`.layouts`, :mod:`.preflight`, :mod:`.results`, :mod:`.cli` (``main``), :mod:`.grid`, :mod:`.analysis`,
:mod:`.stats`, :mod:`.instability`.
"""
