"""A tiny llama-architecture GGUF with random weights, for running a real engine in tests.

Nothing is downloaded: the vocabulary, merges and weights are generated here and written with the
``gguf`` package (``pip install 'pytest-llmperf[llamacpp]'``). The model is useless as a language
model but well behaved as a load-test target:

- Tokenizer: byte-level BPE (``tokenizer.ggml.model = "gpt2"``, pre-tokenizer ``gpt-2``): the 256
  byte tokens, every given word as one token both with a leading space (``Ġword``) and bare, the
  intermediate tokens its merges pass through, and ChatML's control tokens, with a chat template
  that puts nothing before the user's text (see :data:`CHAT_TEMPLATE`). Prompts built from the
  plugin's :data:`~pytest_llmperf.load.prompts.COMMON_WORDS` therefore have exact token counts.
- Generation stays on whole space-led words and never reaches EOS: embedding channel
  :data:`CONSTANT_CHANNEL` holds the same value for every token and no layer writes to it, so after
  the final norm it is a large positive constant; the output rows put a large positive weight on it
  for space-led words and a large negative one for everything else (bytes, prefixes, bare words,
  control tokens). Every generated token is then a complete word, so each streamed chunk carries
  visible text (byte tokens of split UTF-8 would be held back by the server), and without EOS every
  request generates exactly ``max_tokens`` tokens even where ``ignore_eos`` is not honoured.

The same file serves the other request kinds without changes: ``llama-server --embeddings
--pooling mean`` (or ``last``) answers ``/v1/embeddings`` with the final hidden state pooled
(``n_embd`` floats, L2-normalised), and ``--reranking`` answers ``/v1/rerank``: rank pooling on a
causal model takes the last token's hidden state, and with no classification head in the file the
score is its first element. :func:`build_tiny_mmproj_gguf` writes the vision half for images: a
CLIP-style encoder with LLaVA's two-layer MLP projector (``clip.projector_type = "mlp"``) that
``llama-server --mmproj`` loads next to the text model; every image becomes
:func:`mmproj_image_tokens` tokens of the prompt, whatever its size (LLaVA 1.5 resizes every image
to one square).

Tool calls, structured output, speculative decoding and LoRA need no other model either. With
``tools=True`` (the default) the vocabulary ends with ``<tool_call>``, ``</tool_call>`` and
``<|tools|>``, and the chat template (:data:`TOOLS_CHAT_TEMPLATE`) renders tool calls the
Qwen/Hermes way, which llama.cpp's template analysis reads as a JSON tool-call format; a prompt
that offers tools ends with ``<|tools|>``, the one token that writes embedding channel
:data:`TOOLS_CHANNEL`, which only ``<tool_call>``'s output row reads: the model opens a call at
once, and llama.cpp's tool-call grammar writes the rest (a random model left to
``tool_choice: required`` alone would write words before a call forever: that grammar allows text
first). A JSON-schema ``response_format`` needs nothing: its grammar makes any model answer valid
JSON, as long as the schema bounds its strings (``maxLength``, ``enum``: the model prefers another
word to a closing quote). The same file is a draft model for itself (same weights: a greedy draft
is always accepted); another ``seed`` gives a draft that (next to) never is.
:func:`build_tiny_lora_gguf` writes LoRA adapters for it (``llama-server --lora``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.load.prompts import COMMON_WORDS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

BOS_EOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
CONTROL_TOKENS = (BOS_EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
# ChatML's turn markers after the text only: a role header before it ("<|im_start|>user\n") would
# be a prefix shared by every request, and with the short prompts of a test it alone would exceed
# the share of cached prompt tokens a cold run may show.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>' }}{% endif %}"
)
CONSTANT_CHANNEL = 0
# Tool calls (see TOOLS_CHAT_TEMPLATE): Qwen/Hermes-style call markers, and the token the template
# ends a prompt with when the request offers tools, in place of <|im_start|>.
TOOL_CALL_TOKEN = "<tool_call>"
TOOL_CALL_END_TOKEN = "</tool_call>"
TOOLS_PROMPT_TOKEN = "<|tools|>"
TOOL_TOKENS = (TOOL_CALL_TOKEN, TOOL_CALL_END_TOKEN, TOOLS_PROMPT_TOKEN)
# The chat template with tool calls: plain chat renders exactly as CHAT_TEMPLATE; an assistant turn
# that called a tool renders its (first) call as <tool_call>{"name": ..., "arguments": ...}</tool_call>,
# which llama.cpp's template analysis reads as a JSON tool-call format opened by "<tool_call>"; a
# request that offers tools ends with <|tools|> instead of <|im_start|> (one token either way, so
# prompt lengths stay exact). Only the first call of a turn is rendered: the template does not
# support parallel calls, so llama.cpp's grammar ends the answer after one call. The tools
# themselves are not described (the model cannot read), only their names are looked at, which
# tells llama.cpp the template knows tools.
TOOLS_CHAT_TEMPLATE = (
    "{%- for tool in tools or [] %}{%- set _name = tool.function.name %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- set call = message['tool_calls'][0]['function'] %}"
    "{%- set arguments = call['arguments'] if call['arguments'] is string else call['arguments'] | tojson %}"
    "{{ '<tool_call>{\"name\": \"' + call['name'] + '\", \"arguments\": ' + arguments + '}</tool_call><|im_end|>\\n' }}"
    "{%- else %}{{ message['content'] + '<|im_end|>' + '\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|tools|>' if tools else '<|im_start|>' }}{%- endif %}"
)
# The residual channel only <|tools|> writes (its embedding; no layer writes to it), and the
# output weight on it that makes <tool_call> the first token of an answer to a request with tools.
TOOLS_CHANNEL = 1
_TOOLS_VALUE = 1.0
_TOOLS_BIAS = 20.0
# Embedding value on the constant channel, and the output weight (+ for words, - for the rest) on
# it: with random parts of std ~0.1 and ~0.5, words win by about 60 logits.
_CONSTANT_VALUE = 1.0
_CHANNEL_BIAS = 5.0
_EMBED_STD = 0.1
_OUTPUT_STD = 0.5


class TinyModelError(InputError):
    """Arguments that cannot make a model; the message names the argument."""


class GgufMismatch(LLMPerfError, RuntimeError):
    """The installed gguf package names the llama tensors differently from this module."""


@dataclass(frozen=True)
class TinyVocab:
    """The tokenizer half of the model: token strings (byte-level spelling), their GGUF token
    types, merges in rank order, and the ids that matter to a test."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    word_ids: tuple[int, ...]  # the space-led words: the only tokens generation can produce
    bos_id: int
    eos_id: int
    eot_id: int
    # The tool-call tokens (with_tool_tokens), when the vocabulary has them.
    tool_call_id: int | None = None
    tools_prompt_id: int | None = None


