#!/usr/bin/env bash
# Block-wise reconstruction on SmolLM2-135M (CPU): what recovers the pruned model per CPU-minute, resumable as the
# earlier campaigns: every job is one train.py / eval.py run in its own directory, skipped when its summary.json
# (results.json) exists. Each stream runs one job at a time on one thread (OMP_NUM_THREADS=1).
#
# Every job has the recovery study's evaluation protocol (WikiText-2 test and validation perplexity, 40 systematic windows
# of 512 tokens) and pruning (32 C4 windows of 512 tokens); reconstruction trains on its own 32 C4 windows of 512
# tokens (reconstruct.seed 0). Learning rates and epochs are chosen on the validation perplexity only; a grid whose
# chosen point is an endpoint is extended by the next half-decade point on that side.
#
#   bash experiments/reconstruction/run.sh REF nm2_4            # dense + pruned reference perplexities (eval.py)
#   bash experiments/reconstruction/run.sh seq "grid spp nm2_4 3" "grid masked_full nm2_4 3"
#   bash experiments/reconstruction/run.sh seq "epochs spp nm2_4"   # epochs 1..: at the form's chosen rate
#   bash experiments/reconstruction/run.sh seq "e2e nm2_4"          # SPP end to end alone (the reference curve)
#   bash experiments/reconstruction/run.sh seq "then_e2e spp nm2_4" # the chosen reconstruction (rate and epochs), then SPP
#   bash experiments/reconstruction/run.sh seq "seeds spp nm2_4"    # seeds 1, 2 of the chosen reconstruction (rate, epochs)
#   bash experiments/reconstruction/run.sh seq "seeds spp nm2_4 2"  # seed 2 only (one stream per seed)
#   bash experiments/reconstruction/run.sh seq "check spp unstructured50" # references + Wanda 2:4's choice there
#   bash experiments/reconstruction/run.sh seq "check masked_full unstructured50 3" # ... with 3 epochs at its rate
#   DRY=1 ... prints the jobs; STOP_AT=HH:MM starts no job that would end after it (JOB_MINUTES, default 20)
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${R:-experiments/results/runs/reconstruction}
C="model=smollm2_135m calibration.nsamples=32 data.max_examples=540 data.val_size=40 data.train_batch_size=8
   trainer.max_epochs=1 trainer.val_check_interval=0.25 eval.seqlen=512 eval.max_windows=40
   eval.window_sampling=systematic eval.doc_seed=0 eval.extra_ppl_sources=[wikitext2_val] logger=[csv]
   export.merged=false guards.enabled=false sample.enabled=false"
W="reconstruct=blockwise reconstruct.nsamples=32 reconstruct.seqlen=512"
E="model=smollm2_135m calibration=c4 calibration.nsamples=32 calibration.seqlen=512 eval.seqlen=512
   eval.max_windows=40 eval.window_sampling=systematic eval.doc_seed=0 eval.extra_ppl_sources=[wikitext2_val]
   eval.tasks=[] logger=[csv] print_config=false"
SPP_LR=0.02  # SPP's end-to-end rate chosen on validation at Wanda 2:4 (the recovery study's grid)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

pruner_of() { [[ $1 == *_sparsegpt ]] && echo sparsegpt || echo wanda; }
sparsity_of() { echo "${1%_sparsegpt}"; }

job() {  # job DIR SCRIPT OVERRIDES...: one run, skipped when done; status 1 when it failed or STOP_AT skipped it
  local dir=$1 script=$2; shift 2
  local done_file=summary.json; [[ $script == eval.py ]] && done_file=results.json
  if [[ -f $dir/$done_file ]]; then echo "[reconstruction] done already: $dir"; return 0; fi
  if [[ -n ${DRY:-} ]]; then echo "[reconstruction] would run: $script $dir $*"; return 0; fi
  if [[ -n ${STOP_AT:-} ]] && (( $(date +%s) + 60 * ${JOB_MINUTES:-20} > $(date -d "$STOP_AT" +%s) )); then
    echo "[reconstruction] not starting $dir: it would not end before STOP_AT=$STOP_AT"; return 1
  fi
  rm -rf "$dir" "$dir.failed.log"; mkdir -p "$(dirname "$dir")"
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  echo "[reconstruction] $(date -u +%FT%TZ) start $dir (load $load)"
  local where=run_dir  # every command writes its files, its log and .hydra/ there
  # shellcheck disable=SC2086
  if python "$script" "$@" "$where=$dir" > "$dir.running.log" 2>&1; then
    mv "$dir.running.log" "$dir/stdout.log"
    python -m lab.recovery machine "$dir" --load-start "$load" > /dev/null
    echo "[reconstruction] $(date -u +%FT%TZ) done  $dir"
  else
    mv "$dir.running.log" "$dir.failed.log"
    echo "[reconstruction] $(date -u +%FT%TZ) FAILED $dir (see $dir.failed.log)"; return 1
  fi
}

rates() {  # rates FORM: the base learning-rate grid of a reconstruction form (half-decade steps)
  case $1 in
    spp) echo "0.03 0.1 0.3" ;; masked_full) echo "3e-05 0.0001 0.0003" ;; norms) echo "0.0003 0.001 0.003" ;;
    *) echo "0.001 0.01 0.1" ;;
  esac
}

