"""pytest-llmperf plugin (hooks, fixtures, options)."""
