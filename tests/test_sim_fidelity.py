"""The simulator held to its own model: measured TTFT and TPOT are what the scheduler predicts.

The prediction is not a hard-coded number: :func:`pytest_llmperf.sim.scheduler.replay` runs the
simulator's own scheduler and roofline perf model offline, in virtual time, on the arrival
schedule the client actually produced (each record's ``sent_s``), stepping exactly as the live
engine does (a step starts when the previous one ends, or at the arrival that wakes an idle
engine; an arrival joins the next step). Per request that gives the modelled first-token and
finish times; TTFT is measured from ``scheduled_s`` on both sides, as the client reports it.

Bounds, per (load, slowdown) cell:

- TTFT p50 within 10% of the predicted p50, plus ``HTTP_ALLOWANCE_S`` (2 ms). The model covers
  queueing and prefill; the loopback HTTP path is outside it: before the engine stamps the
  arrival the server parses and tokenizes the request, and after the first token the handler
  wakes, writes, and the client reads (1.5-3 ms measured on a 2-core box). The bug this guards
  against (issue 17: the first chunk held ~30 ms by Nagle's algorithm until the client's
  delayed ACK) is ten times that allowance.
- TPOT p50 within 10% of the predicted p50 (both ends of that interval carry the same HTTP
  time, so it cancels).
- TTFT p50 and p95 at slowdown 1.5 at least 1.2x those at slowdown 1 at every load (the model
  predicts ~1.5x; issue 17 measured ~1.0x at 20 req/s because a TCP timer, not the engine,
  set TTFT).

Loads: 5 req/s (low: ~2 requests in flight), 20 req/s (moderate: ~8, every step a mixed
prefill+decode step) and 60 req/s (near saturation for slowdown 1.5, whose modelled capacity
for 256/64-token requests is ~71 req/s). The server runs the stdlib asyncio loop, where the bug
lived: uvloop sets TCP_NODELAY on every connection by itself, asyncio only when the listening
socket's protocol is IPPROTO_TCP.

Each load runs 4 s, but 20 req/s 2 s: its 40 requests hold its TTFT median within ~1.5 ms of the
model, against 3.7 ms allowed. At 60 req/s 4 s are needed: half that moves its median ~0.5 ms
further from the model (the requests that open a connection weigh more), whose margin is ~1 ms.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import numpy as np
import pytest

from pytest_llmperf import Workload
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.metrics import delayed_ack_stall_warning
from pytest_llmperf.servers.process import ServerProcess, free_port
from pytest_llmperf.sim import server as sim_server
from pytest_llmperf.sim.config import SimConfig
from pytest_llmperf.sim.scheduler import replay

PRESET = "llama-3.1-8b-h100"
INPUT_TOKENS, OUTPUT_TOKENS = 256, 64
DURATION_S = {5.0: 4.0, 20.0: 2.0, 60.0: 4.0}  # rate -> seconds
RATES = tuple(DURATION_S)
SLOWDOWNS = (1.0, 1.5)
REL_TOL = 0.10
HTTP_ALLOWANCE_S = 0.002


# ---------------------------------------------------------------------- sockets


async def _accepted_nodelay(sock: socket.socket) -> int:
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            conn = transport.get_extra_info("socket")
            seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    host, port = sock.getsockname()[:2]
    _, writer = await asyncio.open_connection(host, port)
    try:
        return await asyncio.wait_for(seen, 5)
    finally:
        writer.close()
        server.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_accepted_connections_have_tcp_nodelay(loop):
    """The root cause of issue 17: connections accepted on bind_socket's socket had Nagle on."""
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        run = lambda coro: uvloop.run(coro)  # noqa: E731
    else:
        run = asyncio.run
    sock = sim_server.bind_socket("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    assert run(_accepted_nodelay(sock)) == 1


# ---------------------------------------------------------------------- the offline replay


def test_replay_of_a_lone_request_is_the_lone_request_timing():
    perf = SimConfig(preset=PRESET, slowdown=1.5).perf_model()
    (only,) = replay(perf, [(3.0, INPUT_TOKENS, OUTPUT_TOKENS)])
    lone = perf.lone_request(INPUT_TOKENS, OUTPUT_TOKENS)
    assert only.ttft_s == pytest.approx(lone.ttft_s, rel=1e-9)
    assert only.tpot_s == pytest.approx(lone.tpot_s, rel=1e-9)


def test_replay_an_arrival_during_a_step_joins_the_next_one():
    perf = SimConfig(preset=PRESET).perf_model()
    arrival = 0.020
    first, second = replay(perf, [(0.0, INPUT_TOKENS, OUTPUT_TOKENS), (arrival, INPUT_TOKENS, OUTPUT_TOKENS)])
    # The first request prefills alone, then decodes one token per step (c tokens computed).
    boundary = perf.prefill_step_time_s(INPUT_TOKENS)
    assert first.first_token_s == pytest.approx(boundary)
    c = INPUT_TOKENS
    while boundary <= arrival:
        boundary += perf.decode_step_time_s(1, c)
        c += 1
    # The second request waits for the step in flight, then prefills in a mixed step with the
    # first request's next token: queueing behind the running step is part of its TTFT.
    n = INPUT_TOKENS
    mixed = perf.step_time_s(1 + n, (c + 1) + n * (n + 1) / 2, (c + 1) + n)
    assert second.first_token_s == pytest.approx(boundary + mixed, rel=1e-9)
    assert second.ttft_s == pytest.approx(boundary - arrival + mixed, rel=1e-9)


# ---------------------------------------------------------------------- live fidelity


def _launch(tmp_path_factory, slowdown: float) -> tuple[ServerProcess, str]:
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = ServerProcess(
        [sys.executable, "-m", "pytest_llmperf.sim", "--host", "127.0.0.1", "--port", str(port),
         "--preset", PRESET, "--seed", "1", "--slowdown", str(slowdown), "--loop", "asyncio"],
        health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=log, startup_timeout_s=30, grace_s=2,
    )
    proc.start()
    return proc, f"http://127.0.0.1:{port}"


class Cell:
    """One (slowdown, rate) run: the measured records and the model's prediction for them."""

    def __init__(self, slowdown: float, rate: float, result) -> None:
        self.slowdown, self.rate, self.result = slowdown, rate, result
        records = [r for r in result.records if r.ok]
        assert len(records) >= 0.9 * rate * DURATION_S[rate]
        perf = SimConfig(preset=PRESET, slowdown=slowdown).perf_model()
        predicted = replay(perf, [(r.sent_s, r.prompt_tokens, r.output_tokens) for r in records])
        self.ttft = np.array([r.ttft_s for r in records])
        self.tpot = np.array([r.tpot_s for r in records])
        self.pred_ttft = np.array([p.first_token_s - r.scheduled_s for p, r in zip(predicted, records)])
        self.pred_tpot = np.array([p.tpot_s for p in predicted])

    def describe(self) -> str:
        ms = lambda v: f"{v * 1e3:.2f} ms"  # noqa: E731
        return (
            f"slowdown {self.slowdown} at {self.rate} req/s: TTFT p50 {ms(np.median(self.ttft))} "
            f"(model {ms(np.median(self.pred_ttft))}), TTFT p95 {ms(np.percentile(self.ttft, 95))} "
            f"(model {ms(np.percentile(self.pred_ttft, 95))}), TPOT p50 {ms(np.median(self.tpot))} "
            f"(model {ms(np.median(self.pred_tpot))})"
        )


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict[tuple[float, float], Cell]:
    cells = {}
    for slowdown in SLOWDOWNS:
        proc, root = _launch(tmp_path_factory, slowdown)
        try:
            runner = Runner(root + "/v1")
            for rate in RATES:
                workload = Workload(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, rate_rps=rate,
                                    duration_s=DURATION_S[rate], arrival="constant", seed=1)
                cells[slowdown, rate] = Cell(slowdown, rate, runner.run(workload))
        finally:
            proc.stop()
    return cells


@pytest.mark.integration
@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("slowdown", SLOWDOWNS)
def test_ttft_and_tpot_medians_follow_the_model(grid, slowdown, rate):
    cell = grid[slowdown, rate]
    ttft, pred_ttft = np.median(cell.ttft), np.median(cell.pred_ttft)
    tpot, pred_tpot = np.median(cell.tpot), np.median(cell.pred_tpot)
    assert abs(ttft - pred_ttft) <= REL_TOL * pred_ttft + HTTP_ALLOWANCE_S, cell.describe()
    assert abs(tpot - pred_tpot) <= REL_TOL * pred_tpot, cell.describe()
    # The run was clean: no TCP timer in the first-token times.
    assert cell.result.summary.validity.warnings == [], cell.describe()


@pytest.mark.integration
@pytest.mark.parametrize("rate", RATES)
def test_ttft_rises_with_the_slowdown(grid, rate):
    plain, slow = grid[1.0, rate], grid[1.5, rate]
    for q in (50, 95):
        assert np.percentile(slow.ttft, q) > 1.2 * np.percentile(plain.ttft, q), (plain.describe(), slow.describe())


# ---------------------------------------------------------------------- the client's diagnostic


def _nagle_socket(host: str, port: int) -> socket.socket:
    """The listening socket as bind_socket made it before the fix: proto 0, no TCP_NODELAY."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    return sock


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="relies on Linux's 40 ms delayed ACK")
def test_client_warns_when_a_server_leaves_nagle_on(monkeypatch):
    """Real servers can hit this too (any asyncio server on a proto-0 listening socket)."""
    monkeypatch.setattr(sim_server, "bind_socket", _nagle_socket)
    with sim_server.start_in_thread(SimConfig(preset=PRESET, seed=1), loop="asyncio") as sim:
        result = Runner(sim.base_url, RunnerConfig(use_uvloop=False)).run(
            Workload(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, rate_rps=20, duration_s=1.5,
                     arrival="constant", seed=1))
    ttft_p50 = result.summary.ttft_s.p50
    assert ttft_p50 > 0.035  # the bug is reproduced: ~40 ms against a modelled ~11 ms
    (warning,) = result.summary.validity.warnings
    assert "TCP_NODELAY" in warning and "delayed ACK" in warning
    assert delayed_ack_stall_warning(result.records) == warning
