"""Conversations -> ``input_ids`` and ``labels`` with a loss mask on assistant turns.

How the mask is found (no ``{% generation %}`` markers needed): for every
assistant message ``i`` the template is rendered twice more, once for
``messages[:i]`` with the generation prompt and once for ``messages[:i+1]``. The
text between the two is exactly what the model must produce for that turn
(its content and its end-of-turn token). Trailing whitespace after the end-of-turn
token (ChatML's ``\\n``) is not trained, because the next turn's header follows it,
not the model's output. Character spans become token spans through the fast
tokenizer's offsets, on the one encoding of the whole text, so the ids are exactly
what the tokenizer produces for the rendered conversation.

Messages are taken in the OpenAI/HF shapes (:func:`check_messages`): content as a list
of text parts, assistant turns with ``tool_calls`` (trained, like any assistant turn:
the calls are what the model must emit) and ``tool`` turns (inputs, never trained). A
row's ``tools`` reach the template as ``tools``, as ``apply_chat_template`` passes them.

Labels are aligned with ``input_ids`` (``labels[t]`` is the target *at* position
``t``; the model shifts them, as Hugging Face causal LMs do) and hold -100 where
there is no loss.

Exactly one BOS: a template that writes ``bos_token`` while the tokenizer would
also add one yields two; the duplicate is removed. A tokenizer that adds a BOS
by default, used with a template that writes none, gets one prepended.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
from collections.abc import Sequence
from itertools import chain
from typing import Any, Literal

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_data.templates import Renderer

TrainOn = Literal["assistant", "last"]
TRAIN_ON = ("assistant", "last")


class TooLong(InputError):
    """A conversation longer than ``max_seq_length`` when truncation is off."""


class NoTrainableTokens(InputError):
    """A conversation whose mask trains nothing (no assistant turn, or a template that
    drops assistant content): an error rather than a silent zero loss."""


# Message keys that chat templates read besides role and content (tool use).
TOOL_KEYS = ("tool_calls", "tool_call_id", "name")
TOOL_USE_HINT = (
    "use a template that renders tool calls, tools and tool turns, e.g. chatml (pt-data: "
    "data.tokenizer.chat_template; pt-train: data.chat_template)"
)


def text_of_parts(parts: list, where: str) -> str:
    """The text of OpenAI/HF content parts (``[{"type": "text", "text": ...}]``), joined
    with newlines as vLLM's OpenAI server joins them, so that training renders the text
    that serving renders. Any other part (an image, audio) is refused: pt trains on text."""
    texts = []
    for k, part in enumerate(parts):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            if not isinstance(part.get("text"), str):
                raise InputError(f"{where}: text part {k} has no string 'text'")
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InputError(
                f"{where}: content part {k} is {kind!r}, not text",
                hint='keep only {"type": "text", "text": ...} parts (pt trains text-only '
                "models): drop the image/audio parts or the row in a transform",
            )
    return "\n".join(texts)


def _parse_json(text: str, what: str, hint: str) -> Any:
    """``text`` parsed (datasets store tool calls and schemas as JSON strings), or an
    InputError saying ``what`` and why."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} ({exc})", hint=hint) from None


