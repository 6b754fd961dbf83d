"""Write the guessing game's data: ``sft.jsonl``, games of a guesser that heeds the answers
but guesses at random in the range they leave open, as conversations for SFT;
``train.jsonl`` and ``test.jsonl``, prompt rows ``{id, prompt, secret}`` for GRPO's
episodes and for the evaluation.

    python games.py OUT [--games 4000] [--prompts 2000] [--test 200] [--seed 0]

That guesser wins about 3 games in 4 (from 1 to 10 in four guesses); one that halves the
range every time wins them all. SFT can at best imitate the first: what GRPO does better
than that it learned from the reward alone."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

LOW, HIGH, TURNS = 1, 10, 4  # env.yaml's and grpo.yaml's environment options


def opening() -> str:
    return f"Guess my number from {LOW} to {HIGH}."  # guess.py's Guess.reset


def game(secret: int, rng: random.Random) -> list[dict]:
    """A game as the Guess environment plays it: each guess drawn at random from the range
    the answers so far leave open, up to TURNS guesses."""
    messages = [{"role": "user", "content": opening()}]
    low, high = LOW, HIGH
    for turn in range(TURNS):
        guess = rng.randint(low, high)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            break
        if guess < secret:
            low = guess + 1
        else:
            high = guess - 1
        if turn < TURNS - 1:
            messages.append({"role": "user", "content": "higher" if guess < secret else "lower"})
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--games", type=int, default=4000)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "sft.jsonl", "w") as f:
        for i in range(args.games):
            played = game(rng.randint(LOW, HIGH), rng)
            f.write(json.dumps({"id": f"game-{i}", "messages": played}) + "\n")
    for split, count in (("train", args.prompts), ("test", args.test)):
        with open(args.out / f"{split}.jsonl", "w") as f:
            for i in range(count):
                row = {"id": f"{split}-{i}", "prompt": opening(), "secret": rng.randint(LOW, HIGH)}
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
