#!/usr/bin/env bash
# Table 2/8: zero-shot accuracy, pruned vs pruned+SPP (Wanda, SparseGPT; unstructured 50 % and 2:4) and dense.
# Use: MODEL=llama7b EXTRA="model.path=/data/llama-7b" bash experiments/table2_zeroshot/run.sh
#      nice -n 10 bash experiments/table2_zeroshot/run.sh      (SmolLM2-135M, CPU budget, Wanda only)
TABLE=table2_zeroshot
source "$(dirname "$0")/../common.sh"
if [[ $MODEL == smollm2_135m ]]; then PRUNERS=${PRUNERS:-wanda}; else PRUNERS=${PRUNERS:-wanda,sparsegpt}; fi
sweep dense pruner=none sparsity=dense adapter=none "${ZERO_SHOT[@]}"
sweep pruned "pruner=$PRUNERS" sparsity=unstructured50,nm2_4 adapter=none,spp "${ZERO_SHOT[@]}"
collect table2
