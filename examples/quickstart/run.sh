#!/usr/bin/env bash
# The offline quickstart: install pt, then run every method on the CPU from one start.
#
#   bash examples/quickstart/run.sh            # output in ./quickstart-out
#
# 1. pt-data synth     a synthetic arithmetic train/test set whose worked solutions forget
#                      a carry or borrow in 40% of the problems that have one (the answers
#                      the grader checks are true), and a local tokenizer
# 2. pt-data build     templated, tokenized, packed SFT rows; train and test prompts
# 3. pt-train run      SFT of a small Llama from random weights; its step 240 is the warm
#                      start, its last step the SFT model
# 4. pt-train run      DFT and ASFT from the SFT model, on the same demonstrations
# 5. pt-rollout | pt-eval grade | pt-data pairs | pt-train run: DPO from the SFT model
#                      on pairs of its own graded samples
# 6. pt-train run      OPD: the warm start distilled from the SFT model on its own samples
# 7. pt-train run      GRPO from the SFT model, rewarded by pt-eval's grader
# 8. pt-rollout generate | pt-eval grade: every model on the held-out problems; a table
#                      and the training curves as PNG
# Steps 4-7 run in two lanes side by side, as do the evaluations (two cores, one thread
# each).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/examples/quickstart"
OUT=${PT_QUICKSTART_OUT:-$PWD/quickstart-out}
SAMPLES=${PT_QUICKSTART_SAMPLES:-8}
SFT_SEED=${PT_QUICKSTART_SFT_SEED:-0}  # another seed stands for another CPU's arithmetic
if [[ ! "$SAMPLES" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: PT_QUICKSTART_SAMPLES=$SAMPLES is not a number of samples" >&2
    echo "hint: a whole number above 0, e.g. PT_QUICKSTART_SAMPLES=8" >&2
    exit 2
fi
if [[ ! "$SFT_SEED" =~ ^[0-9]+$ ]]; then
    echo "error: PT_QUICKSTART_SFT_SEED=$SFT_SEED is not a seed" >&2
    echo "hint: a whole number, e.g. PT_QUICKSTART_SFT_SEED=1" >&2
    exit 2
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} TOKENIZERS_PARALLELISM=false
export PATH="$HOME/.local/bin:$PATH"

step() { printf '\n\033[1m== %s\033[0m  (%ds)\n' "$*" $(( $(date +%s) - started )) >&2; }
started=$(date +%s)

step "install (uv sync)"
command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
(cd "$REPO" && uv sync --all-packages --locked --quiet --compile-bytecode)
export PATH="$REPO/.venv/bin:$PATH"

rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
path_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "$1"; }

step "1. pt-data synth arithmetic, pt-data tokenizer"
pt-data synth arithmetic --n 8000 --n-test 200 --flawed 0.4 --out synth > /dev/null
pt-data tokenizer --texts synth/train.jsonl --out tokenizer > /dev/null

step "2. pt-data build (test prompts, training prompts)"
pt-data build "$HERE/prompts.yaml" > /dev/null
pt-data build "$HERE/train-prompts.yaml" > /dev/null

step "3. pt-data build | pt-train run (SFT from random weights; the warm start at step 240)"
pt-data build "$HERE/data.yaml" \
    | pt-train run "$HERE/sft.yaml" training.seed="$SFT_SEED" --data - > manifest-sft.json
pt-train init "$HERE/sft.yaml" --out runs/untrained/inference/step-0 > manifest-untrained.json

# From here two lanes run side by side, one thread each (a model this small keeps a core
# busy with Python more than with arithmetic); each lane's progress goes to logs/.
mkdir -p logs
lanes() {  # run the given functions side by side; if one fails, stop the others and fail
    local names=("$@") pids=() i
    for i in "${!names[@]}"; do
        OMP_NUM_THREADS=1 "${names[$i]}" 2> "logs/${names[$i]}.log" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            kill "${pids[@]}" 2> /dev/null || true
            echo "error: ${names[$i]} failed; its log: $OUT/logs/${names[$i]}.log" >&2
            exit 1
        fi
    done
}

lane_a() {
    # 6. OPD: the warm start learns from the SFT model on its own samples
    pt-train run "$HERE/opd.yaml" > manifest-opd.json
    # 5. DPO from the SFT model on pairs of its own graded samples
    pt-rollout generate --model - --prompts data/train-prompts --engine hf --n 4 \
        --temperature 1.0 --max-tokens 40 --seed 1 --limit 600 --out rollouts/sft-train.jsonl \
        < manifest-sft.json \
        | pt-eval grade - --out grades/sft-train.jsonl \
        | pt-data pairs - --out data/pairs \
        | pt-train run "$HERE/dpo.yaml" --data - > manifest-dpo.json
}

lane_b() {
    # 4. DFT and ASFT (DFT anchored by KL) from the SFT model on the same demonstrations
    pt-train run "$HERE/finetune.yaml" --data data/sft > manifest-dft.json
    pt-train run "$HERE/finetune.yaml" run_name=asft objective.name=asft --data data/sft \
        > manifest-asft.json
    # 7. GRPO from the SFT model, rewarded by pt-eval
    pt-train run "$HERE/grpo.yaml" > manifest-grpo.json
}

step "4-7. pt-train run (OPD); pt-rollout generate | pt-eval grade | pt-data pairs | pt-train run (DPO)   [progress: logs/]"
step "   alongside: pt-train run (DFT, ASFT); pt-train run (GRPO)"
lanes lane_a lane_b

evaluate() {  # 8. sample the held-out problems with each model given, grade them
    local name model
    for name in "$@"; do
        case $name in
            base) model=runs/sft/inference/step-240 ;;  # the warm start: step 240 of the SFT run
            *) model=$(path_of "manifest-$name.json") ;;
        esac
        pt-rollout generate --model "$model" --prompts data/test-prompts \
            --engine hf --n "$SAMPLES" --temperature 0.6 --max-tokens 40 --seed 0 \
            --out "rollouts/$name.jsonl" \
            | pt-eval grade - --out "grades/$name.jsonl" > "grades-$name.json"
    done
}
eval_a() { evaluate untrained sft asft opd; }
eval_b() { evaluate base dft dpo grpo; }

step "8. pt-rollout generate | pt-eval grade (every model)   [progress: logs/]"
lanes eval_a eval_b

step "report"
python3 "$HERE/report.py" "$OUT" --seconds $(( $(date +%s) - started ))
