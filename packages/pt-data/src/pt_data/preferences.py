"""Preference pairs: the shapes people have -> one prompt and two answers -> token ids.

Three source shapes become ``{"prompt": [messages], "chosen": [assistant messages],
"rejected": [assistant messages]}`` (:func:`normalize_preference_row`):

* **answers with a prompt**: ``prompt`` (a string is one user turn, or messages) and
  ``chosen``/``rejected`` (a string is one assistant turn, or assistant messages);
* **whole conversations** (UltraFeedback-binarized): ``chosen`` and ``rejected`` are both
  complete message lists; the prompt is their common prefix, cut back to end before an
  assistant turn, and what follows must be assistant turns. A ``prompt`` column beside
  them is not used (there it repeats the first user turn);
* **Anthropic HH texts**: ``"\\n\\nHuman: ...\\n\\nAssistant: ..."`` strings are read as
  turns (contents stripped) and then split like whole conversations, so the prompt ends
  with the last human turn the two texts share.

A pair whose chosen equals its rejected is dropped (``identical``), as is one whose two
conversations differ before their final assistant answers (``prompts_differ``).

Tokenized pair (:func:`tokenize_preference_rows`), the row pt-train trains DPO on::

    prompt_input_ids     the prompt through the generation prompt, one BOS
    chosen_input_ids     what follows the prompt in the chosen conversation
    chosen_labels        = the id where trained, -100 elsewhere (e.g. after <|im_end|>)
    rejected_input_ids, rejected_labels   likewise

Each side is the one encoding of the whole rendered conversation (prompt + answer), the
same ids and mask as :func:`pt_data.tokenize.tokenize_conversation` gives it, split where
the tokenized prompt ends: ``prompt_input_ids + chosen_input_ids`` is exactly that
encoding. Where the tokenizer merges characters across the boundary (``"Assistant: "``
then ``"Hello"`` -> one token ``" Hello"``), the prompt ends before the merged token and
the completion starts with it, trained as the conversation mask trains it; such pairs
are counted as ``boundary_merged``.

Lengths: a prompt is never cut (a cut prompt is another question, and the preference was
judged on the whole one): a pair whose prompt is longer than ``max_prompt_length``, or
leaves no room for an answer token within ``max_seq_length``, is dropped
(``prompt_too_long``). An answer longer than ``max_completion_length`` or than
``max_seq_length`` minus the prompt drops the pair (``too_long``), or with ``truncate``
is cut to its first tokens (counted in ``truncated``; dropped as
``truncated_to_nothing`` if a side keeps no trained token, ``identical`` if the cut sides
become equal).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_core.files import require_columns
from pt_data.tokenize import ChunkPool, ConversationTokenizer, as_turns, check_messages

CARRIED = ("id", "source", "margin")

_HH_TURN = re.compile(r"\n\n(Human|Assistant):")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


# --------------------------------------------------------------------------- shapes


def parse_hh(text: str) -> list[dict] | None:
    """An Anthropic HH text (``\\n\\nHuman: ...\\n\\nAssistant: ...``) as messages; None when
    the text does not start with a ``Human:`` turn."""
    if not text.lstrip().startswith("Human:"):
        return None
    parts = _HH_TURN.split("\n\n" + text.lstrip())
    # parts: ["", "Human", " text", "Assistant", " text", ...]
    return [
        {"role": _HH_ROLES[role], "content": content.strip()}
        for role, content in zip(parts[1::2], parts[2::2], strict=True)
    ]


def _side(value: Any, column: str) -> list[dict]:
    if isinstance(value, str):
        turns = parse_hh(value)
        if turns is not None:
            return turns
    return as_turns(value, "assistant", column)


def split_shared_prompt(
    chosen: list[dict], rejected: list[dict]
) -> tuple[list[dict], list[dict], list[dict]] | None:
    """``(prompt, chosen answer, rejected answer)`` of two whole conversations: the prompt is
    their common prefix, cut back to end before an assistant turn; None unless both
    remainders are non-empty assistant turns."""
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    while k > 0 and chosen[k - 1]["role"] == "assistant":
        k -= 1
    tails = chosen[k:], rejected[k:]
    if k == 0 or not all(tails) or any(m["role"] != "assistant" for t in tails for m in t):
        return None
    return chosen[:k], tails[0], tails[1]


def normalize_preference_row(row: dict) -> tuple[dict | None, str | None]:
    """A preference row of any supported shape as ``({"prompt", "chosen", "rejected", ...},
    None)``, or ``(None, reason)`` when the pair is dropped (``identical``,
    ``prompts_differ``). Columns ``id``, ``source`` and ``margin`` are carried."""
    require_columns(row, ["chosen", "rejected"], "preference row")
    chosen, rejected = _side(row["chosen"], "chosen"), _side(row["rejected"], "rejected")
    for column, turns in (("chosen", chosen), ("rejected", rejected)):
        if not turns:
            raise InputError(f"column {column!r} is an empty list")
        check_messages(turns, column)
    whole = [t[0]["role"] != "assistant" for t in (chosen, rejected)]
    if all(whole):
        split = split_shared_prompt(chosen, rejected)
        if split is None:
            return None, "identical" if chosen == rejected else "prompts_differ"
        prompt, chosen, rejected = split
    elif any(whole):
        raise InputError(
            "one of 'chosen' and 'rejected' is a whole conversation and the other only an answer",
            hint="give both as answers (with a 'prompt' column) or both as whole conversations",
        )
    else:
        if "prompt" not in row:
            raise InputError(
                "'chosen' and 'rejected' hold only answers and the row has no 'prompt' column; "
                f"it has: {', '.join(map(repr, row))}",
                hint="add a 'prompt' column, give whole conversations as message lists, or "
                "'\\n\\nHuman: ...\\n\\nAssistant: ...' texts",
            )
        value = row["prompt"]
        prompt = parse_hh(value) if isinstance(value, str) else None
        if prompt is None:  # a plain string is one user turn
            prompt = as_turns(value, "user", "prompt")
        elif prompt[-1]["role"] == "assistant" and not prompt[-1]["content"]:
            # an HH prompt ending in "\n\nAssistant:", the answers' header: the answers are
            # the texts after it, stripped like HH turns
            prompt = prompt[:-1]
            chosen, rejected = (
                [{**m, "content": m["content"].strip()} for m in t] for t in (chosen, rejected)
            )
        check_messages(prompt, "prompt")
        for column, turns in (("chosen", chosen), ("rejected", rejected)):
            roles = {m["role"] for m in turns} - {"assistant"}
            if roles:
                raise InputError(
                    f"{column!r} holds {', '.join(sorted(roles))} turns; the answers of a "
                    "pair are assistant turns",
                    hint="put the other turns in 'prompt', or give whole conversations",
                )
    if chosen == rejected:
        return None, "identical"
    out: dict[str, Any] = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    for key in CARRIED:
        if row.get(key) is not None:
            out[key] = row[key]
    return out, None


# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class PairLimits:
    """Length limits of tokenized pairs (see the module docstring for the policy)."""

    max_seq_length: int | None = None
    max_prompt_length: int | None = None
    max_completion_length: int | None = None
    truncate: bool = False


@dataclass
class PairResult:
    """One pair after tokenizing: its row, or the reason it was dropped."""

    row: dict | None
    reason: str | None = None
    truncated: bool = False
    boundary_merged: bool = False


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _first_trained(labels: Sequence[int]) -> int:
    return next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))


class PreferenceTokenizer:
    """Template + tokenizer for pairs, set up once (the conversation tokenizer inside)."""

    def __init__(self, tokenizer: Any, *, chat_template: str | None = None):
        self.ct = ConversationTokenizer(tokenizer, chat_template=chat_template)
        self.tokenizer = tokenizer

    def encode(self, rows: Sequence[dict]) -> list[tuple[list, list, list, list, list, bool]]:
        """Untruncated ``(prompt_ids, chosen_ids, chosen_labels, rejected_ids,
        rejected_labels, boundary_merged)`` of normalized rows."""
        ct = self.ct
        rendered = []
        for row in rows:
            prompt = row["prompt"]
            rendered.append((ct.renderer.render(prompt, add_generation_prompt=True), []))
            for side in ("chosen", "rejected"):
                messages = prompt + row[side]
                rendered.append(
                    ct.render_with_spans(messages, targets=range(len(prompt), len(messages)))
                )
        encoded = ct.encode_rendered(rendered)
        out = []
        for n in range(len(rows)):
            (alone, _), (chosen, c_labels), (rejected, r_labels) = encoded[3 * n : 3 * n + 3]
            if _first_trained(c_labels) == len(c_labels) or _first_trained(r_labels) == len(
                r_labels
            ):
                raise InputError(
                    "an answer has no trainable tokens: the chat template renders no assistant "
                    "content for it",
                    hint="use a template that renders assistant turns (chat_template: chatml)",
                )
            cut = min(
                _common_prefix(alone, chosen),
                _common_prefix(alone, rejected),
                _first_trained(c_labels),
                _first_trained(r_labels),
            )
            out.append(
                (
                    chosen[:cut],
                    chosen[cut:],
                    c_labels[cut:],
                    rejected[cut:],
                    r_labels[cut:],
                    cut < len(alone),
                )
            )
        return out

    def tokenize(self, rows: Sequence[dict], limits: PairLimits) -> list[PairResult]:
        """Preference rows of any supported shape -> tokenized pair rows (or the reasons
        they were dropped), under ``limits``."""
        normalized = [normalize_preference_row(row) for row in rows]
        kept = [row for row, _ in normalized if row is not None]
        encoded = iter(self.encode(kept))
        results = []
        for row, reason in normalized:
            if row is None:
                results.append(PairResult(None, reason))
                continue
            result = apply_limits(*next(encoded), limits=limits)
            if result.row is not None:
                for key in CARRIED:
                    if key in row:
                        result.row[key] = row[key]
            results.append(result)
        return results


def apply_limits(
    prompt_ids: list,
    chosen_ids: list,
    chosen_labels: list,
    rejected_ids: list,
    rejected_labels: list,
    boundary_merged: bool = False,
    *,
    limits: PairLimits,
) -> PairResult:
    """The length policy of the module docstring, on one tokenized pair."""
    n_prompt = len(prompt_ids)
    if (limits.max_prompt_length is not None and n_prompt > limits.max_prompt_length) or (
        limits.max_seq_length is not None and n_prompt >= limits.max_seq_length
    ):
        return PairResult(None, "prompt_too_long", boundary_merged=boundary_merged)
    room = [
        x
        for x in (
            limits.max_completion_length,
            None if limits.max_seq_length is None else limits.max_seq_length - n_prompt,
        )
        if x is not None
    ]
    room_left = min(room) if room else None
    truncated = False
    if room_left is not None and max(len(chosen_ids), len(rejected_ids)) > room_left:
        if not limits.truncate:
            return PairResult(None, "too_long", boundary_merged=boundary_merged)
        truncated = True
        chosen_ids, chosen_labels = chosen_ids[:room_left], chosen_labels[:room_left]
        rejected_ids, rejected_labels = rejected_ids[:room_left], rejected_labels[:room_left]
        if _first_trained(chosen_labels) == len(chosen_labels) or _first_trained(
            rejected_labels
        ) == len(rejected_labels):
            return PairResult(None, "truncated_to_nothing", truncated, boundary_merged)
    if chosen_ids == rejected_ids and chosen_labels == rejected_labels:
        return PairResult(None, "identical", truncated, boundary_merged)
    row = {
        "prompt_input_ids": list(prompt_ids),
        "chosen_input_ids": list(chosen_ids),
        "chosen_labels": list(chosen_labels),
        "rejected_input_ids": list(rejected_ids),
        "rejected_labels": list(rejected_labels),
    }
    return PairResult(row, None, truncated, boundary_merged)


class PairCounts:
    """Running counts of a tokenization: pairs kept, dropped by reason, truncated, merged."""

    def __init__(self) -> None:
        self.pairs = 0
        self.dropped: Counter = Counter()
        self.truncated = 0
        self.boundary_merged = 0

    def add(self, result: PairResult) -> None:
        if result.row is None:
            self.dropped[result.reason] += 1
        else:
            self.pairs += 1
            self.truncated += result.truncated
            self.boundary_merged += result.boundary_merged

    def as_dict(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "dropped": dict(sorted(self.dropped.items())),
            "truncated": self.truncated,
            "boundary_merged": self.boundary_merged,
        }


_cache: dict[tuple, PreferenceTokenizer] = {}


def get_preference_tokenizer(tokenizer: Any, chat_template: str | None = None):
    key = (id(tokenizer), chat_template)
    pt = _cache.get(key)
    if pt is None or pt.tokenizer is not tokenizer:
        pt = _cache[key] = PreferenceTokenizer(tokenizer, chat_template=chat_template)
    return pt


def _where(index: int, row: dict) -> str:
    return f"preference row {index + 1}" + (f" (id {row['id']!r})" if "id" in row else "")


def _tokenize_chunk(state: tuple[PreferenceTokenizer, PairLimits], rows: list[dict]):
    """Tokenized pairs of ``rows``, or ``(index, message, hint)`` of the first bad row."""
    pt, limits = state
    try:
        return pt.tokenize(rows, limits)
    except InputError:
        for i, row in enumerate(rows):
            try:
                pt.tokenize([row], limits)
            except InputError as exc:
                return (i, exc.message, exc.hint)
        raise


class ParallelPairs(ChunkPool):
    """Tokenize normalized preference rows over ``num_proc`` processes (forked once):
    ``pairs(rows)`` -> one :class:`PairResult` per row, in order."""

    def __init__(self, pt: PreferenceTokenizer, limits: PairLimits, num_proc: int | None = None):
        super().__init__(_tokenize_chunk, (pt, limits), num_proc)

    def __call__(self, rows: Sequence[dict], ids: Sequence[Any] | None = None):
        results = self.map_chunks(rows)
        self.raise_errors(results, ids, "pair")
        return [r for chunk in results for r in chunk]


def tokenize_preference_rows(
    rows: Iterable[dict],
    tokenizer: Any,
    *,
    chat_template: str | None = None,
    max_seq_length: int | None,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    truncate: bool = False,
) -> tuple[list[dict], dict[str, Any]]:
    """Preference rows of any supported shape -> tokenized pair rows and the counts.

    Returns ``(rows, {"pairs", "dropped": {reason: n}, "truncated", "boundary_merged"})``;
    each row holds ``prompt_input_ids``, ``chosen_input_ids``, ``chosen_labels``,
    ``rejected_input_ids``, ``rejected_labels`` and the carried ``id``, ``source``,
    ``margin``. A malformed row raises :class:`~pt_core.errors.InputError` naming it.
    """
    pt = get_preference_tokenizer(tokenizer, chat_template)
    limits = PairLimits(max_seq_length, max_prompt_length, max_completion_length, truncate)
    rows = list(rows)
    results = _tokenize_chunk((pt, limits), rows)
    if isinstance(results, tuple):
        i, message, hint = results
        raise InputError(f"{_where(i, rows[i])}: {message}", hint=hint)
    counts = PairCounts()
    for result in results:
        counts.add(result)
    return [r.row for r in results if r.row is not None], counts.as_dict()
