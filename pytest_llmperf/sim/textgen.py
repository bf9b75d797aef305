"""What a simulated request generates: how many tokens, why it stops, and the words themselves.

The words come from a fixed pseudo-random table of vocabulary words (every entry one token of
:mod:`.tokenizer`); a request reads the table from an offset drawn from its seed, so the same
seed always yields the same text and no per-token random numbers are drawn.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_llmperf.errors import InputError
from pytest_llmperf.sim.tokenizer import VOCAB_WORDS, word_piece

if TYPE_CHECKING:
    from collections.abc import Sequence

_TABLE_SIZE = 4096
WORD_TABLE: tuple[str, ...] = tuple(
    word_piece(i) for i in random.Random(0x5EED).choices(range(len(VOCAB_WORDS)), k=_TABLE_SIZE)
)
# Spread of natural answer lengths around the median (lognormal sigma): most answers within
# ~0.3x-3x of the median, as chat transcripts show.
NATURAL_LENGTH_SIGMA = 0.7


@dataclass(slots=True)
class ToolCallPlan:
    """A tool call in the visible output: its text is ``{"name": "N", "parameters": ARGS}``.

    Offsets are in characters of the visible text: ``name_end`` just past the name's closing
    quote (the first delta goes out once the tokens reach it, as vLLM's parser emits the name
    once it is complete), ``[args_start, args_end)`` the arguments. ``ends[j]`` is where visible
    token j's text ends."""

    id: str
    name: str
    text: str
    name_end: int
    args_start: int
    args_end: int
    ends: list[int]

    @property
    def arguments(self) -> str:
        return self.text[self.args_start : self.args_end]

    def chars(self, tokens: int) -> int:
        """Characters of the visible text that ``tokens`` visible tokens hold."""
        return self.ends[tokens - 1] if tokens > 0 else 0


@dataclass(slots=True)
class OutputPlan:
    """The whole output of one request, decided when it arrives.

    Tokens ``[0, reasoning_tokens)`` are hidden reasoning, the rest visible. ``texts`` is only
    set when a stop string cut the output (then each token's text is trimmed to the cut) or the
    output is a constrained answer (each token's text); ``call`` when that answer is a tool call.
    """

    target_len: int
    finish_reason: str
    stop_reason: str | None
    reasoning_tokens: int
    offset: int
    texts: list[str] | None = None
    call: ToolCallPlan | None = None

    def text(self, start: int, end: int) -> str:
        """Concatenated text of tokens ``[start, end)``."""
        if end <= start:
            return ""
        if self.texts is not None:
            return "".join(self.texts[start:end])
        i = (self.offset + start) % _TABLE_SIZE
        n = end - start
        if i + n <= _TABLE_SIZE:
            return "".join(WORD_TABLE[i : i + n])
        return "".join(WORD_TABLE[(i + j) % _TABLE_SIZE] for j in range(n))


def plan_output(
    rng: random.Random,
    *,
    max_tokens: int,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    stop: Sequence[str] = (),
    include_stop_str_in_output: bool = False,
    reasoning_tokens: int = 0,
    natural_median_tokens: int = 160,
) -> OutputPlan:
    """Decide a request's output.

    With ``ignore_eos`` it runs to ``max_tokens``. Otherwise its natural length is the hidden
    reasoning plus a lognormal answer length (median ``natural_median_tokens``), clamped to
    ``[max(min_tokens, 1), max_tokens]``; ending before max_tokens is an EOS ("stop").
    A stop string, checked once ``min_tokens`` tokens exist (vLLM's rule), ends it earlier.
    """
    if max_tokens < 1:
        raise InputError(f"max_tokens must be at least 1, got {max_tokens}")
    offset = rng.randrange(_TABLE_SIZE)
    answer = max(1, round(rng.lognormvariate(math.log(natural_median_tokens), NATURAL_LENGTH_SIGMA)))
    if ignore_eos:
        target, reason = max_tokens, "length"
    else:
        natural = max(reasoning_tokens + answer, min_tokens, 1)
        target, reason = (max_tokens, "length") if natural >= max_tokens else (natural, "stop")
    out = OutputPlan(target, reason, None, min(reasoning_tokens, target), offset)
    if stop:
        _apply_stop(out, tuple(stop), min_tokens, include_stop_str_in_output)
    return out


def plan_constrained(
    pieces: list[str],
    *,
    max_tokens: int,
    reasoning_tokens: int,
    offset: int,
    call: tuple[str, str, str] | None = None,
) -> OutputPlan:
    """The plan of a constrained answer whose visible tokens are ``pieces`` (the answer's text as
    the tokenizer splits it), after ``reasoning_tokens`` of hidden reasoning read from the word
    table at ``offset``. It ends when the answer does (``stop``, or ``tool_calls`` for a ``call``
    given as (id, name, arguments)), or at ``max_tokens`` (``length``: the answer is cut short)."""
    if max_tokens < 1:
        raise InputError(f"max_tokens must be at least 1, got {max_tokens}")
    reasoning = [WORD_TABLE[(offset + j) % _TABLE_SIZE] for j in range(reasoning_tokens)]
    texts = reasoning + pieces
    total = len(texts)
    if total > max_tokens:
        target, reason = max_tokens, "length"
    else:
        target, reason = total, "tool_calls" if call is not None else "stop"
    out = OutputPlan(target, reason, None, min(reasoning_tokens, target), offset, texts[:target])
    if call is not None:
        call_id, name, arguments = call
        text = "".join(pieces)
        name_end = len('{"name": ') + len(json.dumps(name))
        args_start = name_end + len(', "parameters": ')
        ends = list(itertools.accumulate(len(p) for p in pieces))
        out.call = ToolCallPlan(call_id, name, text, name_end, args_start, args_start + len(arguments), ends)
    return out


def _apply_stop(plan: OutputPlan, stops: tuple[str, ...], min_tokens: int, include: bool) -> None:
    text = ""
    ends: list[int] = []  # character offset where each token's text ends
    longest = max(len(s) for s in stops)
    for j in range(plan.target_len):
        before = len(text)
        text += plan.text(j, j + 1)
        ends.append(len(text))
        if j + 1 < min_tokens:
            continue
        window_start = max(0, before - longest + 1)
        best: tuple[int, str] | None = None
        for s in stops:
            pos = text.find(s, window_start)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        if best is None:
            continue
        pos, s = best
        cut = pos + len(s) if include else pos
        starts = [0] + ends[:-1]
        plan.texts = [text[min(a, cut) : min(b, cut)] for a, b in zip(starts, ends)]
        plan.target_len = j + 1
        plan.finish_reason = "stop"
        plan.stop_reason = s
        plan.reasoning_tokens = min(plan.reasoning_tokens, plan.target_len)
        return
