"""Tokenized preference pairs for the tests of the objectives that train on pairs (DPO,
ORPO, KTO): ordinary tokens of the tiny tokenizer, completions of different lengths."""

from __future__ import annotations

import torch

VOCAB_LOW, VOCAB_HIGH = 5, 300  # ordinary tokens of the tiny tokenizer (462 ids)


def preference_pairs(n: int = 8, seed: int = 0) -> list[dict]:
    """Tokenized pairs of different lengths; in every third pair the first chosen token
    is not trained (label -100), so a completion's trained tokens are not all of it."""
    g = torch.Generator().manual_seed(seed)

    def tokens(low: int, high: int) -> list[int]:
        length = int(torch.randint(low, high, (1,), generator=g))
        return torch.randint(VOCAB_LOW, VOCAB_HIGH, (length,), generator=g).tolist()

    rows = []
    for i in range(n):
        prompt, chosen, rejected = tokens(3, 9), tokens(4, 15), tokens(4, 15)
        chosen_labels = list(chosen)
        if i % 3 == 0:
            chosen_labels[0] = -100
        rows.append(
            {
                "prompt_input_ids": prompt,
                "chosen_input_ids": chosen,
                "chosen_labels": chosen_labels,
                "rejected_input_ids": rejected,
                "rejected_labels": list(rejected),
            }
        )
    return rows


def load_float64(model_dir):
    """The model at ``model_dir`` in float64, for log-probs computed apart from pt-train."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()


def completion_logp(model, prompt, completion, labels) -> tuple[torch.Tensor, int]:
    """log p(completion | prompt) summed over the completion's trained tokens, from the
    full logits of one forward pass over prompt + completion (float64)."""
    ids = list(prompt) + list(completion)
    targets = [-100] * len(prompt) + list(labels)
    logits = model(input_ids=torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)  # position t predicts token t + 1
    trained = [t for t in range(len(ids) - 1) if targets[t + 1] != -100]
    return torch.stack([logp[t, ids[t + 1]] for t in trained]).sum(), len(trained)
