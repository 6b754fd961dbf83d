#!/usr/bin/env bash
# The DFT paper's evaluation: average@16 at temperature 1.0 on Math500, Minerva Math,
# OlympiadBench, AIME24 and AMC23, with the standard step-by-step \boxed{} prompt.
#   bash eval.sh runs/dft-qwen2.5-math-1.5b/inference/step-N
set -euo pipefail
model=${1:?usage: eval.sh MODEL_DIR}
for bench in math500 minerva_math olympiadbench aime24 amc23; do
    pt-eval run --model "$model" --benchmark "$bench" --n 16 --temperature 1.0 \
        --max-tokens 4096 --out "eval/$(basename "$model")/$bench"
done