def _tool_call(call: Any, where: str) -> dict:
    """One tool call with its ``arguments`` as a dict: OpenAI's format holds them as a JSON
    string, and tool-use chat templates expect a mapping (they would quote the string)."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InputError(
            f"{where}: a tool call must be {{function: {{name, arguments}}}} or "
            f"{{name, arguments}}, got {call!r}"
        )
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return call
    parsed = _parse_json(
        arguments,
        f"{where}: the arguments of tool call {function['name']!r} are not JSON",
        "give arguments as an object or as a JSON string of one",
    )
    function = {**function, "arguments": parsed}
    return {**call, "function": function} if "function" in call else function


def as_template_message(message: dict, where: str) -> dict:
    """``message`` as chat templates read it: content parts joined into text, tool-call
    arguments as dicts, and ``content`` "" on an assistant turn made only of tool calls
    (templates test ``if message.content``). The same dict when nothing needs changing."""
    content = message.get("content")
    tool_calls = message.get("tool_calls")
    if isinstance(content, str) and not tool_calls:
        return message
    out = dict(message)
    if isinstance(content, list):
        out["content"] = text_of_parts(content, where)
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise InputError(
                f"{where}: 'tool_calls' is {type(tool_calls).__name__}; expected a list"
            )
        out["tool_calls"] = [_tool_call(c, where) for c in tool_calls]
        if content is None:
            out["content"] = ""
    return out


def check_messages(messages: Any, where: str = "conversation") -> list[dict]:
    """Messages must be a non-empty list of ``{role, content}`` with text content (a string
    or text parts); an assistant turn may carry ``tool_calls`` instead of content. Returns
    them as chat templates read them (:func:`as_template_message`)."""
    if not isinstance(messages, list) or not messages:
        raise InputError(
            f"{where}: 'messages' must be a non-empty list of {{role, content}}, "
            f"got {type(messages).__name__}"
        )
    out = []
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or "role" not in m
            or not ("content" in m or m.get("tool_calls"))
        ):
            keys = list(m) if isinstance(m, dict) else type(m).__name__
            raise InputError(f"{where}: message {i} needs 'role' and 'content', has {keys}")
        m = as_template_message(m, f"{where}: message {i}")
        if not isinstance(m["content"], str):
            raise InputError(
                f"{where}: message {i} content is {type(m['content']).__name__}, expected a "
                "string or a list of text parts"
            )
        out.append(m)
    return out


def check_tools(tools: Any, where: str = "conversation") -> list[dict] | None:
    """A row's ``tools`` column as the chat template takes it: a list of tool schemas (a
    JSON string of one, as some datasets store it, is parsed), or None."""
    if isinstance(tools, str):
        tools = _parse_json(
            tools,
            f"{where}: column 'tools' is a string but not JSON",
            "give tools as a list of JSON schemas, or as a JSON string of one",
        )
    if tools is None or (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return tools
    raise InputError(
        f"{where}: column 'tools' holds {type(tools).__name__}; expected a list of tool "
        "schemas ({type: function, function: {name, description, parameters}})",
        hint="give tools as a list of JSON schemas, or drop the column",
    )


class ConversationTokenizer:
    """Template + tokenizer + mask policy, set up once and applied to many conversations."""

    def __init__(
        self, tokenizer: Any, *, chat_template: str | None = None, train_on: TrainOn = "assistant"
    ):
        if train_on not in TRAIN_ON:
            raise InputError(f"train_on={train_on!r}; expected one of {', '.join(TRAIN_ON)}")
        self.tokenizer = tokenizer
        self.renderer = Renderer(tokenizer, chat_template)
        self.train_on = train_on
        self.backend = getattr(tokenizer, "_tokenizer", None) if tokenizer.is_fast else None
        self.bos_id = tokenizer.bos_token_id
        self.eos_token = tokenizer.eos_token or ""
        # Does this tokenizer put a BOS in front of plain text by itself (Llama-style)?
        self.adds_bos = False
        if self.bos_id is not None:
            probe = tokenizer("x", add_special_tokens=True)["input_ids"]
            self.adds_bos = bool(probe) and probe[0] == self.bos_id

    # ------------------------------------------------------------------ text and spans

    def render(self, messages: list[dict], tools: Any = None) -> str:
        """The text of one conversation (its messages and the row's ``tools``)."""
        return self.renderer.render(check_messages(messages), tools=check_tools(tools))

    def render_with_spans(
        self, messages: list[dict], targets: Sequence[int] | None = None, tools: Any = None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans that carry loss: those of the
        assistant messages that ``train_on`` selects, or of the message indices ``targets``.

        An assistant turn made only of tool calls is a target like any other (the model
        must learn to emit the calls); ``tool`` turns are inputs, as user turns are. The
        row's ``tools`` reach the template as ``tools``, as in ``apply_chat_template``."""
        messages = check_messages(messages)
        tools = check_tools(tools)

        def render(msgs: list[dict], add_generation_prompt: bool = False) -> str:
            return self.renderer.render(msgs, add_generation_prompt, tools=tools)

        full = render(messages)
        if targets is None:
            targets = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            if self.train_on == "last":
                targets = targets[-1:]
        spans: list[tuple[int, int]] = []
        turns: dict[int, str] = {}  # the rendered text of target turns, by message index
        cursor = 0
        for i in targets:
            if i == 0:  # starts with the assistant: many templates cannot render zero messages
                spans.append(self._locate(full, messages[i]["content"], cursor, i))
                cursor = spans[-1][1]
                continue
            before = render(messages[:i], add_generation_prompt=True)
            through = full if i == len(messages) - 1 else render(messages[: i + 1])
            if full.startswith(through) and through.startswith(before) and len(before) >= cursor:
                start, end = len(before), len(through)
                text = turns[i] = full[start:end]
                end = start + len(text.rstrip())
            else:
                start, end = self._locate(full, messages[i]["content"], cursor, i)
            if end > start:
                spans.append((start, end))
            cursor = max(cursor, end)
        if tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
            self._check_tool_use(messages, tools, full, turns)
        return full, spans

    def _check_tool_use(
        self, messages: list[dict], tools: list[dict] | None, full: str, turns: dict[int, str]
    ) -> None:
        """A template that drops tool calls would train an empty reply for every call (the
        end-of-turn token alone); one that drops the tools or the tools' outputs trains a
        model that never saw them. Each is refused: the rows are right, the template is not."""
        for i, message in enumerate(messages):
            if message["role"] == "tool" and message["content"].strip() not in full:
                raise InputError(
                    f"the chat template does not render tool message {i}", hint=TOOL_USE_HINT
                )
            if message["role"] != "assistant" or not message.get("tool_calls"):
                continue
            if i in turns:
                turn = turns[i]
            else:  # not trained (train_on: last), or a template that rewrites earlier turns
                through = self.renderer.render(messages[: i + 1], tools=tools)
                before = self.renderer.render(messages[:i], True, tools=tools) if i else ""
                turn = through[len(before) :] if through.startswith(before) else through
            names = [call["function"]["name"] for call in message["tool_calls"]]
            if not all(name in turn for name in names):
                raise InputError(
                    f"the chat template does not render the tool calls of assistant message "
                    f"{i} ({', '.join(names)}): their turn would train an empty reply",
                    hint=TOOL_USE_HINT,
                )
        if tools and self.renderer.render(messages) == full:
            raise InputError(
                "the chat template renders the conversation the same with and without the "
                "row's tools: it drops them",
                hint=TOOL_USE_HINT,
            )

    def _locate(self, full: str, content: str, cursor: int, index: int) -> tuple[int, int]:
        """Fallback for templates that rewrite earlier turns (so renderings are not
        prefixes of each other): find the content itself, plus the end-of-turn token."""
        needle = content.strip()
        start = full.find(needle, cursor) if needle else -1
        if start < 0:
            raise InputError(
                f"assistant message {index} does not appear in the rendered conversation",
                hint="the chat template drops or rewrites assistant content; use another "
                "template, e.g. chatml (pt-data: data.tokenizer.chat_template; pt-train: "
                "data.chat_template)",
            )
        end = start + len(needle)
        rest = full[end:]
        stripped = rest.lstrip()
        if self.eos_token and stripped.startswith(self.eos_token):
            end += len(rest) - len(stripped) + len(self.eos_token)
        return start, end

    # ------------------------------------------------------------------ tokens

    def encode_many(
        self, conversations: Sequence[list[dict]], tools: Sequence[Any] | None = None
    ) -> list[tuple[list, list]]:
        """``(input_ids, labels)`` per conversation, untruncated; ``tools``: each
        conversation's tool schemas (None: none has any)."""
        return self.encode_rendered(self._render_all(conversations, tools))

    def _render_all(self, conversations, tools) -> list[tuple[str, list[tuple[int, int]]]]:
        tools = [None] * len(conversations) if tools is None else tools
        return [
            self.render_with_spans(m, tools=t) for m, t in zip(conversations, tools, strict=True)
        ]

    def encode_rendered(
        self, rendered: Sequence[tuple[str, list[tuple[int, int]]]]
    ) -> list[tuple[list, list]]:
        """``(input_ids, labels)`` of rendered texts with their trained character spans: one
        encoding of each whole text, the spans mapped to tokens, exactly one BOS."""
        if self.backend is not None:
            encodings = self.backend.encode_batch(
                [t for t, _ in rendered], add_special_tokens=False
            )
            out = [
                self._mask(enc, spans) for enc, (_, spans) in zip(encodings, rendered, strict=True)
            ]
        else:
            out = [self._encode_slow(text, spans) for text, spans in rendered]
        return [self._one_bos(ids, labels) for ids, labels in out]

    def encode(self, messages: list[dict], tools: Any = None) -> tuple[list, list]:
        return self.encode_many([messages], [tools])[0]

    def encode_flat(
        self, conversations: Sequence[list[dict]], tools: Sequence[Any] | None = None
    ) -> EncodedBatch:
        """Like :meth:`encode_many`, straight into flat int32 arrays (the fast path that
        ``pt-data build`` takes: no per-token Python lists for the labels)."""
        import numpy as np

        if self.backend is None:
            return EncodedBatch.from_lists(self.encode_many(conversations, tools))
        rendered = self._render_all(conversations, tools)
        encodings = self.backend.encode_batch([t for t, _ in rendered], add_special_tokens=False)
        lengths = [len(e) for e in encodings]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int32, total)
        labels = np.full(total, IGNORE_INDEX, dtype=np.int32)
        for base, enc, (_, spans) in zip(offsets.tolist(), encodings, rendered, strict=False):
            for start, end in spans:
                a = _token_at(enc, start, end, forward=True)
                b = _token_at(enc, end - 1, start - 1, forward=False)
                if a is not None and b is not None:
                    labels[base + a : base + b + 1] = ids[base + a : base + b + 1]
        batch = EncodedBatch(ids, labels, offsets)
        if self.bos_id is not None and len(batch):
            starts = offsets[:-1]
            first = np.where(
                np.asarray(lengths) > 0, ids[np.minimum(starts, max(total - 1, 0))], -1
            )
            second = np.where(
                np.asarray(lengths) > 1, ids[np.minimum(starts + 1, max(total - 1, 0))], -1
            )
            doubled = (first == self.bos_id) & (second == self.bos_id)
            missing = (first != self.bos_id) & self.adds_bos
            if doubled.any() or missing.any():  # rare: fix those rows one by one
                pairs = [
                    self._one_bos(ids[a:b].tolist(), labels[a:b].tolist())
                    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
                ]
                batch = EncodedBatch.from_lists(pairs)
        return batch

    def _mask(self, enc, spans: list[tuple[int, int]]) -> tuple[list, list]:
        ids = enc.ids
        labels = [IGNORE_INDEX] * len(ids)
        for start, end in spans:
            a = _token_at(enc, start, end, forward=True)
            b = _token_at(enc, end - 1, start - 1, forward=False)
            if a is None or b is None:
                continue
            labels[a : b + 1] = ids[a : b + 1]
        return ids, labels

    def _encode_slow(self, text: str, spans: list[tuple[int, int]]) -> tuple[list, list]:
        # Python tokenizers have no offsets: encode the pieces between span edges separately.
        ids: list[int] = []
        labels: list[int] = []
        edges = sorted({0, len(text), *(p for s in spans for p in s)})
        for a, b in zip(edges, edges[1:], strict=False):
            piece = self.tokenizer.encode(text[a:b], add_special_tokens=False)
            trained = any(s <= a and b <= e for s, e in spans)
            ids += piece
            labels += piece if trained else [IGNORE_INDEX] * len(piece)
        return ids, labels

    def _one_bos(self, ids: list, labels: list) -> tuple[list, list]:
        if self.bos_id is None:
            return ids, labels
        lead = 0
        while lead < len(ids) and ids[lead] == self.bos_id:
            lead += 1
        if lead > 1:
            return ids[lead - 1 :], labels[lead - 1 :]
        if lead == 0 and self.adds_bos:
            return [self.bos_id, *ids], [IGNORE_INDEX, *labels]
        return ids, labels


def _token_at(enc, pos: int, stop: int, *, forward: bool) -> int | None:
    """The token covering character ``pos``, searching towards ``stop`` over characters that
    belong to no token."""
    step = 1 if forward else -1
    while pos != stop:
        t = enc.char_to_token(pos)
        if t is not None:
            return t
        pos += step
    return None


def finish(
    ids: list,
    labels: list,
    *,
    max_seq_length: int | None,
    truncate: bool,
    where: str = "conversation",
) -> dict:
    """Apply the length policy and the zero-trainable check to one encoded conversation."""
    if max_seq_length is not None and len(ids) > max_seq_length:
        if not truncate:
            raise TooLong(
                f"{where} has {len(ids)} tokens, more than max_seq_length={max_seq_length}",
                hint="raise max_seq_length, set truncate: true, or let pt-data build drop it",
            )
        ids, labels = ids[:max_seq_length], labels[:max_seq_length]
    if all(label == IGNORE_INDEX for label in labels):
        raise NoTrainableTokens(
            f"{where} has no trainable tokens (the loss mask is all -100)",
            hint="it needs an assistant message with content that the chat template renders; "
            "after truncation, a longer max_seq_length may be needed",
        )
    return {"input_ids": list(ids), "labels": list(labels)}


_cache: dict[tuple, ConversationTokenizer] = {}


def get_conversation_tokenizer(
    tokenizer: Any, chat_template: str | None = None, train_on: TrainOn = "assistant"
) -> ConversationTokenizer:
    key = (id(tokenizer), chat_template, train_on)
    ct = _cache.get(key)
    if ct is None or ct.tokenizer is not tokenizer:
        ct = _cache[key] = ConversationTokenizer(
            tokenizer, chat_template=chat_template, train_on=train_on
        )
    return ct


def tokenize_conversation(
    tokenizer: Any,
    messages: list[dict],
    *,
    max_seq_length: int | None = None,
    train_on: TrainOn = "assistant",
    truncate: bool = False,
    chat_template: str | None = None,
    tools: Any = None,
) -> dict:
    """One conversation -> ``{"input_ids": [...], "labels": [...]}``.

    ``train_on="assistant"`` trains every assistant turn (content and end-of-turn
    token; an assistant turn of tool calls too), ``"last"`` only the final one; ``tool``
    turns are never trained. ``tools``: the row's tool schemas, passed to the template.
    Longer than ``max_seq_length``: raises :class:`TooLong` unless ``truncate`` keeps the
    first ``max_seq_length`` tokens. A mask with no trained token raises
    :class:`NoTrainableTokens`.
    """
    ct = get_conversation_tokenizer(tokenizer, chat_template, train_on)
    ids, labels = ct.encode(messages, tools)
    return finish(ids, labels, max_seq_length=max_seq_length, truncate=truncate)


# --------------------------------------------------------------------------- in parallel


class EncodedBatch:
    """Many tokenized conversations held flat: ``ids``/``labels`` (int32) and ``offsets``
    (n+1), cheap to send between processes and to pack without Python lists."""

    def __init__(self, ids, labels, offsets, trained=None):
        self.ids, self.labels, self.offsets = ids, labels, offsets
        self.trained = trained  # tokens with a label per sequence, once counted

    @classmethod
    def from_lists(cls, pairs: Sequence[tuple[list, list]]) -> EncodedBatch:
        import numpy as np

        lengths = [len(ids) for ids, _ in pairs]
        total = sum(lengths)
        offsets = np.zeros(len(pairs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter(chain.from_iterable(p[0] for p in pairs), dtype=np.int32, count=total)
        labels = np.fromiter(chain.from_iterable(p[1] for p in pairs), dtype=np.int32, count=total)
        return cls(ids, labels, offsets)

    @classmethod
    def concat(cls, batches: list) -> EncodedBatch:
        """The batches end to end. Each entry of ``batches`` is set to None once copied,
        so that the batches and their concatenation are not all in memory at once."""
        import numpy as np

        if not batches:
            return cls(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64))
        sizes = [int(b.offsets[-1]) for b in batches]
        counts = [len(b) for b in batches]
        total, n = sum(sizes), sum(counts)
        ids = np.empty(total, dtype=np.int32)
        labels = np.empty(total, dtype=np.int32)
        offsets = np.zeros(n + 1, dtype=np.int64)
        counted = all(b.trained is not None for b in batches)
        trained = np.empty(n, dtype=np.int64) if counted else None
        at = row = 0
        for k, (size, count) in enumerate(zip(sizes, counts, strict=True)):
            b = batches[k]
            ids[at : at + size] = b.ids
            labels[at : at + size] = b.labels
            offsets[row + 1 : row + count + 1] = b.offsets[1:] + at
            if trained is not None:
                trained[row : row + count] = b.trained
            at, row = at + size, row + count
            batches[k] = None
        return cls(ids, labels, offsets, trained)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self):
        return self.offsets[1:] - self.offsets[:-1]

    def trained_counts(self):
        """Tokens with a label, per sequence (counted once)."""
        import numpy as np

        if self.trained is None:
            sums = np.zeros(len(self.labels) + 1, dtype=np.int64)
            np.cumsum(self.labels != IGNORE_INDEX, out=sums[1:])
            self.trained = sums[self.offsets[1:]] - sums[self.offsets[:-1]]
        return self.trained

    def select(self, keep, max_len: int | None = None) -> EncodedBatch:
        """The sequences at indices ``keep``, each cut to ``max_len`` tokens if given."""
        import numpy as np

        from pt_data.pack import gather_segments

        keep = np.asarray(keep, dtype=np.int64)
        lengths = self.lengths
        if max_len is not None:
            lengths = np.minimum(lengths, max_len)
        index, offsets = gather_segments(self.offsets, keep, lengths)
        trained = self.trained[keep] if self.trained is not None and max_len is None else None
        return EncodedBatch(self.ids[index], self.labels[index], offsets, trained)


_worker: tuple | None = None  # (function, state) in a pool process


def _init_worker(fn, state) -> None:
    global _worker
    _worker = (fn, state)
    # Ctrl-C reaches the whole process group: the parent alone handles it (and stops the
    # processes); a process interrupted inside the task queue's lock would hold it forever
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_chunk(chunk: Sequence):
    assert _worker is not None
    fn, state = _worker
    return fn(state, chunk)


class ChunkPool:
    """``fn(state, chunk)`` over chunks of a list, in ``num_proc`` processes forked once (on
    first need: a list of one chunk is not worth starting processes for). With one process
    there is no pool at all. Results come back in input order, one per chunk."""

    def __init__(self, fn, state, num_proc: int | None = None, chunk_size: int = 256):
        self.fn, self.state = fn, state
        self.num_proc = num_proc or default_num_proc()
        self.chunk_size = chunk_size
        self.pool = None

    def map_chunks(self, items: Sequence) -> list:
        return self.submit_chunks(items)()

    def submit_chunks(self, items: Sequence):
        """Start ``fn`` over the chunks of ``items``; returns at once (with processes) a
        function that waits for the results, one per chunk in order: the caller works
        meanwhile. In one process (or for one chunk), the work is done here."""
        chunks = [items[i : i + self.chunk_size] for i in range(0, len(items), self.chunk_size)]
        if self.num_proc > 1 and len(chunks) > 1:
            pending = self._start_pool().map_async(_run_chunk, chunks, chunksize=1)
            return pending.get
        results = [self.fn(self.state, c) for c in chunks]
        return lambda: results

    def start(self) -> None:
        """Fork the processes now (with ``num_proc`` > 1), while this process is small:
        each keeps a copy of what it was forked with."""
        if self.num_proc > 1:
            self._start_pool()

    def _start_pool(self):
        if self.pool is None:
            methods = mp.get_all_start_methods()
            ctx = mp.get_context("fork" if "fork" in methods else None)
            self.pool = ctx.Pool(
                self.num_proc, initializer=_init_worker, initargs=(self.fn, self.state)
            )
        return self.pool

    def raise_errors(self, results: list, ids: Sequence[Any] | None, what: str) -> None:
        """Errors travel back as data, ``(index in chunk, message, hint)`` (a pickled
        exception would lose its hint): raise the first, naming its row."""
        for n, result in enumerate(results):
            if isinstance(result, tuple):
                i, message, hint = result
                index = n * self.chunk_size + i
                who = f"row {ids[index]!r}" if ids is not None else f"{what} {index}"
                raise InputError(f"{who}: {message}", hint=hint)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None

    def abort(self) -> None:
        """Stop the processes at once (an error or Ctrl-C: their work is not wanted, and
        waiting for them to finish it could wait forever)."""
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.abort()
        self.close()


def _encode_flat(ct: ConversationTokenizer, chunk: list[tuple[list[dict], Any]]):
    """``chunk``: ``(messages, tools)`` per conversation."""
    conversations, tools = [m for m, _ in chunk], [t for _, t in chunk]
    try:
        batch = ct.encode_flat(conversations, tools)
        batch.trained_counts()  # counted here, in parallel
        return batch
    except InputError:
        for i, (messages, row_tools) in enumerate(chunk):
            try:
                ct.encode(messages, row_tools)
            except InputError as exc:
                return (i, exc.message, exc.hint)
        raise


class ParallelEncoder(ChunkPool):
    """Tokenize lists of conversations over ``num_proc`` processes (forked once).

    ``encoder(conversations, ids, tools)`` -> :class:`EncodedBatch` in input order;
    ``tools``: each conversation's tool schemas (its row's ``tools``), or None.
    """

    def __init__(
        self, ct: ConversationTokenizer, num_proc: int | None = None, chunk_size: int = 256
    ):
        super().__init__(_encode_flat, ct, num_proc, chunk_size)
        self.ct = ct

    def __call__(
        self,
        conversations: Sequence[list[dict]],
        ids: Sequence[Any] | None = None,
        tools: Sequence[Any] | None = None,
    ):
        return self.submit(conversations, ids, tools)()

    def submit(
        self,
        conversations: Sequence[list[dict]],
        ids: Sequence[Any] | None = None,
        tools: Sequence[Any] | None = None,
    ):
        """Start tokenizing; returns a function that waits for the :class:`EncodedBatch`."""
        if tools is None:
            tools = [None] * len(conversations)
        wait = self.submit_chunks(list(zip(conversations, tools, strict=True)))

        def result() -> EncodedBatch:
            results = wait()
            self.raise_errors(results, ids, "conversation")
            return EncodedBatch.concat(results)  # (frees each result once copied)

        return result


def default_num_proc() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def as_turns(value: Any, role: str, column: str) -> list[dict]:
    """A string or a message list as a message list: role and content (text parts joined
    into text), and the tool-use keys a message has (``tool_calls``, ``tool_call_id``,
    ``name``). Malformed roles and contents are left for the filters to count."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return [
            as_template_message(
                {
                    "role": m.get("role"),
                    "content": m.get("content"),
                    **{k: m[k] for k in TOOL_KEYS if m.get(k) is not None},
                },
                f"column {column!r} message {i}",
            )
            for i, m in enumerate(value)
        ]
    raise InputError(
        f"column {column!r} holds {type(value).__name__}; expected a string or a list of messages"
    )
