#!/usr/bin/env bash
# Table 3: 75 % sparsity (unstructured75, 2:8 = 2 kept of 8): Wanda vs Wanda+DS⊘T vs Wanda+SPP, LM-eval and PPL.
# Use: MODEL=llama7b EXTRA="model.path=/data/llama-7b" bash experiments/table3_75pct/run.sh
#      nice -n 10 bash experiments/table3_75pct/run.sh        (SmolLM2-135M, CPU budget)
TABLE=table3_75pct
source "$(dirname "$0")/../common.sh"
sweep pruned pruner=wanda,dsnot sparsity=unstructured75,nm2_8 adapter=none "${ZERO_SHOT[@]}"
sweep spp pruner=wanda sparsity=unstructured75,nm2_8 adapter=spp "${ZERO_SHOT[@]}"
collect table3
