#!/usr/bin/env bash
# The recovery study on SmolLM2-135M (CPU), resumable as the one-epoch study's was: every job is one `train.py` (or `eval.py`)
# run in its own directory, skipped when its summary.json exists, so a chunk stopped half-way re-runs only the missing
# jobs. Two streams of one thread each run side by side (every method's step time under the same load).
#
# Every training job has the headline settings (the one-epoch study's: 540 Alpaca records = 500 train (63 steps of 8) + 40
# validation, one epoch, validation 4x per epoch, seed 0 / data seed 0 unless the seed chunk says otherwise) and
# measures the merged model's WikiText-2 *test* and *validation* perplexity (40 systematic windows of 512 tokens
# each). Learning rates are chosen on the validation perplexity only (lr_select --objective ppl_val_merged), so a
# grid point at the chosen rate IS the headline seed-0 run: nothing is re-trained after selection.
#
#   bash experiments/recovery/run.sh G nm2_4                # grids of all six methods at Wanda 2:4
#   bash experiments/recovery/run.sh G unstructured50       # grids of SPP, LoRA*, SparsePEFT, masked full FT
#   bash experiments/recovery/run.sh G unstructured75 | G nm2_4_sparsegpt
#   bash experiments/recovery/run.sh S nm2_4                # seeds 1, 2 at the chosen rates: every method at
#                                                             # nm2_4, SPP + its closest competitor elsewhere
#   bash experiments/recovery/run.sh D                      # objective=distill: SPP + closest competitor, seeds 0-2
#   bash experiments/recovery/run.sh REC                    # recovery curves at nm2_4 (2 epochs, a point / 16 steps)
#   bash experiments/recovery/run.sh seq "recovery_check spp"  # SPP's recovery run again (speed of a second machine)
#   bash experiments/recovery/run.sh seq "fresh spp"        # SPP for as many steps on records it sees once
#   bash experiments/recovery/run.sh seq "seeds spp nm2_4 3 4"  # seeds 3, 4 at the chosen rate
#   bash experiments/recovery/run.sh seq "rate_seeds spp unstructured75 2e-2"  # seeds 1, 2 at a runner-up rate
#   bash experiments/recovery/run.sh seq "grid spp nm2_4" "grid lora nm2_4"   # one stream, steps in this order
#   bash experiments/recovery/run.sh Z nm2_4                # zero-shot + perplexities of dense, pruned and the chosen
#                                                             # seed-0 runs (eval.py on their adapters, shipped data)
#   DRY=1 bash experiments/recovery/run.sh G nm2_4          # print the jobs, run nothing
#   STOP_AT=23:40 bash experiments/recovery/run.sh G nm2_4  # start no job that would end after 23:40 (a job
#                                                             # is assumed to take JOB_MINUTES, default 45): a
#                                                             # session's end kills a running job, and it is lost
# A grid whose chosen rate is an endpoint is extended by the next half-decade point on that side (extend_grid).
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${R:-experiments/results/runs/recovery}
C="model=smollm2_135m calibration.nsamples=32 data.max_examples=540 data.val_size=40 data.train_batch_size=8
   trainer.max_epochs=1 trainer.val_check_interval=0.25 eval.seqlen=512 eval.max_windows=40
   eval.window_sampling=systematic eval.doc_seed=0 eval.extra_ppl_sources=[wikitext2_val] logger=[csv]
   export.merged=false guards.enabled=false sample.enabled=false"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# The half-decade grids of the learning-rate search live in lab/recovery/selection.py, which the report also
# reads: BASE_GRIDS at Wanda 2:4 (SPP on 1-2-5 steps, the rest on 1-3 steps); in another setting, once the method's
# Wanda 2:4 grid is settled (interior), the three points centred on its choice there (base_grid).

pruner_of() { [[ $1 == *_sparsegpt ]] && echo sparsegpt || echo wanda; }
sparsity_of() { echo "${1%_sparsegpt}"; }

# Zero-shot and reference perplexities (eval.py): the shipped 200-document samples (data_dir=data, what a fresh
# clone has), lm-eval's per-document records kept (eval.log_samples) so methods are compared document by document.
# The calibration must be train.py's (C4, 32 x 512 tokens: the model's budget, which eval.py does not apply) for the
# pruning cache to give the very model each run trained on.
E="model=smollm2_135m calibration=c4 calibration.nsamples=32 calibration.seqlen=512 eval.seqlen=512 eval.max_windows=40 eval.window_sampling=systematic
   eval.doc_seed=0 eval.extra_ppl_sources=[wikitext2_val] eval.tasks=[spp_zeroshot] eval.limit=200
   eval.lm_eval_batch_size=8 eval.log_samples=true data_dir=data logger=[csv] print_config=false"

