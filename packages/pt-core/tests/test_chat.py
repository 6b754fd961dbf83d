"""The chat format every stage agrees on (pt_core.chat): end-of-turn tokens, tokenizer
fingerprints and template resolution, on the Qwen2.5 tokenizer of the real-shape fixture
and the tiny one."""

from __future__ import annotations

import copy

import pytest

from pt_core.chat import (
    CHATML,
    PLAIN,
    end_of_turn_ids,
    resolve_template,
    tokenizer_fingerprint,
)
from pt_core.errors import ConfigError


def test_end_of_turn_is_the_token_that_closes_a_reply(qwen_tokenizer, tiny_tokenizer):
    """A base Qwen2.5 tokenizer's EOS is <|endoftext|> (151643), but its ChatML template
    closes a reply with <|im_end|> (151645): that is the token a chat model stops on.
    The plain template ends a reply with the EOS itself."""
    assert qwen_tokenizer.eos_token_id == 151643
    assert end_of_turn_ids(qwen_tokenizer) == (151645,)
    assert end_of_turn_ids(qwen_tokenizer, CHATML) == (151645,)
    assert end_of_turn_ids(qwen_tokenizer, PLAIN) == (151643,)
    assert end_of_turn_ids(tiny_tokenizer) == (tiny_tokenizer.convert_tokens_to_ids("<|im_end|>"),)


def test_a_template_that_ends_replies_with_text_has_no_end_of_turn_token(qwen_tokenizer):
    text_only = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}{% endfor %}"
    )
    assert end_of_turn_ids(qwen_tokenizer, text_only) == ()
    bare = copy.deepcopy(qwen_tokenizer)
    bare.chat_template = None
    assert end_of_turn_ids(bare) == ()


def test_fingerprint_is_the_vocabulary(qwen_tokenizer, tiny_tokenizer):
    """Same ids -> same text is what matters: renaming the EOS (as a ChatML checkpoint does)
    or changing the template keeps the fingerprint; another vocabulary changes it."""
    renamed = copy.deepcopy(qwen_tokenizer)
    renamed.eos_token = "<|im_end|>"
    renamed.chat_template = PLAIN
    assert tokenizer_fingerprint(renamed) == tokenizer_fingerprint(qwen_tokenizer)
    assert tokenizer_fingerprint(tiny_tokenizer) != tokenizer_fingerprint(qwen_tokenizer)


def test_resolve_names_the_key_the_user_writes(tmp_path, qwen_tokenizer):
    bare = copy.deepcopy(qwen_tokenizer)
    bare.chat_template = None
    with pytest.raises(ConfigError) as err:
        resolve_template(bare, None, key="data.chat_template")
    assert "data.chat_template" in err.value.hint
    with pytest.raises(ConfigError, match="--chat-template 'nope.jinja'"):
        resolve_template(bare, "nope.jinja", key="--chat-template")
    jinja = tmp_path / "t.jinja"
    jinja.write_text(PLAIN)
    assert resolve_template(bare, str(jinja)) == PLAIN
    assert resolve_template(bare, "chatml") == CHATML


def test_a_template_that_cannot_render_a_reply_leaves_the_eos_alone(qwen_tokenizer):
    """Some templates refuse conversations they do not expect (raise_exception); the stop
    set then falls back to the EOS ids instead of stopping the stage."""
    strict = "{{ raise_exception('only system turns here') }}"
    assert end_of_turn_ids(qwen_tokenizer, strict) == ()
