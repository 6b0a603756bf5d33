# shellcheck shell=bash
# Shared logic of the per-(model, task) run scripts
# (run_scripts/qwen{1.5b,3b,7b}_{ifbench,text2sql,toolcall,toolcall_multiturn}.sh).
# Sourced, never run: a per-model script is `source common.sh` + `mrtpo_launch <size> <task> "$@"`.
#
# It composes one command line
#     <venv python> -m recipe.mrtpo.main_mrtpo <the overrides below> <ALGO's overrides> "$@"
# (the caller's extra arguments last, so they win over everything here) and runs it, or with DRY_RUN=1
# composes the same config, runs the launch's checks on it and prints it (no Ray, no GPU, a few seconds).
#
# Environment (all optional):
#   ALGO             the method (default mrtpo), one of `python3 -m recipe.mrtpo.methods names`; its overrides
#                    come from the methods registry (recipe/mrtpo/methods/, `python3 -m recipe.mrtpo.methods` lists
#                    them) and switch only what differs:
#                      grpo    algorithm.adv_estimator=grpo   (verl's GRPO on the mean of the sample's rewards)
#                      gdpo    algorithm.adv_estimator=gdpo   (per-reward group normalisation, no replay)
#                      mrtpo   algorithm.adv_estimator=mrtpo  (GDPO + per-reward token relevance, the method)
#                      cort    mrtpo + mrtpo.mode=cort        (CoRT-style joint replay baseline)
#                      shuffle mrtpo + mrtpo.shuffle=True     (control: relevance permuted over positions)
#                      opsd    gdpo + mrtpo.mode=opsd         (OPSD as its paper defines it: the initial policy under
#                              P_all teaches the policy under the rollout prompt through a JSD (beta 0.5) over its
#                              renormalised top-50, the distillation loss alone; its overrides also set use_kl_loss=True
#                              (verl's reference worker holds the frozen teacher) and kl_loss_coef=0; knobs mrtpo.opsd_beta /
#                              opsd_topk / opsd_support, docs/opsd.md)
#                      gdpo-distill gdpo + mrtpo.mode=gdpo-distill (not OPSD: GDPO's policy loss + verl's top-k forward
#                              KL to the live policy under P_all; knobs mrtpo.opsd_topk / opsd_loss_mode / opsd_loss_coef)
#                      rlsd    gdpo + mrtpo.mode=rlsd         (GDPO's advantage reweighted per token by the P_all teacher)
#                      sdpo    gdpo + mrtpo.mode=sdpo         (SDPO: JSD to an EMA teacher under P_all over the student's
#                              top-100 + tail, no RL term; knobs mrtpo.sdpo_*, docs/opsd.md)
#                    A knob the method does not read (say mrtpo.beta=0.3 with ALGO=gdpo) is refused before Ray starts.
#   MODEL_PATH       hub id or local folder (default: the script's Qwen2.5 / Qwen2.5-Coder Instruct model)
#   TRAIN_FILES      parquet file(s), comma-separated (default: the task's set under data/, see _mrtpo_task)
#   VAL_FILES        parquet file(s), comma-separated (default: the task's evaluation sets under data/)
#   DATA_SET         which built files TRAIN_FILES / VAL_FILES default to (docs/data.md has the commands and row counts):
#                      offline  (default) what `python -m data_prep.build_offline` builds (IF on project prompts, BFCL split)
#                      public   the peers' public training sets: ifbench -> data/if_multi_constraints (IF_multi_constraints_upto5),
#                               text2sql -> data/spider (Spider train from its archive), toolcall -> data/toolrl (ToolRL's 4k
#                               mix with this project's reward); validation sets as for offline
#                      toolrl   toolcall only: data/toolrl_reward (ToolRL's 4k mix, ToolRL's prompt and reward form, as GDPO's run)
#                    Relative paths are taken from the directory you call the script from.
#   CHECKPOINT_ROOT  where checkpoints go (default <repo>/checkpoints): with NNODES > 1 it must be storage every node
#                    shares, mounted at the same path (each rank writes its own shard there): NNODES > 1 without it is
#                    refused (but with SMOKE=1, which saves nothing), and before step 1 every node must read a marker the run writes there (the node check);
#                    a resume that finds no checkpoint where the run recorded one, or shards of another world size,
#                    is refused in one line.
#   MRTPO_DATA_ROOT  where rows' relative files (SQL databases) are found (default <repo>/data), on every node
#   MRTPO_ASSETS     the verifiers' assets, NLTK's data under nltk_data/ (default <repo>/.assets, what
#                    run_scripts/fetch_assets.py unpacks; MRTPO_NLTK_DATA overrides that one folder), on every node.
#                    These are passed to every Ray worker; the node check looks for what the run's rows need on each node.
#   MRTPO_PREFLIGHT  0 skips the launch's fast checks (`python -m recipe.mrtpo.doctor --preflight`: the NVIDIA
#                    driver, flash-attn or the SDPA overrides, the NLTK data of ifbench, the data root; one line each),
#                    which otherwise run before Ray starts and stop a launch that fails one
#   NNODES           nodes (default 1). More than one: start a Ray cluster over the nodes first (`ray start
#                    --head` on one, `ray start --address=<head>:6379` on the others; the repository at the
#                    same path on every node), then run the script on the head node.
#   N_GPUS_PER_NODE  GPUs per node (default 8)
#   SEED             one seed for everything verl and the recipe seed (default 0; _mrtpo_seed): also the last part
#                    of the experiment name and so of the checkpoint folder, checkpoints/<project>/<experiment>
#   SMOKE=1          the first GPU run's preset (_mrtpo_smoke): 2 steps of a small batch, the replay from step 1
#                    (no warm-up), no validation, no checkpoint, relevance dumps every step; experiment name +_smoke
#   DRY_RUN=1        compose the config as a launch would (run_scripts/dry_run.py), run the launch's checks
#                    (recipe.mrtpo.main_mrtpo.check_config and verl's validate_config), print it resolved as YAML
#                    on stdout and exit; starts nothing. A refused config: one line on stderr, exit status 2
#   PROJECT_NAME     trainer.project_name (default mrtpo)
#   EXPERIMENT_NAME  trainer.experiment_name (default <model folder name>_<task>_<ALGO>, lower case), then _smoke
#                    (SMOKE=1) and _seed<SEED> appended unless it already ends so
#   MRTPO_VENV       the venv whose python runs verl (default <repo>/.venv; else `python` on PATH)
# The command line is echoed on stderr before it runs.

MRTPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# the methods registry's command line needs only the standard library (any python3, no venv)
MRTPO_ALGOS="$(PYTHONPATH="$MRTPO_ROOT" python3 -m recipe.mrtpo.methods names 2>/dev/null)"

mrtpo_die() { printf '[mrtpo] ERROR: %s\n' "$*" >&2; exit 1; }
mrtpo_log() { printf '[mrtpo] %s\n' "$*" >&2; }

# mrtpo_abspath PATH: PATH made absolute against the caller's working directory (URLs kept as they are).
mrtpo_abspath() {
  case "$1" in
    /* | *://*) printf '%s' "$1" ;;
    *) printf '%s/%s' "$PWD" "${1#./}" ;;
  esac
}

# mrtpo_trim STR: STR without leading and trailing white space.
mrtpo_trim() {
  local s="$1"
  s="${s#"${s%%[![:space:]]*}"}"
  printf '%s' "${s%"${s##*[![:space:]]}"}"
}

# mrtpo_rooted "a,b,...": each relative path of the list taken under the repository root.
mrtpo_rooted() {
  local out="" p
  local -a parts
  IFS=',' read -r -a parts <<< "$1"
  for p in "${parts[@]}"; do
    case "$p" in /* | *://*) ;; *) p="$MRTPO_ROOT/$p" ;; esac
    out+="${out:+,}$p"
  done
  printf '%s' "$out"
}

# mrtpo_hydra_list "a,b,...": a Hydra list of single-quoted absolute paths, e.g. ['/x/a.parquet','/x/b.parquet'].
mrtpo_hydra_list() {
  local out="" p
  local -a parts
  IFS=',' read -r -a parts <<< "$1"
  for p in "${parts[@]}"; do
    p="$(mrtpo_trim "$p")"
    [ -n "$p" ] || continue
    case "$p" in *"'"* | *"\\"*) mrtpo_die "data path with a quote or backslash is not supported: $p" ;; esac
    out+="${out:+,}'$(mrtpo_abspath "$p")'"
  done
  [ -n "$out" ] || mrtpo_die "empty file list: '$1'"
  printf '[%s]' "$out"
}

# mrtpo_check_files "a,b,...": every local path exists, else a clear error naming the builder command.
mrtpo_check_files() {
  local p missing=""
  local -a parts
  IFS=',' read -r -a parts <<< "$1"
  for p in "${parts[@]}"; do
    p="$(mrtpo_trim "$p")"
    [ -z "$p" ] || [[ "$p" == *://* ]] || [ -f "$(mrtpo_abspath "$p")" ] || missing+=" $(mrtpo_abspath "$p")"
  done
  [ -z "$missing" ] || {
    if [ -n "$DRY_RUN_ON" ]; then mrtpo_log "warning: missing data file(s):$missing (dry run: continuing)"; return 0; fi
    mrtpo_die "missing data file(s):$missing
  build them first: $TASK_DATA_HINT"
  }
}

# mrtpo_python: the interpreter that has verl (the project's venv if present).
mrtpo_python() {
  local venv="${MRTPO_VENV:-$MRTPO_ROOT/.venv}"
  if [ -x "$venv/bin/python" ]; then printf '%s' "$venv/bin/python"
  elif command -v python >/dev/null 2>&1; then printf 'python'
  elif command -v python3 >/dev/null 2>&1; then printf 'python3'
  else mrtpo_die "no python found (run: bash run_scripts/setup.sh, or set MRTPO_VENV)"; fi
}

# _mrtpo_size SIZE: what scales with the model. Sized for 80 GB GPUs (A100/H100), one node of 8; with
# fewer or smaller GPUs lower the token budgets (or add ...fsdp_config.param_offload=True) on the command line.
# The reference model needs no offload knob: verl 0.9.1 offloads the FSDP2 reference's parameters to CPU
# whatever ref.fsdp_config.param_offload says (ref/dp_ref.yaml:20 sets engine forward_only=True, and
# workers/engine/fsdp/transformer_impl.py:459-463 then installs CPUOffloadPolicy and clears _is_offload_param).
# The replay has no micro-batch knob here either: with use_dynamic_bsz (below) it packs its forwards by
# rollout.log_prob_max_token_len_per_gpu, and mrtpo.replay_micro_batch_size is not read.
_mrtpo_size() {
  case "$1" in
    1.5b)
      MODEL_SIZE=1.5B
      ROLLOUT_TP=1             # vLLM tensor parallel: the whole model on one GPU (as GDPO's 1.5B run): 8 engines
      PPO_MAX_TOKENS=24576     # tokens per GPU per actor-update micro-batch (dynamic batch size): ~8 x 3072
      LOGPROB_MAX_TOKENS=32768 # tokens per GPU per old/ref log-prob and replay forward (no gradients)
      ;;
    3b)
      MODEL_SIZE=3B
      ROLLOUT_TP=1             # ~6 GB of bf16 weights: one GPU per engine
      PPO_MAX_TOKENS=24576     # 7B's budget: with gradient checkpointing a token's saved activations scale with
                               # layers x hidden, 36 x 2048 for Qwen2.5-3B against 28 x 3584 for 7B (0.73 x), and
                               # its weights, gradients and Adam states are 0.4 x: what fits 7B fits 3B
      LOGPROB_MAX_TOKENS=32768
      ;;
    7b)
      MODEL_SIZE=7B
      ROLLOUT_TP=1             # ~15 GB of bf16 weights + KV cache fit one 80 GB GPU: 8 engines (TP=2 would give 4)
      PPO_MAX_TOKENS=24576     # ~8 x 3072: the usual 7B budget with gradient checkpointing on 80 GB
      LOGPROB_MAX_TOKENS=24576 # the replay's forwards use it too (benchmarks/gpu_replay.py's default budget)
      ;;
    *) mrtpo_die "unknown model size '$1' (1.5b | 3b | 7b)" ;;
  esac
}

# _mrtpo_task TASK: default model family and data of each task (files as data_prep writes them); the
# defaults are the offline sets (DATA_SET=offline), _mrtpo_data_set switches them for the other data sets.
_mrtpo_task() {
  TRAIN_BATCH=512  # prompts per step (GDPO's tool-calling setup); a data set smaller than that sets its own
  MAX_RESPONSE_LENGTH=1024  # GDPO's tool-calling setup; a multi-turn trajectory sets its own
  TASK_ARGS=()     # overrides only one task needs (the multi-turn agent loop's)
  case "$1" in
    ifbench)
      # Train: multi-constraint prompts (one reward per constraint); validate on IFEval and IFBench.
      MODEL_DEFAULT="Qwen/Qwen2.5-${MODEL_SIZE}-Instruct"
      TRAIN_DEFAULT="data/instruction_following/train.parquet"
      VAL_DEFAULT="data/ifeval/test.parquet,data/ifbench/test.parquet"
      MAX_PROMPT_LENGTH=2048
      TASK_DATA_HINT="python -m data_prep.build_offline --out-dir data"
      ;;
    text2sql)
      # Offline: train and validate on the Chinook set (data/chinook: 197 train / 49 test rows, execution
      # accuracy = the execution_match reward). The paper's Spider / BIRD runs are DATA_SET=public.
      MODEL_DEFAULT="Qwen/Qwen2.5-Coder-${MODEL_SIZE}-Instruct"
      TRAIN_DEFAULT="data/chinook/train.parquet"
      VAL_DEFAULT="data/chinook/test.parquet"
      MAX_PROMPT_LENGTH=4096   # database schemas (BIRD's especially) are long; longer prompts are dropped
      TASK_DATA_HINT="python -m data_prep.build_offline --out-dir data --only chinook"
      ;;
    toolcall)
      # Train and validate on the hash split of BFCL's AST-checkable categories (format + correctness rewards).
      MODEL_DEFAULT="Qwen/Qwen2.5-${MODEL_SIZE}-Instruct"
      TRAIN_DEFAULT="data/bfcl/train.parquet"
      VAL_DEFAULT="data/bfcl/test.parquet"
      MAX_PROMPT_LENGTH=2048
      TASK_DATA_HINT="python -m data_prep.build_offline --out-dir data"
      ;;
    toolcall_multiturn)
      # BFCL v4 multi-turn (base, long_context, miss_func, miss_param), split by scenario (408 train / 392 test
      # rows; BFCL's evaluation data, docs/data.md), played by the bfcl_multi_turn agent loop (rows choose it by
      # agent_name; its knobs in recipe/mrtpo/config/bfcl_agent_loop.yaml); rewards state / response / format /
      # irrelevance from BFCL's checker (docs/design.md section 7).
      MODEL_DEFAULT="Qwen/Qwen2.5-${MODEL_SIZE}-Instruct"
      TRAIN_DEFAULT="data/bfcl_multi_turn/train.parquet"
      VAL_DEFAULT="data/bfcl_multi_turn/test.parquet"
      MAX_PROMPT_LENGTH=8192   # the first turn with the function docs of up to 3 backends (tools=)
      MAX_RESPONSE_LENGTH=8192 # the whole trajectory: model steps, tool results and injected turns of up to 7 turns
      # Measured on BFCL's gold trajectories (benchmarks/bench_multi_turn_lengths.py, table in docs/design.md §7):
      # prompts at most 7,323 tokens; gold responses at most 1,572 tokens outside long_context, but 42 of
      # long_context's 200 (of its 50 TradingBot questions: get_stock_info returns 31.7k characters of digits, ~1 token
      # a character) need 16.5k-36.9k even with the 16k-character cut below, and 40 of them end at this budget
      # (force_terminated). Left as is: the gold needs more than Qwen2.5's 32,768-token context, and a longer
      # response needs the per-GPU token budgets of _mrtpo_size raised (verl asserts a sequence fits them).
      TRAIN_BATCH=128          # 408 training rows: 3 steps an epoch (verl's loader drops the last partial batch)
      TASK_DATA_HINT="python -m data_prep.build_offline --out-dir data --only bfcl_multi_turn"
      TASK_ARGS=(
        "actor_rollout_ref.rollout.agent.agent_loop_config_path=$MRTPO_ROOT/recipe/mrtpo/config/bfcl_agent_loop.yaml"
        # rows choose the loop by agent_name; a row without one runs it too (the loop refuses a non-BFCL row)
        actor_rollout_ref.rollout.agent.default_agent_loop=bfcl_multi_turn
        # verl cuts tool results at 256 characters by default, which cuts many of BFCL's (BFCL cuts nothing;
        # long_context's outputs are long by design): 16k characters, the rest cut in the middle (counted).
        # Measured: it cuts 43 of the 4,625 gold results (all get_stock_info, long_context), still ~16.4k tokens
        # each; a smaller cut fits the gold in MAX_RESPONSE_LENGTH (at 4,096 characters 4 long_context gold
        # trajectories still exceed it, at 2,048 none, the longest 5,389 tokens) but cuts results in 99 / 162 of
        # long_context's 200 questions: a choice about what long_context shows the model, not made here
        actor_rollout_ref.rollout.multi_turn.max_tool_response_length=16384
      )
      ;;
    *) mrtpo_die "unknown task '$1' (ifbench | text2sql | toolcall | toolcall_multiturn)" ;;
  esac
  _mrtpo_data_set "$1"
}

# _mrtpo_data_set TASK: TRAIN_DEFAULT / VAL_DEFAULT for DATA_SET=offline|public|toolrl (docs/data.md).
_mrtpo_data_set() {
  case "${DATA_SET:-offline}/$1" in
    offline/text2sql)
      # Chinook's 197 training rows are fewer than 512 prompts a step, which would leave verl's loader
      # (drop_last) without a batch: 128 (one batch per epoch, one actor update per step at ppo_mini_batch_size=128).
      TRAIN_BATCH=128
      ;;
    offline/*) ;;
    public/ifbench)
      TRAIN_DEFAULT="data/if_multi_constraints/train.parquet"
      TASK_DATA_HINT="python -m data_prep.instruction_following if_multi_constraints --out-dir data/if_multi_constraints"
      ;;
    public/text2sql)
      # Train on Spider train, validate on Spider dev and BIRD dev; local copies of the official releases.
      TRAIN_DEFAULT="data/spider/train.parquet"
      VAL_DEFAULT="data/spider/test.parquet,data/bird/test.parquet"
      TASK_DATA_HINT="python -m data_prep.text_to_sql spider --input spider_data.zip --out-dir data/spider; the same with --part dev; python -m data_prep.text_to_sql bird --input dev.zip --part dev --out-dir data/bird"
      ;;
    public/toolcall)
      TRAIN_DEFAULT="data/toolrl/train.parquet"
      TASK_DATA_HINT="python -m data_prep.tool_calling toolrl --input rlla_rl.json --out-dir data/toolrl"
      ;;
    toolrl/toolcall)
      TRAIN_DEFAULT="data/toolrl_reward/train.parquet"
      VAL_DEFAULT="data/toolrl_reward/test.parquet"
      TASK_DATA_HINT="python -m data_prep.tool_calling toolrl --input rlla_rl.json --reward toolrl --out-dir data/toolrl_reward"
      ;;
    *) mrtpo_die "DATA_SET='${DATA_SET}' is not available for task '$1' (offline | public; toolrl for toolcall)" ;;
  esac
}

# _mrtpo_algo ALGO: the overrides that select the method ALGO (ALGO_ARGS), from the methods registry.
_mrtpo_algo() {
  [ -n "$MRTPO_ALGOS" ] || mrtpo_die "cannot read the methods registry (python3 -m recipe.mrtpo.methods in $MRTPO_ROOT)"
  case " $MRTPO_ALGOS " in
    *" $1 "*) ;;
    *) mrtpo_die "unknown ALGO '$1' (one of: $MRTPO_ALGOS)" ;;
  esac
  local out
  out="$(PYTHONPATH="$MRTPO_ROOT" python3 -m recipe.mrtpo.methods overrides "$1")" || mrtpo_die "no overrides for ALGO '$1'"
  mapfile -t ALGO_ARGS <<<"$out"
  ALGO_READS="$(PYTHONPATH="$MRTPO_ROOT" python3 -m recipe.mrtpo.methods reads "$1")" || mrtpo_die "no knobs for ALGO '$1'"
}

# _mrtpo_read_only ARRAY: drop from the named array the recipe's own mrtpo.* overrides that ALGO does not read
# (ALGO_READS, from the registry): the registry refuses a knob its method would ignore, and one command line
# serves every method. The caller's own overrides are never filtered (an inert one of theirs is refused).
_mrtpo_read_only() {
  local -n _arr="$1"
  local -a kept=()
  local a knob
  for a in "${_arr[@]}"; do
    if [[ "$a" == mrtpo.* ]]; then
      knob="${a#mrtpo.}"
      knob="${knob%%[.=]*}"
      [[ " $ALGO_READS " == *" $knob "* ]] || continue
    fi
    kept+=("$a")
  done
  _arr=("${kept[@]}")
}

# mrtpo_flag NAME VALUE: 1 for 1/true/yes, empty for 0/false/no/unset, else a clear error.
mrtpo_flag() {
  case "$2" in
    1 | true | True | yes) printf '1' ;;
    0 | "" | false | False | no) ;;
    *) mrtpo_die "$1 must be 1 or 0, got '$2'" ;;
  esac
}

# _mrtpo_seed SEED: every seed verl 0.9.1 and the recipe read, from the one SEED (SEED_ARGS).
_mrtpo_seed() {
  [[ "$1" =~ ^[0-9]+$ ]] || mrtpo_die "SEED must be a non-negative integer, got '$1'"
  SEED_ARGS=(
    "data.seed=$1"                                 # the train sampler's shuffle (verl's default null: a fresh order every run)
    "actor_rollout_ref.actor.data_loader_seed=$1"  # the order of the mini-batches in the actor update
    "actor_rollout_ref.rollout.seed=$1"            # vLLM sampling: every request its own seed (recipe/mrtpo/rollout/rollout_seed.py)
    "actor_rollout_ref.actor.fsdp_config.seed=$1"  # engine seeds, read under fsdp_config.full_determinism=True
    "actor_rollout_ref.ref.fsdp_config.seed=$1"
    "mrtpo.seed=$1"                                # the shuffle ablation's permutations (with the step); shuffle only
  )
}

# _mrtpo_smoke NGPUS_TOTAL: the SMOKE=1 preset (SMOKE_ARGS): the first replay within minutes of the start.
_mrtpo_smoke() {
  local batch=$(( 2 * $1 > 8 ? 2 * $1 : 8 ))  # prompts: x rollout.n = 8 responses per GPU, one update per step
  SMOKE_ARGS=(
    mrtpo.warmup_steps=0               # full beta from step 1: the first step already replays
    trainer.val_before_train=False     # no validation pass before the first step ...
    trainer.test_freq=-1               # ... nor after the last one
    "data.train_batch_size=$batch"
    "actor_rollout_ref.actor.ppo_mini_batch_size=$batch"
    trainer.total_training_steps=2
    trainer.save_freq=-1               # no checkpoint written ...
    trainer.resume_mode=disable        # ... and none resumed
    mrtpo.dump.every_n_steps=1         # relevance dumps of both steps (<default_local_dir>/relevance_dumps)
  )
}

# mrtpo_launch SIZE TASK [extra Hydra overrides...]: compose and run (or, with DRY_RUN=1, print) the config.
mrtpo_launch() {
  [ $# -ge 2 ] || mrtpo_die "usage: mrtpo_launch <1.5b|3b|7b> <ifbench|text2sql|toolcall|toolcall_multiturn> [overrides...]"
  local size="$1" task="$2"
  shift 2
  DRY_RUN_ON="$(mrtpo_flag DRY_RUN "${DRY_RUN:-0}")" || exit 1
  local smoke seed="${SEED:-0}"
  smoke="$(mrtpo_flag SMOKE "${SMOKE:-0}")" || exit 1
  local preflight
  preflight="$(mrtpo_flag MRTPO_PREFLIGHT "${MRTPO_PREFLIGHT:-1}")" || exit 1
  local algo="${ALGO:-mrtpo}"
  _mrtpo_size "$size"
  _mrtpo_task "$task"
  _mrtpo_algo "$algo"

  local nnodes="${NNODES:-1}" ngpus="${N_GPUS_PER_NODE:-8}"
  [[ "$nnodes" =~ ^[1-9][0-9]*$ ]] || mrtpo_die "NNODES must be a positive integer, got '$nnodes'"
  [[ "$ngpus" =~ ^[1-9][0-9]*$ ]] || mrtpo_die "N_GPUS_PER_NODE must be a positive integer, got '$ngpus'"
  # the default checkpoint folder is inside the repository, on each node's own disk: shards split over the nodes
  # (SMOKE=1 saves and resumes nothing; the node check's marker still refuses a run that does, on a folder not shared)
  if [ "$nnodes" -gt 1 ] && [ -z "${CHECKPOINT_ROOT:-}" ] && [ -z "$smoke" ]; then
    local shared="NNODES=$nnodes needs CHECKPOINT_ROOT on storage every node shares (the default $MRTPO_ROOT/checkpoints is each node's own disk)"
    if [ -n "$DRY_RUN_ON" ]; then mrtpo_log "warning: $shared (dry run: continuing)"; else mrtpo_die "$shared"; fi
  fi

  local model="${MODEL_PATH:-$MODEL_DEFAULT}"
  [ -n "$model" ] || mrtpo_die "MODEL_PATH is empty"
  # A local folder (absolute, ./relative or existing) becomes absolute; anything else is a hub id.
  if [[ "$model" == /* || "$model" == .* || -e "$model" ]]; then model="$(mrtpo_abspath "$model")"; fi
  case "$model" in *"'"* | *"\\"*) mrtpo_die "MODEL_PATH with a quote or backslash is not supported: $model" ;; esac

  # Defaults live in the repository's data/ wherever the script is called from.
  local train="${TRAIN_FILES:-$(mrtpo_rooted "$TRAIN_DEFAULT")}" val="${VAL_FILES:-$(mrtpo_rooted "$VAL_DEFAULT")}"
  mrtpo_check_files "$train"
  mrtpo_check_files "$val"
  local train_list val_list
  train_list="$(mrtpo_hydra_list "$train")"
  val_list="$(mrtpo_hydra_list "$val")"

  local model_tag
  model_tag="$(basename "${model%/}" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9._\n-' '-')"
  _mrtpo_seed "$seed"
  # The seed is always the name's last part, so two seeds never share a checkpoint folder (resume_mode=auto
  # would continue the other seed's run); a smoke run has its own name too.
  local experiment="${EXPERIMENT_NAME:-${model_tag}_${task}_${algo}}"
  [ -z "$smoke" ] || [[ "$experiment" == *_smoke ]] || experiment+="_smoke"
  [[ "$experiment" == *"_seed$seed" ]] || experiment+="_seed$seed"
  case "$experiment" in *"'"* | *"\\"* | */*) mrtpo_die "EXPERIMENT_NAME with a quote, backslash or slash is not supported: $experiment" ;; esac
  local project="${PROJECT_NAME:-mrtpo}"
  local pythonpath="$MRTPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"

  local -a args=(
    # --- data ------------------------------------------------------------------------------------------
    "data.train_files=$train_list"
    "data.val_files=$val_list"
    "data.train_batch_size=$TRAIN_BATCH"      # prompts per step: 512 (GDPO's tool-calling setup; x n = 2048 responses), Chinook 128
    "data.max_prompt_length=$MAX_PROMPT_LENGTH"  # 2048 as GDPO; 4096 for SQL schemas
    "data.max_response_length=$MAX_RESPONSE_LENGTH"  # 1024 (GDPO's tool-calling setup); 8192 for multi-turn trajectories
    data.filter_overlong_prompts=True         # drop (and count) prompts over max_prompt_length instead of failing
    data.truncation=error
    # --- model -----------------------------------------------------------------------------------------
    "actor_rollout_ref.model.path='$model'"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    # --- actor (policy update) -------------------------------------------------------------------------
    actor_rollout_ref.actor.strategy=fsdp2    # verl's recommended FSDP; the recipe's replay runs on the same module
    actor_rollout_ref.actor.optim.lr=1e-6     # GDPO's tool-calling setup
    actor_rollout_ref.actor.ppo_mini_batch_size=128   # prompts per update: 4 updates per step (as GDPO)
    actor_rollout_ref.actor.ppo_epochs=1
    actor_rollout_ref.actor.use_dynamic_bsz=True      # micro-batches packed by tokens (as GDPO); budget below
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$PPO_MAX_TOKENS"
    actor_rollout_ref.actor.use_kl_loss=True          # KL to the reference policy in the actor loss ...
    actor_rollout_ref.actor.kl_loss_coef=0.001        # ... coefficient 0.001 (GDPO's setup) ...
    actor_rollout_ref.actor.kl_loss_type=low_var_kl   # ... k3 estimator
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.loss_agg_mode=token-mean
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    # --- reference policy (for the KL loss) --------------------------------------------------------------
    actor_rollout_ref.ref.strategy=fsdp2              # always CPU-offloaded by verl (see _mrtpo_size)
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=$LOGPROB_MAX_TOKENS"
    actor_rollout_ref.ref.fsdp_config.model_dtype=bf16  # verl's default holds the frozen reference in fp32 (offloaded to
                                                        # CPU, copied in per forward): bf16 halves both; its forward runs
                                                        # in bf16 either way (the actor's mixed precision)
    # --- rollout (vLLM) ----------------------------------------------------------------------------------
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=4                     # responses per prompt (GDPO's setup)
    actor_rollout_ref.rollout.temperature=1.0
    "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$LOGPROB_MAX_TOKENS"
    # validation decodes greedily (verl's default val_kwargs: temperature 0, one sample per prompt)
    # --- algorithm ---------------------------------------------------------------------------------------
    algorithm.use_kl_in_reward=False                  # the KL is in the loss (above), not in the reward
    algorithm.norm_adv_by_std_in_grpo=True
    # MRTPO's knobs (docs/design.md §1); passed only to the methods that read them (_mrtpo_read_only).
    mrtpo.beta=0.5                # reallocation strength after warm-up (0 = GDPO)
    mrtpo.warmup_steps=10         # beta ramps in with a smoothstep over the first 10 steps
    mrtpo.max_realloc_rms=1.0     # rho: RMS bound on the reallocated part w - 1 per (sample, reward)
    mrtpo.measure=js_distance     # sqrt(JSD / ln 2) between the P_all and P_minus_k next-token distributions
    # --- trainer -----------------------------------------------------------------------------------------
    "trainer.nnodes=$nnodes"
    "trainer.n_gpus_per_node=$ngpus"
    "trainer.project_name=$project"
    "trainer.experiment_name=$experiment"
    "trainer.default_local_dir='${CHECKPOINT_ROOT:-$MRTPO_ROOT/checkpoints}/$project/$experiment'"  # checkpoints + relevance dumps, per seed
    trainer.total_training_steps=100  # ~GDPO's run (15 epochs of ToolRL's 4k rows at 512 ~ 105 steps), the same
    trainer.total_epochs=100          # for every task whatever its size: >= 1 step per epoch, so the steps decide
    trainer.val_before_train=True     # step-0 scores of the base model
    trainer.test_freq=10
    trainer.save_freq=50
    trainer.max_actor_ckpt_to_keep=2
    trainer.critic_warmup=0
    "trainer.logger=[console]"        # add wandb with: 'trainer.logger=[console,wandb]'
    # Ray workers (on every node) import the recipe from the repository.
    "++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH='$pythonpath'"
    # ... and resolve the rows' files (SQL databases) against the same data root and the verifiers' assets (NLTK's
    # data) against the same asset root (README: node-local files).
    "++ray_kwargs.ray_init.runtime_env.env_vars.MRTPO_DATA_ROOT='${MRTPO_DATA_ROOT:-$MRTPO_ROOT/data}'"
    "++ray_kwargs.ray_init.runtime_env.env_vars.MRTPO_ASSETS='${MRTPO_ASSETS:-$MRTPO_ROOT/.assets}'"
  )
  [ -z "${MRTPO_NLTK_DATA:-}" ] || args+=("++ray_kwargs.ray_init.runtime_env.env_vars.MRTPO_NLTK_DATA='$MRTPO_NLTK_DATA'")
  case "${CHECKPOINT_ROOT:-}${MRTPO_DATA_ROOT:-}${MRTPO_ASSETS:-}${MRTPO_NLTK_DATA:-}" in
    *"'"* | *"\\"*) mrtpo_die "CHECKPOINT_ROOT / MRTPO_DATA_ROOT / MRTPO_ASSETS / MRTPO_NLTK_DATA with a quote or backslash is not supported" ;;
  esac

  args+=("${TASK_ARGS[@]}" "${SEED_ARGS[@]}")
  _mrtpo_read_only args
  if [ -n "$smoke" ]; then
    _mrtpo_smoke "$((nnodes * ngpus))"
    _mrtpo_read_only SMOKE_ARGS
    args+=("${SMOKE_ARGS[@]}")
    mrtpo_log "SMOKE=1: $(printf '%s ' "${SMOKE_ARGS[@]}")"
  fi

  local py
  py="$(mrtpo_python)"
  # A dry run composes the same config through Hydra's compose API and runs the launch's own checks on it
  # (run_scripts/dry_run.py); a real run is verl's entry point.
  local -a cmd=("$py" -m recipe.mrtpo.main_mrtpo)
  [ -z "$DRY_RUN_ON" ] || cmd=("$py" "$MRTPO_ROOT/run_scripts/dry_run.py")
  cmd+=("${args[@]}" "${ALGO_ARGS[@]}" "$@")

  cd "$MRTPO_ROOT" || mrtpo_die "cannot cd to $MRTPO_ROOT"
  export PYTHONPATH="$pythonpath"
  export PYTHONHASHSEED="$seed"  # Python's str hash salt; verl forwards it to its Ray actors when set (constants_ppo.py)
  export HYDRA_FULL_ERROR=1
  if [ -z "$DRY_RUN_ON" ] && [ -n "$preflight" ]; then
    # the fast checks of a GPU launch (recipe/mrtpo/doctor.py), one line each, before Ray starts
    "$py" -m recipe.mrtpo.doctor --preflight --task "$task" -- "${cmd[@]:3}" >&2 \
      || mrtpo_die "the launch's preflight failed (the MISSING / DIFFERS lines above; MRTPO_PREFLIGHT=0 skips it)"
  fi
  mrtpo_log "$(printf '%q ' "${cmd[@]}")"
  exec "${cmd[@]}"
}