job() {  # job DIR SCRIPT OVERRIDES...: one run, skipped when DIR/summary.json exists; a failure is logged, not fatal
  # Status 0 when DIR holds its results (done already or just finished; always under DRY), 1 when STOP_AT skipped
  # the job or it failed: a caller that needs the result (grid's extension) stops there.
  local dir=$1 script=$2; shift 2
  local done_file=summary.json; [[ $script == eval.py ]] && done_file=results.json
  if [[ -f $dir/$done_file ]]; then echo "[recovery] done already: $dir"; return 0; fi
  if [[ -n ${DRY:-} ]]; then echo "[recovery] would run: $script $dir $*"; return 0; fi
  if [[ -n ${STOP_AT:-} ]] && (( $(date +%s) + 60 * ${JOB_MINUTES:-45} > $(date -d "$STOP_AT" +%s) )); then
    echo "[recovery] not starting $dir: it would not end before STOP_AT=$STOP_AT (JOB_MINUTES=${JOB_MINUTES:-45})"
    return 1
  fi
  rm -rf "$dir" "$dir.failed.log"; mkdir -p "$(dirname "$dir")"
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  echo "[recovery] $(date -u +%FT%TZ) start $dir (load $load)"
  local where=run_dir  # every command writes its files, its log and .hydra/ there
  # shellcheck disable=SC2086
  if python "$script" "$@" "$where=$dir" > "$dir.running.log" 2>&1; then
    mv "$dir.running.log" "$dir/stdout.log"
    python -m lab.recovery machine "$dir" --load-start "$load" > /dev/null
    echo "[recovery] $(date -u +%FT%TZ) done  $dir"
  else
    mv "$dir.running.log" "$dir.failed.log"
    echo "[recovery] $(date -u +%FT%TZ) FAILED $dir (see $dir.failed.log)"
    return 1
  fi
}

train() {  # train DIR SETTING METHOD LR SEED [OVERRIDES...]
  local dir=$1 st=$2 m=$3 lr=$4 s=$5; shift 5
  # shellcheck disable=SC2086
  job "$dir" train.py $C pruner="$(pruner_of "$st")" sparsity="$(sparsity_of "$st")" adapter="$m" trainer.lr="$lr" \
    seed="$s" data.seed="$s" "$@"
}

chosen_lr() { python -m lab.lr_select "$R/grid/$1/$2" --objective ppl_val_merged --print-lr; }

grid() {  # grid METHOD SETTING: the method's grid, then one more point past a chosen endpoint, until interior
  local m=$1 st=$2 lr
  local rates; rates=$(python -m lab.recovery grid-rates "$m" --setting "$st" --root "$R") || return 1
  local complete=1
  for lr in $rates; do train "$R/grid/$st/$m/lr$lr" "$st" "$m" "$lr" 0 || complete=0; done
  [[ -n ${DRY:-} ]] && return 0
  # extend only a complete base grid, and stop at a point that did not finish (STOP_AT skipped it, or it failed):
  # the extension would propose the same point again, forever
  (( complete )) || return 0
  local next
  while next=$(python -m lab.recovery extend "$R/grid/$st/$m") && [[ -n $next ]]; do
    train "$R/grid/$st/$m/lr$next" "$st" "$m" "$next" 0 || return 0
  done
}

seeds() {  # seeds METHOD SETTING [SEED...]: seeds 1 and 2 (or those given) at the method's chosen rate (seed 0 is
  # the grid point itself)
  local m=$1 st=$2 s lr; shift 2
  lr=$(chosen_lr "$st" "$m") || return 1
  for s in ${*:-1 2}; do train "$R/seeds/$st/$m/s$s" "$st" "$m" "$lr" "$s"; done
}

rate_seeds() {  # rate_seeds METHOD SETTING LR [SEED...]: seeds 1 and 2 (or those given) at a rate that is not the
  # seed-0 choice (its runner-up), so the rate can be chosen on the mean over seeds (lab/recovery/choices.py)
  local m=$1 st=$2 lr=$3 s; shift 3
  for s in ${*:-1 2}; do train "$R/seeds/$st/$m/lr$lr/s$s" "$st" "$m" "$lr" "$s"; done
}

