"""Write the report directory from a session report (:class:`~pytest_llmperf.report.model.ReportDocument`).

``report_dir`` receives ``llmperf.json`` (the model's JSON without samples, strict JSON, checked by
``schemas/llmperf-report.schema.json``), ``llmperf-junit.xml``, ``llmperf-summary.md`` and
``plots/``. Every file is written atomically (temp file + ``os.replace``) so a CI step that
uploads the directory never picks up half a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmperf import jsonio
from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.report.files import atomic_write_text

if TYPE_CHECKING:
    import os

    from pytest_llmperf.report.model import ReportDocument

JSON_NAME = "llmperf.json"
JUNIT_NAME = "llmperf-junit.xml"
MARKDOWN_NAME = "llmperf-summary.md"
PLOTS_DIR = "plots"
SCHEMA_NAME = "llmperf-report.schema.json"


class ReportSchemaError(LLMPerfError, ValueError):
    """A report document that does not match the schema; the message lists each problem by path."""


class StepSummaryError(LLMPerfError, OSError):
    """The GitHub step summary file cannot be appended to; the message names it and why."""


def write_reports(
    doc: ReportDocument, report_dir: Path | str, *, github_step_summary: str | os.PathLike[str] | None = None,
    plots: bool = True, parallel_plots: bool = False,
) -> list[Path]:
    """Write every report for ``doc`` into ``report_dir``; return the files written there.

    With ``github_step_summary`` (the path in ``$GITHUB_STEP_SUMMARY``) the Markdown summary is
    also appended to that file. ``plots=False`` draws none (and removes those an earlier session
    left there); ``parallel_plots`` draws them in worker processes (see
    :func:`~pytest_llmperf.report.plots.write_plots` for when a program may). Raises OSError when
    a file cannot be written.
    """
    # Imported here so `import pytest_llmperf.report.writers` stays cheap (the plugin imports it
    # only at session end).
    from pytest_llmperf.report.junit import render_junit
    from pytest_llmperf.report.markdown import render_markdown
    from pytest_llmperf.report.plots import clear_plots, write_plots

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    written = [
        atomic_write_text(report_dir / JSON_NAME, to_json(doc)),
        atomic_write_text(report_dir / JUNIT_NAME, render_junit(doc)),
    ]
    if plots:
        drawn = write_plots(doc, report_dir / PLOTS_DIR, parallel=parallel_plots)
    else:
        clear_plots(report_dir / PLOTS_DIR)
        drawn = None
    markdown = render_markdown(doc, plots=drawn, base_dir=report_dir)
    written.append(atomic_write_text(report_dir / MARKDOWN_NAME, markdown))
    written.extend(drawn.paths if drawn is not None else [])
    if github_step_summary:
        append_step_summary(Path(github_step_summary), markdown)
    return written


def to_json(doc: ReportDocument) -> str:
    """``doc`` without samples as strict JSON (:mod:`pytest_llmperf.jsonio`: NaN as null, ±inf as
    "inf"/"-inf"; a value of an unknown type as its text rather than failing the whole report at
    the end of a long session)."""
    return jsonio.dumps(doc.to_json_dict(samples=False), indent=1, lenient=True) + "\n"


def append_step_summary(path: Path, markdown: str) -> None:
    """Append to the GitHub step summary file (other steps may have written to it already)."""
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(markdown if markdown.endswith("\n") else markdown + "\n")
    except OSError as exc:
        raise StepSummaryError(f"cannot append to GITHUB_STEP_SUMMARY file {path}: {exc.strerror or exc}") from exc


def schema_path() -> Path:
    """The JSON Schema (draft 2020-12) of ``llmperf.json``, shipped as package data."""
    return Path(__file__).resolve().parent.parent / "schemas" / SCHEMA_NAME


def load_schema() -> dict[str, object]:
    """The schema as JSON data, for a validator (not read here)."""
    schema: dict[str, object] = jsonio.loads(schema_path().read_text(encoding="utf-8"))
    return schema


def validate(doc: ReportDocument | Mapping[str, object]) -> None:
    """Check ``doc`` (a report model, or JSON as ``llmperf.json`` holds it) against the schema.

    Raises :class:`ReportSchemaError` listing every problem with its JSON path, or ImportError
    when jsonschema (a development dependency) is not installed.
    """
    try:
        import jsonschema
    except ImportError as exc:
        raise ImportError(
            "validating a report needs jsonschema: pip install 'pytest-llmperf[dev]' (or jsonschema)"
        ) from exc
    # Validate what a reader of the file sees: tuples as lists, NaN as null, infinities spelled.
    data = doc if isinstance(doc, Mapping) else doc.to_json_dict()
    instance = jsonio.loads(jsonio.dumps(data, lenient=True))
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [_describe(e, jsonschema) for e in errors[:20]]
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise ReportSchemaError(
            f"report document does not match {schema_path().name} ({len(errors)} problem(s)):\n"
            + "\n".join(lines) + more
        )


def _describe(error: Any, jsonschema: Any) -> str:
    # "X is not valid under any of the given schemas" (a nullable object) says nothing useful:
    # report the closest branch's own problem instead, e.g. a missing required key.
    if error.context:
        # The "wrong type" branch (null) is never the interesting one when the value is an object.
        branches = [e for e in error.context if e.validator != "type"] or list(error.context)
        error = jsonschema.exceptions.best_match(branches)
    message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    return f"  {_json_path(error.absolute_path)}: {message}"


def _json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out
