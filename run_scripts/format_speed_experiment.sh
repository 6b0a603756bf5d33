#!/usr/bin/env bash
# The format-speed miniature on CPU: how fast a format reward is learned beside a content reward. A tiny
# Qwen2 is warm-started by SFT to emit one tool call whose frame is often wrong and whose argument is
# right most of the time; a preflight replays the warm start's samples and checks that q_format lies
# where the frame is decided; then GRPO, GDPO, MRTPO and MRTPO+shuffle run through verl's real loop.
# Writes the preflight table, the grid's table (steps to format >= THRESHOLD, format after 10 steps,
# correctness, the replay's localisation and the sign diagnostic) and the plots to OUT, and copies them
# to DOCS.
#
# Two conditions (REWARD, PROMPTS_PER_STEP):
#   REWARD=tool_calling PROMPTS_PER_STEP=4 (the default): the first grid, the control row set. The
#     recipe's tool-calling verifier (correctness in [0, 1]); one frame, broken after the JSON object.
#     Folders OUT/warm_start, OUT/runs, OUT/results.md; copied to DOCS. Its preflight has not been run;
#     in its runs' dumps q_format put 3% on the closing position (5% of the tokens), so it is not
#     expected to pass the gate: re-running its grid then needs --ignore-gate.
#   REWARD=toolrl PROMPTS_PER_STEP=32: the paper's conditions. ToolRL's rewards (format {0, 1},
#     correctness [-3, 3]); the instruction names the layout (the call alone, or with a <response>
#     block) and the warm start follows it 80% / 20% of the time. Folders OUT/toolrl-p32 (runs,
#     preflight, results) and OUT/warm_start-toolrl; copied to DOCS/toolrl-p32. The grid starts only if
#     the preflight's gate passes (exit 3 otherwise).
#
#   REWARD=toolrl PROMPTS_PER_STEP=32 SEEDS="0 1 2 3 4 5 6 7" STEPS=30 bash run_scripts/format_speed_experiment.sh
#   REWARD=toolrl PROMPTS_PER_STEP=32 bash run_scripts/format_speed_experiment.sh --preflight-only
#   bash run_scripts/format_speed_experiment.sh                     # the control: 4 methods x 6 seeds x 12 steps
#   bash run_scripts/format_speed_experiment.sh --analyse-only      # only rebuild the table and plots
#
# Environment: SEEDS, STEPS (defaults: 0-5 and 12 for the control; 0-7 and 30 under REWARD=toolrl:
# 30 steps leave the slowest method room to reach format 0.8, see docs/format_speed), METHODS, OUT, DOCS,
# REWARD, PROMPTS_PER_STEP, MRTPO_HEAVY_LOCK. Each verl run holds the machine-wide lock
# (/tmp/mrtpo-heavy.lock) while it runs, and so do the warm start and the preflight; a control run needs ~11 GiB and
# ~5-6 min, a toolrl-p32 run the time docs/format_speed measures. Finished runs are kept, so re-running
# resumes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REWARD="${REWARD:-tool_calling}"
PROMPTS_PER_STEP="${PROMPTS_PER_STEP:-4}"
if [ "$REWARD" = toolrl ]; then
    SEEDS="${SEEDS:-0 1 2 3 4 5 6 7}"
    STEPS="${STEPS:-30}"
else
    SEEDS="${SEEDS:-0 1 2 3 4 5}"
    STEPS="${STEPS:-12}"
fi
METHODS="${METHODS:-grpo gdpo mrtpo shuffle}"
OUT="${OUT:-outputs/format_speed}"
DOCS="${DOCS:-docs/format_speed}"
bash run_scripts/setup.sh || { echo "[format-speed] ERROR: setup failed (see above)" >&2; exit 1; }
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# shellcheck disable=SC2086  # SEEDS and METHODS are word lists
exec "${MRTPO_VENV:-$ROOT/.venv}/bin/python" -m experiments.format_speed --out "$OUT" --docs "$DOCS" --seeds $SEEDS \
    --steps "$STEPS" --methods $METHODS --reward "$REWARD" --prompts-per-step "$PROMPTS_PER_STEP" "$@"
