"""The ``llmperf`` command line: ``run``, ``compare``, ``baselines``, ``sim``; and the option
table the pytest plugin shares with it (:mod:`pytest_llmperf.cli.options`)."""