def with_tool_tokens(vocab: TinyVocab) -> TinyVocab:
    """``vocab`` with :data:`TOOL_TOKENS` appended: the call markers as user-defined tokens (the
    tokenizer keeps them whole in text, as Qwen's vocabulary does), ``<|tools|>`` as a control
    token. The ids of every other token stay as they were."""
    if vocab.tool_call_id is not None:
        return vocab
    start = len(vocab.tokens)
    return dataclasses.replace(
        vocab,
        tokens=(*vocab.tokens, *TOOL_TOKENS),
        token_types=(*vocab.token_types, 4, 4, 3),  # gguf.TokenType USER_DEFINED, USER_DEFINED, CONTROL
        tool_call_id=start,
        tools_prompt_id=start + 2,
    )


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are spelled in."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def spell(text: str, table: dict[int, str]) -> str:
    """``text`` in the byte-level spelling of ``table`` (a leading space becomes "Ġ")."""
    return "".join(table[b] for b in text.encode("utf-8"))


def bpe(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Plain BPE as llama.cpp applies it to one pre-tokenized word: merge the lowest-ranked
    adjacent pair (leftmost on ties) until no pair has a rank."""
    while len(symbols) > 1:
        best: tuple[int, int] | None = None
        for i in range(len(symbols) - 1):
            rank = ranks.get((symbols[i], symbols[i + 1]))
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return symbols


def _extend(spelled: str, ranks: dict[tuple[str, str], int]) -> bool:
    """Add the merges that make ``spelled`` one token, ranked after every existing merge; undo
    them and return False when the word still splits.

    The word is first tokenized with the merges so far (pieces p1..pm); the new merges join the
    pieces left to right. Ranked last, they cannot change how any word accepted earlier is
    tokenized: each step of that word's tokenization already had a lower-ranked merge to apply.
    """
    pieces = bpe(list(spelled), ranks)
    if len(pieces) == 1:
        return True
    added: list[tuple[str, str]] = []
    acc = pieces[0]
    for piece in pieces[1:]:
        pair = (acc, piece)
        if pair not in ranks:
            ranks[pair] = len(ranks)
            added.append(pair)
        acc += piece
    if len(bpe(list(spelled), ranks)) == 1:
        return True
    for pair in added:  # appended last, so removing them keeps ranks contiguous
        del ranks[pair]
    return False


def build_vocab(words: Iterable[str]) -> TinyVocab:
    """The byte-level BPE vocabulary for ``words`` (each becomes one token with a leading space).

    Space-led words get their merges first, so they always come out whole. Bare words (the first
    word of a prompt has no space before it) are added afterwards where a simulated tokenization
    shows they come out as one token without disturbing the others; the rest cost a few tokens
    each, as rare words do in any real vocabulary.
    """
    table = bytes_to_unicode()
    unique: list[str] = []
    for word in words:
        if not isinstance(word, str) or not word or any(ch.isspace() for ch in word):
            raise TinyModelError(f"vocab_words: each word must be a non-empty string without spaces, got {word!r}")
        if word not in unique:
            unique.append(word)
    if not unique:
        raise TinyModelError("vocab_words: give at least one word")

    ranks: dict[tuple[str, str], int] = {}
    spaced = [spell(" " + w, table) for w in unique]
    for s, w in zip(spaced, unique):
        if not _extend(s, ranks):  # cannot happen: only "Ġ"-led merges exist at this point
            raise TinyModelError(f"vocab_words: {w!r} would not tokenize as one token")
    for w in unique:
        _extend(spell(w, table), ranks)
    merges = sorted(ranks, key=ranks.__getitem__)

    tokens: list[str] = list(CONTROL_TOKENS)
    types: list[int] = [3] * len(CONTROL_TOKENS)  # gguf.TokenType.CONTROL
    byte_tokens = [table[b] for b in range(256)]
    tokens += byte_tokens
    types += [1] * len(byte_tokens)  # NORMAL: byte-level BPE vocabularies type bytes as normal
    index = {t: i for i, t in enumerate(tokens)}
    for left, right in merges:
        merged = left + right
        if merged not in index:
            index[merged] = len(tokens)
            tokens.append(merged)
            types.append(1)
    return TinyVocab(
        tokens=tuple(tokens),
        token_types=tuple(types),
        merges=tuple(f"{left} {right}" for left, right in merges),
        word_ids=tuple(index[s] for s in spaced),
        bos_id=index[BOS_EOS_TOKEN],
        eos_id=index[BOS_EOS_TOKEN],
        eot_id=index[IM_END_TOKEN],
    )


def _check_dims(n_layer: int, n_embd: int, n_head: int, n_ff: int, ctx: int) -> None:
    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head), ("n_ff", n_ff), ("ctx", ctx)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TinyModelError(f"{name} must be a positive integer, got {value!r}")
    if n_embd % n_head:
        raise TinyModelError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
    if (n_embd // n_head) % 2:
        raise TinyModelError(f"the head size n_embd/n_head ({n_embd // n_head}) must be even (RoPE rotates pairs)")
    if n_embd < 2:
        raise TinyModelError("n_embd must be at least 2 (one channel is held constant)")


def _weights(vocab: TinyVocab, *, n_layer: int, n_embd: int, n_ff: int, seed: int) -> dict[str, np.ndarray]:
    """Tensors in numpy (row-major) shape, i.e. GGUF dims reversed, as convert_hf_to_gguf writes
    them: a linear layer is (out_features, in_features)."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab.tokens)
    c = CONSTANT_CHANNEL

    def linear(out_f: int, in_f: int) -> np.ndarray:
        return rng.normal(0.0, 0.5 / np.sqrt(in_f), size=(out_f, in_f)).astype(np.float32)

    embd = rng.normal(0.0, _EMBED_STD, size=(n_vocab, n_embd)).astype(np.float32)
    embd[:, c] = _CONSTANT_VALUE
    output = rng.normal(0.0, _OUTPUT_STD, size=(n_vocab, n_embd)).astype(np.float32)
    output[:, c] = -_CHANNEL_BIAS
    output[list(vocab.word_ids), c] = _CHANNEL_BIAS
    if vocab.tools_prompt_id is not None:
        # Only <|tools|> writes the tools channel and only <tool_call> reads it: the first token of an
        # answer to a request with tools (its prompt ends with <|tools|>) is <tool_call>; anywhere
        # else the channel is 0 and <tool_call> stays as far out of reach as every other non-word.
        t = TOOLS_CHANNEL
        embd[:, t] = 0.0
        embd[vocab.tools_prompt_id, t] = _TOOLS_VALUE
        output[:, t] = 0.0
        output[vocab.tool_call_id, t] = _TOOLS_BIAS
    ones = np.ones(n_embd, dtype=np.float32)

    tensors = {"token_embd.weight": embd, "output_norm.weight": ones.copy(), "output.weight": output}
    for i in range(n_layer):
        attn_out = linear(n_embd, n_embd)
        ffn_down = linear(n_embd, n_ff)
        # No layer writes to the constant channel (or the tools channel), so the residual stream
        # keeps it unchanged.
        attn_out[c, :] = 0.0
        ffn_down[c, :] = 0.0
        if vocab.tools_prompt_id is not None:
            attn_out[TOOLS_CHANNEL, :] = 0.0
            ffn_down[TOOLS_CHANNEL, :] = 0.0
        tensors.update({
            f"blk.{i}.attn_norm.weight": ones.copy(),
            f"blk.{i}.attn_q.weight": linear(n_embd, n_embd),
            f"blk.{i}.attn_k.weight": linear(n_embd, n_embd),
            f"blk.{i}.attn_v.weight": linear(n_embd, n_embd),
            f"blk.{i}.attn_output.weight": attn_out,
            f"blk.{i}.ffn_norm.weight": ones.copy(),
            f"blk.{i}.ffn_gate.weight": linear(n_ff, n_embd),
            f"blk.{i}.ffn_up.weight": linear(n_ff, n_embd),
            f"blk.{i}.ffn_down.weight": ffn_down,
        })
    return tensors


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise ImportError(
            "building a tiny GGUF model needs the 'gguf' package: "
            "pip install 'pytest-llmperf[llamacpp]' (or pip install gguf)"
        ) from exc
    return gguf


def _check_tensor_names(gguf: Any, names: Sequence[str], n_layer: int) -> None:
    # The names above are spelled out for readability; make sure they are what gguf-py (and so
    # llama.cpp) calls the llama tensors, so a rename upstream fails here, not in the server.
    arch = gguf.MODEL_ARCH.LLAMA
    known: set[str] = set()
    for tensor in gguf.MODEL_TENSORS[arch]:
        template = gguf.TENSOR_NAMES[tensor]
        known.update(template.format(bid=i) + ".weight" for i in range(n_layer))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise GgufMismatch(f"gguf {getattr(gguf, '__version__', '?')} does not name llama tensors {unknown}")


def build_tiny_llama_gguf(
    path: str | os.PathLike[str],
    *,
    vocab_words: Sequence[str] = COMMON_WORDS,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_ff: int = 128,
    ctx: int = 2048,
    seed: int = 0,
    tools: bool = True,
) -> Path:
    """Write a random-weight llama GGUF to ``path`` and return the path.

    ``vocab_words`` become single tokens (with a leading space; the default is the words the
    plugin builds prompts from). With ``tools`` (the default) the model calls tools: the
    vocabulary ends with :data:`TOOL_TOKENS`, the chat template is :data:`TOOLS_CHAT_TEMPLATE`, and
    an answer to a request that offers tools opens with ``<tool_call>`` (llama.cpp's tool-call
    grammar then writes a call to one of them); plain chat is unchanged. ``tools=False`` writes the
    plain vocabulary and :data:`CHAT_TEMPLATE`. The same arguments always produce the same file.
    The file is written next to ``path`` and renamed into place, so a reader never sees half a
    model.
    """
    _check_dims(n_layer, n_embd, n_head, n_ff, ctx)
    if isinstance(vocab_words, str):
        raise TinyModelError("vocab_words must be a sequence of words, not one string")
    if tools and n_embd < 3:
        raise TinyModelError("n_embd must be at least 3 with tools (one channel is held constant, one marks tools)")
    gguf = _import_gguf()
    vocab = build_vocab(vocab_words)
    if tools:
        vocab = with_tool_tokens(vocab)
    tensors = _weights(vocab, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, seed=seed)
    _check_tensor_names(gguf, list(tensors), n_layer)

    out = _target(path)

    def fill(writer: Any) -> None:
        writer.add_name("pytest-llmperf tiny random llama")
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_context_length(ctx)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head)
        writer.add_rope_dimension_count(n_embd // n_head)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(len(vocab.tokens))
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(list(vocab.tokens))
        writer.add_token_types(list(vocab.token_types))
        writer.add_token_merges(list(vocab.merges))
        writer.add_bos_token_id(vocab.bos_id)
        writer.add_eos_token_id(vocab.eos_id)
        writer.add_eot_token_id(vocab.eot_id)
        writer.add_add_bos_token(False)
        writer.add_chat_template(TOOLS_CHAT_TEMPLATE if tools else CHAT_TEMPLATE)
        for name, array in tensors.items():
            writer.add_tensor(name, array)

    return _write_gguf(gguf, out, "llama", fill)


def _target(path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    if out.is_dir():
        raise TinyModelError(f"path {str(out)!r} is a directory; give a file name such as tiny.gguf")
    return out


def _write_gguf(gguf: Any, out: Path, arch: str, fill: Callable[[Any], None]) -> Path:
    """Write a GGUF of architecture ``arch`` (``fill`` adds its keys and tensors) next to ``out``
    and rename it into place, so a reader never sees half a model."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        fill(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    os.replace(tmp, out)
    return out


# ---------------------------------------------------------------------------- images (mmproj)

# CLIP's normalisation is irrelevant to random weights; 0.5 maps pixels to [-1, 1].
_IMAGE_MEAN_STD = (0.5, 0.5, 0.5)


def mmproj_image_tokens(image_size: int = 32, patch_size: int = 8) -> int:
    """Prompt tokens one image takes with :func:`build_tiny_mmproj_gguf`'s projector: one per
    patch of the square the image is resized to, ``(image_size / patch_size)²`` (LLaVA 1.5 keeps
    no class token in the output and adds no begin/end tokens)."""
    return (image_size // patch_size) ** 2


def _mmproj_weights(*, n_embd_text: int, n_embd: int, n_ff: int, n_layer: int, image_size: int,
                    patch_size: int, seed: int) -> dict[str, np.ndarray]:
    """The vision tower and projector in numpy (row-major) shape, as convert_hf_to_gguf writes a
    LLaVA mmproj: linear layers (out_features, in_features), the patch convolution
    (n_embd, 3, patch, patch), one position embedding per patch (no class token)."""
    rng = np.random.default_rng([seed, 1])

    def linear(out_f: int, in_f: int) -> np.ndarray:
        return rng.normal(0.0, 0.5 / np.sqrt(in_f), size=(out_f, in_f)).astype(np.float32)

    n_pos = mmproj_image_tokens(image_size, patch_size)
    ones, zeros = np.ones(n_embd, dtype=np.float32), np.zeros(n_embd, dtype=np.float32)
    tensors = {
        "v.patch_embd.weight": rng.normal(0.0, 0.1, size=(n_embd, 3, patch_size, patch_size)).astype(np.float32),
        "v.position_embd.weight": rng.normal(0.0, 0.1, size=(n_pos, n_embd)).astype(np.float32),
    }
    for i in range(n_layer):
        p = f"v.blk.{i}."
        tensors.update({
            p + "ln1.weight": ones.copy(), p + "ln1.bias": zeros.copy(),
            p + "attn_q.weight": linear(n_embd, n_embd), p + "attn_k.weight": linear(n_embd, n_embd),
            p + "attn_v.weight": linear(n_embd, n_embd), p + "attn_out.weight": linear(n_embd, n_embd),
            p + "ln2.weight": ones.copy(), p + "ln2.bias": zeros.copy(),
            p + "ffn_up.weight": linear(n_ff, n_embd), p + "ffn_up.bias": np.zeros(n_ff, dtype=np.float32),
            p + "ffn_down.weight": linear(n_embd, n_ff), p + "ffn_down.bias": zeros.copy(),
        })
    # LLaVA's projector: mm.0 (vision -> text width), GELU, mm.2 (text -> text width).
    tensors.update({
        "mm.0.weight": linear(n_embd_text, n_embd), "mm.0.bias": np.zeros(n_embd_text, dtype=np.float32),
        "mm.2.weight": linear(n_embd_text, n_embd_text), "mm.2.bias": np.zeros(n_embd_text, dtype=np.float32),
    })
    return tensors


def _check_mmproj_names(gguf: Any, names: Sequence[str], n_layer: int) -> None:
    known: set[str] = set()
    for tensor in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.MMPROJ]:
        template = gguf.TENSOR_NAMES[tensor]
        for i in range(max(n_layer, 3)):  # mm.{bid}: the projector's layers 0 and 2
            known.update(template.format(bid=i) + suffix for suffix in (".weight", ".bias"))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise GgufMismatch(f"gguf {getattr(gguf, '__version__', '?')} does not name mmproj tensors {unknown}")


def build_tiny_mmproj_gguf(
    path: str | os.PathLike[str],
    *,
    n_embd_text: int = 64,
    image_size: int = 32,
    patch_size: int = 8,
    n_embd: int = 32,
    n_head: int = 2,
    n_ff: int = 64,
    n_layer: int = 2,
    seed: int = 0,
) -> Path:
    """Write a random-weight multimodal projector (``llama-server --mmproj FILE``) for the text
    model of :func:`build_tiny_llama_gguf` and return the path.

    ``n_embd_text`` must be the text model's ``n_embd`` (llama-server refuses a mismatch at
    start-up). The vision tower is a ``n_layer``-block ViT of width ``n_embd`` over
    ``image_size``-pixel squares cut in ``patch_size`` patches; like LLaVA, the projector reads the
    second-to-last block's output. The same arguments always produce the same file.
    """
    for name, value in (("n_embd_text", n_embd_text), ("image_size", image_size), ("patch_size", patch_size),
                        ("n_embd", n_embd), ("n_head", n_head), ("n_ff", n_ff), ("n_layer", n_layer)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TinyModelError(f"{name} must be a positive integer, got {value!r}")
    if image_size % patch_size:
        raise TinyModelError(f"image_size ({image_size}) must be a multiple of patch_size ({patch_size})")
    if n_embd % n_head:
        raise TinyModelError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
    if n_ff == n_embd:
        # llama.cpp swaps ffn_up/ffn_down of LLaVA files whose ffn_down is n_embd wide on input
        # (old conversions); equal widths would trigger that.
        raise TinyModelError(f"n_ff must differ from n_embd ({n_embd})")
    gguf = _import_gguf()
    tensors = _mmproj_weights(n_embd_text=n_embd_text, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer,
                              image_size=image_size, patch_size=patch_size, seed=seed)
    _check_mmproj_names(gguf, list(tensors), n_layer)
    out = _target(path)
    keys, vision = gguf.Keys.Clip, gguf.Keys.ClipVision

    def fill(writer: Any) -> None:
        writer.add_name("pytest-llmperf tiny random mmproj")
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_bool(keys.HAS_VISION_ENCODER, True)
        writer.add_string(keys.PROJECTOR_TYPE, "mlp")
        writer.add_uint32(vision.IMAGE_SIZE, image_size)
        writer.add_uint32(vision.PATCH_SIZE, patch_size)
        writer.add_uint32(vision.EMBEDDING_LENGTH, n_embd)
        writer.add_uint32(vision.FEED_FORWARD_LENGTH, n_ff)
        writer.add_uint32(vision.PROJECTION_DIM, n_embd_text)
        writer.add_uint32(vision.BLOCK_COUNT, n_layer)
        writer.add_uint32(vision.Attention.HEAD_COUNT, n_head)
        writer.add_float32(vision.Attention.LAYERNORM_EPS, 1e-5)
        writer.add_array(vision.IMAGE_MEAN, list(_IMAGE_MEAN_STD))
        writer.add_array(vision.IMAGE_STD, list(_IMAGE_MEAN_STD))
        for name, array in tensors.items():
            writer.add_tensor(name, array)

    return _write_gguf(gguf, out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ], fill)


# ---------------------------------------------------------------------------- LoRA adapters

LORA_TARGETS = ("attn_q", "attn_v")


def build_tiny_lora_gguf(
    path: str | os.PathLike[str],
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    rank: int = 4,
    alpha: float = 8.0,
    targets: Sequence[str] = LORA_TARGETS,
    seed: int = 0,
) -> Path:
    """Write a random LoRA adapter GGUF for the model of :func:`build_tiny_llama_gguf` (same
    ``n_layer`` and ``n_embd``) and return the path: what llama.cpp's convert_lora_to_gguf.py
    writes for a PEFT adapter (``general.type = "adapter"``, ``adapter.type = "lora"``,
    ``adapter.lora.alpha``; ``blk.N.<target>.weight.lora_a`` of shape (rank, n_embd) and
    ``.lora_b`` of shape (n_embd, rank) in numpy order), which ``llama-server --lora FILE``
    loads and a request applies with ``"lora": [{"id": k, "scale": s}]``.

    The adapter adds ``scale · alpha / rank · B·A`` to each target's weight. The default targets,
    the query and value projections, leave the model's generation rules intact (the value
    projection reaches the residual stream through ``attn_output``, whose constant and tools rows
    are zero): an adapter changes which words are generated, never that they are whole words. The
    same arguments always produce the same file.
    """
    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TinyModelError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise TinyModelError(f"alpha must be a positive number, got {alpha!r}")
    targets = tuple(targets) if not isinstance(targets, str) else (targets,)
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if unknown or not targets:
        raise TinyModelError(f"targets must be among {', '.join(LORA_TARGETS)}, got {list(targets)}")
    gguf = _import_gguf()
    rng = np.random.default_rng([seed, 2])
    tensors: dict[str, np.ndarray] = {}
    for i in range(n_layer):
        for target in targets:
            base = f"blk.{i}.{target}.weight"
            tensors[base + ".lora_a"] = rng.normal(0.0, 1.0 / np.sqrt(n_embd), size=(rank, n_embd)).astype(np.float32)
            tensors[base + ".lora_b"] = rng.normal(0.0, 0.5 / np.sqrt(rank), size=(n_embd, rank)).astype(np.float32)
    _check_tensor_names(gguf, sorted({name.rsplit(".", 1)[0] for name in tensors}), n_layer)
    out = _target(path)

    def fill(writer: Any) -> None:
        writer.add_name("pytest-llmperf tiny random lora")
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        for name, array in tensors.items():
            writer.add_tensor(name, array)

    return _write_gguf(gguf, out, "llama", fill)
