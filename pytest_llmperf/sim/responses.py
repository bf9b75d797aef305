"""Writing one generation's response: an SSE stream like vLLM's, or one JSON body.

Each handler parks on its sequence until a chunk's worth of tokens (or the end) exists, then
writes one event (or a few, when it fell behind) and parks again. Fault knobs that act on the
response (stalls, drops) live here too.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextvars import ContextVar
from time import perf_counter
from typing import TYPE_CHECKING

from pytest_llmperf.sim.engine import sleep_until
from pytest_llmperf.sim.scheduler import FINISHED, Sequence

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from pytest_llmperf.sim.request_parsing import GenRequest
    from pytest_llmperf.sim.state import SimState
    from pytest_llmperf.sim.textgen import OutputPlan

# Set in a request's context when it deliberately breaks its connection, so the server's log
# filter can keep uvicorn from reporting the incomplete response as an application error.
SIMULATED_DROP: ContextVar[bool] = ContextVar("llmperf_sim_simulated_drop", default=False)


class Generation:
    """The response to one generation request: an SSE stream or one JSON body."""

    def __init__(self, state: SimState, req: GenRequest, seq: Sequence, plan: OutputPlan, drop_after: int | None) -> None:
        self.state = state
        self.req = req
        self.seq = seq
        self.plan = plan
        self.drop_after = drop_after
        self.created = int(time.time())
        self.model_json = json.dumps(state.model_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # uvicorn's send() is silent after a disconnect, so watch receive() to stop generating.
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive))
        try:
            if self.req.stream:
                await self._stream(send)
            else:
                await self._whole(send)
        finally:
            watcher.cancel()
            if self.seq.status != FINISHED:
                self.state.engine.abort(self.seq)

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.state.engine.abort(self.seq)
                return

    async def _wait_for(self, count: int) -> None:
        seq = self.seq
        if seq.status == FINISHED or seq.num_output >= count:
            return
        waiter = asyncio.get_running_loop().create_future()
        seq.notify_at = count
        seq.waiter = waiter
        await waiter

    async def _maybe_stall(self) -> None:
        await maybe_stall(self.state)

    def _drop(self) -> None:
        self.state.engine.abort(self.seq)
        SIMULATED_DROP.set(True)

    # ------------------------------------------------------------------ streaming

    async def _stream(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")],
            }
        )
        seq, plan = self.seq, self.plan
        target = plan.target_len
        per_chunk = self.state.config.tokens_per_chunk
        events = EventWriter(self)
        sent = 0
        while sent < target:
            await self._wait_for(min(sent + per_chunk, target))
            await self._maybe_stall()
            avail = seq.num_output
            if seq.finish_reason == "abort":
                # Shut down or client gone: end the body without [DONE] so clients see a cut stream.
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if self.drop_after is not None and avail >= self.drop_after:
                avail = self.drop_after
            if avail <= sent:
                continue
            await send({"type": "http.response.body", "body": events.chunks(sent, avail), "more_body": True})
            sent = avail
            if self.drop_after is not None and sent >= self.drop_after:
                self._drop()
                return
        await send({"type": "http.response.body", "body": events.tail(sent), "more_body": False})

    # ------------------------------------------------------------------ whole response

    async def _whole(self, send: Send) -> None:
        seq, plan = self.seq, self.plan
        await self._wait_for(self.drop_after or plan.target_len)
        await self._maybe_stall()
        if seq.finish_reason == "abort":
            await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if self.drop_after is not None:
            # Headers, then nothing: the connection closes with the body incomplete.
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            self._drop()
            return
        body = json.dumps(self._whole_body(), separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _whole_body(self) -> dict[str, object]:
        plan, seq = self.plan, self.seq
        n = seq.num_output
        r = min(plan.reasoning_tokens, n)
        choice: dict[str, object]
        if self.req.api == "chat":
            message: dict[str, object] = {
                "role": "assistant",
                "content": plan.text(r, n),
                "reasoning_content": plan.text(0, r) if r else None,
                "tool_calls": [],
            }
            call = plan.call
            if call is not None:
                chars = call.chars(n - r)
                message["content"] = None
                if chars >= call.name_end:
                    arguments = call.text[call.args_start : min(call.args_end, max(chars, call.args_start))]
                    message["tool_calls"] = [{"id": call.id, "type": "function",
                                              "function": {"name": call.name, "arguments": arguments}}]
            choice = {"index": 0, "message": message, "logprobs": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": plan.text(0, n), "logprobs": None}
            obj = "text_completion"
        choice["finish_reason"] = "tool_calls" if plan.call is not None and seq.finish_reason == "stop" else seq.finish_reason
        choice["stop_reason"] = plan.stop_reason
        return {
            "id": seq.request_id,
            "object": obj,
            "created": self.created,
            "model": self.state.model_name,
            "choices": [choice],
            "usage": usage_block(seq.prompt_len, n, seq.cached_tokens or 0, r),
        }


async def maybe_stall(state: SimState) -> None:
    """Hold a chunk (or a whole body) back ``stall_s`` (x time_scale) with probability ``stall_prob``."""
    cfg = state.config
    if cfg.stall_prob and state.rng.random() < cfg.stall_prob:
        await sleep_until(perf_counter() + cfg.stall_s * cfg.time_scale)


def usage_block(prompt: int, completion: int, cached: int, reasoning: int) -> dict[str, object]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


class EventWriter:
    """Builds a request's SSE events from string templates (one json.dumps per text, no dicts)."""

    __slots__ = ("gen", "chat", "head", "role_sent", "prompt_len", "usage_each", "stamp", "call_open", "args_sent")

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.chat = gen.req.api == "chat"
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        self.head = (
            f'data: {{"id":"{gen.seq.request_id}","object":"{obj}","created":{gen.created},'
            f'"model":{gen.model_json},"choices":['
        )
        self.role_sent = False
        self.prompt_len = gen.seq.prompt_len
        self.usage_each = gen.req.continuous_usage
        self.stamp = gen.state.config.stamp_chunks
        self.call_open = False  # the call's first delta (id, name) went out
        self.args_sent = 0  # characters of its arguments sent

    def _event(self, choice: str, completion_tokens: int) -> str:
        out = self.head + choice + "]"
        if self.usage_each:
            p = self.prompt_len
            out += (
                f',"usage":{{"prompt_tokens":{p},"total_tokens":{p + completion_tokens},'
                f'"completion_tokens":{completion_tokens}}}'
            )
        if self.stamp:
            out += f',"llmperf_server_time":{perf_counter()!r}'
        return out + "}\n\n"

    def chunks(self, start: int, end: int) -> bytes:
        """Events for tokens ``[start, end)``; the last one carries finish_reason at the end."""
        plan = self.gen.plan
        final = end >= plan.target_len
        events: list[str] = []
        if not self.chat:
            events.append(self._event(self._choice("text", plan.text(start, end), final), end))
            return "".join(events).encode()
        if not self.role_sent:
            # vLLM opens every chat stream with the role, once the first output is ready.
            self.role_sent = True
            events.append(
                self._event('{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}', 0)
            )
        r = plan.reasoning_tokens
        if start < r:
            mid = min(end, r)
            events.append(self._event(self._choice("reasoning_content", plan.text(start, mid), final and mid == end), mid))
            start = mid
        if start < end:
            if plan.call is not None:
                event = self._call_event(start - r, end - r, final)
                if event is not None:
                    events.append(self._event(event, end))
            else:
                events.append(self._event(self._choice("content", plan.text(start, end), final), end))
        return "".join(events).encode()

    def _call_event(self, start: int, end: int, final: bool) -> str | None:
        """The choice of a chunk holding visible tokens ``[start, end)`` of a tool call, shaped as
        vLLM's tool parsers stream it: nothing until the function's name is complete, then one
        delta with the call's index, id, type and name (and the arguments' text so far), then the
        arguments' new text in each chunk; None when the tokens add nothing to send (vLLM sends no
        chunk then). The last chunk carries finish_reason ``tool_calls`` (``length`` if cut)."""
        call = self.gen.plan.call
        assert call is not None
        chars = call.chars(end)
        upto = min(call.args_end, max(chars, call.args_start)) - call.args_start
        delta: dict[str, object] | None = None
        if not self.call_open:
            if chars >= call.name_end:
                self.call_open = True
                delta = {"index": 0, "id": call.id, "type": "function",
                         "function": {"name": call.name, "arguments": call.arguments[:upto]}}
                self.args_sent = upto
        elif upto > self.args_sent:
            delta = {"index": 0, "function": {"arguments": call.arguments[self.args_sent : upto]}}
            self.args_sent = upto
        if delta is None and not final:
            return None
        body = json.dumps({"tool_calls": [delta]} if delta is not None else {}, separators=(",", ":"))
        finish = "null"
        extra = ""
        if final:
            plan = self.gen.plan
            finish = json.dumps(plan.finish_reason)
            extra = f',"stop_reason":{json.dumps(plan.stop_reason)}'
        return f'{{"index":0,"delta":{body},"logprobs":null,"finish_reason":{finish}{extra}}}'


    def _choice(self, key: str, text: str, final: bool) -> str:
        finish = "null"
        extra = ""
        if final:
            plan = self.gen.plan
            finish = json.dumps(plan.finish_reason)
            extra = f',"stop_reason":{json.dumps(plan.stop_reason)}'
        if self.chat:
            return f'{{"index":0,"delta":{{"{key}":{json.dumps(text)}}},"logprobs":null,"finish_reason":{finish}{extra}}}'
        return f'{{"index":0,"text":{json.dumps(text)},"logprobs":null,"finish_reason":{finish}{extra}}}'

    def tail(self, sent: int) -> bytes:
        """The usage chunk (when asked for) and the closing ``[DONE]``."""
        gen = self.gen
        out = ""
        if gen.req.include_usage:
            seq = gen.seq
            usage = usage_block(seq.prompt_len, sent, seq.cached_tokens or 0, min(gen.plan.reasoning_tokens, sent))
            body = self.head[len("data: ") :] + "]" + ',"usage":' + json.dumps(usage, separators=(",", ":"))
            if self.stamp:
                body += f',"llmperf_server_time":{perf_counter()!r}'
            out += "data: " + body + "}\n\n"
        return (out + "data: [DONE]\n\n").encode()