recon() {  # recon DIR SETTING FORM LR EPOCHS SEED [OVERRIDES...]: reconstruction alone (nothing trains after it)
  local dir=$1 st=$2 f=$3 lr=$4 e=$5 s=$6; shift 6
  # shellcheck disable=SC2086
  job "$dir" train.py $C $W pruner="$(pruner_of "$st")" sparsity="$(sparsity_of "$st")" adapter=none \
    reconstruct.form="$f" reconstruct.lr="$lr" reconstruct.epochs="$e" reconstruct.seed="$s" seed="$s" "$@"
}

grid() {  # grid FORM SETTING EPOCHS: the form's rate grid, extended until the chosen rate is interior
  local f=$1 st=$2 e=$3 lr complete=1 g="$R/grid/$2/$1/e$3"
  for lr in $(rates "$f"); do recon "$g/lr$lr" "$st" "$f" "$lr" "$e" 0 || complete=0; done
  [[ -n ${DRY:-} ]] && return 0
  (( complete )) || return 0
  local next
  while next=$(python -m lab.reconstruction extend "$g") && [[ -n $next ]]; do
    recon "$g/lr$next" "$st" "$f" "$next" "$e" 0 || return 0
  done
}

chosen_lr() { python -m lab.reconstruction chosen "$R/grid/$2/$1/e$3"; }
pick() {  # pick FORM SETTING: "LR EPOCHS" of the chosen reconstruction (over the rate and epochs grids)
  python -m lab.reconstruction pick "$R" --form "$1" --setting "$2"
}

epochs() {  # epochs FORM SETTING: epochs 1, 2, 3 (the grid's) and 5 at the rate chosen with 3, doubled until interior
  local f=$1 st=$2 lr e top=5 best; lr=$(chosen_lr "$f" "$st" 3) || return 1
  for e in 1 2 5; do recon "$R/epochs/$st/$f/lr$lr/e$e" "$st" "$f" "$lr" "$e" 0 || return 0; done
  [[ -n ${DRY:-} ]] && return 0
  while [[ -f $R/epochs/$st/$f/lr$lr/e$((2 * top))/summary.json ]]; do top=$((2 * top)); done  # resumed
  while read -r _ best < <(pick "$f" "$st") && [[ $best == "$top" ]]; do
    top=$((2 * top)); recon "$R/epochs/$st/$f/lr$lr/e$top" "$st" "$f" "$lr" "$top" 0 || return 0
  done
}

e2e() {  # e2e SETTING: SPP end to end alone, two epochs, the validation perplexity every 16 steps (the reference)
  local st=$1
  # shellcheck disable=SC2086
  job "$R/e2e/$st/spp" train.py $C pruner="$(pruner_of "$st")" sparsity="$(sparsity_of "$st")" adapter=spp \
    trainer.lr=$SPP_LR trainer.max_epochs=2 trainer.curve_every_n_steps=16
}

then_e2e() {  # then_e2e FORM SETTING: the chosen reconstruction, then SPP end to end as e2e
  local f=$1 st=$2 lr e; read -r lr e < <(pick "$f" "$st") && [[ -n $e ]] || return 1
  # shellcheck disable=SC2086
  job "$R/then_e2e/$st/$f/lr$lr/e$e" train.py $C $W pruner="$(pruner_of "$st")" sparsity="$(sparsity_of "$st")" \
    adapter=spp trainer.lr=$SPP_LR trainer.max_epochs=2 trainer.curve_every_n_steps=16 \
    reconstruct.form="$f" reconstruct.lr="$lr" reconstruct.epochs="$e"
}

seeds() {  # seeds FORM SETTING [SEEDS]: seeds 1 and 2 (or SEEDS, e.g. "2") of the chosen reconstruction (seed 0 is
  # the grid point); two streams can take one seed each
  local f=$1 st=$2 lr e s; read -r lr e < <(pick "$f" "$st") && [[ -n $e ]] || return 1
  for s in ${3:-1 2}; do recon "$R/seeds/$st/$f/lr$lr/e$e/s$s" "$st" "$f" "$lr" "$e" "$s"; done
}

check() {  # check FORM SETTING [EPOCHS]: the shorter check at another setting: its references, then the form at
  # Wanda 2:4's chosen rate and epochs (or EPOCHS at that rate: the recipe that fits the goal's 15 CPU-min)
  local f=$1 st=$2 lr e; reference "$st"
  read -r lr e < <(pick "$f" nm2_4) && [[ -n $e ]] || return 1
  e=${3:-$e}
  recon "$R/check/$st/$f/lr$lr/e$e" "$st" "$f" "$lr" "$e" 0
}

reference() {  # reference SETTING: the dense (with nm2_4) and pruned models' perplexities
  local st=$1
  # shellcheck disable=SC2086
  [[ $st == nm2_4 ]] && job "$R/reference/dense" eval.py $E label=dense
  # shellcheck disable=SC2086
  job "$R/reference/$st" eval.py $E pruner="$(pruner_of "$st")" sparsity="$(sparsity_of "$st")" label="pruned_$st"
}

chunk=${1:?usage: run.sh REF SETTING | seq STEP...}; shift
case $chunk in
  REF) reference "${1:?setting}" ;;
  seq) for step in "$@"; do eval "$step"; done ;;
  *) echo "run.sh: unknown chunk '$chunk'; use REF or seq" >&2; exit 2 ;;
esac
