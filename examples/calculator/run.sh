#!/usr/bin/env bash
# A tiny model learns to use a calculator: 5-digit products, too long for it to work out
# in its head, answered directly (no tool) or by a call of a multiply tool.
#
#   bash examples/calculator/run.sh            # output in ./calculator-out
#
# 1. pt-data synth      the same problems two ways: answered directly, and traces that
#                       call multiply and read its result; a local tokenizer
# 2. pt-data build      SFT rows of each arm (the tool arm's with the tool listed in the
#                       opening); test and training prompts
# 3. pt-train run       SFT of a small Llama from random weights, once on each arm
# 4. pt-train run       GRPO in the tool environment from an early step of the tool arm's
#                       SFT, rewarded by pt-eval's grade of its final answer
# 5. pt-rollout generate [--env] | pt-eval grade: every model on the held-out problems,
#                       the tool arm's as episodes in the tool environment; the table, and
#                       GRPO's reward curve (pt-train plot)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/examples/calculator"
OUT=${PT_CALCULATOR_OUT:-$PWD/calculator-out}
TRAIN=${PT_CALCULATOR_TRAIN:-4000}      # training problems
TEST=${PT_CALCULATOR_TEST:-200}         # held-out problems
SFT_STEPS=${PT_CALCULATOR_SFT_STEPS:-600}
WARM=${PT_CALCULATOR_WARM:-300}         # the SFT step GRPO starts from
GRPO_STEPS=${PT_CALCULATOR_GRPO_STEPS:-40}
SAMPLES=${PT_CALCULATOR_SAMPLES:-4}     # samples of each held-out problem
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} TOKENIZERS_PARALLELISM=false
export PATH="$HOME/.local/bin:$PATH"

step() { printf '\n\033[1m== %s\033[0m  (%ds)\n' "$*" $(( $(date +%s) - started )) >&2; }
started=$(date +%s)

if [ -z "${PT_NO_SYNC:-}" ]; then  # PT_NO_SYNC=1: the pt already on PATH, as it is
    step "install (uv sync)"
    command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
    (cd "$REPO" && uv sync --all-packages --locked --quiet --compile-bytecode)
    export PATH="$REPO/.venv/bin:$PATH"
fi

rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
cp "$HERE/calc.py" .  # the tool: looked up as calc.py:multiply from here

step "1. pt-data synth calculator and multiplication, pt-data tokenizer"
for kind in calculator multiplication; do
    pt-data synth "$kind" --n "$TRAIN" --n-test "$TEST" --out "synth/$kind" > /dev/null
done
pt-data tokenizer --texts synth/calculator/train.jsonl --texts synth/multiplication/train.jsonl \
    --out tokenizer > /dev/null

step "2. pt-data build (test prompts, training prompts)"
pt-data build "$HERE/prompts.yaml" > /dev/null
pt-data build "$HERE/train-prompts.yaml" > /dev/null

step "3. pt-data build | pt-train run (SFT of each arm from random weights)"
pt-data build "$HERE/data.yaml" | pt-train run "$HERE/sft.yaml" --data - \
    training.max_steps="$SFT_STEPS" training.inference_steps="$WARM" > manifest-tool.json
pt-data build "$HERE/direct-data.yaml" | pt-train run "$HERE/sft.yaml" --data - \
    run_name=sft-direct training.max_steps="$SFT_STEPS" > manifest-direct.json

step "4. pt-train run (GRPO in the tool environment from step $WARM of the tool arm's SFT)"
pt-train run "$HERE/grpo.yaml" model.name_or_path="runs/sft-tool/inference/step-$WARM" \
    training.max_steps="$GRPO_STEPS" > manifest-grpo.json

step "5. pt-rollout generate [--env] | pt-eval grade (every model)"
path_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "$1"; }
evaluate() {  # NAME MODEL [--env env.yaml]
    local name=$1 model=$2
    shift 2
    pt-rollout generate --model "$model" --prompts data/test-prompts --engine hf \
        --n "$SAMPLES" --temperature 0.6 --max-tokens 48 --seed 0 "$@" \
        --out "rollouts/$name.jsonl" \
        | pt-eval grade - --out "grades/$name.jsonl" > "grades-$name.json"
}
evaluate direct "$(path_of manifest-direct.json)"
evaluate warm "runs/sft-tool/inference/step-$WARM" --env "$HERE/env.yaml"
evaluate tool "$(path_of manifest-tool.json)" --env "$HERE/env.yaml"
evaluate grpo "$(path_of manifest-grpo.json)" --env "$HERE/env.yaml"
pt-train plot runs/grpo --key sampled_reward --key tool_calls --smooth 5 \
    --out reward.png > /dev/null

step "report"
python3 "$HERE/report.py" "$OUT" --seconds $(( $(date +%s) - started ))
echo "GRPO's reward curve: $OUT/reward.png"
