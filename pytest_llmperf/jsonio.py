"""JSON in and out: one encoder and one spelling of the numbers JSON has no word for.

Everything pytest-llmperf writes as JSON goes through :func:`dumps` / :func:`dump`: baseline
store files and rebase markers, ``llmperf.json`` reports, ``llmperf run --json``, the CLI's
``--json`` output and the payload an xdist worker hands its controller. What they write is strict
JSON (RFC 8259), which every parser reads:

- NaN is ``null`` ("no value"), as a :class:`~pytest_llmperf.metrics.Distribution` without
  samples already writes its statistics;
- +inf and -inf are the strings ``"inf"`` and ``"-inf"`` (a latency statistic that counts failed
  requests as +inf), the spelling of the report schema's ``extended_number``.

Reading goes through :func:`loads`, which takes both that spelling and the one store files were
written in before this module owned it: bare ``NaN`` / ``Infinity`` / ``-Infinity`` tokens
(Python's own extension of JSON), read as floats. A reader of a number that may be non-finite
turns either spelling into a float with :func:`decode_float`.

Values JSON cannot hold by itself become plain data first (:func:`plain`): numpy scalars and
arrays become numbers and lists, tuples lists, paths strings, datetimes ISO text, enums their
value, objects with ``to_dict()`` (and other dataclasses) their dict. Anything else is a
:class:`NotSerializable` error, or its ``str`` where a writer asks for ``lenient`` (a report must
not fail at the end of a long session over one odd value).

Fingerprints and workload hashes serialise their own canonical JSON (sorted keys, no spaces) as an
identity, not a document; they do not go through here, so a saved hash never changes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import numbers
from collections.abc import Mapping
from pathlib import PurePath
from typing import IO, Any

from pytest_llmperf.errors import LLMPerfError

INF = "inf"
NEG_INF = "-inf"

# A float as written (:func:`encode_float`): a number, None for NaN, "inf" / "-inf" for infinities.
JsonFloat = float | str | None

# What a reader catches for text that is not JSON (json's own error, a ValueError).
JSONDecodeError = json.JSONDecodeError


class NotSerializable(LLMPerfError, TypeError):
    """A value of a type JSON cannot hold and :func:`plain` does not know how to turn into data."""


def encode_float(value: float) -> JsonFloat:
    """``value`` as written: NaN as None (``null``), ±inf as ``"inf"`` / ``"-inf"``."""
    if math.isnan(value):
        return None
    if math.isinf(value):
        return INF if value > 0 else NEG_INF
    return value


def decode_float(value: Any) -> float | None:
    """A float from a number or a spelled infinity (``"inf"``, ``"-inf"``; old files' bare
    ``Infinity`` / ``NaN`` tokens are floats already); None for ``null`` and anything else."""
    if value == INF or value == NEG_INF:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def plain(value: Any, *, lenient: bool = False) -> Any:
    """A copy of ``value`` made of what strict JSON holds, non-finite floats spelled as above.

    Raises :class:`NotSerializable` for a value it cannot turn into data, unless ``lenient``:
    then the value's ``str`` is written.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return encode_float(float(value))
    if isinstance(value, Mapping):
        return {_key(k, lenient): plain(v, lenient=lenient) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, lenient=lenient) for v in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):  # numpy arrays and scalars
        return plain(tolist(), lenient=lenient)
    if isinstance(value, enum.Enum):
        return plain(value.value, lenient=lenient)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return plain(to_dict(), lenient=lenient)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value), lenient=lenient)
    if lenient:
        return str(value)
    raise NotSerializable(f"object of type {type(value).__name__} is not JSON serializable")


def _key(key: Any, lenient: bool) -> str:
    """A mapping key as JSON writes it (json's own spelling for the scalars it accepts)."""
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, numbers.Integral):
        return str(int(key))
    if isinstance(key, numbers.Real):
        spelled = encode_float(float(key))
        return "null" if spelled is None else str(spelled)
    if lenient:
        return str(key)
    raise NotSerializable(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def dumps(value: Any, *, indent: int | None = None, compact: bool = False, lenient: bool = False,
          sort_keys: bool = False) -> str:
    """``value`` as strict JSON text (UTF-8 characters kept as they are). ``compact`` drops the
    spaces after separators (stored files); ``indent`` pretty-prints."""
    separators = (",", ":") if compact else None
    return json.dumps(plain(value, lenient=lenient), indent=indent, separators=separators, sort_keys=sort_keys,
                      allow_nan=False, ensure_ascii=False)


def dump(value: Any, fh: IO[str], **options: Any) -> None:
    """Write :func:`dumps` of ``value`` to the text file ``fh``, with a final newline."""
    fh.write(dumps(value, **options) + "\n")


def loads(text: str | bytes | bytearray) -> Any:
    """Parse JSON text. Both spellings of non-finite numbers are read: ``"inf"`` / ``null`` as
    they are (see :func:`decode_float`), old files' ``NaN`` / ``Infinity`` tokens as floats.
    Raises :data:`JSONDecodeError` (a ``ValueError``) on text that is not JSON."""
    return json.loads(text)


__all__ = ["INF", "NEG_INF", "JSONDecodeError", "NotSerializable", "decode_float", "dump", "dumps", "encode_float",
           "loads", "plain"]
