#!/usr/bin/env bash
# The format-speed miniature on CPU: how fast a format reward is learned beside a content reward. A tiny
# Qwen2 is warm-started by SFT to emit one tool call whose frame (tags, stray text) is often broken and
# whose argument is right about half the time; then GRPO, GDPO, MRTPO and MRTPO+shuffle run through
# verl's real loop, rewarded by the real tool-calling verifier (format, correctness). Writes the table
# (steps to format >= THRESHOLD, format after 10 steps, correctness, the replay's localisation and the
# sign diagnostic on the tag tokens) and the plots to OUT, and copies them to DOCS.
#
#   bash run_scripts/format_speed_experiment.sh                     # 4 methods x 6 seeds x 12 steps
#   SEEDS="0 1" METHODS="gdpo mrtpo" bash run_scripts/format_speed_experiment.sh --lr 5e-4
#   bash run_scripts/format_speed_experiment.sh --analyse-only      # only rebuild the table and plots
#
# Each verl run holds the machine-wide lock (/tmp/mrtpo-heavy.lock, MRTPO_HEAVY_LOCK) while it runs and
# needs ~11 GiB of memory and ~5-6 min (~2 min of it start-up; 149 min for all 24); finished runs are kept, so
# re-running resumes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SEEDS="${SEEDS:-0 1 2 3 4 5}"
STEPS="${STEPS:-12}"
METHODS="${METHODS:-grpo gdpo mrtpo shuffle}"
OUT="${OUT:-outputs/format_speed}"
DOCS="${DOCS:-docs/format_speed}"
bash run_scripts/setup.sh || { echo "[format-speed] ERROR: setup failed (see above)" >&2; exit 1; }
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# shellcheck disable=SC2086  # SEEDS and METHODS are word lists
exec "${MRTPO_VENV:-$ROOT/.venv}/bin/python" -m experiments.format_speed --out "$OUT" --docs "$DOCS" --seeds $SEEDS \
    --steps "$STEPS" --methods $METHODS "$@"
