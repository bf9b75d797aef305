"""The simulator's tokenizer: counts a client can rely on, chat template overhead, round trips."""

from __future__ import annotations

import pytest

from pytest_llmperf.sim.textgen import WORD_TABLE
from pytest_llmperf.sim.tokenizer import (
    BOS_ID,
    MAX_PIECE_CHARS,
    VOCAB_WORDS,
    SimTokenizer,
    TokenizerError,
    chat_overhead_tokens,
)

WORDS = ["the", "data", "model", "system", "value", "time", "people", "world"]


@pytest.mark.parametrize("k", [1, 7, 100, 1000])
def test_k_short_words_are_k_tokens(k):
    tok = SimTokenizer()
    text = "".join(" " + WORDS[i % len(WORDS)] for i in range(k))
    assert len(tok.encode(text)) == k
    assert len(tok.encode(text.lstrip())) == k
    assert tok.count(text) == k
    # Words outside the built-in vocabulary count the same way (hashed ids, still one token).
    assert len(tok.encode(" zyx" * k)) == k


def test_long_words_split_into_fixed_pieces():
    tok = SimTokenizer()
    word = " " + "a" * 24  # 25 characters with its space
    assert len(tok.encode(word)) == -(-25 // MAX_PIECE_CHARS) == 3
    assert tok.count("x" * MAX_PIECE_CHARS) == 1
    assert tok.count("x" * (MAX_PIECE_CHARS + 1)) == 2


def test_whitespace_and_punctuation_pieces():
    tok = SimTokenizer()
    assert tok.pieces("hello, world\n\nnext  two") == ["hello,", " world", "\n\n", "next", " ", " two"]


def test_special_tokens_and_chat_template_overhead():
    tok = SimTokenizer()
    assert tok.encode("the data", add_special_tokens=True) == [BOS_ID] + tok.encode("the data")
    messages = [{"role": "user", "content": " the data model"}]
    assert len(tok.encode_chat(messages)) == 3 + chat_overhead_tokens(1) == 3 + 10
    assert len(tok.encode_chat(messages, add_generation_prompt=False)) == 3 + chat_overhead_tokens(1, False)
    two = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "the data"}]}]
    assert len(tok.encode_chat(two)) == 4 + chat_overhead_tokens(2)


def test_round_trip_and_determinism():
    text = "The quick, brown fox\n\njumped  over supercalifragilistic words 12345!"
    a, b = SimTokenizer(), SimTokenizer()
    ids = a.encode(text)
    assert a.decode(ids) == text
    assert b.encode(text) == ids  # stable across instances (and processes: crc32, not hash())
    assert a.decode(a.encode(" the data")) == " the data"


def test_generated_words_are_single_tokens():
    tok = SimTokenizer()
    for word in VOCAB_WORDS:
        assert len(tok.encode(" " + word)) == 1, word
    sample = "".join(WORD_TABLE[:500])
    assert len(tok.encode(sample)) == 500


@pytest.mark.parametrize(
    "messages, where",
    [([], "messages"), ("hi", "messages"), ([{"content": "x"}], r"messages\[0\].role"),
     ([{"role": "user", "content": 3}], r"messages\[0\].content"),
     ([{"role": "user", "content": [{"type": "image_url"}]}], r"messages\[0\].content\[0\]")],
)
def test_bad_messages_name_the_field(messages, where):
    with pytest.raises(TokenizerError, match=where):
        SimTokenizer().encode_chat(messages)


def test_decode_rejects_bad_ids():
    with pytest.raises(TokenizerError, match="tokens"):
        SimTokenizer().decode([1, -5])
