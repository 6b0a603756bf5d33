#!/usr/bin/env bash
# The whole test suite: installs what it needs (idempotent), lints, then runs pytest.
#   bash run_scripts/test.sh                 # ruff check + everything (CPU; GPU tests skip with a reason)
#   bash run_scripts/test.sh -k advantage    # extra arguments go to pytest
#   MRTPO_TEST_WORKERS=0 bash run_scripts/test.sh   # one process (default 2: pytest-xdist, the e2e runs on one worker)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash run_scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$ROOT/.venv/bin/ruff" check "$ROOT"
# Two workers on two cores: the end-to-end runs (tests/conftest.py: all on one worker, one at a time) wait on
# their subprocesses much of the time, and the other worker runs the rest of the suite meanwhile.
exec "$ROOT/.venv/bin/python" -m pytest -n "${MRTPO_TEST_WORKERS:-2}" "$@"
