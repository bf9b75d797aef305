"""Suites whose server differs from this folder's run as sessions of their own, each with its
own pytest.ini (LoRA adapters and speculative decoding are server settings):
``pytest example_suites/lora`` and ``pytest example_suites/speculative``."""

collect_ignore = ["lora", "speculative"]
