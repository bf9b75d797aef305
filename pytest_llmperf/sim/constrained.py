"""Tool calls and structured output: what a request constrains, and the JSON the simulator answers.

A chat request may carry ``tools`` (OpenAI function tools) with ``tool_choice`` (``auto``, the
default with tools; ``none``; ``required``; or ``{"type": "function", "function": {"name": N}}``),
and a chat or completions request ``response_format`` (``text``, ``json_object``, or
``json_schema`` with ``json_schema.schema``). :func:`parse_constraint` validates them into a
:class:`Constraint` (400s in vLLM's words where vLLM has them); :func:`plan_answer` decides the
answer:

- a **tool call** when ``tool_choice`` is ``required`` (a tool drawn uniformly) or names a function,
  and with probability ``tool_call_prob`` when it is ``auto``: the model generates
  ``{"name": "N", "parameters": ARGS}`` (:func:`~pytest_llmperf.sim.tokenizer.tool_call_text`,
  Llama 3.1's JSON tool-call format), ``ARGS`` an instance of the function's ``parameters``;
- else a **JSON object** with ``response_format`` ``json_schema`` (an instance of its schema) or
  ``json_object`` (``{"answer": "<words>"}``, the words as many as a natural answer's tokens);
- else plain text, as without constraints.

Instances come from :func:`instance`, a generator for the JSON Schema subset tools and structured
outputs use (``type`` object / array / string / integer / number / boolean / null or a list of
them, ``properties``, ``required``, ``additionalProperties``, ``items``, ``prefixItems``,
``minItems``/``maxItems``, ``uniqueItems``, ``enum``, ``const``, ``minimum``/``maximum``,
``exclusiveMinimum``/``exclusiveMaximum``, ``multipleOf``, ``minLength``/``maxLength``, ``format``
date / date-time / time / email / uri / uuid, ``anyOf``/``oneOf`` (one branch), ``allOf``
(merged), local ``$ref`` into ``$defs``/``definitions``), drawn from the request's RNG so a seed
gives the same answer. Not generated: ``pattern``, ``not``, ``if``/``then``, dependent schemas
(an instance may then miss them). :func:`break_json` makes an answer invalid for
``--invalid-json-rate``: cut short (not JSON) or changed so the schema rejects it.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_llmperf.sim.request_parsing import ApiError
from pytest_llmperf.sim.tokenizer import VOCAB_WORDS, tool_call_text

TOOL_CHOICES = ("auto", "none", "required")
# Nesting beyond this ($ref cycles, deep schemas) gets the smallest instance that fits.
MAX_DEPTH = 8
# Items of an array, and words of a string, when the schema leaves them open.
DEFAULT_MAX_ITEMS = 3
DEFAULT_MAX_WORDS = 6


@dataclass(frozen=True, slots=True)
class Constraint:
    """What one request constrains: its tools and tool choice, and its response format."""

    tools: tuple[Mapping[str, Any], ...]  # each tool's "function" object (name, parameters, ...)
    raw_tools: tuple[Mapping[str, Any], ...]  # the tools as sent (what the chat template shows)
    choice: str  # "auto" | "none" | "required" | a function's name
    format: str | None  # None | "json_object" | "json_schema"
    schema: Mapping[str, Any] | None

    @property
    def forced(self) -> bool:
        """A call is required (``required`` or a named function): vLLM then decodes under a grammar."""
        return bool(self.tools) and self.choice not in ("auto", "none")

    def parameters(self, name: str) -> Mapping[str, Any]:
        """The named function's ``parameters`` (an object of any keys when it has none)."""
        for tool in self.tools:
            if tool["name"] == name and isinstance(tool.get("parameters"), Mapping):
                return tool["parameters"]
        return {"type": "object"}


