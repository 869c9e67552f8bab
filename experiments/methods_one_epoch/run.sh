#!/usr/bin/env bash
# The one-epoch methods study on SmolLM2-135M (CPU), resumable: every job is a single `train.py` run in its own directory
# and is skipped when its summary.json exists, so a chunk stopped half-way re-runs only the missing jobs.
# Two streams of one thread each run side by side (the same load for every method's step time).
#   bash experiments/methods_one_epoch/run.sh A      # learning-rate grid on the validation loss (Wanda 2:4), 16 jobs
#   bash experiments/methods_one_epoch/run.sh B1     # headline 2:4, seed 0, at the chunk-A learning rates, 6 jobs
#   bash experiments/methods_one_epoch/run.sh B2     # seeds 1 and 2, 8 jobs (perplexity only)
#   bash experiments/methods_one_epoch/run.sh C      # unstructured 50 % / 75 % and the prompt-masked SPP run, 11 jobs
#   bash experiments/methods_one_epoch/run.sh D      # SparseGPT 2:4: the four methods, seed 0, 4 jobs
#   bash experiments/methods_one_epoch/run.sh AB1    # A then B1 in each stream (B1's job of a method waits for nothing:
#                                             # its stream ran that method's grid first)
#   bash experiments/methods_one_epoch/run.sh seq "grid lora" "headline lora 0 nm2_4"   # one stream, steps in this order
# Chunk A's learning rate per method: python -m lab.lr_select $R/lr_select/<method>
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${R:-experiments/results/runs/methods_one_epoch}
GRID=${GRID:-"1e-4 1e-3 1e-2 1e-1"}   # the same four learning rates for every method (one per decade)
C="model=smollm2_135m pruner=wanda calibration.nsamples=32 data.max_examples=540 data.val_size=40
   data.train_batch_size=8 trainer.max_epochs=1 trainer.val_check_interval=0.25 eval.seqlen=512 eval.max_windows=40
   eval.window_sampling=systematic eval.doc_seed=0 logger=[csv] export.merged=false"
# Zero-shot at lm-eval batch 8 (from B1's LoRA* job on): 1.24x faster than batch 1 at one thread, the same accuracies
# (python eval.py model=smollm2_135m eval.ppl=false eval.tasks=[spp_zeroshot] eval.limit=30, batch 1 vs 8: 129 s vs
# 104 s of loglikelihood requests, identical results.md); B1's SPP and SparsePEFT jobs ran at batch 1.
Z="eval.tasks=[spp_zeroshot] eval.limit=200 eval.lm_eval_batch_size=8"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

job() {  # job DIR OVERRIDES...: one train.py run, skipped when DIR/summary.json exists; a failure is logged, not
        # fatal: its output stays in DIR.failed.log (DIR.running.log while it runs)
  local dir=$1; shift
  if [[ -f $dir/summary.json ]]; then echo "[methods_one_epoch] done already: $dir"; return 0; fi
  rm -rf "$dir" "$dir.failed.log"; mkdir -p "$(dirname "$dir")"
  echo "[methods_one_epoch] $(date -u +%FT%TZ) start $dir (load $(cut -d' ' -f1 /proc/loadavg))"
  # shellcheck disable=SC2086
  if python train.py $C "$@" hydra.run.dir="$dir" > "$dir.running.log" 2>&1; then
    mv "$dir.running.log" "$dir/stdout.log"
    echo "[methods_one_epoch] $(date -u +%FT%TZ) done  $dir"
  else
    mv "$dir.running.log" "$dir.failed.log"
    echo "[methods_one_epoch] $(date -u +%FT%TZ) FAILED $dir (see $dir.failed.log)"
  fi
}

grid() {  # grid METHOD: chunk A for one method, 300 records (270 train, 30 validation), no test-split evaluation
  local m=$1 lr
  for lr in $GRID; do
    job "$R/lr_select/$m/lr$lr" sparsity=nm2_4 adapter="$m" trainer.lr="$lr" data.max_examples=300 \
      eval.ppl=false eval.tasks=[] guards.enabled=false sample.enabled=false
  done
}

