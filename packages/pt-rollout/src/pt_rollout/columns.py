"""The rollouts and scores rows' columns: what ``pt-rollout generate`` and ``pt-rollout
score`` write, the online loop makes round by round, and the trainer reads.

A rollouts row is one completion of one prompt: ``id``, ``sample``, ``prompt``,
``completion`` (its text), ``prompt_token_ids``, ``completion_token_ids``,
``finish_reason``, the prompt row's other columns, and per completion token (entry ``j``
for completion token ``j``):

- ``completion_logprobs``: the sampled token's log-prob under the generator;
- ``student_topk_ids`` / ``student_topk_logprobs``: the generator's k most likely tokens;
- ``token_weight_version``: the weight version that sampled the token (in-flight updates).

A scores row adds the teacher's view of each completion token: ``teacher_token_logprobs``,
``teacher_topk_ids`` / ``teacher_topk_logprobs`` (its k most likely), and
``teacher_student_topk_logprobs`` (its log-probs of the student's top-k).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pt_rollout.prompts import PromptRow

COMPLETION_LOGPROBS = "completion_logprobs"
STUDENT_TOPK_IDS = "student_topk_ids"
STUDENT_TOPK_LOGPROBS = "student_topk_logprobs"
TOKEN_WEIGHT_VERSION = "token_weight_version"
TEACHER_TOKEN_LOGPROBS = "teacher_token_logprobs"
TEACHER_TOPK_IDS = "teacher_topk_ids"
TEACHER_TOPK_LOGPROBS = "teacher_topk_logprobs"
TEACHER_STUDENT_TOPK_LOGPROBS = "teacher_student_topk_logprobs"


def field_of(value: Any, name: str) -> Any:
    """A field of a :class:`~pt_rollout.engines.Completion` or
    :class:`~pt_rollout.engines.TokenScores`, or of its dict as it crossed a socket."""
    return value.get(name) if isinstance(value, dict) else getattr(value, name)


def completion_columns(completion: Any, *, logprobs: bool | None = None) -> dict:
    """The columns of one completion: its token ids and finish reason, and what the
    engine recorded per token. ``logprobs``: write ``completion_logprobs`` always (True),
    never (False), or where the engine gave them (None)."""
    out = {
        "completion_token_ids": list(field_of(completion, "token_ids")),
        "finish_reason": field_of(completion, "finish_reason"),
    }
    sampled = field_of(completion, "logprobs")
    if logprobs or (logprobs is None and sampled is not None):
        out[COMPLETION_LOGPROBS] = sampled
    if field_of(completion, "topk_ids") is not None:
        out[STUDENT_TOPK_IDS] = field_of(completion, "topk_ids")
        out[STUDENT_TOPK_LOGPROBS] = field_of(completion, "topk_logprobs")
    return out


def score_columns(scores: Any, *, top_k: int, at_student_topk: bool) -> dict:
    """The teacher's columns of one completion from its scores: the token log-probs, with
    ``top_k`` its top-k, with ``at_student_topk`` its log-probs of the student's top-k."""
    out = {TEACHER_TOKEN_LOGPROBS: field_of(scores, "token_logprobs")}
    if top_k:
        out[TEACHER_TOPK_IDS] = field_of(scores, "topk_ids") or []
        out[TEACHER_TOPK_LOGPROBS] = field_of(scores, "topk_logprobs") or []
    if at_student_topk:
        out[TEACHER_STUDENT_TOPK_LOGPROBS] = field_of(scores, "at_ids_logprobs") or []
    return out


def completion_text(tokenizer, token_ids: list[int], stop: list[str]) -> str:
    """The completion as text: special tokens dropped, cut before the first stop string."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text


def rollout_row(
    row: PromptRow, sample: int, prompt_ids: list[int], completion, tokenizer, stop: list[str],
    *, logprobs: bool | None = None, extra: dict | None = None,
) -> dict:  # fmt: skip
    """One rollouts row (:mod:`pt_rollout.columns`): the prompt row's ``sample``-th
    completion, its text cut at the first of ``stop``, then ``extra`` and the prompt row's
    other columns (a column of the row never overwrites one of the sample's)."""
    columns = completion_columns(completion, logprobs=logprobs)
    record = {
        "id": row.id,
        "sample": sample,
        **(extra or {}),
        "prompt": row.prompt,
        "completion": completion_text(tokenizer, columns["completion_token_ids"], stop),
        "prompt_token_ids": list(prompt_ids),
        **columns,
    }
    return {**record, **{k: v for k, v in row.columns.items() if k not in record}}
