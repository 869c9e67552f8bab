#!/usr/bin/env bash
# Tables 6/7: SPP ablations: r in {4, 8, 16}; without W_beta (alpha zero-init); zero-init of alpha / beta /
# neither; and the no-residual form (alpha = beta = 1, multiplied in place; Sec. 3.2 remark 1).
# Use: MODEL=llama7b EXTRA="model.path=/data/llama-7b" bash experiments/table6_ablations/run.sh
#      nice -n 10 bash experiments/table6_ablations/run.sh    (SmolLM2-135M, CPU budget, Wanda 2:4, PPL only)
TABLE=table6_ablations
source "$(dirname "$0")/../common.sh"
if [[ $MODEL == smollm2_135m ]]; then
  PRUNERS=${PRUNERS:-wanda}; SPARSITIES=${SPARSITIES:-nm2_4}; EVAL=()
else
  PRUNERS=${PRUNERS:-wanda,sparsegpt}; SPARSITIES=${SPARSITIES:-nm2_4,unstructured50}; EVAL=("${ZERO_SHOT[@]}")
fi
if [[ -n ${SEEDS:-} ]]; then EVAL+=("seed=$SEEDS"); fi
BASE=("pruner=$PRUNERS" "sparsity=$SPARSITIES" "${EVAL[@]}")
sweep pruned "${BASE[@]}" adapter=none
sweep rank "${BASE[@]}" adapter=spp adapter.r=4,8,16
sweep no_beta "${BASE[@]}" adapter=spp adapter.use_beta=false adapter.alpha_init=zeros
sweep init "${BASE[@]}" adapter=spp adapter.beta_init=kaiming adapter.alpha_init=kaiming,zeros
sweep no_residual "${BASE[@]}" adapter=spp adapter.residual=false
collect table6
