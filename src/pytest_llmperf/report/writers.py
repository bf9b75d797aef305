"""Write the report directory from a session report document (see report/document.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from .document import without_samples


def write_reports(doc: Mapping[str, Any], report_dir: Path, *, github_step_summary: str | None = None) -> list[Path]:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / "llmperf.json"
    path.write_text(json.dumps(without_samples(doc), indent=1, allow_nan=False, default=str))
    return [path]
