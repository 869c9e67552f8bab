#!/usr/bin/env bash
# Table 5: MMLU 5-shot accuracy, pruned vs pruned+SPP (Wanda, SparseGPT; unstructured 50 % and 2:4) and dense.
# Use: MODEL=llama7b EXTRA="model.path=/data/llama-7b" bash experiments/table5_mmlu/run.sh
#      nice -n 10 bash experiments/table5_mmlu/run.sh         (SmolLM2-135M: MMLU_LIMIT questions per subject)
TABLE=table5_mmlu
source "$(dirname "$0")/../common.sh"
if [[ $MODEL == smollm2_135m ]]; then PRUNERS=${PRUNERS:-wanda}; else PRUNERS=${PRUNERS:-wanda,sparsegpt}; fi
sweep dense pruner=none sparsity=dense adapter=none "${MMLU[@]}"
sweep pruned "pruner=$PRUNERS" sparsity=unstructured50,nm2_4 adapter=none,spp "${MMLU[@]}"
collect table5
