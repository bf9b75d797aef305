"""How a session's launches are laid out in passes over the suite (``--llmperf-launches L``, A/B
blocks): the mode session holds one (:mod:`pytest_llmperf.plugin.modes`), :mod:`pytest_llmperf.plugin.passes`
runs the passes it lays out."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_llmperf.servers.pair import block_order


@dataclass(frozen=True)
class LaunchPlan:
    """How a session's launches are laid out: ``launches`` per side (A/B mode: blocks)."""

    launches: int = 1
    ab: bool = False

    @property
    def passes(self) -> int:
        return 2 * self.launches if self.ab else self.launches

    def launch(self, p: int) -> int:
        """Which launch (A/B: block) pass ``p`` measures on, 0-based."""
        return p // 2 if self.ab else p

    def side(self, p: int) -> str | None:
        """A/B mode: the side pass ``p`` measures (None otherwise)."""
        return block_order(p // 2)[p % 2] if self.ab else None

    def per_launch(self, trials: int) -> int:
        """Trials a run of ``trials`` measures on each launch: ceil(trials / launches)."""
        return -(-trials // self.launches)


__all__ = ["LaunchPlan"]
