#!/usr/bin/env bash
# A multi-turn environment without tools: guess a number from 1 to 10 in four guesses,
# each wrong guess answered "higher" or "lower". A tiny model first learns the game from a
# guesser that heeds the answers but guesses at random in the range they leave open (it
# wins 3 games in 4), then GRPO rewards it for winning.
#
#   bash examples/guess/run.sh                 # output in ./guess-out
#
# 1. games.py           that guesser's games (SFT), training and test games
# 2. pt-data tokenizer, pt-data build | pt-train run: SFT from random weights
# 3. pt-rollout generate --env: the SFT model plays the test games
# 4. pt-train run       GRPO on the game (guess.py:Guess), the environment's reward
# 5. pt-rollout generate --env: the GRPO model plays them; the table, GRPO's reward curve
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/examples/guess"
OUT=${PT_GUESS_OUT:-$PWD/guess-out}
SFT_STEPS=${PT_GUESS_SFT_STEPS:-300}
GRPO_STEPS=${PT_GUESS_GRPO_STEPS:-150}
TEST=${PT_GUESS_TEST:-200}               # held-out games
SAMPLES=${PT_GUESS_SAMPLES:-4}           # each played this many times
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
cp "$HERE/guess.py" .  # the environment: looked up as guess.py:Guess from here

step "1. games.py (SFT games; training and test games)"
python3 "$HERE/games.py" games --test "$TEST"

step "2. pt-data tokenizer, pt-data build | pt-train run (SFT from random weights)"
pt-data tokenizer --texts games/sft.jsonl --out tokenizer > /dev/null
pt-data build "$HERE/data.yaml" | pt-train run "$HERE/sft.yaml" --data - \
    training.max_steps="$SFT_STEPS" > manifest-sft.json

path_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "$1"; }
play() {  # NAME MANIFEST: the model plays each test game SAMPLES times
    pt-rollout generate --model "$(path_of "$2")" --prompts games/test.jsonl --engine hf \
        --env "$HERE/env.yaml" --n "$SAMPLES" --temperature 1.0 --max-tokens 8 --seed 0 \
        --out "rollouts/$1.jsonl" > /dev/null
}

step "3. pt-rollout generate --env (the SFT model plays the test games)"
play sft manifest-sft.json

step "4. pt-train run (GRPO on the game)"
pt-train run "$HERE/grpo.yaml" model.name_or_path="$(path_of manifest-sft.json)" \
    training.max_steps="$GRPO_STEPS" > manifest-grpo.json

step "5. pt-rollout generate --env (the GRPO model plays them)"
play grpo manifest-grpo.json
pt-train plot runs/grpo --key sampled_reward --key turns --smooth 5 --out reward.png > /dev/null

step "report"
python3 "$HERE/report.py" "$OUT" --seconds $(( $(date +%s) - started ))
echo "GRPO's reward curve: $OUT/reward.png"
