"""Whether the server served the request kind a run asked for, or answered something else.

A server that cannot serve a kind usually says so on every request (an HTTP 4xx for an image, an
unknown adapter, an embeddings route it does not have), or answers as if the kind were not there
(no tool call when one is forced, text instead of the JSON asked for, a prompt count without the
images). Counted one request at a time that is an error rate or an invalid-answer rate; when it
is every request of the run, the run measured nothing of what it claims, and the test fails with
one line naming the cause and where to look. A run where only some requests miss is left to the
rates (``error_rate``, ``invalid_rate``) and the gate.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.records import RequestRecord
    from pytest_llmperf.workload import Workload

# Where to look, per kind, when a server refuses or ignores it.
HINTS = {
    "images": "is it a vision model? (vLLM: a multimodal model and --limit-mm-per-prompt; llama.cpp: --mmproj)",
    "embeddings": "is it serving an embedding model? (vLLM: --runner pooling; llama.cpp: --embeddings)",
    "rerank": "is it serving a reranker? (vLLM: --runner pooling with a cross-encoder; llama.cpp: --reranking)",
    "tools": "does it parse tool calls? (vLLM: --enable-auto-tool-choice --tool-call-parser NAME; llama.cpp: --jinja)",
    "response_format": "does it constrain output? (vLLM: a structured-output backend; llama.cpp: grammars)",
    "adapters": "is the adapter loaded? (vLLM: --enable-lora --lora-modules NAME=PATH; llama.cpp: --lora)",
}


def kind_problems(workload: Workload, records: Sequence[RequestRecord]) -> list[str]:
    """One line per kind the server refused or ignored on every measured request (see the module
    docstring); empty when it served what was asked (or nothing can tell)."""
    measured = [r for r in records if r.phase == "measure"]
    if not measured:
        return []
    out = []
    kind = _kind(workload)
    refused = [r for r in measured if not r.ok and r.error_kind in ("http_4xx", "wrong_answer")]
    if kind is not None and len(refused) == len(measured):
        reasons = Counter(r.error_detail or r.error_kind for r in refused)
        detail, _ = reasons.most_common(1)[0]
        what = "image" if kind == "images" else kind
        out.append(f"the server served no {what} request: all {len(measured)} failed ({detail}); {HINTS[kind]}")
    if workload.adapters is not None:
        for name in workload.adapters.names:
            mine = [r for r in measured if r.request_type == name]
            if mine and all(not r.ok and r.error_kind == "http_4xx" for r in mine):
                out.append(f"the server refused every request to adapter {name!r} ({mine[0].error_detail}); "
                           f"{HINTS['adapters']}")
    checked = [r for r in measured if r.answer_valid is not None]
    if checked and all(r.answer_valid is False for r in checked):
        kinds = Counter(r.answer_invalid for r in checked)
        top, count = kinds.most_common(1)[0]
        if count == len(checked) and top in ("no_call", "not_json"):
            what = "tools" if top == "no_call" else "response_format"
            out.append(f"the server ignored {what}: all {len(checked)} answers were invalid "
                       f"({checked[0].answer_error}); {HINTS[what]}")
    return out


def _kind(workload: Workload) -> str | None:
    if workload.api in ("embeddings", "rerank"):
        return workload.api
    if workload.images is not None or any(m.images is not None for m in workload.mix):
        return "images"
    return None


__all__ = ["HINTS", "kind_problems"]
