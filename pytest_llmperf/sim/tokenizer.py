"""A deterministic word-piece-like tokenizer that needs no download.

Rules (docs/simulator.md has them too, for client authors):

- Text splits into pieces: a word with at most one leading space (`` the``, ``data,``), or a
  run of whitespace (when such a run ends in a space before a word, that space goes to the
  word, so ``"a  b"`` is ``a``, `` ``, `` b``; ``"\\n\\n"`` stays one piece).
- A piece of at most ``MAX_PIECE_CHARS`` characters (leading space included) is one token;
  longer pieces are cut into ``MAX_PIECE_CHARS``-character tokens.
- Ids: special tokens first, then the built-in vocabulary (``VOCAB_WORDS`` with and without a
  leading space); any other piece gets ``FIRST_HASHED_ID + crc32(piece) mod 2**30``, stable
  across processes. Decoding hashed ids needs the piece to have been seen by this tokenizer
  instance (a bounded memory of recent pieces).
- Chat template (Llama-3 style): ``<|begin_of_text|>`` then, per message,
  ``<|start_header_id|> role <|end_header_id|> \\n\\n content <|eot_id|>``, then with
  ``add_generation_prompt`` the same header for ``assistant``. Overhead: 1 + 5 per message + 4.
- Completions prompts get ``<|begin_of_text|>`` when ``add_special_tokens`` (the default).
- Images in chat (``{"type": "image_url"}`` parts) become V placeholder tokens, all with the id
  ``FIRST_IMAGE_ID + key mod 2**30`` (``key`` from the image's content), inserted by the caller
  where :meth:`SimTokenizer.encode_chat_parts` says; they decode as ``<|image_pad|>``.
- Tools (a chat request's ``tools``) are shown to the model as a system message right after
  ``<|begin_of_text|>``: ``TOOLS_PREAMBLE`` then each tool as ``json.dumps(tool, indent=4)``,
  joined by blank lines (Llama 3.1's template shows them so, in its first user message). An
  assistant message's ``tool_calls`` are its content's continuation, each call as
  :func:`tool_call_text` (what the model generated), so a follow-up turn hits the answer's blocks.
- Embeddings inputs get ``<|begin_of_text|>`` (``add_special_tokens``, default on); a rerank
  (query, document) pair is ``<|begin_of_text|> query <|eot_id|> document <|end_of_text|>``:
  ``RERANK_SPECIAL_TOKENS`` (3) around the two texts, as a BERT-style cross-encoder's
  ``[CLS] q [SEP] d [SEP]``.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pytest_llmperf.errors import InputError

MAX_PIECE_CHARS = 10

SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
BOS_ID, EOS_ID, START_HEADER_ID, END_HEADER_ID, EOT_ID = range(len(SPECIAL_TOKENS))
CHAT_PREFIX_TOKENS = 1  # <|begin_of_text|>
CHAT_TOKENS_PER_MESSAGE = 5  # start header, role, end header, "\n\n", eot
CHAT_GENERATION_PROMPT_TOKENS = 4  # start header, "assistant", end header, "\n\n"

# Common short English words: what the simulator generates, and the low ids of the vocabulary.
_WORD_LIST = """
    the of and to in is that for it as was with be by on not he this are or his from at which
    but have an they you were her she there been one all we their has would when if so no will
    can more other its who into only new some could time these two may then do first any my now
    such like our over man me even most made after also did many before must through back years
    where much your way well down should because each just those people how too little state
    good very make world still own see men work long get here between both life being under never
    day same another know while last might us great old year off come since against go came right
    used take three small data model system value number result order point case group fact part
    place problem end hand week company area home water room mother money story month lot study
    book eye job word issue side kind head house service friend father power hour game line
    member law car city name team minute idea kid body back face level office door health person
    art war history party change morning reason research girl guy moment air teacher force
    education foot boy age policy music market sense nation plan college interest death
    experience effect class control field role effort rate heart drug show leader light voice
    wife police mind price report decision son view relation town road arm difference thing