evaluate() {  # evaluate DIR OVERRIDES...: one eval.py job
  local dir=$1; shift
  # shellcheck disable=SC2086
  job "$dir" eval.py $E "$@"
}

reference() {  # reference SETTING: the pruned model (and, for nm2_4, the dense one), zero-shot + perplexities
  local st=$1
  [[ $st == nm2_4 ]] && evaluate "$R/reference/dense" label=dense
  evaluate "$R/reference/$st" pruner="$(pruner_of "$st")" sparsity="$(sparsity_of "$st")" label="pruned_$st"
}

zero_shot() {  # zero_shot METHOD SETTING: the chosen seed-0 grid run's adapter, merged as its export was
  local m=$1 st=$2
  [[ -f $R/zero_shot/$st/$m/results.json ]] && { echo "[recovery] done already: $R/zero_shot/$st/$m"; return 0; }
  if [[ $m == masked_full ]]; then zero_shot_export "$m" "$st"; return; fi
  adapter_of "$m" "$st" || return 1
  evaluate "$R/zero_shot/$st/$m" pruner="$(pruner_of "$st")" sparsity="$(sparsity_of "$st")" \
    adapter_dir="$ADAPTER" label="${m}_$st"
}

# Adapters, checkpoints and exports stay out of git (experiments/results/.gitignore): a later session's checkout holds
# the chosen run's records but not its adapter. The chosen grid point is then trained again, with the same settings
# and seed, into rerun/SETTING/METHOD (its summary.json is committed; the report's zero-shot table shows whether its
# test perplexity equals the grid run's: it does on the same CPU, to ~1e-5 across AVX2 / AVX-512).
adapter_of() {  # adapter_of METHOD SETTING: set ADAPTER to the chosen run's adapter folder, re-training the run if needed
  local m=$1 st=$2 run lr
  run=$(python -m lab.recovery chosen-dir "$R" "$st" "$m") || return 1
  if [[ -f $run/adapter/adapter_method.json ]]; then ADAPTER=$run/adapter; return 0; fi
  lr=$(chosen_lr "$st" "$m") || return 1
  train "$R/rerun/$st/$m" "$st" "$m" "$lr" 0 || return 1
  if [[ -z ${DRY:-} && ! -f $R/rerun/$st/$m/adapter/adapter_method.json ]]; then
    echo "[recovery] $R/rerun/$st/$m has no adapter (finished in another checkout): remove it to train it again" >&2
    return 1
  fi
  ADAPTER=$R/rerun/$st/$m/adapter
}

# Masked full FT's trained weights are the model itself, not adapter tensors for eval.py to put on the pruned model,
# and the grid runs do not export (export.merged=false). Its chosen run is resumed from its last checkpoint with
# export.merged=true into export/SETTING/METHOD (training is finished: nothing trains, the run exports and measures
# its perplexities, which must equal the grid run's), and eval.py scores that export as a saved folder. Where this
# checkout has no checkpoint (the run finished in another session), the export job trains the chosen run again.
zero_shot_export() {  # zero_shot_export METHOD SETTING
  local m=$1 st=$2 run lr ex="$R/export/$2/$1" resume=()
  run=$(python -m lab.recovery chosen-dir "$R" "$st" "$m") || return 1
  lr=$(chosen_lr "$st" "$m") || return 1
  [[ -f $run/checkpoints/last.ckpt ]] && resume=(trainer.resume_from="$run/checkpoints/last.ckpt")
  train "$ex" "$st" "$m" "$lr" 0 "${resume[@]}" export.merged=true
  [[ -n ${DRY:-} || -f $ex/merged/spp_export.json ]] || { echo "[recovery] no export in $ex: not scoring $m"; return 1; }
  evaluate "$R/zero_shot/$st/$m" model.path="$ex/merged" label="${m}_$st"
}

competitor() { python -m lab.recovery competitor "$R" "$1"; }

# objective=distill (the dense model as teacher) at the method's chosen cross-entropy rate, seeds 0-2
# (does distillation change the ranking?)
distill() {
  local m=$1 st=nm2_4 s lr
  lr=$(chosen_lr "$st" "$m") || return 1
  for s in 0 1 2; do train "$R/distill/$st/$m/s$s" "$st" "$m" "$lr" "$s" objective=distill; done
}

