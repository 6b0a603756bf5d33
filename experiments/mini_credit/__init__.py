"""The miniature credit-assignment experiment: GRPO, GDPO, MRTPO and MRTPO+shuffle on a task whose rewards
each read a known set of response tokens, through verl's real loop on CPU.

    python -m experiments.mini_credit [--out outputs/mini_credit] [--seeds 0 1 2] [--steps 20]
        [--methods grpo gdpo mrtpo shuffle] [--threshold 0.6] [--prepare-only | --analyse-only]

(``bash run_scripts/mini_credit_experiment.sh`` runs the setup first, then this.) Per seed it

1. builds the synthetic-slots data (``data_prep.synthetic_slots``: prompts such as "Set A=3. Set C=8.
   Set B=5. Fill in the form in this order: B, C, A.", answer "Form: B=5 C=8 A=3", reward ``slot_X`` =
   field X right, Z_k = the sentence "Set X=d.");
2. warm-starts a tiny Qwen2 (real tokenizer, hidden 128, 2 layers) by supervised fine-tuning in plain
   PyTorch (:mod:`.warm_start`: correct answers first, to learn the copying, then demonstrations whose
   fields are right with probability 0.5, so that the policy is right about half the time on each
   reward), ~3 min on 2 cores; the model is cached in ``OUT/seed<k>/sft_model`` by a key of every
   input, so all methods of a seed start from the same weights (``--prepare-only`` stops here);
3. runs every method for ``--steps`` steps with ``python -m recipe.mrtpo.main_mrtpo`` (:mod:`.runs`:
   vLLM-CPU rollout, FSDP2 actor, :func:`recipe.mrtpo.cpu.launcher.run_cpu`), 4 prompts x 4 responses
   per step, MRTPO with a one-step warm-up (step 1 is plain GDPO, then beta = 0.5) and relevance dumps
   of every response.

Then it measures (:mod:`.results`), per method (mean ± sample std over seeds): the final reward of each
slot (mean of the last ``--final-window`` training steps' batch means), the first step at which each
slot's batch mean reaches ``--threshold``, and, for the replay methods, the **localisation precision**
of the replay (:mod:`.localisation`): the share of reward k's relevance mass q[i,k,:]
(``docs/design.md`` §1.2) that lies on the tokens reward k's verifier reads (the value token of field
k), next to the share those tokens have of the response (what a uniform q would score) and the share of
pairs whose largest q is on such a token. (For the shuffle ablation, ``docs/design.md`` §1.7, the dumps
hold the unshuffled q; its advantage used a permutation of it.)

Writes ``OUT/results.md`` (the table), ``OUT/results.json`` (every number), ``OUT/localisation.png``
and, via :func:`recipe.mrtpo.tools.report.build.build_report`, per-reward curves and steps-to-threshold
charts in ``OUT/report/``. Runs that finished are not run again (``OUT/runs/<method>_seed<k>/result.json``),
so an interrupted experiment resumes; ``--analyse-only`` only rebuilds the outputs.

Modules: :mod:`.common` (the methods, the error type), :mod:`.warm_start`, :mod:`.runs`,
:mod:`.localisation`, :mod:`.results`, :mod:`.cli` (``main``; ``__main__`` runs it).
"""
