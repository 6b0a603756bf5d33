#!/usr/bin/env bash
# MRTPO recipe, Qwen/Qwen2.5-1.5B-Instruct: multi-turn tool use: BFCL v4 multi-turn played by the bfcl_multi_turn agent loop, rewards state / response / format / irrelevance from BFCL's checker.
# Data: python -m data_prep.build_offline --out-dir data --only bfcl_multi_turn   (data/bfcl_multi_turn, split by scenario)
#   bash run_scripts/qwen1.5b_toolcall_multiturn.sh                    # MRTPO on 1 node x 8 GPUs
#   ALGO=gdpo bash run_scripts/qwen1.5b_toolcall_multiturn.sh          # baselines / ablations: grpo | gdpo | cort | shuffle | opsd | rlsd
#   DRY_RUN=1 bash run_scripts/qwen1.5b_toolcall_multiturn.sh          # compose + check the config, print it (no Ray, no GPU)
#   SMOKE=1 bash run_scripts/qwen1.5b_toolcall_multiturn.sh            # first GPU run: 2 small steps, replay from step 1, dumps on
#   SEED=1 bash run_scripts/qwen1.5b_toolcall_multiturn.sh             # another seed: its own experiment name and checkpoints
#   MODEL_PATH=/models/... TRAIN_FILES=... VAL_FILES=a,b NNODES=2 bash run_scripts/qwen1.5b_toolcall_multiturn.sh trainer.save_freq=20
# Every extra argument is a Hydra override passed to verl last (it wins). Hyper-parameters, the agent loop's
# settings and the environment variables are in run_scripts/common.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mrtpo_launch 1.5b toolcall_multiturn "$@"
