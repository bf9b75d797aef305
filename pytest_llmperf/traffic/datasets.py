"""Prompts from a dataset file on disk (nothing is downloaded).

Formats (``format="auto"`` picks by extension):

- ``sharegpt`` (``.json``): a JSON list of ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}``; a row is the first human turn, and the reply that
  follows it sets the answer length (its token count), as vLLM's ShareGPT benchmark does.
- ``jsonl`` (``.jsonl``): one object per line with ``prompt`` (a string) or ``messages`` (an
  OpenAI chat list), and optionally ``output_tokens`` (else the workload's ``output_tokens``).
- ``parquet`` / ``arrow`` (``.parquet``, ``.arrow``, ``.feather``): the same columns as JSONL,
  read with ``pyarrow`` (``pip install 'pytest-llmperf[datasets]'``).

Images (chat): a JSONL/Parquet row's ``images`` (a list, or one string) and a ShareGPT row's
``image`` (as LLaVA and ShareGPT4V files have it) name image files relative to the dataset file,
or ``http(s)://`` / ``data:`` URLs, sent as ``image_url`` parts before the row's prompt; a
``messages`` row may also hold OpenAI content parts (text and ``image_url``) as they are sent.
A file named that does not exist fails the read, naming the row.

The load layer then counts each row's prompt tokens (exactly via ``/tokenize`` when the server
has it, else with the calibrated word model), drops rows outside ``[min_input_tokens,
max_input_tokens]`` or whose answer exceeds ``max_output_tokens``, and shuffles the rest with the
workload's seed; request i uses row ``order[i mod n]``. At most ``max_rows`` rows (a seeded
sample) are read into the run.

Identity: :func:`digest` is SHA-256 over every usable row in file order (its prompt or messages,
its ``output_tokens``, for ShareGPT the reference answer, and the SHA-256 of each image file it
names, or the URL), so a run's fingerprint names the
dataset by its content, not its path. Rows the reader skips (blank lines, ShareGPT conversations
without a human turn) do not enter it. The length filters need the server's token counts, so
they cannot be applied here: their limits enter the fingerprint with the spec instead, and every
usable row is digested (a change to a row the filters would drop still counts as a change).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_llmperf.errors import InputError
from pytest_llmperf.traffic.structured import ResponseFormatSpec, ToolSpec

DATASET_FORMATS = ("auto", "sharegpt", "jsonl", "parquet", "arrow")


class DatasetError(InputError):
    """A dataset that cannot be used; the message names the file, the row and the field."""


@dataclass(frozen=True)
class DatasetSpec:
    path: str
    format: str = "auto"
    min_input_tokens: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_rows: int = 5000

    @classmethod
    def parse(cls, spec: Any) -> DatasetSpec:
        if isinstance(spec, DatasetSpec):
            return spec
        if isinstance(spec, (str, Path)):
            spec = {"path": str(spec)}
        if not isinstance(spec, Mapping):
            raise DatasetError(f"dataset: expected a path or a mapping with 'path', got {spec!r}")
        data = dict(spec)
        allowed = ("path", "format", "min_input_tokens", "max_input_tokens", "max_output_tokens", "max_rows")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise DatasetError(f"dataset: unknown key(s) {', '.join(unknown)}; valid: {', '.join(allowed)}")
        if not isinstance(data.get("path"), (str, Path)) or not str(data.get("path")):
            raise DatasetError("dataset: 'path' must name a dataset file")
        data["path"] = str(data["path"])
        if data.get("format", "auto") not in DATASET_FORMATS:
            raise DatasetError(f"dataset.format must be one of {', '.join(DATASET_FORMATS)}, got {data['format']!r}")
        for key in ("min_input_tokens", "max_input_tokens", "max_output_tokens", "max_rows"):
            value = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise DatasetError(f"dataset.{key} must be a positive integer, got {value!r}")
        lo, hi = data.get("min_input_tokens"), data.get("max_input_tokens")
        if lo is not None and hi is not None and hi < lo:
            raise DatasetError(f"dataset.max_input_tokens ({hi}) is below min_input_tokens ({lo})")
        return cls(**data)

    @property
    def resolved_format(self) -> str:
        if self.format != "auto":
            return self.format
        suffix = Path(self.path).suffix.lower()
        found = {".json": "sharegpt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                 ".arrow": "arrow", ".feather": "arrow"}.get(suffix)
        if found is None:
            raise DatasetError(f"{self.path}: cannot tell the dataset format from {suffix!r}; set dataset.format")
        return found

    def to_spec(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True, slots=True)
class DatasetRow:
    """One usable row: a prompt (or chat messages) and, when the file says, the answer length."""

    row: int
    prompt: str | None = None
    messages: tuple[Mapping[str, object], ...] | None = None
    output_tokens: int | None = None
    # ShareGPT: the reference answer, whose token count becomes the answer length.
    output_text: str | None = None
    # Images sent before the prompt: absolute file paths, or http(s)/data URLs.
    images: tuple[str, ...] = ()
    # The row's own constrained answer (OpenAI ``tools``/``tool_choice`` or ``response_format``
    # columns), which replaces the workload's.
    tools: ToolSpec | None = None
    response_format: ResponseFormatSpec | None = None

    @property
    def text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(content_text(m.get("content")) for m in self.messages or ())


def content_text(content: object) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def _is_part(part: object) -> bool:
    if not isinstance(part, Mapping):
        return False
    if part.get("type") == "text":
        return isinstance(part.get("text"), str)
    url = part.get("image_url")
    return part.get("type") == "image_url" and isinstance(url, Mapping) and isinstance(url.get("url"), str)


def _valid_content(content: object) -> bool:
    return isinstance(content, str) or (isinstance(content, list) and bool(content) and all(map(_is_part, content)))


def _images(spec: DatasetSpec, row: int, value: Any) -> tuple[str, ...]:
    """A row's image references: file paths (made absolute against the dataset's folder, and
    checked to exist) or URLs."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if isinstance(value, np.ndarray):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DatasetError(f"{_where(spec, row)}: field 'images': expected a list of image paths or URLs")
    out = []
    for ref in value:
        if is_url(ref):
            out.append(ref)
            continue
        if "://" in ref:
            raise DatasetError(f"{_where(spec, row)}: field 'images': {ref!r}: only http(s):// and data: URLs "
                               "or file paths can be sent")
        path = Path(spec.path).parent / ref
        if not path.is_file():
            raise DatasetError(f"{_where(spec, row)}: field 'images': image file {str(path)!r} does not exist")
        out.append(str(path.resolve()))
    return tuple(out)


