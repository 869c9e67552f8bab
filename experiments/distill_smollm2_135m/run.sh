#!/usr/bin/env bash
# objective=distill against objective=ce for SPP on the README main job (SmolLM2-135M, Wanda 2:4, r=16, the CPU
# budget, seed 0, WikiText-2 test on 40 systematic windows); one pruning cache for both. Writes the two summaries
# into experiments/results/distill_smollm2_135m/ with the machine's paths made relative (repository, run folder).
# Use: bash experiments/distill_smollm2_135m/run.sh [RUNS=/tmp/distill_runs]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/tmp/distill_runs}
OUT=experiments/results/distill_smollm2_135m
for obj in ce distill; do
  python train.py objective=$obj run_dir="$RUNS/$obj"
  python - "$RUNS/$obj/summary.json" "$OUT/${obj}_summary.json" "$RUNS/$obj" "$PWD" <<'PY'
import json, os, sys
src, dst, run, repo = sys.argv[1:]
text = open(src).read().replace(run, os.path.basename(run)).replace(repo + "/", "")
text = text.replace(os.path.expanduser("~"), "~")
tmp = dst + ".tmp"
with open(tmp, "w") as fh:
    fh.write(json.dumps(json.loads(text), indent=1) + "\n")
os.replace(tmp, dst)
PY
done
