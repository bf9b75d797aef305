"""Multi-turn conversations: sessions of N turns with think time between them.

A session is one simulated user. Turn t (0-based) sends the whole conversation so far: the
earlier user messages and the server's *actual* answers, then a new user message of
``input_tokens`` tokens (the workload's distribution; ``followup_tokens`` for turns 2.. when
given: a long first message, short follow-ups) asking for ``output_tokens``. After the
answer the user thinks for ``think_time_s`` (exponential with that mean when
``think="exponential"``, else fixed) before the next turn.

Sessions arrive open loop at the workload's ``rate_rps`` (sessions per second) or are run by a
fixed number of concurrent users (the workload's ``concurrency``); ``num_requests`` counts
sessions. The expected prefix-cache hit of turn t >= 1 is its whole history (prompt of turn t-1
plus its answer), so from the second turn on most of each prompt should hit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    import numpy as np

THINK = ("fixed", "exponential")


class ConversationError(InputError):
    """A conversation spec that cannot be run; the message names the key."""


@dataclass(frozen=True)
class ConversationSpec:
    turns: int | tuple[int, int] = 3
    think_time_s: float = 1.0
    think: str = "fixed"
    # Length of the user messages of turns 2.. (None: the workload's input_tokens, like turn 1).
    followup_tokens: int | None = None

    @classmethod
    def parse(cls, spec: Any) -> ConversationSpec:
        if isinstance(spec, ConversationSpec):
            return spec
        if isinstance(spec, int) and not isinstance(spec, bool):
            spec = {"turns": spec}
        if not isinstance(spec, Mapping):
            raise ConversationError(f"conversation: expected a mapping (turns, think_time_s, think), got {spec!r}")
        data = dict(spec)
        allowed = ("turns", "think_time_s", "think", "followup_tokens")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ConversationError(f"conversation: unknown key(s) {', '.join(unknown)}; valid: {', '.join(allowed)}")
        turns = data.get("turns", 3)
        if isinstance(turns, (list, tuple)):
            if len(turns) != 2 or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in turns) \
                    or turns[1] < turns[0]:
                raise ConversationError(f"conversation.turns: expected N or [min, max] with 1 <= min <= max, got {turns!r}")
            data["turns"] = (int(turns[0]), int(turns[1]))
        elif isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise ConversationError(f"conversation.turns must be a positive integer or [min, max], got {turns!r}")
        think = data.get("think_time_s", 1.0)
        if isinstance(think, bool) or not isinstance(think, (int, float)) or not math.isfinite(think) or think < 0:
            raise ConversationError(f"conversation.think_time_s must be a non-negative number, got {think!r}")
        data["think_time_s"] = float(think)
        follow = data.get("followup_tokens")
        if follow is not None and (isinstance(follow, bool) or not isinstance(follow, int) or follow < 1):
            raise ConversationError(f"conversation.followup_tokens must be a positive integer, got {follow!r}")
        if data.get("think", "fixed") not in THINK:
            raise ConversationError(f"conversation.think must be one of {', '.join(THINK)}, got {data['think']!r}")
        return cls(**data)

    def draw_turns(self, rng: np.random.Generator) -> int:
        """Turns of one session: fixed, or uniform over [min, max]."""
        if isinstance(self.turns, int):
            return self.turns
        return int(rng.integers(self.turns[0], self.turns[1] + 1))

    def draw_think(self, rng: np.random.Generator) -> float:
        if self.think == "exponential" and self.think_time_s > 0:
            return float(rng.exponential(self.think_time_s))
        return self.think_time_s

    def label(self) -> str:
        turns = self.turns if isinstance(self.turns, int) else f"{self.turns[0]}-{self.turns[1]}"
        return f"{turns} turns think {self.think_time_s:g}s"

    def to_spec(self) -> dict[str, object]:
        turns = list(self.turns) if isinstance(self.turns, tuple) else self.turns
        return {"turns": turns, "think_time_s": self.think_time_s, "think": self.think,
                "followup_tokens": self.followup_tokens}
