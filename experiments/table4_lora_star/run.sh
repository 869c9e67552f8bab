#!/usr/bin/env bash
# Table 4: LoRA* (peft LoRA r=8, alpha 16, merged then re-masked with the Wanda masks) vs SPP at 75 % sparsity.
# Use: MODEL=llama7b EXTRA="model.path=/data/llama-7b" bash experiments/table4_lora_star/run.sh
#      nice -n 10 bash experiments/table4_lora_star/run.sh    (SmolLM2-135M, CPU budget)
TABLE=table4_lora_star
source "$(dirname "$0")/../common.sh"
sweep lora_vs_spp pruner=wanda sparsity=unstructured75,nm2_8 adapter=lora,spp "${ZERO_SHOT[@]}"
if [[ $MODEL == smollm2_135m ]]; then
  # 12 steps make the result lr-bound: each method also runs at two more learning rates around the budget's
  # 2e-2 (LoRA diverges at 2e-2), so the table compares them each at their best of three.
  sweep lora_lr pruner=wanda sparsity=unstructured75,nm2_8 adapter=lora "trainer.lr=${LORA_LRS:-2e-3,5e-3}" \
    "${ZERO_SHOT[@]}"
  sweep spp_lr pruner=wanda sparsity=unstructured75,nm2_8 adapter=spp "trainer.lr=${SPP_LRS:-5e-2,1e-2}" \
    "${ZERO_SHOT[@]}"
fi
collect table4
