"""Names the stages agree on: row-schema columns and exit codes (see docs/contracts.md)."""

from __future__ import annotations

# Exit code of a stage that stopped on SIGTERM/SIGUSR1 after saving a checkpoint.
# pt-slurm requeues a job that ends with it and does not count it as a failure.
REQUEUE_EXIT_CODE = 85

IGNORE_INDEX = -100  # label of a token that carries no loss

CONVERSATION_COLUMNS = ("messages",)
TOKENIZED_COLUMNS = ("input_ids", "labels", "position_ids")
PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")
# A tokenized pair: the prompt once; per answer its ids (what follows the prompt) and labels
# (the id where trained, IGNORE_INDEX elsewhere), as long as its ids.
TOKENIZED_PREFERENCE_COLUMNS = (
    "prompt_input_ids",
    "chosen_input_ids",
    "chosen_labels",
    "rejected_input_ids",
    "rejected_labels",
)
PROMPT_COLUMNS = ("id", "prompt")
ROLLOUT_COLUMNS = (
    "id",
    "sample",
    "prompt",
    "completion",
    "prompt_token_ids",
    "completion_token_ids",
    "finish_reason",
)
SCORE_COLUMNS = ("teacher_token_logprobs",)
GRADE_COLUMNS = ("extracted", "correct", "grade_status")
GRADE_STATUSES = ("ok", "no_answer", "timeout", "error")
