"""The launch-passes mode (``--llmperf-launches L``, L > 1): the suite runs once per server
launch, and a run's trials are spread over the launches (see :mod:`pytest_llmperf.plugin.passes`).

A run of ``n`` trials measures ``ceil(n / L)`` on each launch; in the last pass they join the
earlier launches' trials of the same run key, in launch order. The last launch makes up trials an
earlier pass did not measure (its run of the test failed before this run), so a run keeps at least
the trials asked for. Trials are never adaptive here: every launch measures its fixed share.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from pytest_llmperf.plugin.launch_plan import LaunchPlan
from pytest_llmperf.plugin.mode_stored import StoredBaselineSession
from pytest_llmperf.plugin.modes import Measured
from pytest_llmperf.results import at_launch, merge_runs

if TYPE_CHECKING:
    from pytest_llmperf.plugin.modes import RunRequest
    from pytest_llmperf.results import RunResult
    from pytest_llmperf.servers.manager import ServerManager


class LaunchPassesSession(StoredBaselineSession):
    """L launches of the server, one per pass over the suite (module docstring)."""

    def __init__(self, servers: ServerManager, launches: int) -> None:
        super().__init__(servers, LaunchPlan(launches))
        self._earlier_runs: dict[str, list[RunResult]] = {}  # by run key, in launch order

    def measure(self, request: RunRequest) -> Measured:
        server = self.server()
        earlier = self._earlier_runs.setdefault(request.key, [])
        count = self.plan.per_launch(request.trials)
        if self.last_pass:
            count = max(count, request.trials - sum(len(r.trials) for r in earlier))
        runner = request.runner(server, request.printer)
        run = at_launch(runner.run(request.workload, slo=request.slo, trials=count), self.plan.launch(self.pass_index))
        if not self.last_pass:
            earlier.append(run)
            return Measured(run, server, final=False)
        return Measured(functools.reduce(merge_runs, [*earlier, run]), server)


__all__ = ["LaunchPassesSession"]