def _where(spec: DatasetSpec, row: int) -> str:
    unit = "line" if spec.resolved_format == "jsonl" else "row"
    return f"{spec.path}:{row}" if unit == "line" else f"{spec.path}: row {row}"


def _output_tokens(spec: DatasetSpec, row: int, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise DatasetError(f"{_where(spec, row)}: field 'output_tokens': expected an integer token count, got {value!r}")
    if value < 1:
        raise DatasetError(f"{_where(spec, row)}: field 'output_tokens': must be at least 1, got {int(value)}")
    return int(value)


def _row(spec: DatasetSpec, row: int, obj: Any) -> DatasetRow:
    if not isinstance(obj, Mapping):
        raise DatasetError(f"{_where(spec, row)}: expected an object with 'prompt' or 'messages'")
    out = _output_tokens(spec, row, obj.get("output_tokens"))
    extra = {"images": _images(spec, row, obj.get("images")), **_constrained(spec, row, obj)}
    prompt = obj.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(f"{_where(spec, row)}: field 'prompt': expected a non-empty string")
        return DatasetRow(row, prompt=prompt, output_tokens=out, **extra)
    messages = obj.get("messages")
    if messages is None:
        raise DatasetError(f"{_where(spec, row)}: missing field 'prompt' (or 'messages')")
    if isinstance(messages, np.ndarray):
        messages = list(messages)
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and _valid_content(m.get("content"))
            for m in messages):
        raise DatasetError(f"{_where(spec, row)}: field 'messages': expected a non-empty list of "
                           "{role, content} objects (content a string or a list of text and image_url parts)")
    return DatasetRow(row, messages=tuple(dict(m) for m in messages), output_tokens=out, **extra)