def _schema_error(schema: Any, where: str, param: str) -> ApiError | None:
    if not isinstance(schema, Mapping):
        return ApiError(400, f"{where}: a JSON Schema must be an object, got {type(schema).__name__}", param)
    message = _check_schema(json.dumps(schema, sort_keys=True))
    if message is not None:
        return ApiError(400, f"{where}: not a valid JSON Schema: {message}", param)
    return None


@functools.lru_cache(maxsize=256)
def _check_schema(schema_json: str) -> str | None:
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema_json))
    except jsonschema.SchemaError as exc:
        return exc.message
    return None


def parse_constraint(data: Mapping[str, Any], chat: bool) -> Constraint | None:
    """The request's tools and response format (None when it has neither); 400s for bad ones."""
    tools_raw = data.get("tools") if chat else None
    choice_raw = data.get("tool_choice") if chat else None
    fmt_raw = data.get("response_format")
    if not tools_raw and choice_raw in (None, "none", "auto") and fmt_raw is None:
        return None
    tools: list[Mapping[str, Any]] = []
    raw: list[Mapping[str, Any]] = []
    if tools_raw is not None:
        if not isinstance(tools_raw, list):
            raise ApiError(400, "tools: expected a list of {type: function, function: {name, parameters}}", "tools")
        for k, tool in enumerate(tools_raw):
            function = tool.get("function") if isinstance(tool, Mapping) and tool.get("type", "function") == "function" else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
                raise ApiError(400, f"tools[{k}]: expected {{type: function, function: {{name, parameters}}}}", "tools")
            if function.get("parameters") is not None:
                error = _schema_error(function["parameters"], f"tools[{k}].function.parameters", "tools")
                if error is not None:
                    raise error
            tools.append(function)
            raw.append(tool)
    names = [t["name"] for t in tools]
    if choice_raw is None:
        choice = "auto" if tools else "none"
    elif isinstance(choice_raw, str):
        if choice_raw not in TOOL_CHOICES:
            raise ApiError(400, f"tool_choice: expected one of {', '.join(TOOL_CHOICES)} or "
                                f"{{type: function, function: {{name}}}}, got {choice_raw!r}", "tool_choice")
        choice = choice_raw
    elif (isinstance(choice_raw, Mapping) and isinstance(choice_raw.get("function"), Mapping)
          and isinstance(choice_raw["function"].get("name"), str)):
        choice = choice_raw["function"]["name"]
    else:
        raise ApiError(400, "tool_choice: expected a string or {type: function, function: {name}}", "tool_choice")
    if choice not in ("auto", "none") and not tools:
        raise ApiError(400, "When using `tool_choice`, `tools` must be set.", "tool_choice")  # vLLM's words
    if choice not in TOOL_CHOICES and choice not in names:
        raise ApiError(400, f"Tool '{choice}' has not been passed in `tools`.", "tool_choice")  # vLLM's words
    fmt: str | None = None
    schema: Mapping[str, Any] | None = None
    if fmt_raw is not None:
        kind = fmt_raw.get("type") if isinstance(fmt_raw, Mapping) else None
        if kind == "json_schema":
            inner = fmt_raw.get("json_schema")
            schema = inner.get("schema") if isinstance(inner, Mapping) else None
            if schema is None:
                raise ApiError(400, "response_format: type json_schema needs json_schema.schema", "response_format")
            error = _schema_error(schema, "response_format.json_schema.schema", "response_format")
            if error is not None:
                raise error
            fmt = "json_schema"
        elif kind == "json_object":
            fmt = "json_object"
        elif kind != "text":
            raise ApiError(400, "response_format: expected {type: text}, {type: json_object} or "
                                "{type: json_schema, json_schema: {name, schema}}", "response_format")
    if not tools and fmt is None:
        return None
    return Constraint(tuple(tools), tuple(raw), choice, fmt, schema)


# ---------------------------------------------------------------------------- the answer


