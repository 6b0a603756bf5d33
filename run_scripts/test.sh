#!/usr/bin/env bash
# The whole test suite: installs what it needs (idempotent), then runs pytest.
#   bash run_scripts/test.sh                 # everything (CPU; GPU tests skip with a reason)
#   bash run_scripts/test.sh -k advantage    # extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash run_scripts/setup.sh
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$ROOT/.venv/bin/python" -m pytest "$@"
