"""Typed JSON values: the base of every value pytest-llmperf reads back from a file, and the one
way a file's JSON becomes such a value.

A value declares its fields once, as a :class:`JsonModel` (a frozen pydantic model); its JSON
form follows from them (:meth:`JsonModel.to_dict`, written by :mod:`pytest_llmperf.jsonio`), and
reading checks every field (:func:`validate`). Fields that are domain objects with a JSON form
of their own (a :class:`~pytest_llmperf.metrics.Summary`, a
:class:`~pytest_llmperf.fingerprint.Fingerprint`) are declared with :func:`domain_field`: their
``from_dict``/``to_dict`` stay the one reader and writer of that object.

Reading is strict: a number where a string belongs, a string where a number belongs (other than
the spelled infinities, :data:`JsonNumber`) or ``true`` where a count belongs is an error, not a
value coerced into something else. Keys a model does not know are ignored, so a file written by a
newer version that added a field still reads. Values built in code are checked too, but leniently
(a numpy scalar becomes the Python number it holds), since a measured run must not fail at its
end over a ``numpy.bool_``.

A failed check raises the error class the caller names (a corrupt saved run, a malformed report),
one of this package's exception tree, with the source and the JSON path of each problem:
``runs/main.json.gz: tests['t.py::test#0'].trials[0].stats.ttft_p95: expected a number, got 'fast'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    PlainValidator,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.jsonio import INF, NEG_INF

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

M = TypeVar("M", bound="JsonModel")
D = TypeVar("D")

# Problems listed in one message before "and N more".
_MAX_PROBLEMS = 5


class JsonModel(BaseModel):
    """A value read from and written to JSON: frozen, unknown keys ignored, read strictly
    (:func:`validate`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # Optional fields written only when set (as the files of earlier versions had them: absent).
    omit_when_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self.omit_when_none:
            if data.get(name, 0) is None:
                del data[name]
        return data

    def to_dict(self) -> dict[str, Any]:
        """The JSON form as plain data (floats as floats: :mod:`pytest_llmperf.jsonio` spells
        the non-finite ones when it writes)."""
        return self.model_dump(mode="python")

    @classmethod
    def from_dict(cls: type[M], data: object, *, source: str = "", error: type[LLMPerfError] | None = None) -> M:
        """Read and check ``data`` (see :func:`validate`)."""
        return validate(cls, data, source=source, error=error)


def validate(cls: type[M], data: object, *, source: str = "", error: type[LLMPerfError] | None = None) -> M:
    """``data`` (parsed JSON) as a ``cls``, every field checked. A problem raises ``error``
    (default :class:`~pytest_llmperf.errors.InputError`) naming ``source`` and each field's path."""
    try:
        return cls.model_validate(data, strict=True)
    except ValidationError as exc:
        raise (error or InputError)(describe(exc, source)) from None


def describe(exc: ValidationError, source: str = "") -> str:
    """A validation error as one line: ``source: path: problem; path: problem``."""
    problems = [f"{_path(e['loc'])}: {_problem(e)}" for e in exc.errors()]
    text = "; ".join(problems[:_MAX_PROBLEMS])
    if len(problems) > _MAX_PROBLEMS:
        text += f"; and {len(problems) - _MAX_PROBLEMS} more"
    return f"{source}: {text}" if source else text


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":  # the mapping's key itself, not a value under it
            out += " (its key)"
        elif part.startswith(("function-", "kind=")):
            # pydantic's own steps through a validator or a tagged union, not keys of the document
            continue
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "(top level)"


def _problem(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    given = err.get("input")
    expected = {
        "float_type": "a number", "int_type": "an integer", "string_type": "a string", "bool_type": "true or false",
        "list_type": "an array", "dict_type": "an object", "model_type": "an object", "typed_dict_type": "an object",
        "none_required": "null", "tuple_type": "an array",
    }.get(kind)
    if expected is not None:
        return f"expected {expected}, got {_kind(given)}"
    if kind == "missing":
        return "missing"
    message = str(err.get("msg", kind))
    return message.removeprefix("Value error, ")


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, (str, int, float)):
        return repr(value) if len(repr(value)) <= 40 else type(value).__name__
    return {"dict": "an object", "list": "an array"}.get(type(value).__name__, type(value).__name__)


def _spelled_infinity(value: object) -> object:
    # "inf" / "-inf" are how jsonio writes infinities; anything else is checked as a number.
    if value == INF or value == NEG_INF:
        return float(value)
    return value


# A float as read from JSON: a number, or "inf" / "-inf" (:mod:`pytest_llmperf.jsonio`).
JsonNumber = Annotated[float, BeforeValidator(_spelled_infinity)]


def read_with(cls: type[D], parse: Callable[[Any], D]) -> PlainValidator:
    """The validator of a field holding a domain object with a JSON form of its own (declare it
    ``Annotated[Summary, read_with(Summary, Summary.from_dict), WRITE_TO_DICT]``): ``parse``
    reads it, its errors (``ValueError``, ``KeyError``, ``TypeError``) reported at the field's
    path; an instance given directly is kept as it is."""

    def check(value: object) -> D:
        if isinstance(value, cls):
            return value
        try:
            return parse(value)
        except (KeyError, TypeError) as exc:
            raise InputError(f"not a valid {cls.__name__}: {type(exc).__name__}: {exc}") from None
        except ValueError as exc:
            raise InputError(f"not a valid {cls.__name__}: {exc}") from None

    return PlainValidator(check)


# The serializer of such a field: the object's own ``to_dict()``.
WRITE_TO_DICT = PlainSerializer(lambda value: value.to_dict())


__all__ = ["WRITE_TO_DICT", "JsonModel", "JsonNumber", "describe", "read_with", "validate"]
