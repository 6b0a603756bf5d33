#!/usr/bin/env bash
# The miniature credit-assignment experiment on CPU: a synthetic task whose rewards each read one known
# token (a field of "Form: B=5 C=8 A=3"), a tiny Qwen2 warm-started by SFT on imperfect demonstrations,
# then GRPO, GDPO, MRTPO and MRTPO+shuffle through verl's real loop, SEEDS x STEPS each. Writes the table
# (final rewards, steps to THRESHOLD, localisation precision of the replay) and plots to OUT.
#
#   bash run_scripts/mini_credit_experiment.sh                       # 4 methods x 3 seeds x 20 steps, ~60 min on 2 cores
#   SEEDS="0 1 2" STEPS=12 bash run_scripts/mini_credit_experiment.sh
#   METHODS="gdpo mrtpo" OUT=outputs/mini_ab bash run_scripts/mini_credit_experiment.sh --lr 5e-4   # extra args: python -m experiments.mini_credit's
#
# Each verl run needs ~10 GiB of memory and ~4 min (start-up ~100 s + ~7 s a step); runs go one at a
# time. Finished runs are kept, so re-running resumes; add --analyse-only to only rebuild the table.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SEEDS="${SEEDS:-0 1 2}"
STEPS="${STEPS:-20}"
METHODS="${METHODS:-grpo gdpo mrtpo shuffle}"
THRESHOLD="${THRESHOLD:-0.6}"
OUT="${OUT:-outputs/mini_credit}"
bash run_scripts/setup.sh || { echo "[mini] ERROR: setup failed (see above)" >&2; exit 1; }
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086  # SEEDS and METHODS are word lists
exec "${MRTPO_VENV:-$ROOT/.venv}/bin/python" -m experiments.mini_credit --out "$OUT" --seeds $SEEDS --steps "$STEPS" \
    --methods $METHODS --threshold "$THRESHOLD" "$@"