@dataclass(frozen=True, slots=True)
class Answer:
    """What a constrained request answers: a call (``name`` set) or a JSON text, and whether it is
    decoded under a grammar (tool_choice required/named, response_format), which costs the step."""

    text: str  # what the model generates (the call's JSON, or the object's)
    name: str | None = None  # the function called
    arguments: str = ""  # the call's arguments as generated
    grammar: bool = False
    broken: bool = False  # --invalid-json-rate hit it


def plan_answer(
    c: Constraint, rng: random.Random, *, call_prob: float, answer_words: int, invalid_rate: float,
    ignore_tools: bool = False, ignore_format: bool = False,
) -> Answer | None:
    """The answer to a constrained request (None: plain text, as without constraints)."""
    broken = bool(invalid_rate) and rng.random() < invalid_rate
    if c.tools and not ignore_tools and c.choice != "none":
        if c.choice == "required":
            name = rng.choice([t["name"] for t in c.tools])
        elif c.choice == "auto":
            name = rng.choice([t["name"] for t in c.tools]) if rng.random() < call_prob else None
        else:
            name = c.choice
        if name is not None:
            schema = c.parameters(name)
            value = instance(schema, rng)
            args = json.dumps(value)
            if broken:
                args = break_json(args, value, schema, rng)
            return Answer(tool_call_text(name, args), name, args, grammar=c.forced, broken=broken)
    if c.format is None or ignore_format:
        return None
    if c.format == "json_schema":
        schema = c.schema or {}
        value = instance(schema, rng)
    else:
        schema = {"type": "object"}
        # {"answer": "w1 ... wn"} is about 1 + n tokens as the simulator tokenizes it (the closing
        # '"}' joins the last word): n words make about a natural answer's length.
        value = {"answer": " ".join(rng.choice(VOCAB_WORDS) for _ in range(max(1, answer_words - 1)))}
    text = json.dumps(value)
    if broken:
        text = break_json(text, value, schema, rng)
    return Answer(text, grammar=True, broken=broken)


# ---------------------------------------------------------------------------- instances