def _constrained(spec: DatasetSpec, row: int, obj: Mapping[str, Any]) -> dict[str, Any]:
    """A row's ``tools`` (with ``tool_choice``) or ``response_format`` columns, checked as the
    workload's fields are."""
    out: dict[str, Any] = {}
    try:
        if obj.get("tools") is not None:
            choice = obj.get("tool_choice", "auto")
            if isinstance(choice, Mapping):  # {type: function, function: {name}}: the forced name
                choice = (choice.get("function") or {}).get("name")
            out["tools"] = ToolSpec.parse({"definitions": obj["tools"], "choice": choice}, "field 'tools'")
        if obj.get("response_format") is not None:
            out["response_format"] = ResponseFormatSpec.parse(obj["response_format"], "field 'response_format'")
    except InputError as exc:
        raise DatasetError(f"{_where(spec, row)}: {exc}") from None
    return out


def _sharegpt(spec: DatasetSpec) -> list[DatasetRow]:
    try:
        data = json.loads(Path(spec.path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DatasetError(f"{spec.path}: cannot read dataset: {exc.strerror}") from None
    except ValueError as exc:
        raise DatasetError(f"{spec.path}: not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise DatasetError(f"{spec.path}: a ShareGPT file is a JSON list of {{'conversations': [...]}} objects")
    rows = []
    for i, item in enumerate(data, 1):
        turns = item.get("conversations") if isinstance(item, Mapping) else None
        if not isinstance(turns, list):
            raise DatasetError(f"{spec.path}: row {i}: missing field 'conversations'")
        human = next((j for j, t in enumerate(turns) if isinstance(t, Mapping) and t.get("from") == "human"), None)
        if human is None:
            continue  # no human turn: nothing to ask
        text = turns[human].get("value")
        if not isinstance(text, str):
            raise DatasetError(f"{spec.path}: row {i}: field 'conversations[{human}].value': expected a string")
        reply = turns[human + 1] if human + 1 < len(turns) and isinstance(turns[human + 1], Mapping) else None
        answer = reply.get("value") if reply is not None else None
        if text.strip():
            # LLaVA / ShareGPT4V rows name their image; vLLM's ShareGPT reader drops the "<image>" tag.
            images = _images(spec, i, item.get("image"))
            if images:
                text = text.replace("<image>", "").strip() or text
            rows.append(DatasetRow(i, prompt=text, output_text=answer if isinstance(answer, str) else None,
                                   images=images))
    return rows


def _jsonl(spec: DatasetSpec) -> list[DatasetRow]:
    rows = []
    try:
        fh = open(spec.path, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise DatasetError(f"{spec.path}: cannot read dataset: {exc.strerror}") from None
    with fh:
        for n, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise DatasetError(f"{spec.path}:{n}: not valid JSON: {exc}") from None
            rows.append(_row(spec, n, obj))
    return rows


def _arrow(spec: DatasetSpec) -> list[DatasetRow]:
    try:
        import pyarrow as pa
        import pyarrow.feather as feather
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{spec.path}: reading {spec.resolved_format} needs pyarrow: "
                           "pip install 'pytest-llmperf[datasets]'") from None
    try:
        if spec.resolved_format == "parquet":
            table = pq.read_table(spec.path)
        else:
            try:
                table = feather.read_table(spec.path)
            except pa.ArrowInvalid:
                with pa.memory_map(spec.path) as source:
                    table = pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{spec.path}: cannot read dataset: {exc}") from None
    names = table.column_names
    if "prompt" not in names and "messages" not in names:
        raise DatasetError(f"{spec.path}: missing column 'prompt' (or 'messages'); columns: {', '.join(names)}")
    return [_row(spec, i, obj) for i, obj in enumerate(table.to_pylist(), 1)]


def _usable(spec: DatasetSpec) -> list[DatasetRow]:
    fmt = spec.resolved_format
    rows = _sharegpt(spec) if fmt == "sharegpt" else _jsonl(spec) if fmt == "jsonl" else _arrow(spec)
    if not rows:
        raise DatasetError(f"{spec.path}: no usable row (no prompt in the file)")
    return rows


def read_dataset(spec: DatasetSpec, seed: int = 0) -> list[DatasetRow]:
    """All usable rows (validated), or a seeded sample of ``max_rows`` of them."""
    rows = _usable(spec)
    if len(rows) > spec.max_rows:
        pick = np.sort(np.random.default_rng([seed, 17]).choice(len(rows), size=spec.max_rows, replace=False))
        rows = [rows[i] for i in pick]
    return rows


def digest(spec: DatasetSpec) -> str:
    """Hex SHA-256 of every usable row, in file order (the dataset's content identity; the row
    numbers are left out: a blank line moves them without changing what is sent). Reads and
    validates the file like :func:`read_dataset`, with the same errors."""
    out = hashlib.sha256()
    for row in _usable(spec):
        # One JSON array per row: a prompt and a one-message chat of the same text stay apart.
        fields: list[object] = [row.prompt, row.messages, row.output_tokens, row.output_text]
        if row.images:  # appended only when present: a text dataset's digest is what it was
            fields.append([ref if is_url(ref) else _file_digest(ref) for ref in row.images])
        if row.tools is not None or row.response_format is not None:
            fields.append([row.tools.to_spec() if row.tools else None,
                           row.response_format.to_spec() if row.response_format else None])
        out.update(json.dumps(fields, sort_keys=True, default=str).encode())
        out.update(b"\n")
    return out.hexdigest()


def is_url(ref: str) -> bool:
    """Whether an image reference is a URL to send as is (else a file to read)."""
    return ref.startswith(("http://", "https://", "data:"))


def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def select(spec: DatasetSpec, rows: list[DatasetRow], prompt_tokens: list[int], output_tokens: list[int | None],
           seed: int) -> list[int]:
    """Indices of rows that pass the length filters, shuffled with ``seed``.

    Raises :class:`DatasetError` naming the filter that removed every row (the first one that
    leaves nothing, in the order min_input_tokens, max_input_tokens, max_output_tokens).
    """
    keep = list(range(len(rows)))
    filters = (
        ("min_input_tokens", spec.min_input_tokens, lambda i: prompt_tokens[i] >= spec.min_input_tokens),  # type: ignore[operator]
        ("max_input_tokens", spec.max_input_tokens, lambda i: prompt_tokens[i] <= spec.max_input_tokens),  # type: ignore[operator]
        ("max_output_tokens", spec.max_output_tokens,
         lambda i: output_tokens[i] is None or output_tokens[i] <= spec.max_output_tokens),  # type: ignore[operator]
    )
    for name, limit, ok in filters:
        if limit is None:
            continue
        left = [i for i in keep if ok(i)]
        if not left:
            lengths = [prompt_tokens[i] for i in keep] if "input" in name else [output_tokens[i] for i in keep]
            known = [v for v in lengths if v is not None]
            span = f"{min(known)}-{max(known)}" if known else "unknown"
            raise DatasetError(f"{spec.path}: no usable row left: dataset.{name}={limit} removed all {len(keep)} "
                               f"remaining rows (their {'prompt' if 'input' in name else 'answer'} lengths: "
                               f"{span} tokens)")
        keep = left
    order = np.random.default_rng([seed, 23]).permutation(len(keep))
    return [keep[i] for i in order]
