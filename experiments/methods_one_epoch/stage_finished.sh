#!/usr/bin/env bash
# Stage (git add) the raw files of every FINISHED campaign job (a directory holding summary.json), never a job
# still running. Use: bash experiments/methods_one_epoch/stage_finished.sh && git commit -m "..."
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${R:-experiments/results/runs/methods_one_epoch}
find "$R" -name summary.json -printf '%h\n' | sort | while read -r d; do git add -- "$d"; done
git diff --cached --stat -- "$R" | tail -1