def instance(schema: Any, rng: random.Random, root: Any = None, depth: int = 0) -> Any:
    """A JSON value the schema accepts (for the subset in the module docstring), drawn from ``rng``."""
    if root is None:
        root = schema
    if schema is True or not isinstance(schema, Mapping) or not schema:
        return _words(rng, 1, 3)
    if "$ref" in schema:
        target = _resolve(root, schema["$ref"])
        if target is None or depth >= MAX_DEPTH:
            return None if target is None else _smallest(target, root, depth)
        return instance(target, rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            # oneOf: the first branch (they are usually exclusive by type); anyOf: any one.
            branch = branches[0] if key == "oneOf" else rng.choice(branches)
            merged = {k: v for k, v in schema.items() if k != key}
            merged.update(branch if isinstance(branch, Mapping) else {})
            return instance(merged, rng, root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        return instance(_merge_all_of(schema, root), rng, root, depth + 1)
    kind = _type(schema, rng)
    if depth >= MAX_DEPTH:
        return _smallest(schema, root, depth)
    if kind == "object":
        return _object(schema, rng, root, depth)
    if kind == "array":
        return _array(schema, rng, root, depth)
    if kind == "integer":
        return _integer(schema, rng)
    if kind == "number":
        return _number(schema, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _type(schema: Mapping[str, Any], rng: random.Random) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        options = [k for k in kind if k != "null"] or ["null"]
        return str(rng.choice(options))
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return "number"
    return "string"


def _resolve(root: Any, ref: Any) -> Mapping[str, Any] | None:
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, Mapping) else None


def _merge_all_of(schema: Mapping[str, Any], root: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        if isinstance(part, Mapping) and "$ref" in part:
            part = _resolve(root, part["$ref"]) or {}
        if not isinstance(part, Mapping):
            continue
        for key, value in part.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required":
                merged["required"] = sorted(set(merged.get("required", [])) | set(value))
            else:
                merged.setdefault(key, value)
    return merged


def _smallest(schema: Mapping[str, Any], root: Any, depth: int) -> Any:
    """The least instance of a schema met too deep: required keys only, at their own least."""
    if "$ref" in schema:
        target = _resolve(root, schema["$ref"])
        return None if target is None or depth > 4 * MAX_DEPTH else _smallest(target, root, depth + 1)
    rng = random.Random(0)
    kind = _type(schema, rng)
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _smallest(props.get(k, {}), root, depth + 1) for k in schema.get("required", [])}
    if kind == "array":
        return [_smallest(schema.get("items") or {}, root, depth + 1) for _ in range(int(schema.get("minItems", 0)))]
    if kind in ("integer", "number"):
        return _integer(schema, rng) if kind == "integer" else _number(schema, rng)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _string(schema, rng)


def _object(schema: Mapping[str, Any], rng: random.Random, root: Any, depth: int) -> dict[str, Any]:
    props: Mapping[str, Any] = schema["properties"] if isinstance(schema.get("properties"), Mapping) else {}
    required = set(schema.get("required") or ())
    out: dict[str, Any] = {}
    for name, sub in props.items():
        if name in required or rng.random() < 0.5:
            out[name] = instance(sub, rng, root, depth + 1)
    for name in sorted(required - set(out)):  # required but not described
        out[name] = _words(rng, 1, 2)
    extra = schema.get("additionalProperties", True)
    want = int(schema.get("minProperties", 0) or 0)
    if not props and extra is not False and not out:
        want = max(want, rng.randint(1, DEFAULT_MAX_ITEMS))
    if extra is not False:
        cap = schema.get("maxProperties")
        while len(out) < want and (cap is None or len(out) < cap):
            key = rng.choice(VOCAB_WORDS)
            if key not in out:
                out[key] = instance(extra if isinstance(extra, Mapping) else {}, rng, root, depth + 1)
    return out


def _array(schema: Mapping[str, Any], rng: random.Random, root: Any, depth: int) -> list[Any]:
    prefix: list[Any] = schema["prefixItems"] if isinstance(schema.get("prefixItems"), list) else []
    items = schema.get("items", {})
    lo = int(schema.get("minItems", 0) or 0)
    hi = schema.get("maxItems")
    hi = int(hi) if isinstance(hi, int) else max(lo, DEFAULT_MAX_ITEMS)
    if items is False:
        hi = min(hi, len(prefix))
    n = rng.randint(max(lo, min(1, hi)), max(lo, hi))
    unique = bool(schema.get("uniqueItems"))
    out: list[Any] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n and tries < 20 * max(n, 1):
        tries += 1
        sub = prefix[len(out)] if len(out) < len(prefix) else items
        value = instance(sub if sub is not True else {}, rng, root, depth + 1)
        if unique:
            key = json.dumps(value, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
        out.append(value)
    return out


def _bounds(schema: Mapping[str, Any]) -> tuple[float | None, float | None, bool, bool]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    lo_open = hi_open = False
    if isinstance(xlo, (int, float)) and not isinstance(xlo, bool) and (lo is None or xlo >= lo):
        lo, lo_open = xlo, True
    if isinstance(xhi, (int, float)) and not isinstance(xhi, bool) and (hi is None or xhi <= hi):
        hi, hi_open = xhi, True
    return lo, hi, lo_open, hi_open


def _integer(schema: Mapping[str, Any], rng: random.Random) -> int:
    lo, hi, lo_open, hi_open = _bounds(schema)
    a = -math.inf if lo is None else (math.floor(lo) + 1 if lo_open else math.ceil(lo))
    b = math.inf if hi is None else (math.ceil(hi) - 1 if hi_open else math.floor(hi))
    if a == -math.inf and b == math.inf:
        a, b = 0, 100
    elif a == -math.inf:
        a = b - 100
    elif b == math.inf:
        b = a + 100
    a, b = int(a), int(b)
    step = schema.get("multipleOf")
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        k_lo, k_hi = -(-a // step), b // step
        if k_lo <= k_hi:
            return rng.randint(k_lo, k_hi) * step
    return rng.randint(a, b) if a <= b else a


def _number(schema: Mapping[str, Any], rng: random.Random) -> float | int:
    lo, hi, lo_open, hi_open = _bounds(schema)
    step = schema.get("multipleOf")
    if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0:
        a = 0.0 if lo is None else lo
        b = a + 100 * step if hi is None else hi
        k_lo = math.ceil(a / step) + (1 if lo_open and math.isclose(math.ceil(a / step) * step, a) else 0)
        k_hi = math.floor(b / step) - (1 if hi_open and math.isclose(math.floor(b / step) * step, b) else 0)
        if k_lo <= k_hi:
            value = rng.randint(k_lo, k_hi) * step
            return int(value) if isinstance(step, int) else value
    a = 0.0 if lo is None else float(lo)
    b = (a + 100.0) if hi is None else float(hi)
    if lo is None and hi is not None:
        a = b - 100.0
    value = round(rng.uniform(a, b), 2)
    # Rounding may land on an open or crossed bound: step inside it.
    if value < a or (lo_open and value <= a):
        value = a + (b - a) / 2
    if value > b or (hi_open and value >= b):
        value = a + (b - a) / 2
    return value


_FORMATS = {
    "date": lambda r: f"20{r.randint(10, 29)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    "date-time": lambda r: f"20{r.randint(10, 29)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T"
                           f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z",
    "time": lambda r: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z",
    "email": lambda r: f"{r.choice(VOCAB_WORDS)}@example.com",
    "uri": lambda r: f"https://example.com/{r.choice(VOCAB_WORDS)}",
    "uuid": lambda r: f"{r.getrandbits(32):08x}-{r.getrandbits(16):04x}-4{r.getrandbits(12):03x}-"
                      f"8{r.getrandbits(12):03x}-{r.getrandbits(48):012x}",
}


def _string(schema: Mapping[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt](rng)
    lo = int(schema.get("minLength", 0) or 0)
    hi = schema.get("maxLength")
    text = _words(rng, 1, DEFAULT_MAX_WORDS)
    if isinstance(hi, int) and len(text) > hi:
        text = text[:hi].rstrip() if len(text[:hi].rstrip()) >= lo else text[:hi]
    while len(text) < lo:
        text += " " + rng.choice(VOCAB_WORDS)
        if isinstance(hi, int) and len(text) > hi:
            text = text[:hi]
    return text


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(VOCAB_WORDS) for _ in range(rng.randint(lo, hi)))


# ---------------------------------------------------------------------------- faults


def break_json(text: str, value: Any, schema: Mapping[str, Any], rng: random.Random) -> str:
    """``text`` (``value`` as JSON) made invalid: cut short (not JSON) or, half the time when the
    schema allows it, changed so that it no longer validates (a required key dropped, a value of
    the wrong type, or the value wrapped in a list)."""
    if rng.random() < 0.5:
        for candidate in _mangled(value, schema):
            if not _valid(candidate, schema):
                return json.dumps(candidate)
    cut = text[: rng.randint(1, max(1, len(text) - 1))]
    try:
        json.loads(cut)
    except ValueError:
        return cut
    return cut + "{"  # a prefix that parses (a number cut short): make it unparseable


def _mangled(value: Any, schema: Mapping[str, Any]) -> list[Any]:
    out: list[Any] = []
    if isinstance(value, dict):
        required = [k for k in schema.get("required", ()) if k in value]
        if required:
            out.append({k: v for k, v in value.items() if k != required[0]})
        for key, item in value.items():
            out.append({**value, key: [item] if not isinstance(item, list) else {"value": item}})
    out.append([value])
    return out


def _valid(value: Any, schema: Mapping[str, Any]) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator(dict(schema)).is_valid(value)


__all__ = ["Answer", "Constraint", "TOOL_CHOICES", "break_json", "instance", "parse_constraint", "plan_answer"]
