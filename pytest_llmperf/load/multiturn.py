"""Multi-turn load: sessions that send the conversation so far, turn after turn.

See :mod:`pytest_llmperf.traffic.conversations` for the model. Per session s (seeded by
(workload.seed, s)): draw N turns; turn 0's user message is a session-unique salt plus words
(``input_tokens`` tokens with the chat template), each later user message is ``input_tokens``
tokens of words; the request carries the history (earlier user messages and the *received*
assistant answers, ``record.response_text``) and is scheduled the moment the user sends it
(after the think time), so TTFT is measured from then. A failed turn ends its session.

Open loop: session starts follow the workload's arrival process at ``rate_rps`` sessions/s
(ramped by ``ramp_s``); closed loop: ``concurrency`` users run sessions back to back. Sessions
starting in the warm-up (``warmup_s + ramp_s``, or the first ``warmup_requests`` sessions) are
warm-up in all their turns. No session starts after ``duration_s`` or past ``num_requests``
sessions; started ones finish within ``drain_s`` (default the request timeout).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_llmperf.load.arrivals import Pacer, arrival_times, ramped
from pytest_llmperf.load.loadgen import LoadOutcome, _LoopLagMonitor, new_record
from pytest_llmperf.load.prompts import SALT_WORDS, PromptFactory
from pytest_llmperf.records import PHASE_MEASURE, PHASE_WARMUP, RequestRecord

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from pytest_llmperf.workload import Workload


class ConversationLoad:
    def __init__(self, workload: Workload, factory: PromptFactory,
                 send: Callable[[Any, RequestRecord], Awaitable[RequestRecord]],
                 clock: Callable[[], float], prepare: Callable[[Any], Any] | None = None) -> None:
        assert workload.conversation is not None
        self.workload = workload
        self.spec = workload.conversation
        self.factory = factory
        self.send = send
        self.clock = clock
        self.prepare = prepare
        self.records: list[RequestRecord] = []
        self._index = itertools.count()
        self._vocab = np.asarray(factory.model.vocab, dtype=object)
        self._sessions = 0
        self._measure_start_s: float | None = None

    def _words(self, rng: np.random.Generator, n: int) -> str:
        return " ".join(self._vocab[rng.integers(0, len(self._vocab), size=max(1, n))])

    async def session(self, sid: int, phase: str) -> None:
        w = self.workload
        rng = np.random.default_rng([w.seed, sid, 41])
        turns = self.spec.draw_turns(rng)
        history: list[dict[str, object]] = []
        model = self.factory.model
        for turn in range(turns):
            input_tokens = int(w.input_tokens.sample(rng, 1)[0])
            output_tokens = int(w.output_tokens.sample(rng, 1)[0])
            if turn == 0:
                words = model.words_for(input_tokens)
                text = self.factory.salt(sid) + " " + self._words(rng, words - SALT_WORDS)
                expected: int | None = input_tokens
            elif history and history[-1].get("role") == "tool":
                text = ""  # the agentic loop: the model continues from the tool results, no user turn
                expected = None
            else:
                follow = self.spec.followup_tokens or input_tokens
                text = self._words(rng, int(round(follow / model.slope)))
                expected = None  # the history's length depends on the answers received
            index = next(self._index)
            request = self.factory.finish(index, phase, text, expected, output_tokens, f"turn{turn + 1}",
                                          history=list(history), keep_text=True, session=sid, turn=turn)
            payload = self.prepare(request) if self.prepare is not None else request
            now = self.clock()
            record = new_record(request, phase, now)
            if phase == PHASE_MEASURE and self._measure_start_s is None:
                self._measure_start_s = now
            self.records.append(record)
            try:
                await self.send(payload, record)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # recorded, like the load generator does
                record.ok = False
                record.error_kind = "client"
                record.error_detail = f"{type(exc).__name__}: {exc}"[:300]
                record.end_s = self.clock()
            if not record.ok:
                return
            if text:
                history.append({"role": "user", "content": text})
            answer = "".join(record.response_text or ())
            if record.tool_calls:
                history.extend(self._tool_turn(sid, turn, answer, record.tool_calls, rng))
            else:
                history.append({"role": "assistant", "content": answer})
            if turn + 1 < turns:
                await asyncio.sleep(self.spec.draw_think(rng))

    def _tool_turn(self, sid: int, turn: int, answer: str, calls: list[dict[str, str]],
                   rng: np.random.Generator) -> list[dict[str, object]]:
        """The assistant's calls as the next request sends them back, each followed by its result
        (``followup_tokens`` words, else the workload's input length, as a JSON object): the
        agentic loop of a tool-using client."""
        ids = [call.get("id") or f"call_{sid}_{turn}_{k}" for k, call in enumerate(calls)]
        out: list[dict[str, object]] = [{
            "role": "assistant", "content": answer or None,
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": c.get("name", ""), "arguments": c.get("arguments", "")}}
                           for i, c in zip(ids, calls)],
        }]
        tokens = self.spec.followup_tokens or int(self.workload.input_tokens.expected)
        for call_id in ids:
            result = self._words(rng, int(round(tokens / self.factory.model.slope)))
            out.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps({"result": result})})
        return out

    def _phase(self, sid: int, offset_s: float) -> str:
        w = self.workload
        return PHASE_WARMUP if sid < w.warmup_requests or offset_s < w.warmup_s + w.ramp_s else PHASE_MEASURE

    def _open(self, phase: str, offset_s: float, measured: int) -> bool:
        w = self.workload
        if phase != PHASE_MEASURE:
            return True
        if w.num_requests is not None and measured >= w.num_requests:
            return False
        measure_start = w.warmup_s + w.ramp_s
        return w.duration_s is None or offset_s < measure_start + w.duration_s

    async def run(self) -> LoadOutcome:
        w = self.workload
        monitor = _LoopLagMonitor()
        lag_task = asyncio.create_task(monitor.run())
        tasks: set[asyncio.Task] = set()
        start = self.clock()
        measured = 0
        try:
            if w.rate_rps is not None:
                pacer = Pacer()
                to_absolute = time.perf_counter() - self.clock()
                try:
                    offsets = ramped(arrival_times(w.arrival, w.rate_rps, w.burstiness, w.seed), w.ramp_s)
                    for sid, offset in enumerate(offsets):
                        phase = self._phase(sid, offset)
                        if not self._open(phase, offset, measured):
                            break
                        measured += phase == PHASE_MEASURE
                        await pacer.wait_until(start + offset + to_absolute)
                        task = asyncio.create_task(self.session(sid, phase))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                finally:
                    pacer.close()
            else:
                assert w.concurrency is not None
                counter = itertools.count()

                async def user() -> None:
                    nonlocal measured
                    while True:
                        sid = next(counter)
                        offset = self.clock() - start
                        phase = self._phase(sid, offset)
                        if not self._open(phase, offset, measured):
                            return
                        measured += phase == PHASE_MEASURE
                        await self.session(sid, phase)

                users = [asyncio.create_task(user()) for _ in range(w.concurrency)]
                done, pending = await asyncio.wait(users, timeout=(w.duration_s or 0) + w.warmup_s + w.ramp_s
                                                   if w.duration_s is not None else None)
                tasks.update(pending)
            arrivals_end = self.clock()
            drain = w.drain_s if w.drain_s is not None else w.timeout_s
            if tasks:
                await asyncio.wait(set(tasks), timeout=drain)
        finally:
            cancelled = 0
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            now = self.clock()
            for r in self.records:
                if r.end_s is None or (not r.ok and r.error_kind is None):
                    r.ok = False
                    r.error_kind = "cancelled"
                    r.error_detail = "still in flight at the run's deadline"
                    r.end_s = r.end_s or now
                    cancelled += 1
            lag_task.cancel()
            await asyncio.gather(lag_task, return_exceptions=True)
        lag_max, lag_p99 = monitor.stats()
        measure_start = self._measure_start_s if self._measure_start_s is not None else arrivals_end
        return LoadOutcome(records=self.records, measure_start_s=measure_start, arrivals_end_s=arrivals_end,
                           end_s=self.clock(), loop_lag_max_s=lag_max, loop_lag_p99_s=lag_p99, cancelled=cancelled)
