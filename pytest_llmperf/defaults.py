"""Defaults shared by the plugin's option table (:mod:`pytest_llmperf.cli.options`), the
``llmperf`` command and the library (the baseline store, its history reader), written once.

Pure data, nothing imported: the option table reads this when pytest loads the plugin, which
must not load the baseline package or anything heavy.
"""

from __future__ import annotations

DEFAULT_STORE = ".llmperf"  # the store's root: a directory (or a URL such as s3://bucket/prefix)
DEFAULT_KEEP = 20  # saved runs kept per baseline name
DEFAULT_HISTORY = 10  # sessions of a baseline's history the gate learns session noise from

__all__ = ["DEFAULT_HISTORY", "DEFAULT_KEEP", "DEFAULT_STORE"]
