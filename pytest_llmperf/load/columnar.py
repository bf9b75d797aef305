"""Records in a compact columnar form, for sending them between processes and machines.

A worker process (local or on a Ray node) returns its records as one dict of numpy arrays instead
of a pickled graph of :class:`~pytest_llmperf.records.RequestRecord` objects and their per-chunk
lists: one float64 column per time field (NaN where a field is None), the per-chunk lists
concatenated into one array with a lengths column, and the few strings (phase, request type,
error kind, token source) as small integer codes with their distinct values. Decoding gives back
records equal to the originals, field by field (tests/test_workers.py checks the round trip, and that
every field of RequestRecord is covered).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pytest_llmperf.records import RequestRecord

_FLOATS = ("scheduled_s", "sent_s")
_OPT_FLOATS = ("headers_s", "end_s", "first_token_s", "first_visible_s")
# Optional integers travel as float64 (exact below 2**53) with NaN for None.
_OPT_INTS = ("prompt_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "status_code",
             "requested_output_tokens", "prompt_tokens_expected", "session", "turn", "draft_tokens",
             "draft_accepted")
_INTS = ("images", "image_pixels", "inputs")
_OPT_BOOLS = ("answer_valid",)  # int8: 1, 0, or -1 for None
_CATEGORIES = ("phase", "request_type", "token_source", "error_kind", "answer_invalid", "adapter")
_RAGGED = ("chunk_times_s", "chunk_tokens")
_OPT_RAGGED = ("server_chunk_times_s",)
# response_text (a list of strings) and tool_calls (a list of dicts) are kept as they are.
_SPARSE_TEXT = ("error_detail", "response_text", "answer_error", "tool_calls")
_OTHER = ("index", "ok", "output_length_fixed")
FIELDS = (_FLOATS + _OPT_FLOATS + _OPT_INTS + _INTS + _OPT_BOOLS + _CATEGORIES + _RAGGED + _OPT_RAGGED
          + _SPARSE_TEXT + _OTHER)


def encode(records: list[RequestRecord]) -> dict[str, Any]:
    """``records`` as columns (numpy arrays, a few short lists and one sparse dict)."""
    n = len(records)
    out: dict[str, Any] = {"n": n, "index": np.fromiter((r.index for r in records), np.int64, n),
                           "ok": np.fromiter((r.ok for r in records), np.bool_, n),
                           "output_length_fixed": np.fromiter((r.output_length_fixed for r in records), np.bool_, n)}
    for name in _FLOATS:
        out[name] = np.fromiter((getattr(r, name) for r in records), np.float64, n)
    for name in _OPT_FLOATS + _OPT_INTS:
        out[name] = np.fromiter((_nan(getattr(r, name)) for r in records), np.float64, n)
    for name in _INTS:
        out[name] = np.fromiter((getattr(r, name) for r in records), np.int64, n)
    for name in _OPT_BOOLS:
        out[name] = np.fromiter((-1 if getattr(r, name) is None else int(getattr(r, name)) for r in records),
                                np.int8, n)
    for name in _CATEGORIES:
        values: dict[Any, int] = {}
        codes = np.fromiter((values.setdefault(getattr(r, name), len(values)) for r in records), np.int32, n)
        out[name] = (codes, list(values))
    for name in _RAGGED:
        lists = [getattr(r, name) for r in records]
        out[name] = (np.fromiter((len(x) for x in lists), np.int64, n),
                     np.asarray([v for x in lists for v in x], dtype=np.float64))
    for name in _OPT_RAGGED:
        opt_lists = [getattr(r, name) for r in records]
        out[name] = (np.fromiter((-1 if x is None else len(x) for x in opt_lists), np.int64, n),
                     np.asarray([v for x in opt_lists if x for v in x], dtype=np.float64))
    for name in _SPARSE_TEXT:
        out[name] = {i: getattr(r, name) for i, r in enumerate(records) if getattr(r, name) is not None}
    return out


def decode(columns: dict[str, Any]) -> list[RequestRecord]:
    """The records :func:`encode` was given."""
    n = int(columns["n"])
    fields: dict[str, list[Any]] = {"index": [int(x) for x in columns["index"]],
                                    "ok": [bool(x) for x in columns["ok"]],
                                    "output_length_fixed": [bool(x) for x in columns["output_length_fixed"]]}
    for name in _FLOATS:
        fields[name] = [float(x) for x in columns[name]]
    for name in _OPT_FLOATS:
        fields[name] = [None if x != x else float(x) for x in columns[name]]
    for name in _OPT_INTS:
        fields[name] = [None if x != x else int(x) for x in columns[name]]
    for name in _INTS:
        fields[name] = [int(x) for x in columns[name]]
    for name in _OPT_BOOLS:
        fields[name] = [None if x < 0 else bool(x) for x in columns[name]]
    for name in _CATEGORIES:
        codes, values = columns[name]
        fields[name] = [values[c] for c in codes]
    for name in _RAGGED:
        lengths, flat = columns[name]
        fields[name] = _split(lengths, flat)
    for name in _OPT_RAGGED:
        lengths, flat = columns[name]
        parts = _split(np.maximum(lengths, 0), flat)
        fields[name] = [None if k < 0 else p for k, p in zip(lengths, parts)]
    for name in _SPARSE_TEXT:
        sparse = columns[name]
        fields[name] = [sparse.get(i) for i in range(n)]
    return [RequestRecord(**{name: fields[name][i] for name in FIELDS}) for i in range(n)]


def _nan(value: float | int | None) -> float:
    return float("nan") if value is None else float(value)


def _split(lengths: np.ndarray, flat: np.ndarray) -> list[list[float]]:
    ends = np.cumsum(lengths)
    return [flat[e - k:e].tolist() for k, e in zip(lengths.tolist(), ends.tolist())]


__all__ = ["FIELDS", "decode", "encode"]
