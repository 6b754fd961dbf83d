#!/usr/bin/env bash
# GRPO for longer than the quickstart's 60 steps, from the quickstart's SFT model: run the
# quickstart first, then (from the same directory)
#
#   bash examples/quickstart/grpo-longer.sh          # 200 steps; PT_GRPO_STEPS=N for others
#
# The quickstart's grpo.yaml with 4 samples per problem (16 problems a step) for
# PT_GRPO_STEPS steps on both cores, then the held-out problems sampled and graded exactly
# as the quickstart does (8 samples at temperature 0.6, seed 0). Prints the SFT model's and
# the GRPO model's accuracy and draws the reward curve (quickstart-out/grpo-longer.png).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/examples/quickstart"
OUT=${PT_QUICKSTART_OUT:-$PWD/quickstart-out}
STEPS=${PT_GRPO_STEPS:-200}
NAME=grpo-$STEPS
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} TOKENIZERS_PARALLELISM=false
export PATH="$REPO/.venv/bin:$PATH"

if [[ ! "$STEPS" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: PT_GRPO_STEPS=$STEPS is not a number of steps" >&2
    echo "hint: a whole number above 0, e.g. PT_GRPO_STEPS=200" >&2
    exit 2
fi
if [[ ! -f "$OUT/manifest-sft.json" || ! -f "$OUT/grades-sft.json" ]]; then
    echo "error: no quickstart output in $OUT (manifest-sft.json, grades-sft.json)" >&2
    echo "hint: run 'bash examples/quickstart/run.sh' first, or set PT_QUICKSTART_OUT" >&2
    exit 2
fi
cd "$OUT"
accuracy() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['accuracy'])" "$1"; }

started=$(date +%s)
trap 'rm -f "manifest-$NAME.json.tmp" "grades-$NAME.json.tmp"' EXIT
rm -rf "runs/$NAME" "manifest-$NAME.json" "grades-$NAME.json"  # no figures of an earlier run
pt-train run "$HERE/grpo.yaml" run_name="$NAME" rollout.samples_per_prompt=4 \
    training.max_steps="$STEPS" > "manifest-$NAME.json.tmp"
mv "manifest-$NAME.json.tmp" "manifest-$NAME.json"  # only a finished run has a manifest
seconds=$(( $(date +%s) - started ))
model=$(python3 -c "import json; print(json.load(open('manifest-$NAME.json'))['path'])")
pt-rollout generate --model "$model" --prompts data/test-prompts --engine hf --n 8 \
    --temperature 0.6 --max-tokens 40 --seed 0 --out "rollouts/$NAME.jsonl" \
    | pt-eval grade - --out "grades/$NAME.jsonl" > "grades-$NAME.json.tmp"
mv "grades-$NAME.json.tmp" "grades-$NAME.json"
pt-train plot "runs/$NAME" --key sampled_reward --smooth 10 --out grpo-longer.png > /dev/null

python3 - "$(accuracy grades-sft.json)" "$(accuracy "grades-$NAME.json")" "$STEPS" "$seconds" <<'EOF'
import sys
sft, grpo, steps, seconds = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"held-out accuracy: SFT {100 * sft:.1f}%  ->  GRPO ({steps} steps, {seconds} s) "
      f"{100 * grpo:.1f}%  ({100 * (grpo - sft):+.1f} points); reward curve: grpo-longer.png")
EOF
