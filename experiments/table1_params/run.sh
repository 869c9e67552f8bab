#!/usr/bin/env bash
# Table 1: SPP trainable parameters (r = 16) for the paper's LLaMA sizes and the embedded SmolLM2-135M
# (counted from the architecture, no weights). Use: bash experiments/table1_params/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=experiments/results/table1_params.md
TMP=$(mktemp "$OUT.XXXXXX")
{
  echo "# Table 1: SPP trainable parameters (r = ${R:-16})"
  echo
  echo "Command: \`bash experiments/table1_params/run.sh\` (= \`python -m lab.table1_params --r ${R:-16}\`)"
  echo
  python -m lab.table1_params --r "${R:-16}" --models llama7b llama13b llama30b llama65b llama2_7b llama2_13b llama2_70b \
    smollm2_135m
} > "$TMP"
mv "$TMP" "$OUT"
cat "$OUT"
