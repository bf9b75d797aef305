"""Traffic taken from files: dataset prompts, replayed traces, multi-turn conversation specs.

Domain modules (no network, no load layer): they read and validate files and describe traffic;
:mod:`pytest_llmperf.load.file_requests` (traces, datasets) and :mod:`pytest_llmperf.load.multiturn`
(conversations) turn them into requests.
"""
