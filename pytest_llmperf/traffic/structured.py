"""Constrained answers: tool calls and structured output, as a chat request asks for them.

- :class:`ToolSpec` (``tools:`` in a workload): the OpenAI ``tools`` a request carries, given as
  definitions (``{type: function, function: {name, description, parameters}}``, or just the
  ``function`` part) or as ``count: N`` generated ones (``get_field_k(query: string, limit:
  integer)``, deterministic), and ``choice``: ``auto`` (the model may call), ``required`` (it must
  call one), ``none``, or a function's name (it must call that one).
- :class:`ResponseFormatSpec` (``response_format:``): ``json_object``, or a JSON Schema
  (``{schema: {...}, name: ..., strict: true}``, or OpenAI's ``{type: json_schema, json_schema:
  {...}}`` as it is sent).

Every schema (a tool's ``parameters``, a response format's ``schema``) is checked as a JSON Schema
(Draft 2020-12) when the workload is read, so an invalid schema fails before any load, naming it.
What a valid answer is (a call to a known function whose arguments validate, an object that
validates) is decided in :mod:`pytest_llmperf.load.answers`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_llmperf.errors import InputError

TOOL_CHOICES = ("auto", "required", "none")


class StructuredSpecError(InputError):
    """A tools or response_format spec that cannot be sent as written; the message names the key."""


def check_schema(schema: Any, name: str) -> dict[str, Any]:
    """``schema`` as a JSON Schema (Draft 2020-12), or :class:`StructuredSpecError` naming what is
    wrong with it."""
    import jsonschema

    if not isinstance(schema, Mapping):
        raise StructuredSpecError(f"{name}: a JSON Schema is an object, got {schema!r}")
    try:
        jsonschema.Draft202012Validator.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise StructuredSpecError(f"{name}: not a valid JSON Schema at {where}: {exc.message}") from None
    return json.loads(json.dumps(schema))  # a plain, JSON-only copy


def synthetic_tools(count: int) -> list[dict[str, Any]]:
    """``count`` function tools with small, distinct schemas (deterministic): what the request
    sends when a workload asks for generated tools."""
    return [{"type": "function", "function": {
        "name": f"get_field_{k}",
        "description": f"Look up field {k} of a record matching the query.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "what to look up"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
            "required": ["query"], "additionalProperties": False},
    }} for k in range(count)]


@dataclass(frozen=True)
class ToolSpec:
    definitions: tuple[Mapping[str, Any], ...]
    choice: str = "auto"
    # How the tools were given: generated ``count`` (0: written out as definitions).
    generated: int = 0

    @classmethod
    def parse(cls, spec: Any, name: str = "tools") -> ToolSpec:
        if isinstance(spec, ToolSpec):
            return spec
        if isinstance(spec, list):
            spec = {"definitions": spec}
        if not isinstance(spec, Mapping):
            raise StructuredSpecError(f"{name}: expected a mapping (definitions or count, choice), got {spec!r}")
        allowed = ("definitions", "count", "choice")
        unknown = sorted(set(spec) - set(allowed))
        if unknown:
            raise StructuredSpecError(f"{name}: unknown key(s) {', '.join(map(str, unknown))}; "
                                      f"valid: {', '.join(allowed)}")
        if ("definitions" in spec) == ("count" in spec):
            raise StructuredSpecError(f"{name}: give either 'definitions' (OpenAI tool objects) or 'count' "
                                      "(generated tools)")
        generated = 0
        if "count" in spec:
            count = spec["count"]
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 128:
                raise StructuredSpecError(f"{name}.count must be an integer from 1 to 128, got {count!r}")
            definitions = synthetic_tools(count)
            generated = count
        else:
            raw = spec["definitions"]
            if not isinstance(raw, list) or not raw:
                raise StructuredSpecError(f"{name}.definitions: expected a non-empty list of tools")
            definitions = [_tool(item, f"{name}.definitions[{k}]") for k, item in enumerate(raw)]
        names = [d["function"]["name"] for d in definitions]
        if len(set(names)) != len(names):
            raise StructuredSpecError(f"{name}: function names must be distinct, got {names}")
        choice = spec.get("choice", "auto")
        if not isinstance(choice, str) or (choice not in TOOL_CHOICES and choice not in names):
            raise StructuredSpecError(f"{name}.choice must be one of {', '.join(TOOL_CHOICES)} or a function name "
                                      f"({', '.join(names)}), got {choice!r}")
        return cls(tuple(definitions), choice, generated)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(str(d["function"]["name"]) for d in self.definitions)

    @property
    def forced(self) -> str | None:
        """The function a call must name (``choice`` a name), ``"*"`` for any (``required``), else None."""
        if self.choice == "required":
            return "*"
        if self.choice in ("auto", "none"):
            return None
        return self.choice

    def parameters(self, function: str) -> Mapping[str, Any] | None:
        for d in self.definitions:
            if d["function"]["name"] == function:
                return d["function"].get("parameters") or {"type": "object"}
        return None

    def tool_choice(self) -> object:
        """``tool_choice`` as the OpenAI API takes it."""
        if self.choice in TOOL_CHOICES:
            return self.choice
        return {"type": "function", "function": {"name": self.choice}}

    def label(self) -> str:
        return f"tools {len(self.definitions)} {self.choice}"

    def to_spec(self) -> dict[str, object]:
        if self.generated:
            return {"count": self.generated, "choice": self.choice}
        return {"definitions": [dict(d) for d in self.definitions], "choice": self.choice}


def _tool(item: Any, name: str) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise StructuredSpecError(f"{name}: expected a tool object, got {item!r}")
    function = item.get("function", item) if item.get("type", "function") == "function" else None
    if not isinstance(function, Mapping):
        raise StructuredSpecError(f"{name}: only function tools can be sent ({{type: function, function: {{...}}}})")
    fname = function.get("name")
    if not isinstance(fname, str) or not fname:
        raise StructuredSpecError(f"{name}.function.name: expected a non-empty string")
    out: dict[str, Any] = {"name": fname}
    if function.get("description") is not None:
        out["description"] = str(function["description"])
    out["parameters"] = check_schema(function.get("parameters", {"type": "object"}), f"{name}.function.parameters")
    return {"type": "function", "function": out}


@dataclass(frozen=True)
class ResponseFormatSpec:
    """``json_object``, or a JSON Schema the answer must validate against."""

    type: str = "json_object"
    schema: Mapping[str, Any] | None = None
    name: str = "answer"
    strict: bool = True

    @classmethod
    def parse(cls, spec: Any, name: str = "response_format") -> ResponseFormatSpec:
        if isinstance(spec, ResponseFormatSpec):
            return spec
        if spec == "json_object":
            return cls()
        if not isinstance(spec, Mapping):
            raise StructuredSpecError(f"{name}: expected json_object, {{schema: ...}} or an OpenAI response_format "
                                      f"object, got {spec!r}")
        data = dict(spec)
        if data.get("type") == "json_object" and set(data) == {"type"}:
            return cls()
        if data.get("type") == "json_schema":  # the OpenAI form, as sent
            inner = data.get("json_schema")
            if not isinstance(inner, Mapping) or set(data) != {"type", "json_schema"}:
                raise StructuredSpecError(f"{name}: type json_schema needs a json_schema object "
                                          "({name, schema, strict})")
            data = dict(inner)
        allowed = ("schema", "name", "strict")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise StructuredSpecError(f"{name}: unknown key(s) {', '.join(map(str, unknown))}; "
                                      f"valid: {', '.join(allowed)} (or type: json_object)")
        if "schema" not in data:
            raise StructuredSpecError(f"{name}: a json_schema response format needs 'schema'")
        label = data.get("name", "answer")
        strict = data.get("strict", True)
        if not isinstance(label, str) or not label or not isinstance(strict, bool):
            raise StructuredSpecError(f"{name}: 'name' must be a non-empty string and 'strict' true or false")
        return cls("json_schema", check_schema(data["schema"], f"{name}.schema"), label, strict)

    def body(self) -> dict[str, object]:
        """``response_format`` as the OpenAI API takes it."""
        if self.type == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema",
                "json_schema": {"name": self.name, "schema": dict(self.schema or {}), "strict": self.strict}}

    def label(self) -> str:
        return "json" if self.type == "json_object" else f"schema {self.name}"

    def to_spec(self) -> dict[str, object]:
        if self.type == "json_object":
            return {"type": "json_object"}
        return {"schema": dict(self.schema or {}), "name": self.name, "strict": self.strict}


__all__ = ["TOOL_CHOICES", "ResponseFormatSpec", "StructuredSpecError", "ToolSpec", "check_schema",
           "synthetic_tools"]
