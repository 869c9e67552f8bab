#!/usr/bin/env bash
# Stage (git add) the raw files of every FINISHED recovery-study job (a directory holding summary.json or results.json),
# never a job still running, after writing the machine's absolute paths in them relative (checkout -> relative,
# the shared data root -> ../shared/data, the cache -> $SPP_CACHE_DIR). Large outputs stay out of git
# (experiments/results/.gitignore). Use: bash experiments/recovery/stage_finished.sh && git commit -m "..."
# A grid point whose training loss blew up (the grids run with the guards off) must be added to BLOWN_UP in
# tests/test_guards.py, which replays every committed loss history through the guard.
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${R:-experiments/results/runs/recovery}
# a job finished by a runner that predates machine.json gets one now (same machine; load at start unknown)
find "$R" \( -name summary.json -o -name results.json \) -printf '%h\n' | sort | while read -r d; do
  [[ -f $d/machine.json ]] || python -m lab.recovery machine "$d" \
    --note "written when staged, on the machine that ran the job" > /dev/null
done
python -m lab.recovery relativize "$R" > /dev/null
find "$R" \( -name summary.json -o -name results.json \) -printf '%h\n' | sort | while read -r d; do
  git add -- "$d"
done
git diff --cached --stat -- "$R" | tail -1
