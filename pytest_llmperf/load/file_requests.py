"""Requests from files: replayed traces and dataset prompts (see :mod:`pytest_llmperf.traffic`).

Trace replay: :meth:`TraceTraffic.schedule` streams the trace and yields each row's replay offset;
the load generator sends request i at offset i and calls :meth:`TraceTraffic.make` for it, which
takes the row held for i (one row is in memory at a time). A prompt of T tokens with hash ids
h_0..h_{k-1} is the text of blocks h_0, h_1, ... (each ``block_tokens`` tokens of words drawn from
a generator seeded by (run nonce, h)), cut to T tokens minus the chat template: equal ids, equal
text, so the prefix cache sees exactly the sharing the trace recorded, and nothing is shared
with another trial (the nonce). Rows without hash ids get a unique salt and fresh words.

Datasets: rows are counted (``/tokenize`` when the server has it, else the word model), filtered
by length and shuffled with the workload's seed (:func:`pytest_llmperf.traffic.datasets.select`);
request i sends row ``order[i mod n]``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pytest_llmperf.load.prompts import SALT_WORDS, PromptFactory, TokenCounter
from pytest_llmperf.records import PHASE_MEASURE, ImagePart, PreparedRequest
from pytest_llmperf.traffic.datasets import DatasetRow, content_text, is_url, read_dataset, select
from pytest_llmperf.traffic.images import ImageDraw, data_url, file_data_url, image_size, render
from pytest_llmperf.traffic.traces import TraceRow, rows

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pytest_llmperf.workload import Workload

_BLOCK_CACHE = 4096
_MASK63 = (1 << 63) - 1


class TraceTraffic:
    """Schedule and requests of one replayed trace (single process)."""

    def __init__(self, workload: Workload, factory: PromptFactory) -> None:
        assert workload.trace is not None
        self.workload = workload
        self.spec = workload.trace
        self.factory = factory
        self.model = factory.model
        self._vocab = np.asarray(self.model.vocab, dtype=object)
        self._pending: dict[int, TraceRow] = {}
        self._blocks: OrderedDict[int, list[str]] = OrderedDict()
        self._block_words = max(1, int(round(self.spec.block_tokens / self.model.slope)))
        self._trace_images: dict[str, ImagePart] = {}

    def schedule(self) -> Iterator[float]:
        for index, row in enumerate(rows(self.spec)):
            self._pending[index] = row
            yield row.offset_s

    def _block(self, h: int) -> list[str]:
        words = self._blocks.get(h)
        if words is None:
            rng = np.random.default_rng([self.factory.nonce & _MASK63, abs(int(h)) & _MASK63, 29])
            words = list(self._vocab[rng.integers(0, len(self._vocab), size=self._block_words)])
            self._blocks[h] = words
            if len(self._blocks) > _BLOCK_CACHE:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(h)
        return words

    def prompt(self, index: int, row: TraceRow) -> str:
        total = self.model.words_for(row.input_tokens)
        words: list[str] = []
        for h in row.hash_ids:
            left = total - len(words)
            if left <= 0:
                break
            words.extend(self._block(h)[:left])
        parts = [" ".join(words)] if words else []
        left = total - len(words)
        if left > 0:
            parts.append(self.factory.salt(index))
            rng = np.random.default_rng([self.workload.seed, index, 31])
            if left > SALT_WORDS:
                parts.append(" ".join(self._vocab[rng.integers(0, len(self._vocab), size=left - SALT_WORDS)]))
        return " ".join(parts)

    def make(self, index: int, phase: str = PHASE_MEASURE) -> PreparedRequest:
        row = self._pending.pop(index)
        request = self.factory.finish(index, phase, self.prompt(index, row), row.input_tokens, row.output_tokens)
        if row.images and self.workload.api == "chat":
            request.images = tuple(self._image(row, k, size) for k, size in enumerate(row.images))
        return request

    def _image(self, row: TraceRow, k: int, size: tuple[int, int, str | None]) -> ImagePart:
        """A trace row's image: the same id is the same image within a trial (nothing is shared
        with another trial: the run's nonce, as for the prompts' blocks)."""
        width, height, ident = size
        nonce = self.factory.nonce
        key = f"t:{nonce}:id:{ident}" if ident is not None else f"t:{nonce}:{row.line}:{k}"
        draw = ImageDraw(hashlib.sha256(key.encode()).hexdigest()[:24], width, height)
        part = self._trace_images.get(draw.image_id)
        if part is None:
            part = ImagePart(data_url(render(draw, "jpeg"), "jpeg"), width, height)
            if ident is not None:
                self._trace_images[draw.image_id] = part
        return part


class DatasetTraffic:
    """Requests whose prompts come from a dataset's rows, in a seeded order."""

    def __init__(self, workload: Workload, factory: PromptFactory, rows_: list[DatasetRow],
                 prompt_tokens: list[int], output_tokens: list[int | None], order: list[int]) -> None:
        self.workload = workload
        self.factory = factory
        self.rows = rows_
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.order = order
        self._images: dict[str, ImagePart] = {}

    def make(self, index: int, phase: str = PHASE_MEASURE) -> PreparedRequest:
        i = self.order[index % len(self.order)]
        row = self.rows[i]
        out = self.output_tokens[i]
        if out is None:
            rng = np.random.default_rng([self.workload.seed, index])
            out = int(self.workload.output_tokens.sample(rng, 1)[0])
        refs = list(row.images)
        if row.messages is not None and self.workload.api == "chat":
            history = [dict(m) for m in row.messages[:-1]]
            content = row.messages[-1].get("content")
            prompt = content_text(content)
            if isinstance(content, list):  # the last message's own images, sent before its text
                refs += [str(p["image_url"]["url"]) for p in content if p.get("type") == "image_url"]
        else:
            history, prompt = None, row.text
        request = self.factory.finish(index, phase, prompt, self.prompt_tokens[i], out, "dataset", history=history)
        if refs and self.workload.api == "chat":
            request.images = tuple(self._image(ref) for ref in refs)
        if self.workload.api == "chat" and (row.tools is not None or row.response_format is not None):
            # The row's own constraint; its answer ends where the call or object does.
            request.tools, request.response_format = row.tools, row.response_format
            request.ignore_eos, request.min_tokens, request.output_length_fixed = False, None, False
            request.extra_body = dict(self.factory.extra_body)
        return request

    def _image(self, ref: str) -> ImagePart:
        """A dataset's image as sent: a file read once and sent as a data URL; a URL as it is
        (its size read from a data URL; unknown, 0 x 0, for one the server fetches)."""
        part = self._images.get(ref)
        if part is None:
            if is_url(ref) and not ref.startswith("data:"):
                part = ImagePart(ref, 0, 0)
            else:
                data = base64.b64decode(ref.split(",", 1)[1]) if ref.startswith("data:") else Path(ref).read_bytes()
                width, height = image_size(data)
                part = ImagePart(ref if ref.startswith("data:") else file_data_url(data, ref), width, height)
            self._images[ref] = part
        return part