best_lr() { python -m lab.lr_select "$R/lr_select/$1" --print-lr; }

headline() {  # headline METHOD SEED SPARSITY [OVERRIDES...]: one method at its chunk-A learning rate; the seed varies
              # initialisation, data order and the train/validation split
  local m=$1 s=$2 sp=$3; shift 3
  job "$R/$sp/${m}_s$s" sparsity="$sp" adapter="$m" trainer.lr="$(best_lr "$m")" seed="$s" data.seed="$s" $Z "$@"
}

pruned() { job "$R/$2/none_$1" sparsity="$2" pruner="$1" adapter=none $Z; }

stream1_A() { grid spp; grid lora; }
stream2_A() { grid sparse_lora; grid masked_full; }
stream1_B1() { headline spp 0 nm2_4; headline lora 0 nm2_4; pruned sparsegpt nm2_4; }
stream2_B1() { headline sparse_lora 0 nm2_4; headline masked_full 0 nm2_4; pruned wanda nm2_4; }
# Seeds 1 and 2 measure perplexity only: 7 zero-shot tasks × 200 documents take 14 min per job at one thread
# (measured in B1), close to the training's 18; the zero-shot columns come from seed 0.
stream1_B2() { for s in 1 2; do headline spp $s nm2_4 eval.tasks=[]; headline lora $s nm2_4 eval.tasks=[]; done; }
stream2_B2() {
  for s in 1 2; do headline sparse_lora $s nm2_4 eval.tasks=[]; headline masked_full $s nm2_4 eval.tasks=[]; done
}
stream1_C() {  # ≈ 170 min of one stream (4 jobs of ≈ 36 min, then ≈ 25 min); stream 2 ≈ 175 min
  for sp in unstructured50 unstructured75; do headline spp 0 $sp; headline lora 0 $sp; done
  prompt_masked
}
# SPP 2:4, seed 0, with the prompt masked out of the loss (`data.train_on_inputs=false`: the loss covers the response
# only). Perplexity only: the zero-shot differences between the 2:4 methods are all inside ±3.4 points (chunk B1),
# and its 11 minutes did not fit beside the rest of chunk C in one session.
prompt_masked() {
  job "$R/nm2_4/spp_s0_prompt_masked" sparsity=nm2_4 adapter=spp trainer.lr="$(best_lr spp)" seed=0 data.seed=0 \
    data.train_on_inputs=false
}
stream2_C() {
  for sp in unstructured50 unstructured75; do headline sparse_lora 0 $sp; headline masked_full 0 $sp; done
  pruned wanda unstructured50
  pruned wanda unstructured75
}

# SparseGPT 2:4 (the one-epoch study: "Wanda; SparseGPT at 2:4"): every method at its chunk-A rate, seed 0, with zero-shot;
# ≈ 66 min per stream. The pruned SparseGPT row is B1's.
sparsegpt() {
  job "$R/nm2_4_sparsegpt/$1_s0" sparsity=nm2_4 pruner=sparsegpt adapter="$1" trainer.lr="$(best_lr "$1")" seed=0 \
    data.seed=0 $Z
}
stream1_D() { sparsegpt spp; sparsegpt lora; }
stream2_D() { sparsegpt sparse_lora; sparsegpt masked_full; }

chunk=${1:?usage: run.sh A|B1|B2|C|D|AB1}
case $chunk in
  AB1) (stream1_A; stream1_B1) & (stream2_A; stream2_B1) & ;;
  A|B1|B2|C|D) "stream1_$chunk" & "stream2_$chunk" & ;;
  seq) shift; for step in "$@"; do $step; done ;;   # word-split on purpose: "function arg ..."
  *) echo "run.sh: unknown chunk '$chunk'; use A, B1, B2, C, D, AB1 or seq" >&2; exit 2 ;;
esac
wait
echo "[methods_one_epoch] chunk $chunk finished $(date -u +%FT%TZ)"
