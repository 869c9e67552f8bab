#!/usr/bin/env bash
# Paper-style evaluation table of the embedded SmolLM2-135M: dense, Wanda 2:4, Wanda unstructured 50 %.
# WikiText-2 perplexity (seqlen 2048, first 4 windows), the 7 zero-shot tasks (first 20 docs each) and 5-shot MMLU
# (first doc of each of the 57 subjects), pruning with C4 calibration=quick (32 x 512 tokens, seed 0).
# Limits are sized for a shared 2-core CPU; for the full protocol use eval=paper and calibration=c4.
# Use: nice -n 10 bash experiments/eval/smollm2_table.sh        (writes experiments/results/eval_smollm2_135m.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-experiments/results/eval_smollm2_135m}
CACHE=${SPP_CACHE_DIR:-$HOME/.cache/spp}
COMMON=(model=smollm2_135m eval=default eval.seqlen=2048 eval.max_windows=4 "eval.tasks=[spp_zeroshot,spp_mmlu]"
        eval.limit=${LIMIT:-20} eval.mmlu_limit=${MMLU_LIMIT:-1} eval.lm_eval_batch_size=${BATCH:-4} calibration=quick "cache_dir=$CACHE" print_config=false)
python eval.py "${COMMON[@]}" label=dense run_dir="$OUT/dense"
python eval.py "${COMMON[@]}" pruner=wanda sparsity=nm2_4 "label='Wanda 2:4'" run_dir="$OUT/wanda_nm2_4"
python eval.py "${COMMON[@]}" pruner=wanda sparsity=unstructured50 "label='Wanda 50%'" run_dir="$OUT/wanda_unstructured50"
python -m spp.eval.collect_results --out "$OUT.md" --title "SmolLM2-135M: dense vs Wanda (CPU-sized limits)" \
  --preamble "Command: \`nice -n 10 bash experiments/eval/smollm2_table.sh\` (LIMIT=${LIMIT:-20}, MMLU_LIMIT=${MMLU_LIMIT:-1})." \
  "$OUT/dense/results.json" "$OUT/wanda_nm2_4/results.json" "$OUT/wanda_unstructured50/results.json"
