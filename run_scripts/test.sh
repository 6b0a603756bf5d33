#!/usr/bin/env bash
# The whole test suite: installs what it needs (idempotent), lints, then runs pytest.
#   bash run_scripts/test.sh                 # ruff check + everything (CPU; GPU tests skip with a reason)
#   bash run_scripts/test.sh -k advantage    # extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash run_scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$ROOT/.venv/bin/ruff" check "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
