"""Traffic taken from files: dataset prompts, replayed traces, multi-turn conversation specs.

Domain modules (no network, no load layer): they read and validate files and describe traffic;
:mod:`pytest_llmperf.load.traffic` turns them into requests.
"""