async def load_dataset(workload: Workload, factory: PromptFactory, counter: TokenCounter | None,
                       *, concurrency: int = 32) -> DatasetTraffic:
    """Read, count, filter and order the workload's dataset (before any load)."""
    spec = workload.dataset
    assert spec is not None
    rows_ = read_dataset(spec, workload.seed)
    model = factory.model
    api = workload.api
    sem = asyncio.Semaphore(concurrency)

    def estimate(text: str, template: bool) -> int:
        return int(round(len(text.split()) * model.slope + (model.overhead if template else 0)))

    async def count_prompt(row: DatasetRow) -> int:
        if counter is not None and model.source == "tokenize":
            async with sem:
                if api == "chat":
                    # Text only: the count the images-ignored check compares the server's count with.
                    msgs = ([{"role": m["role"], "content": content_text(m.get("content"))} for m in row.messages]
                            if row.messages else [{"role": "user", "content": row.text}])
                    ids = await counter.tokenize(messages=msgs)
                else:
                    ids = await counter.tokenize(text=row.text)
            if ids is not None:
                return len(ids)
        return estimate(row.text, True)

    async def count_output(row: DatasetRow) -> int | None:
        if row.output_tokens is not None:
            return row.output_tokens
        if row.output_text is None:
            return None
        if counter is not None and model.source == "tokenize":
            async with sem:
                ids = await counter.tokenize(text=row.output_text)
            if ids is not None:
                return max(1, len(ids))
        return max(1, estimate(row.output_text, False))

    prompt_tokens = list(await asyncio.gather(*(count_prompt(r) for r in rows_)))
    output_tokens = list(await asyncio.gather(*(count_output(r) for r in rows_)))
    order = select(spec, rows_, prompt_tokens, output_tokens, workload.seed)
    return DatasetTraffic(workload, factory, rows_, prompt_tokens, output_tokens, order)
