"""Engines' CI perf definitions turned into pytest-llmperf suites of gated tests.

- :mod:`pytest_llmperf.convert.vllm` reads vLLM's serving definitions
  (``.buildkite/performance-benchmarks/tests/serving-tests*.json``) into a :class:`~.vllm.Conversion`:
  the server configurations, one gated test per definition, and a note for every parameter
  that has no pytest-llmperf counterpart.
- :mod:`pytest_llmperf.convert.suite` writes a conversion out as a directory of sub-suites, one
  per server configuration (``llmperf convert vllm FILE --out DIR``).

Domain modules: they read JSON and write text files; no network, no pytest, no load layer.
"""
