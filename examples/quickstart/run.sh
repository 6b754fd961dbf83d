#!/usr/bin/env bash
# The offline quickstart: install pt, then run the whole pipeline on the CPU.
#
#   bash examples/quickstart/run.sh            # output in ./quickstart-out
#
# 1. pt-data synth     a synthetic arithmetic train/test set
# 2. pt-data build     template, tokenize and pack the train set (piped into 3.)
# 3. pt-train run      a small Llama from random weights, once with SFT, once with DFT
#                      (pt-train init writes the untrained model, for comparison)
# 4. pt-rollout        sample answers on the test set from base, SFT and DFT
# 5. pt-eval grade     grade them; a table and a loss-curve PNG at the end
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/examples/quickstart"
OUT=${PT_QUICKSTART_OUT:-$PWD/quickstart-out}
SAMPLES=${PT_QUICKSTART_SAMPLES:-4}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} TOKENIZERS_PARALLELISM=false
export PATH="$HOME/.local/bin:$PATH"

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
started=$(date +%s)

step "install (uv sync)"
command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
(cd "$REPO" && uv sync --all-packages --locked --quiet)
export PATH="$REPO/.venv/bin:$PATH"

rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"

step "1. pt-data synth arithmetic"
pt-data synth arithmetic --n 8000 --n-test 200 --out synth > /dev/null
pt-data tokenizer --texts synth/train.jsonl --out tokenizer > /dev/null

step "2+3. pt-data build | pt-train run (SFT)"
pt-data build "$HERE/prompts.yaml" > manifests-prompts.json
pt-data build "$HERE/data.yaml" | pt-train run "$HERE/sft.yaml" --data - > manifest-sft.json

step "3. pt-train run (DFT, same data and schedule)"
pt-train run "$HERE/sft.yaml" run_name=dft training.loss=dft --data data/sft > manifest-dft.json

step "3. pt-train init (the untrained model, for comparison)"
pt-train init "$HERE/sft.yaml" --out runs/base/inference/step-0 > manifest-base.json

for name in base sft dft; do
    model=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "manifest-$name.json")
    step "4+5. pt-rollout generate | pt-eval grade ($name)"
    pt-rollout generate --model "$model" --prompts data/test-prompts --n "$SAMPLES" \
        --temperature 0.6 --max-tokens 40 --seed 0 --out "rollouts/$name.jsonl" \
        | pt-eval grade - --out "grades/$name.jsonl" > "grades-$name.json"
done

step "report"
pt-train plot runs/sft > /dev/null
pt-train plot runs/dft > /dev/null
python3 "$HERE/report.py" "$OUT" --seconds $(( $(date +%s) - started ))
