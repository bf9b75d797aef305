"""Scrape an engine's ``/metrics`` during a run: before it, at an interval, and after it.

Telemetry is a side channel. Every failure here (no endpoint, a timeout, garbage text) turns into
``available=False`` with a reason, and the run goes on: nothing in this module raises into the
load loop. What a trial's scrapes come to is a
:class:`~pytest_llmperf.telemetry_data.ServerTelemetry` (defined with the other data the side
channels record, in :mod:`pytest_llmperf.telemetry_data`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from pytest_llmperf.errors import InputError
from pytest_llmperf.telemetry.prometheus import COUNTERS, GAUGES, TelemetryError, parse_exposition
from pytest_llmperf.telemetry_data import DEFAULT_SCRAPE_INTERVAL_S as DEFAULT_INTERVAL_S
from pytest_llmperf.telemetry_data import MetricsSnapshot, SeriesPoint, ServerTelemetry

DEFAULT_TIMEOUT_S = 2.0


def metrics_url(url: str) -> str:
    """The ``/metrics`` URL of a server given its API base (``http://h:8000/v1``) or root.

    A URL whose path already ends in ``metrics`` is kept as is (SGLang behind a router, a custom
    path). Otherwise the OpenAI ``/v1`` suffix is dropped, since engines serve ``/metrics`` at
    the root.
    """
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        raise InputError(f"telemetry URL {url!r} is not absolute (expected http://host:port[/v1])")
    path = parts.path.rstrip("/")
    if path.endswith("metrics"):
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path + "/metrics", "", ""))


@dataclass
class ScrapeOutcome:
    """A scrape's result: a snapshot, or ``None`` and the reason there is none."""

    snapshot: MetricsSnapshot | None
    reason: str | None = None


async def scrape_outcome(
    client_or_url: httpx.AsyncClient | str,
    *,
    url: str | None = None,
    model: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    origin_s: float | None = None,
) -> ScrapeOutcome:
    """Fetch and parse ``/metrics`` once; never raises (failures become ``reason``).

    ``client_or_url`` is an API base URL, or an ``httpx.AsyncClient`` whose ``base_url`` points at
    the server (or pass ``url`` explicitly). ``origin_s`` is the run's ``time.perf_counter()``
    origin, so ``MetricsSnapshot.time_s`` lines up with request records; without it, time is absolute
    perf_counter seconds.
    """
    try:
        if isinstance(client_or_url, str):
            target = metrics_url(url or client_or_url)
            async with httpx.AsyncClient(timeout=timeout_s) as own_client:
                return await _fetch_and_parse(own_client, target, model, timeout_s, origin_s)
        target = metrics_url(url or str(client_or_url.base_url))
        return await _fetch_and_parse(client_or_url, target, model, timeout_s, origin_s)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the side channel must not take the run down
        return ScrapeOutcome(None, f"scrape failed: {type(exc).__name__}: {exc}")


async def scrape(
    client_or_url: httpx.AsyncClient | str,
    *,
    url: str | None = None,
    model: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    origin_s: float | None = None,
) -> MetricsSnapshot | None:
    """Like :func:`scrape_outcome` but returns only the snapshot (``None`` when unavailable)."""
    outcome = await scrape_outcome(
        client_or_url, url=url, model=model, timeout_s=timeout_s, origin_s=origin_s
    )
    return outcome.snapshot


async def _fetch_and_parse(
    client: httpx.AsyncClient,
    target: str,
    model: str | None,
    timeout_s: float,
    origin_s: float | None,
) -> ScrapeOutcome:
    try:
        response = await client.get(target, timeout=timeout_s)
    except httpx.TimeoutException:
        return ScrapeOutcome(None, f"GET {target} timed out after {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return ScrapeOutcome(None, f"GET {target} failed: {type(exc).__name__}: {exc}")
    # Stamp the time the server answered, not when parsing finished.
    now_s = time.perf_counter() - (origin_s or 0.0)
    if response.status_code != 200:
        return ScrapeOutcome(None, f"GET {target} answered HTTP {response.status_code}")
    try:
        # Parsing a large exposition (vLLM's histograms run to thousands of lines) takes
        # milliseconds of pure Python; in a thread it does not stall the load generator's loop.
        snapshot = await asyncio.to_thread(
            parse_exposition, response.text, time_s=now_s, model=model
        )
    except TelemetryError as exc:
        return ScrapeOutcome(None, f"{target}: {exc}")
    if snapshot.engine == "unknown":
        return ScrapeOutcome(
            None,
            f"{target}: no vLLM, SGLang, TGI or llama.cpp metrics among "
            f"{snapshot.raw_count} samples",
        )
    return ScrapeOutcome(snapshot)


def _point(snapshot: MetricsSnapshot) -> SeriesPoint:
    v = snapshot.values
    return SeriesPoint(snapshot.time_s, v.get("running"), v.get("waiting"), v.get("kv_usage"))


def summarize_snapshots(
    before: MetricsSnapshot | None,
    during: list[MetricsSnapshot],
    after: MetricsSnapshot | None,
    *,
    url: str | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
    reason: str | None = None,
    failed_scrapes: int = 0,
) -> ServerTelemetry:
    """Build :class:`ServerTelemetry` from the scrapes of one run (pure; no I/O)."""
    if before is None:
        return ServerTelemetry(
            available=False,
            reason=reason or "no scrape before the run",
            url=url,
            interval_s=interval_s,
            failed_scrapes=failed_scrapes,
        )
    snapshots = [before, *during] + ([after] if after is not None else [])
    deltas: dict[str, float] = {}
    resets: list[str] = []
    if after is not None:
        for key in COUNTERS:
            if key in before.values and key in after.values:
                delta = after.values[key] - before.values[key]
                if delta < 0:
                    resets.append(key)
                    delta = after.values[key]
                deltas[key] = delta
    elif reason is None:
        reason = "no scrape after the run; counter deltas unavailable"
    peaks: dict[str, float] = {}
    for key in GAUGES:
        seen = [s.values[key] for s in snapshots if key in s.values]
        if seen:
            peaks[key] = max(seen)
    return ServerTelemetry(
        available=True,
        reason=reason,
        engine=before.engine,
        url=url,
        interval_s=interval_s,
        before=before,
        after=after,
        deltas=deltas,
        series=[_point(s) for s in snapshots],
        peaks=peaks,
        scrapes=len(snapshots),
        failed_scrapes=failed_scrapes,
        counter_resets=resets,
    )


class TelemetrySampler:
    """Scrapes a server's ``/metrics`` before, during (every ``interval_s``) and after a run.

    Usage::

        sampler = TelemetrySampler("http://127.0.0.1:8000/v1", interval_s=1.0, origin_s=t0)
        await sampler.start()          # scrapes "before", then samples in a background task
        ...                            # run the load
        telemetry = await sampler.stop()   # scrapes "after"; returns ServerTelemetry

    or ``async with TelemetrySampler(...) as sampler: ...`` then ``sampler.result``. Neither
    method raises for a failing endpoint: the result is then ``available=False`` with a reason.
    When the "before" scrape fails no periodic task is started (an absent endpoint is not
    retried every second for the whole run).
    """

    def __init__(
        self,
        client_or_url: httpx.AsyncClient | str,
        *,
        url: str | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        model: str | None = None,
        origin_s: float | None = None,
    ) -> None:
        if not interval_s > 0:
            raise InputError(f"telemetry interval_s must be > 0, got {interval_s!r}")
        if not timeout_s > 0:
            raise InputError(f"telemetry timeout_s must be > 0, got {timeout_s!r}")
        if isinstance(client_or_url, str):
            self._url = metrics_url(url or client_or_url)
            self._client: httpx.AsyncClient | None = None
            self._owns_client = True
        else:
            self._url = metrics_url(url or str(client_or_url.base_url))
            self._client = client_or_url
            self._owns_client = False
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.model = model
        self.origin_s = time.perf_counter() if origin_s is None else origin_s
        self._before: MetricsSnapshot | None = None
        self._during: list[MetricsSnapshot] = []
        self._failed = 0
        self._last_reason: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.result: ServerTelemetry | None = None

    @property
    def url(self) -> str:
        return self._url

    async def _scrape(self) -> MetricsSnapshot | None:
        assert self._client is not None
        outcome = await scrape_outcome(
            self._client,
            url=self._url,
            model=self.model,
            timeout_s=self.timeout_s,
            origin_s=self.origin_s,
        )
        if outcome.snapshot is None:
            self._failed += 1
            self._last_reason = outcome.reason
        return outcome.snapshot

    async def start(self) -> None:
        """Take the "before" scrape and, if it worked, start periodic sampling."""
        if self._owns_client and self._client is None:
            # A client of its own, so scrapes never queue behind the load's connection limits.
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        self._before = await self._scrape()
        if self._before is not None:
            self._task = asyncio.create_task(self._loop(), name="llmperf-telemetry")

    async def _loop(self) -> None:
        next_s = time.perf_counter() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_s - time.perf_counter()))
            # Fixed-rate schedule; a slow scrape skips ticks rather than bunching them up.
            next_s += self.interval_s
            now = time.perf_counter()
            if next_s < now:
                next_s = now + self.interval_s
            try:
                snap = await self._scrape()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # pragma: no cover - scrape_outcome already catches
                self._failed += 1
                self._last_reason = f"{type(exc).__name__}: {exc}"
                continue
            if snap is not None:
                self._during.append(snap)

    async def stop(self) -> ServerTelemetry:
        """Stop sampling, take the "after" scrape, and return the run's telemetry."""
        if self.result is not None:
            return self.result
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        after = await self._scrape() if self._before is not None else None
        reason = None
        if self._before is None:
            reason = self._last_reason or "no scrape before the run"
        elif after is None:
            reason = f"after-run scrape failed: {self._last_reason}"
        if self._owns_client and self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None
        self.result = summarize_snapshots(
            self._before,
            self._during,
            after,
            url=self._url,
            interval_s=self.interval_s,
            reason=reason,
            failed_scrapes=self._failed,
        )
        return self.result

    async def __aenter__(self) -> TelemetrySampler:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
