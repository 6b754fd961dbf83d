#!/usr/bin/env bash
# DFT in its own regime, in miniature: a small model is pretrained on a broad arithmetic
# corpus, then fine-tuned on a narrow task by SFT, DFT and ASFT at two learning rates over
# several seeds, and evaluated on that task and off it (another operation, longer numbers,
# the basics).
#
#   bash examples/dft-miniature/run.sh          # output in ./dft-miniature-out
#
# 1. pt-data synth       the broad corpus (2- and 4-digit sums and differences, 3-digit
#                        differences), the narrow task (3-digit sums), held-out tests
# 2. pt-data build | pt-train run: pretraining from random weights on the broad corpus
# 3. pt-train run        SFT, DFT and ASFT from the pretrained model on the narrow task,
#                        once per learning rate and seed, two runs side by side
# 4. pt-rollout generate | pt-eval grade: the pretrained model and every snapshot of every
#                        run on the four test sets; the table and the curves (PNG)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/examples/dft-miniature"
OUT=${PT_DFT_OUT:-$PWD/dft-miniature-out}
PRETRAIN_STEPS=${PT_DFT_PRETRAIN_STEPS:-600}
STEPS=${PT_DFT_STEPS:-80}                  # fine-tuning steps; snapshots at 1/8, 1/4, 1/2, 1
SEEDS=${PT_DFT_SEEDS:-0 1 2}
LRS=${PT_DFT_LRS:-1e-4 3e-4}              # peak learning rates of the fine-tuning
TEST=${PT_DFT_TEST:-200}                   # held-out problems per test set
SAMPLES=${PT_DFT_SAMPLES:-2}               # samples per problem
METHODS="sft dft asft"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} TOKENIZERS_PARALLELISM=false
export PATH="$HOME/.local/bin:$PATH"

step() { printf '\n\033[1m== %s\033[0m  (%ds)\n' "$*" $(( $(date +%s) - started )) >&2; }
started=$(date +%s)
for n in "$PRETRAIN_STEPS" "$STEPS" "$TEST" "$SAMPLES"; do
    case $n in ''|*[!0-9]*|0) echo "error: PT_DFT_PRETRAIN_STEPS, PT_DFT_STEPS, PT_DFT_TEST and PT_DFT_SAMPLES take a whole number above 0, not '$n'" >&2; exit 2 ;; esac
done
if [ $((STEPS % 8)) -ne 0 ]; then
    echo "error: PT_DFT_STEPS=$STEPS: the curves take snapshots at 1/8, 1/4, 1/2 and the end of a run; use a multiple of 8" >&2
    exit 2
fi

if [ -z "${PT_NO_SYNC:-}" ]; then  # PT_NO_SYNC=1: the pt already on PATH, as it is
    step "install (uv sync)"
    command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
    (cd "$REPO" && uv sync --all-packages --locked --quiet --compile-bytecode)
    export PATH="$REPO/.venv/bin:$PATH"
fi

rm -rf "$OUT" && mkdir -p "$OUT/logs" "$OUT/grades" "$OUT/rollouts" && cd "$OUT"
path_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "$1"; }

step "1. pt-data synth (broad corpus, narrow task, test sets), pt-data tokenizer"
pt-data synth arithmetic --digits 2 --n 6000 --n-test "$TEST" --seed 1 --out synth/broad-2 > /dev/null
pt-data synth arithmetic --digits 3 --ops - --n 3000 --n-test "$TEST" --seed 2 --out synth/sub-3 > /dev/null
pt-data synth arithmetic --digits 4 --n 6000 --n-test "$TEST" --seed 3 --out synth/broad-4 > /dev/null
pt-data synth arithmetic --digits 3 --ops + --n 4000 --n-test "$TEST" --seed 4 --out synth/narrow > /dev/null
pt-data tokenizer --out tokenizer \
    --texts synth/broad-2/train.jsonl --texts synth/sub-3/train.jsonl \
    --texts synth/broad-4/train.jsonl --texts synth/narrow/train.jsonl > /dev/null
pt-data build "$HERE/test-prompts.yaml" > /dev/null
pt-data build "$HERE/narrow.yaml" > /dev/null

step "2. pt-data build | pt-train run (pretraining on the broad corpus, $PRETRAIN_STEPS steps)"
pt-data build "$HERE/broad.yaml" | pt-train run "$HERE/pretrain.yaml" --data - \
    training.max_steps="$PRETRAIN_STEPS" > manifest-pretrain.json
pretrained=$(path_of manifest-pretrain.json)

lanes() {  # NAME JOB...: the jobs dealt in turn to two lanes that run side by side, one
    local name=$1 lane=("" "") pids=() i=0 job  # thread each; if one fails, stop both, fail
    shift
    for job in "$@"; do lane[i % 2]+="$job;"; i=$((i + 1)); done
    for i in 0 1; do
        OMP_NUM_THREADS=1 bash -c "set -euo pipefail; ${lane[$i]}" 2> "logs/$name-$((i + 1)).log" &
        pids+=($!)
    done
    for i in 0 1; do
        if ! wait "${pids[$i]}"; then
            kill "${pids[@]}" 2> /dev/null || true
            echo "error: a lane failed; its log: $OUT/logs/$name-$((i + 1)).log" >&2
            exit 1
        fi
    done
}
export HERE pretrained STEPS SAMPLES
finetune() {  # METHOD LR SEED
    pt-train run "$HERE/finetune.yaml" run_name="$1-lr$2-s$3" objective.name="$1" \
        training.learning_rate="$2" training.seed="$3" training.max_steps="$STEPS" \
        training.inference_steps=$((STEPS / 8)) model.name_or_path="$pretrained" \
        --data data/narrow > "manifest-$1-lr$2-s$3.json"
}
evaluate() {  # NAME MODEL: the four test sets, SAMPLES samples a problem, graded
    pt-rollout generate --model "$2" --prompts data/test-prompts --engine hf \
        --n "$SAMPLES" --temperature 0.6 --max-tokens 96 --seed 0 --out "rollouts/$1.jsonl" \
        | pt-eval grade - --out "grades/$1.jsonl" > /dev/null
}
export -f finetune evaluate

runs=() jobs=()
for lr in $LRS; do for seed in $SEEDS; do for method in $METHODS; do
    runs+=("$method-lr$lr-s$seed"); jobs+=("finetune $method $lr $seed")
done; done; done
step "3. pt-train run (SFT, DFT, ASFT on the narrow task; learning rates: $LRS; seeds: $SEEDS)   [progress: logs/]"
lanes finetune "${jobs[@]}"

step "4. pt-rollout generate | pt-eval grade (the pretrained model, every snapshot)   [progress: logs/]"
jobs=("evaluate start-0 $pretrained")
for r in "${runs[@]}"; do
    for k in 1 2 4 8; do jobs+=("evaluate $r-$((STEPS * k / 8)) runs/$r/inference/step-$((STEPS * k / 8))"); done
done
lanes evaluate "${jobs[@]}"

step "report"
python3 "$HERE/report.py" "$OUT" --steps "$STEPS" --seeds "$SEEDS" --lrs "$LRS" \
    --seconds $(( $(date +%s) - started ))
