"""One exception tree: pytest-llmperf raises its own classes (pytest_llmperf/errors.py), never a
builtin exception constructed on the spot, so ``except LLMPerfError`` catches every error it
raises on purpose. (That every exception class it defines derives from LLMPerfError is checked in
test_code_rules.py.)"""

from __future__ import annotations

import ast
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from pytest_llmperf.baseline.samples import pack_samples, unpack_samples
from pytest_llmperf.baseline.store import BaselineCorrupt, BaselineStore, StoreError
from pytest_llmperf.errors import LLMPerfError

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_llmperf"
# Raised directly, these would escape ``except LLMPerfError``. Fine: NotImplementedError (an
# abstract method), AttributeError (a module's __getattr__), ImportError (a missing optional
# dependency, with the pip command), re-raises (``raise``, ``raise exc``) and assert.
BUILTINS = frozenset({"ValueError", "RuntimeError", "TypeError", "KeyError", "OSError", "Exception",
                      "IOError", "EnvironmentError", "LookupError", "IndexError", "ArithmeticError",
                      "ZeroDivisionError", "FileNotFoundError", "PermissionError"})


def builtin_raises(source: str, filename: str) -> list[str]:
    """``file:line: raise Name(...)`` for every raise of a builtin exception class in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(target, ast.Name) and target.id in BUILTINS:
            found.append(f"{filename}:{node.lineno}: raise {target.id}")
    return found


def test_the_check_sees_what_it_should():
    source = "\n".join([
        "def f(x):",
        "    if x: raise ValueError('bad')",      # 2: a builtin, constructed
        "    if x: raise RuntimeError",           # 3: a builtin class, raised bare
        "    try: pass",
        "    except OSError as exc: raise exc",   # 5: a re-raise: fine
        "    except KeyError: raise",             # 6: a re-raise: fine
        "    raise NotImplementedError",          # 7: fine
        "    raise InputError('x') from None",    # 8: ours: fine
        "    assert x, 'no'",                     # 9: fine
    ])
    assert builtin_raises(source, "m.py") == ["m.py:2: raise ValueError", "m.py:3: raise RuntimeError"]


def test_no_module_raises_a_builtin_exception():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found.extend(builtin_raises(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent))))
    assert found == [], "raise a class of pytest_llmperf's exception tree instead:\n" + "\n".join(found)


def test_corrupt_samples_raise_baseline_corrupt():
    good = pack_samples(np.arange(4.0))
    for bad in ({**good, "codec": "zip"}, {**good, "shape": [5]}, {**good, "data": "!!!"},
                {**good, "dtype": "float16"}, ["not", "a", "mapping"]):
        with pytest.raises(BaselineCorrupt) as info:
            unpack_samples(bad)
        assert isinstance(info.value, StoreError) and isinstance(info.value, LLMPerfError)


def test_corrupt_samples_in_a_saved_run_read_as_a_corrupt_baseline(tmp_path, capsys):
    from pytest_llmperf.cli.baselines_command import baselines_main

    store = BaselineStore(tmp_path)
    path = store.save("main", {"tests": {}, "ttft_s": pack_samples(np.ones(3))})
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["run"]["ttft_s"]["data"] = "!!!"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    packed = store.latest("main").run["ttft_s"]
    with pytest.raises(BaselineCorrupt, match="not valid base64"):
        unpack_samples(packed)
    # ``llmperf baselines show`` names the unreadable series rather than failing.
    assert baselines_main(["show", "main", "--store", str(tmp_path)]) == 0
    assert "<unreadable samples: unpack_samples: 'data' is not valid base64" in capsys.readouterr().out
