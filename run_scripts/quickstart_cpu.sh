#!/usr/bin/env bash
# The CPU quickstart: set up (idempotent), then a few MRTPO steps through verl's real loop on a tiny
# model, printing per-reward scores and replay statistics by step and a relevance heatmap; then it exports
# the last checkpoint, evaluates the initial and the trained model on a few IFEval prompts and builds the
# report (table + figures) from its own runs folder (recipe/mrtpo/cpu/quickstart.py).
#   bash run_scripts/quickstart_cpu.sh [--steps 3] [--out outputs/quickstart] [--eval-items 8]
#   MODEL=smollm2 bash run_scripts/quickstart_cpu.sh   # SmolLM2-135M-Instruct, a model that reads its prompt (slower)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash run_scripts/setup.sh || { echo "[quickstart] ERROR: setup failed (see above)" >&2; exit 1; }
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$ROOT/.venv/bin/python" -m recipe.mrtpo.cpu.quickstart --model "${MODEL:-tiny}" "$@"