# Recovery per CPU-minute: one run of two epochs (126 steps) at the chosen rate, the merged model's
# validation perplexity every 16 optimizer steps (trainer.curve_every_n_steps) with the training CPU time.
recovery() {
  local m=$1 st=nm2_4 lr
  lr=$(chosen_lr "$st" "$m") || return 1
  train "$R/${RECOVERY_KIND:-recovery}/$st/$m" "$st" "$m" "$lr" 0 trainer.max_epochs=2 trainer.curve_every_n_steps=16
}

# Fresh records: every recovery curve falls in its second epoch, which repeats the first
# epoch's 500 records. The same method, rate and seed trained for as many steps on 1,000 records seen once each (one
# epoch of 125 steps; the merged model's validation perplexity every 32 steps) tells repetition from over-training.
fresh() {
  local m=$1 st=nm2_4 lr
  lr=$(chosen_lr "$st" "$m") || return 1
  train "$R/fresh/$st/$m" "$st" "$m" "$lr" 0 data.max_examples=1040 trainer.curve_every_n_steps=32
}

# The same recovery run trained again into recovery_check/ (on the machine that ran the later curves, when the curves
# came from two machines): its CPU time against the first run's is the machines' speed ratio, and the report pairs each
# method with the SPP curve measured on its own machine.
recovery_check() { RECOVERY_KIND=recovery_check recovery "$1"; }

best_new_baseline() {  # the new baseline (ScaleLoRA or norms only) with the lower validation PPL at nm2_4
  local a b; a=$(python -m lab.recovery val-ppl "$R" nm2_4 scale_lora) || return 1
  b=$(python -m lab.recovery val-ppl "$R" nm2_4 norms) || return 1
  python -c "import sys; print('scale_lora' if float(sys.argv[1]) <= float(sys.argv[2]) else 'norms')" "$a" "$b"
}

stream1_G_nm2_4() { grid spp nm2_4; grid masked_full nm2_4; grid norms nm2_4; }
stream2_G_nm2_4() { grid lora nm2_4; grid sparse_lora nm2_4; grid scale_lora nm2_4; }
stream1_G() { grid spp "$1"; grid masked_full "$1"; }
stream2_G() { grid lora "$1"; grid sparse_lora "$1"; }

# Zero-shot: every method at Wanda 2:4; SPP and its closest competitor elsewhere (as the seeds)
stream1_Z() {
  reference "$1"; zero_shot spp "$1"
  [[ $1 == nm2_4 ]] && { zero_shot masked_full "$1"; zero_shot norms "$1"; }
}
stream2_Z() {
  if [[ $1 == nm2_4 ]]; then zero_shot lora "$1"; zero_shot sparse_lora "$1"; zero_shot scale_lora "$1"
  else local rival; rival=$(competitor "$1") && zero_shot "$rival" "$1"; fi
}

stream1_S() {
  if [[ $1 == nm2_4 ]]; then seeds spp nm2_4; seeds masked_full nm2_4; seeds norms nm2_4
  else seeds spp "$1"; fi
}
stream2_S() {
  if [[ $1 == nm2_4 ]]; then seeds lora nm2_4; seeds sparse_lora nm2_4; seeds scale_lora nm2_4
  else local rival; rival=$(competitor "$1") && seeds "$rival" "$1"; fi
}

chunk=${1:?usage: run.sh G SETTING | Z SETTING | S SETTING | D | REC | seq STEP...}
case $chunk in
  G)
    st=${2:?G needs a setting: nm2_4, unstructured50, unstructured75 or nm2_4_sparsegpt}
    if [[ $st == nm2_4 ]]; then stream1_G_nm2_4 & stream2_G_nm2_4 &
    else stream1_G "$st" & stream2_G "$st" &
    fi ;;
  Z) stream1_Z "${2:?Z needs a setting}" & stream2_Z "$2" & ;;
  S) stream1_S "${2:?S needs a setting}" & stream2_S "$2" & ;;
  D) distill spp & (rival=$(competitor nm2_4) && distill "$rival") & ;;
  REC) (recovery spp; recovery lora; recovery masked_full) &
       (recovery sparse_lora; base=$(best_new_baseline) && recovery "$base") & ;;
  seq) shift; for step in "$@"; do $step; done ;;   # word-split on purpose: "function arg ..."
  *) echo "run.sh: unknown chunk '$chunk'; use G, Z, S, D, REC or seq" >&2; exit 2 ;;
esac
wait
echo "[recovery] chunk $chunk finished $(date -u +%FT%TZ)"
