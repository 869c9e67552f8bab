# Shared by experiments/table*/run.sh (sourced, not run): model, CPU budget, loggers and the sweep() wrapper.
# Use: MODEL=llama7b DRY=1 bash experiments/table2_zeroshot/run.sh   (compose + print the plan, no weights)
#      nice -n 10 bash experiments/table6_ablations/run.sh          (embedded SmolLM2-135M, CPU budget)
# Environment: MODEL (conf/model name, default smollm2_135m), EXTRA (more overrides for every job, e.g.
# "model.path=/data/llama-7b"), LOGGERS (default [csv,wandb]; W&B is offline without an API key), RUNS (sweep
# root, default experiments/results/runs/<table>/<model>), DRY=1 (plan only), PRINT_SWEEPS=1 (print the
# override lists, one sweep per line, fields separated by \x1f; used by tests/test_experiments_compose.py).
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1} TOKENIZERS_PARALLELISM=false
MODEL=${MODEL:-smollm2_135m}
LOGGERS=${LOGGERS:-[csv,wandb]}
RUNS=${RUNS:-experiments/results/runs/$TABLE/$MODEL}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"

# The CPU budget of the embedded model is the one of the README main job, conf/budget/smollm2_135m.yaml (picked
# automatically for model=smollm2_135m): 120 Alpaca records cut at 128 tokens (108 train / 12 validation), batch
# 8, one epoch (14 steps) at lr 2e-2, Wanda calibration 32 x 512 C4 tokens, WikiText-2 perplexity on the first 8
# windows of 512 tokens, seed 0. Only logging is set here. (Tables committed before 2026-11-23 used a second,
# smaller budget: batch 4, 12 steps, 4 windows; their resolved_config.yaml files record it.)
# LLaMA models get no budget: the paper's settings from conf/model/<name>.yaml and conf/eval/paper.yaml.
if [[ $MODEL == smollm2_135m ]]; then
  BUDGET=(trainer.log_every_n_steps=1 trainer.progress_bar=tqdm print_config=false)
  ZERO_SHOT=("eval.tasks=[spp_zeroshot]" eval.limit=${LIMIT:-20} eval.lm_eval_batch_size=8)
  MMLU=("eval.tasks=[spp_mmlu]" eval.mmlu_limit=${MMLU_LIMIT:-1} eval.lm_eval_batch_size=8)
else
  BUDGET=()
  ZERO_SHOT=(eval=paper "eval.tasks=[spp_zeroshot]")
  MMLU=(eval=paper "eval.tasks=[spp_mmlu]")
fi

# sweep NAME OVERRIDES...: one `python train.py -m` into $RUNS/NAME (W&B group = the table, tags = table +
# model/pruner/sparsity/adapter/r added by the logger itself).
sweep() {
  local name=$1
  shift
  local args=("hydra.sweep.dir=$RUNS/$name"
              'hydra.sweep.subdir=${hydra.job.num}_${pruner.name}-${sparsity.name}-${adapter.name}-r${adapter.r}'
              "model=$MODEL" "logger=$LOGGERS")
  if [[ $LOGGERS == *wandb* ]]; then
    args+=("logger.wandb.group=$TABLE" "logger.wandb.tags=[$TABLE]")
  fi
  args+=("${BUDGET[@]}" "$@" "${EXTRA_ARGS[@]}")
  if [[ -n ${PRINT_SWEEPS:-} ]]; then
    (IFS=$'\x1f'; echo "${args[*]}")
  elif [[ -n ${DRY:-} ]]; then
    python experiments/plan.py "${args[@]}"
  else
    python train.py -m "${args[@]}"
  fi
}

# collect TABLE_ID: the Markdown table of this table's runs (skipped in DRY / PRINT_SWEEPS mode).
collect() {
  if [[ -z ${PRINT_SWEEPS:-} && -z ${DRY:-} ]]; then
    python experiments/collect_summaries.py "$1" "$RUNS" --out "experiments/results/${TABLE}_${MODEL}.md" \
      --command "MODEL=$MODEL bash experiments/$TABLE/run.sh"
  fi
}