"""
# Deduplicated, and short enough that the space-prefixed form is a single token.
VOCAB_WORDS: tuple[str, ...] = tuple(dict.fromkeys(w for w in _WORD_LIST.split() if len(w) < 10))

_PIECE_RE = re.compile(r" ?\S+|\s+(?= \S)|\s+")
_MAX_DECODE_MEMORY = 200_000


def _build_vocab() -> tuple[dict[str, int], list[str]]:
    pieces = list(SPECIAL_TOKENS)
    seen = set(pieces)
    for word in VOCAB_WORDS:
        for piece in (" " + word, word):
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)
    for piece in ("\n", "\n\n", " ", ".", ",", "user", "assistant", "system", "tool"):
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    return {p: i for i, p in enumerate(pieces)}, pieces


_VOCAB, _ID_TO_PIECE = _build_vocab()
FIRST_HASHED_ID = 1 << 16
# Image placeholders get ids of their own, above every hashed text piece's.
FIRST_IMAGE_ID = FIRST_HASHED_ID + (1 << 30)
IMAGE_PAD = "<|image_pad|>"
RERANK_SPECIAL_TOKENS = 3  # <|begin_of_text|>, the <|eot_id|> separator, <|end_of_text|>


# What the tools' system message says before the tools (Llama 3.1's template words, shortened).
TOOLS_PREAMBLE = (
    "Given the following functions, please respond with a JSON for a function call with its proper "
    'arguments that best answers the given prompt. Respond in the format {"name": function name, '
    '"parameters": dictionary of argument name and its value}. Do not use variables.\n\n'
)


def tool_call_text(name: str, arguments: str) -> str:
    """A tool call as the model generates it (Llama 3.1's JSON format); ``arguments`` is JSON text."""
    return '{"name": ' + json.dumps(name) + ', "parameters": ' + arguments + "}"


def tools_text(tools: Sequence[Any]) -> str:
    """The text of the tools' system message."""
    return TOOLS_PREAMBLE + "\n\n".join(json.dumps(tool, indent=4) for tool in tools)


class ImagePart(NamedTuple):
    """An ``image_url`` content part: where it is (``messages[i].content[j]``) and its URL."""

    where: str
    url: str


def image_token_id(key: int) -> int:
    """The placeholder id of an image with content ``key``: equal images, equal ids."""
    return FIRST_IMAGE_ID + (key & 0x3FFFFFFF)


class TokenizerError(InputError):
    """Input the tokenizer cannot handle; the message names the field."""


class SimTokenizer:
    """Text <-> ids by the rules in the module docstring. Safe to share within one event loop."""

    vocab_size = FIRST_IMAGE_ID + (1 << 30)

    def __init__(self) -> None:
        # Hashed ids cannot be inverted, so remember recently seen pieces for /detokenize.
        self._recent: OrderedDict[int, str] = OrderedDict()

    # ------------------------------------------------------------------ text

    def pieces(self, text: str) -> list[str]:
        out: list[str] = []
        for piece in _PIECE_RE.findall(text):
            if len(piece) <= MAX_PIECE_CHARS:
                out.append(piece)
            else:
                out.extend(piece[i : i + MAX_PIECE_CHARS] for i in range(0, len(piece), MAX_PIECE_CHARS))
        return out

    def piece_id(self, piece: str) -> int:
        pid = _VOCAB.get(piece)
        if pid is not None:
            return pid
        pid = FIRST_HASHED_ID + (zlib.crc32(piece.encode("utf-8")) & 0x3FFFFFFF)
        recent = self._recent
        if pid not in recent:
            recent[pid] = piece
            if len(recent) > _MAX_DECODE_MEMORY:
                recent.popitem(last=False)
        return pid

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [BOS_ID] if add_special_tokens else []
        vocab_get = _VOCAB.get
        for piece in self.pieces(text):
            pid = vocab_get(piece)
            ids.append(pid if pid is not None else self.piece_id(piece))
        return ids

    def count(self, text: str) -> int:
        """Token count of ``text`` without building ids (no special tokens)."""
        n = 0
        for piece in _PIECE_RE.findall(text):
            n += -(-len(piece) // MAX_PIECE_CHARS)
        return n

    def decode(self, ids: Iterable[int]) -> str:
        parts: list[str] = []
        for tid in ids:
            if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
                raise TokenizerError(f"tokens: expected non-negative integer ids, got {tid!r}")
            if tid < len(_ID_TO_PIECE):
                parts.append(_ID_TO_PIECE[tid])
            elif FIRST_IMAGE_ID <= tid < FIRST_IMAGE_ID + (1 << 30):
                parts.append(IMAGE_PAD)
            else:
                piece = self._recent.get(tid)
                parts.append(piece if piece is not None else f"<|unk_{tid}|>")
        return "".join(parts)

    # ------------------------------------------------------------------ chat

    def encode_chat(self, messages: Any, add_generation_prompt: bool = True, tools: Sequence[Any] | None = None) -> list[int]:
        """Apply the chat template to OpenAI-style text messages and encode the result."""
        ids, images = self.encode_chat_parts(messages, add_generation_prompt, tools)
        if images:
            raise TokenizerError(f"{images[0][1].where}: an image part needs a vision encoder (encode_chat_parts)")
        return ids

    def encode_chat_parts(
        self, messages: Any, add_generation_prompt: bool = True, tools: Sequence[Any] | None = None
    ) -> tuple[list[int], list[tuple[int, ImagePart]]]:
        """The chat template's ids for the text, and each image part with the position in those ids
        where its vision tokens go (in order). The caller inserts the placeholders (or drops them).
        ``tools`` (as the request sent them) become a system message after ``<|begin_of_text|>``."""
        if not isinstance(messages, list) or not messages:
            raise TokenizerError("messages: expected a non-empty list of {role, content} objects")
        ids = [BOS_ID]
        if tools:
            ids += [START_HEADER_ID, _VOCAB["system"], END_HEADER_ID, _VOCAB["\n\n"]]
            ids += self.encode(tools_text(tools))
            ids.append(EOT_ID)
        images: list[tuple[int, ImagePart]] = []
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise TokenizerError(f"messages[{i}]: expected an object with 'role' and 'content'")
            role = message.get("role")
            if not isinstance(role, str) or not role:
                raise TokenizerError(f"messages[{i}].role: expected a non-empty string")
            ids.append(START_HEADER_ID)
            ids.append(self.piece_id(role))  # the role name is one token whatever its length
            ids.append(END_HEADER_ID)
            ids.append(_VOCAB["\n\n"])
            texts: list[str] = []
            for part in message_parts(message.get("content"), f"messages[{i}].content"):
                if isinstance(part, str):
                    texts.append(part)
                    continue
                # Adjacent text parts are one text (joined as they always were); an image splits it.
                ids.extend(self.encode("".join(texts)))
                texts.clear()
                images.append((len(ids), part))
            for call in _tool_calls(message.get("tool_calls"), f"messages[{i}].tool_calls"):
                texts.append(call)
            ids.extend(self.encode("".join(texts)))
            ids.append(EOT_ID)
        if add_generation_prompt:
            ids.extend((START_HEADER_ID, _VOCAB["assistant"], END_HEADER_ID, _VOCAB["\n\n"]))
        return ids, images

    # ------------------------------------------------------------------ pooling

    def encode_pair(self, query: str, document: str) -> list[int]:
        """A rerank (query, document) pair as a cross-encoder reads it (3 special tokens)."""
        return pair_ids(self.encode(query), self.encode(document))


def _tool_calls(calls: Any, where: str) -> list[str]:
    """An assistant message's ``tool_calls`` as the text the model generated for them."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise TokenizerError(f"{where}: expected a list of {{id, type: function, function: {{name, arguments}}}}")
    out = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise TokenizerError(f"{where}[{k}]: expected {{id, type: function, function: {{name, arguments}}}}")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        out.append(tool_call_text(function["name"], arguments))
    return out


def pair_ids(query_ids: list[int], document_ids: list[int]) -> list[int]:
    """``<|begin_of_text|> query <|eot_id|> document <|end_of_text|>``: RERANK_SPECIAL_TOKENS + both."""
    return [BOS_ID, *query_ids, EOT_ID, *document_ids, EOS_ID]


def chat_overhead_tokens(num_messages: int = 1, add_generation_prompt: bool = True) -> int:
    """Tokens the chat template adds around ``num_messages`` messages."""
    return (
        CHAT_PREFIX_TOKENS
        + CHAT_TOKENS_PER_MESSAGE * num_messages
        + (CHAT_GENERATION_PROMPT_TOKENS if add_generation_prompt else 0)
    )


def message_text(content: Any, where: str) -> str:
    """The text of a message's content: a string, null, or a list of ``{"type": "text"}`` parts."""
    parts = message_parts(content, where)
    for part in parts:
        if isinstance(part, ImagePart):
            raise TokenizerError(f"{part.where}: only text parts are supported here")
    return "".join(p for p in parts if isinstance(p, str))


def message_parts(content: Any, where: str) -> list[str | ImagePart]:
    """A message's content as text pieces and image parts, in order: the content may be a string,
    null, or a list of ``{"type": "text", "text": ...}`` and
    ``{"type": "image_url", "image_url": {"url": ...}}`` parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        raise TokenizerError(f"{where}: expected a string or a list of content parts")
    out: list[str | ImagePart] = []
    for j, part in enumerate(content):
        here = f"{where}[{j}]"
        if not isinstance(part, Mapping):
            raise TokenizerError(f"{here}: expected a content part object with a 'type'")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise TokenizerError(f"{here}.text: expected a string")
            out.append(text)
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str) or not url:
                raise TokenizerError(f"{here}.image_url: expected {{'url': 'data:image/...' or 'http(s)://...'}}")
            out.append(ImagePart(here, url))
        else:
            raise TokenizerError(f"{here}: unsupported content part type {kind!r} (supported: 'text', 'image_url')")
    return out


def word_piece(index: int) -> str:
    """The generated token with vocabulary index ``index`` (always a single space-prefixed token)."""
    return " " + VOCAB_WORDS[index % len(VOCAB_WORDS)]
